"""Write a kiln model as a llama.cpp GGUF file (`gguf`'s own GGUFWriter and quantizers).

    write_gguf(cfg, state, "model.gguf", tok=tok, tok_config=config, gguf_type="q8_0")

Llama and Mistral are written as llama.cpp's `llama` architecture, Qwen2 as `qwen2`, Qwen3 and
Qwen3-MoE as `qwen3` / `qwen3moe`, Gemma 3 as `gemma3` (names and conventions: gguf_arch.py).
Kiln's RoPE rotates halves (HF's convention) and llama.cpp's `llama` rotates adjacent pairs, so
the q/k rows are permuted as llama.cpp's convert_hf_to_gguf.py does (`permute`, the inverse of
`gguf.unpermute`); the others use the halves convention already. Q8_0 quantises the 2-D weights
whose rows are a multiple of its 32-value block; norms, biases and the rest stay F32, as
llama.cpp's converter keeps them.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np
import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.gguf_arch import (
    LAYER_NAMES,
    TOP_NAMES,
    experts_to_gguf,
    export_architecture,
    norm_offset,
)
from kiln.model.formats.gguf_tokenizer import tokenizer_metadata
from kiln.model.formats.mtp_names import without_mtp
from kiln.model.rope import inverse_frequencies
from kiln.platform.errors import ConfigError

GgufType = Literal["f32", "f16", "bf16", "q8_0"]
GGUF_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0")

_KILN_TO_GGUF_TOP = {kiln: gguf for gguf, kiln in TOP_NAMES.items()}
_KILN_TO_GGUF_LAYER = {kiln: gguf for gguf, kiln in LAYER_NAMES.items()}


def gguf_name(kiln_name: str) -> str:
    """kiln parameter name -> llama.cpp tensor name."""
    if kiln_name in _KILN_TO_GGUF_TOP:
        return _KILN_TO_GGUF_TOP[kiln_name]
    if kiln_name.startswith("blk."):  # stacked experts, named by experts_to_gguf
        return kiln_name
    _, layer, rest = kiln_name.split(".", 2)
    if rest not in _KILN_TO_GGUF_LAYER:
        raise ConfigError(f"GGUF export: parameter {kiln_name!r} has no llama.cpp tensor")
    return f"blk.{layer}.{_KILN_TO_GGUF_LAYER[rest]}"


def permute(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order: per head, (2 halves, pairs) -> (pairs, 2)."""
    rows = weight.shape[0]
    w = weight.reshape(n_heads, 2, rows // n_heads // 2, *weight.shape[1:])
    return w.transpose(1, 2).reshape(weight.shape)


def rope_factors(cfg: ModelConfig) -> torch.Tensor:
    """llama.cpp's `rope_freqs.weight` for Llama-3 scaling: what each frequency is divided by."""
    head_dim = cfg.head_dim or cfg.dim // cfg.n_heads
    plain = inverse_frequencies(head_dim, cfg.rope_theta)
    return plain / inverse_frequencies(head_dim, cfg.rope_theta, cfg.rope_scaling)


def _encode(array: np.ndarray, gguf_type: str):
    """(data, raw GGML type or None) for one tensor at the requested type."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    if array.ndim < 2 or gguf_type == "f32":
        return array.astype(np.float32), None
    if gguf_type == "f16":
        return array.astype(np.float16), None
    if gguf_type == "bf16":
        qtype = GGMLQuantizationType.BF16
        return quantize(array.astype(np.float32), qtype), qtype
    if array.shape[-1] % 32:  # Q8_0 blocks are 32 values of a row; llama.cpp falls back to F16
        return array.astype(np.float16), None
    return quantize(array.astype(np.float32), GGMLQuantizationType.Q8_0), (
        GGMLQuantizationType.Q8_0
    )


_FILE_TYPES = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "bf16": "MOSTLY_BF16", "q8_0": "MOSTLY_Q8_0"}


def write_gguf(
    cfg: ModelConfig,
    state: dict[str, torch.Tensor],
    path: str,
    *,
    tok=None,
    tok_config: dict[str, Any] | None = None,
    gguf_type: str = "f32",
    name: str = "kiln",
) -> dict:
    """Write (config, kiln-named state) and the tokenizer (a `tokenizers.Tokenizer` and its
    tokenizer_config.json, if known) to `path`. Returns a summary: architecture, type, tensors."""
    import gguf

    if gguf_type not in GGUF_TYPES:
        raise ConfigError(f"gguf_type {gguf_type!r}: expected one of {', '.join(GGUF_TYPES)}")
    cfg, state = without_mtp(cfg, state)  # multi-token prediction is training-only
    arch = export_architecture(cfg)  # or a ConfigError naming the field it cannot hold
    head_dim = cfg.head_dim or cfg.dim // cfg.n_heads
    n_kv_heads = cfg.n_kv_heads or cfg.n_heads
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_file_type(int(getattr(gguf.LlamaFileType, _FILE_TYPES[gguf_type])))
    writer.add_context_length(cfg.max_seq_len)
    writer.add_embedding_length(cfg.dim)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.ffn_hidden_dim)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(n_kv_heads)
    writer.add_rope_dimension_count(head_dim)
    if head_dim != cfg.dim // cfg.n_heads or arch in ("qwen3", "qwen3moe", "gemma3"):
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    _add_architecture_fields(writer, cfg, arch)
    writer.add_rope_freq_base(cfg.rope_theta)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    if tok is not None:
        _add_tokenizer(writer, tokenizer_metadata(tok, tok_config or {}, cfg.vocab_size))

    tensors = 0
    stacked = experts_to_gguf(state)
    for kiln_name in sorted(stacked, key=lambda name: _file_order(gguf_name(name))):
        weight = stacked[kiln_name]
        if kiln_name == "output.weight" and cfg.tie_embeddings:
            continue  # llama.cpp reuses token_embd when there is no output tensor
        weight = weight.detach().to("cpu", torch.float32)
        if offset := norm_offset(arch, kiln_name):
            weight = weight + offset
        if arch == "llama" and kiln_name.endswith("attention.wq.weight"):
            weight = permute(weight, cfg.n_heads)
        elif arch == "llama" and kiln_name.endswith("attention.wk.weight"):
            weight = permute(weight, n_kv_heads)
        data, raw_dtype = _encode(weight.numpy(), gguf_type)
        writer.add_tensor(gguf_name(kiln_name), data, raw_dtype=raw_dtype)
        tensors += 1
    if cfg.rope_scaling is not None:
        writer.add_tensor("rope_freqs.weight", rope_factors(cfg).numpy().astype(np.float32))
        tensors += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"architecture": arch, "gguf_type": gguf_type, "tensors": tensors}


def _file_order(name: str) -> tuple[int, int, str]:
    """One tensor order whatever the state's (an HF file's is alphabetical, a Kiln model's by
    module), so that the same model always gives the same bytes: token_embd, each block's
    tensors by name, then the rest by name."""
    if name.startswith("blk."):
        _, layer, rest = name.split(".", 2)
        return 1, int(layer), rest
    return (0 if name == "token_embd.weight" else 2), 0, name


def _add_architecture_fields(writer, cfg: ModelConfig, arch: str) -> None:
    """The metadata llama.cpp's converter writes for experts (qwen3moe) and Gemma 3."""
    if arch == "qwen3moe":
        writer.add_expert_count(cfg.n_experts)
        writer.add_expert_used_count(cfg.top_k)
        writer.add_expert_feed_forward_length(cfg.ffn_hidden_dim)
    if arch == "gemma3":
        if cfg.sliding_window is not None and cfg.sliding_window < cfg.max_seq_len:
            writer.add_sliding_window(cfg.sliding_window)
        if cfg.final_logit_softcap is not None:
            writer.add_final_logit_softcapping(cfg.final_logit_softcap)


def _add_tokenizer(writer, meta: dict[str, Any]) -> None:
    writer.add_tokenizer_model(meta["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.scores" in meta:  # sentencepiece: merges come from the scores
        writer.add_token_scores(meta["tokenizer.ggml.scores"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.merges" in meta:  # byte-level BPE
        writer.add_token_merges(meta["tokenizer.ggml.merges"])
    ids = {
        "tokenizer.ggml.bos_token_id": writer.add_bos_token_id,
        "tokenizer.ggml.eos_token_id": writer.add_eos_token_id,
        "tokenizer.ggml.unknown_token_id": writer.add_unk_token_id,
        "tokenizer.ggml.padding_token_id": writer.add_pad_token_id,
    }
    for key, add in ids.items():
        if meta.get(key) is not None:
            add(meta[key])
    writer.add_add_bos_token(meta["tokenizer.ggml.add_bos_token"])
    writer.add_add_eos_token(meta["tokenizer.ggml.add_eos_token"])
    if "tokenizer.ggml.add_space_prefix" in meta:
        writer.add_add_space_prefix(meta["tokenizer.ggml.add_space_prefix"])
    if meta.get("tokenizer.chat_template"):
        writer.add_chat_template(meta["tokenizer.chat_template"])
