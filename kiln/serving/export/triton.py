"""Export a kiln model as a Triton model repository served by the python backend.

<repo>/<model>/config.pbtxt     max_batch_size, dynamic batching, instance_group, I/O
<repo>/<model>/1/model.py        the TritonPythonModel (kiln/serving/triton/model.py)
<repo>/<model>/1/hf/             weights + tokenizer in Hugging Face format
<repo>/<model>/1/runtime/kiln/   the kiln modules generation needs (no Ray)
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kiln.model.formats.shared_weights import link_or_copy_weights
from kiln.model.quantize import QuantMethod
from kiln.platform.errors import InputError
from kiln.serving.export.hf import export_hf
from kiln.serving.export.runtime import copy_runtime, kiln_imports
from kiln.text.chat_template import end_of_turn_markers, load_chat_config

# the TritonPythonModel: read as a file (it imports triton_python_backend_utils, which only
# Triton's Python backend provides)
TRITON_MODEL_PY = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "triton", "model.py"
)

_INPUTS = [
    # name, type, dims, optional
    ("text_input", "TYPE_STRING", "[ 1 ]", True),  # this or `messages`
    ("messages", "TYPE_STRING", "[ 1 ]", True),  # JSON [{role, content}]: the chat template
    ("max_tokens", "TYPE_INT32", "[ 1 ]", True),
    ("temperature", "TYPE_FP32", "[ 1 ]", True),
    ("top_k", "TYPE_INT32", "[ 1 ]", True),
    ("top_p", "TYPE_FP32", "[ 1 ]", True),
    ("seed", "TYPE_INT64", "[ 1 ]", True),
    ("stop", "TYPE_STRING", "[ -1 ]", True),
    ("stream", "TYPE_BOOL", "[ 1 ]", True),
]
_OUTPUTS = [
    ("text_output", "TYPE_STRING"),
    ("finish_reason", "TYPE_STRING"),
    ("prompt_tokens", "TYPE_INT32"),
    ("completion_tokens", "TYPE_INT32"),
]


class TritonExportConfig(BaseModel):
    """How the Triton model is served."""

    model_config = ConfigDict(extra="forbid")

    model_name: str = Field(
        "kiln",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Name of the model in the Triton repository.",
    )
    max_batch_size: int = Field(8, ge=1, description="Rows Triton may batch into one execute().")
    max_queue_delay_us: int = Field(
        2000, ge=0, description="Dynamic batching: wait this long for more rows."
    )
    instance_kind: Literal["KIND_CPU", "KIND_GPU"] = Field(
        "KIND_CPU", description="Where the instances run (KIND_CPU or KIND_GPU)."
    )
    instance_count: int = Field(1, ge=1, description="Model instances Triton runs.")
    decoupled: bool = Field(
        False, description="Decoupled transaction policy: `stream` sends deltas."
    )
    default_max_tokens: int = Field(
        64, ge=1, description="max_tokens of a request that gives none."
    )
    max_tokens_limit: int = Field(4096, ge=1, description="Largest max_tokens a request may ask.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights' dtype in the Triton model."
    )
    quantize: QuantMethod | None = Field(
        None,
        description="Quantize the weights as the model loads (int8, int4 on CPU instances; fp8 "
        "on GPUs of capability 8.9+); the files keep `dtype`.",
    )
    quantize_group_size: Literal[32, 64, 128, 256] = Field(
        32, description="int4: inputs that share one scale."
    )
    torch_threads: int = Field(
        0, ge=0, description="torch threads per instance (0: torch's default)."
    )
    engine_slots: int = Field(
        8, ge=1, description="KV-cache slots of the continuous-batching engine (rows at once)."
    )
    prefill_chunk: int = Field(
        256, ge=1, description="Prompt tokens the engine prefills per step (long ones chunked)."
    )


def config_pbtxt(
    cfg: TritonExportConfig,
    end_of_turn: list[str] | None = None,
    chat_template: str | None = None,
    special_tokens: dict[str, str] | None = None,
) -> str:
    """The model configuration Triton reads (`end_of_turn`: the chat template's markers). The
    model's chat template and special tokens ride along as parameters, so a REST triton backend
    that only reaches the server (`get_model_config`) renders chat as the model does."""
    inputs = ",\n".join(
        f'  {{ name: "{n}" data_type: {t} dims: {d}{" optional: true" if o else ""} }}'
        for n, t, d, o in _INPUTS
    )
    outputs = ",\n".join(f'  {{ name: "{n}" data_type: {t} dims: [ 1 ] }}' for n, t in _OUTPUTS)
    params = {
        "default_max_tokens": cfg.default_max_tokens,
        "max_tokens_limit": cfg.max_tokens_limit,
        "dtype": cfg.dtype,
        "quantize": cfg.quantize or "",  # "": the weights as stored
        "quantize_group_size": cfg.quantize_group_size,
        "torch_threads": cfg.torch_threads,
        "engine_slots": cfg.engine_slots,
        "prefill_chunk": cfg.prefill_chunk,
        "end_of_turn": json.dumps(end_of_turn or []),
        "chat_template": chat_template or "",  # "": the model has none (ChatML)
        "special_tokens": json.dumps(special_tokens or {}, ensure_ascii=False),
    }
    quoted = {json.dumps(k): json.dumps(str(v), ensure_ascii=False) for k, v in params.items()}
    parameters = "\n".join(
        f"parameters {{ key: {k} value: {{ string_value: {v} }} }}" for k, v in quoted.items()
    )
    return f"""name: "{cfg.model_name}"
backend: "python"
max_batch_size: {cfg.max_batch_size}
dynamic_batching {{ max_queue_delay_microseconds: {cfg.max_queue_delay_us} }}
model_transaction_policy {{ decoupled: {str(cfg.decoupled).lower()} }}
input [
{inputs}
]
output [
{outputs}
]
instance_group [ {{ count: {cfg.instance_count} kind: {cfg.instance_kind} }} ]
{parameters}
"""


def export_triton(
    source, repo_dir: str, cfg: TritonExportConfig | None = None, *, tokenizer=None, **fields
) -> str:
    """Write a Triton model repository for `source` (a Generator, a checkpoint, an HF dir).

    An already exported HF directory is copied as is. Returns the model directory.
    """

    cfg = cfg.model_copy(update=fields) if cfg else TritonExportConfig(**fields)
    model_dir = os.path.join(repo_dir, cfg.model_name)
    version_dir = os.path.join(model_dir, "1")
    if os.path.exists(model_dir):
        shutil.rmtree(model_dir)
    os.makedirs(version_dir)
    hf_dir = os.path.join(version_dir, "hf")
    is_hf_dir = isinstance(source, (str, os.PathLike)) and os.path.exists(
        os.path.join(source, "config.json")
    )
    if is_hf_dir and tokenizer is None and os.path.exists(os.path.join(source, "tokenizer.json")):
        shutil.copytree(source, hf_dir, copy_function=link_or_copy_weights)
    else:
        export_hf(source, hf_dir, tokenizer=tokenizer, dtype=cfg.dtype, model_name=cfg.model_name)
    if not os.path.exists(os.path.join(hf_dir, "tokenizer.json")):
        raise InputError("Triton export needs a tokenizer (text in, text out): pass tokenizer=")
    model_py = TRITON_MODEL_PY
    shutil.copyfile(model_py, os.path.join(version_dir, "model.py"))
    # the runtime is what model.py imports, and what that imports
    roots = kiln_imports(model_py, "kiln.serving.triton.model")
    copy_runtime(os.path.join(version_dir, "runtime"), roots=sorted(roots))
    template, special = load_chat_config(hf_dir)
    with open(os.path.join(model_dir, "config.pbtxt"), "w", encoding="utf-8") as f:
        f.write(config_pbtxt(cfg, end_of_turn_markers(template, special), template, special))
    return model_dir
