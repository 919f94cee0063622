"""One artifact currency for models: every stage that produces a model hands on a Checkpoint
(the tokenizer and chat template in its root) and only `export` writes HF. The quickstart's
shape on a tiny model: import-model (an HF folder made here) -> prepare-chat -> LoRA sft ->
export, and continued pretraining reads an imported Checkpoint in place."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from kiln.model.formats.checkpoint import read_sidecar, resolve
from kiln.model.formats.hf import write_hf_dir
from kiln.model.formats.weights import build_model, read_weights
from kiln.platform.errors import InputError
from kiln.platform.pipeline import Pipeline
from kiln.platform.registry import stage_class
from kiln.training.config import TrainConfig
from kiln.training.stages import continue_from_model
from tests.engine.tiny import tiny_model
from tests.training.post.helpers import CHATML_GENERATION, chat_tokenizer, save_hf_tokenizer
from tests.training.post.lora_helpers import VOCAB

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is", "ignore::FutureWarning")


def _tiny_hf(root: Path) -> str:
    """A tiny Llama as a HF folder, its tokenizer and ChatML template beside the weights."""
    hf = root / "source"
    tok = chat_tokenizer()
    save_hf_tokenizer(tok, str(hf), CHATML_GENERATION)
    model = tiny_model("llama", VOCAB)
    write_hf_dir(model.cfg, model.state_dict(), str(hf), tok=tok, tok_dir=str(hf))
    return str(hf)


def _greedy(model: torch.nn.Module, ids: list[int], n: int) -> list[int]:
    """The in-memory kiln model's greedy continuation (full forward each step)."""
    tokens = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            nxt = model(tokens)[0, -1].argmax()
            tokens = torch.cat([tokens, nxt.view(1, 1)], dim=1)
    return tokens[0, len(ids) :].tolist()


def _sft_pipeline(tmp_path: Path) -> Pipeline:
    rows = [{"prompt": f"fact {i}?", "response": f"fact {i} is paris"} for i in range(8)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Pipeline(
        "currency",
        [
            stage_class("import-model")(name="base", source=_tiny_hf(tmp_path)),
            stage_class("prepare-chat")(
                name="chat", source=str(tmp_path / "sft.jsonl"), template="model", seq_len=48
            ),
            stage_class("sft")(
                lora={"rank": 4, "alpha": 8},
                seq_len=48,
                global_batch_size=4,
                micro_batch_size=4,
                steps=2,
                device="cpu",
                optimizer={"lr": 1e-2, "weight_decay": 0.0},
            ),
            stage_class("export")(formats=["hf"], model_name="tiny-chat"),
        ],
        runs_dir=str(tmp_path / "runs"),
    )


def test_quickstart_chain_converts_once_and_exports_once(tmp_path):
    """~6 s: the run folder holds one import (a full Checkpoint), sft's adapter-only Checkpoint
    on it and one HF folder (the export); greedy output of the export (transformers) equals the
    in-memory model read from sft's checkpoint, and the chat template travelled to it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pipeline = _sft_pipeline(tmp_path)
    assert pipeline.wiring["sft"] == {"data": "chat.data", "model": "base.model"}
    assert pipeline.wiring["export"] == {"checkpoint": "sft.model"}
    result = pipeline.run(shutdown=False)
    assert result.record["status"] == "succeeded"
    kinds = {ref: result.artifact(ref).kind for ref in ("base.model", "sft.model", "export.model")}
    assert kinds == {
        "base.model": "Checkpoint",
        "sft.model": "Checkpoint",
        "export.model": "ExportedModel",
    }
    base, sft = result.artifact("base.model").path, result.artifact("sft.model").path
    export = Path(result.artifact("export.model").path)

    # one HF folder in the run, the export's; checkpoints: the import's weights and sft's adapters
    run = result.run_dir
    assert [p.parent for p in run.rglob("config.json")] == [export / "hf"]
    steps = sorted(p.parent for p in run.rglob("kiln.json"))
    assert steps == sorted([Path(resolve(base)), Path(resolve(sft))])
    assert not read_sidecar(base).get("adapter_only")
    assert read_sidecar(sft)["adapter_only"]["base"] == os.path.abspath(base)
    assert (export / "adapter" / "adapter_config.json").is_file()

    # the import's chat template reached the export through the checkpoints' roots
    hf_tok = AutoTokenizer.from_pretrained(str(export / "hf"))
    assert hf_tok.chat_template and "<|im_start|>" in hf_tok.chat_template
    chat = [{"role": "user", "content": "fact 3?"}]
    rendered = hf_tok.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    prompt = list(rendered["input_ids"])

    _, cfg, state = read_weights(sft)  # adapters merged onto the imported base in memory
    ours = _greedy(build_model(cfg, state, device="cpu"), prompt, 8)
    hf = AutoModelForCausalLM.from_pretrained(str(export / "hf")).eval()
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None
        )
    assert out[0, len(prompt) :].tolist() == ours


def test_train_continues_from_an_imported_checkpoint_in_place(tmp_path):
    """`train`'s `model` input: the Checkpoint is read where it lies (no copy) with its shape;
    an adapter-only one (LoRA) is refused with a line naming it."""
    result = Pipeline(
        "import",
        [stage_class("import-model")(name="base", source=_tiny_hf(tmp_path))],
        runs_dir=str(tmp_path / "runs"),
    ).run(shutdown=False)
    base = result.artifact("base.model").path
    cfg = TrainConfig(model="tiny", seq_len=128, steps=1)
    continued = continue_from_model(cfg, base)
    assert continued.checkpoint.init_from == resolve(base)
    assert continued.model.vocab_size == VOCAB and continued.model.max_seq_len == 128
    assert (Path(base) / "tokenizer.json").is_file()  # the import's tokenizer, in the root

    lora = tmp_path / "lora"  # the import, its sidecar saying adapters only (as LoRA sft's)
    shutil.copytree(base, lora)
    step = Path(resolve(str(lora)))
    sidecar = read_sidecar(base) | {"adapter_only": {"base": base}}
    (step / "kiln.json").write_text(json.dumps(sidecar))
    with pytest.raises(InputError, match="adapter-only"):
        continue_from_model(cfg, str(lora))
