"""The checks every architecture's HF parity test makes against `transformers`: logits on a
right-padded batch, greedy decoding through the engine, and HF -> kiln -> HF byte for byte."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from kiln.engine.generator import Generator
from kiln.engine.sampler import SamplingParams
from kiln.model.formats.hf import write_hf_dir


def assert_logits_match(model, hf, prompts: list[list[int]]) -> None:
    """One right-padded batch; kiln's causal attention never reads the padding."""
    width = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for row, p in enumerate(prompts):
        tokens[row, : len(p)], mask[row, : len(p)] = torch.tensor(p), 1
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=0, atol=1e-4)


def assert_greedy_matches_generate(model, hf, prompts: list[list[int]], new: int = 6) -> None:
    """Greedy decoding through the engine's KV cache equals `transformers.generate`."""
    gen = Generator(model, None, eos_token_ids=[])
    got = gen.generate_ids(prompts, SamplingParams(max_new_tokens=new, temperature=0.0))
    for p, tokens in zip(prompts, got, strict=True):
        want = hf.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False)[0, len(p) :]
        assert tokens == want.tolist(), p


def assert_hf_round_trip(cfg, state, hf_dir: str, out_dir: str, fields: list[str]) -> None:
    """HF -> kiln -> HF: the same tensors, byte for byte, and the same config `fields`."""
    write_hf_dir(cfg, state, out_dir)
    before = load_file(f"{hf_dir}/model.safetensors")
    after = load_file(f"{out_dir}/model.safetensors")
    assert sorted(before) == sorted(after)
    for name, tensor in before.items():
        assert tensor.dtype == after[name].dtype and torch.equal(tensor, after[name]), name
    with open(f"{hf_dir}/config.json") as f, open(f"{out_dir}/config.json") as g:
        src, dst = json.load(f), json.load(g)
    for field in fields:
        assert src.get(field) == dst.get(field), field
