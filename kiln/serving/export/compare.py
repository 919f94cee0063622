"""`kiln compare-models A B`: do two models (any two of a Kiln checkpoint in any layout, an HF
folder, a GGUF file) compute the same function? Same prompts through both: logit differences,
top-1 agreement, greedy text, and the first layer whose hidden state differs (a corrupted or
mis-mapped weight shows where it is, not only that the logits moved)."""

from __future__ import annotations

import torch
from pydantic import BaseModel

from kiln.model.formats.weights import build_model
from kiln.model.transformer import Transformer
from kiln.platform.errors import InputError

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
)


class Comparison(BaseModel):
    max_logit_diff: float
    mean_logit_diff: float
    top1_agreement: float
    greedy_equal: bool
    first_layer_differing: str | None  # "layers.3" (or "embeddings"), None if all agree
    layer_diff: float  # that layer's max hidden-state difference / its largest activation
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.max_logit_diff <= self.tolerance and self.first_layer_differing is None

    def lines(self) -> list[str]:
        layer = self.first_layer_differing or "none"
        return [
            f"max logit diff: {self.max_logit_diff:.3g} (tolerance {self.tolerance:g})",
            f"mean logit diff: {self.mean_logit_diff:.3g}",
            f"top-1 agreement: {100 * self.top1_agreement:.1f}%",
            f"greedy text equal: {'yes' if self.greedy_equal else 'no'}",
            f"first layer differing: {layer}"
            + (
                f" (max hidden diff {self.layer_diff:.3g} of its largest activation)"
                if self.first_layer_differing
                else ""
            ),
        ]


def _hidden_states(model: Transformer, tokens: torch.Tensor) -> tuple[list, torch.Tensor]:
    """([embedding output, each block's output], logits) of one forward."""
    states: list[torch.Tensor] = []
    hooks = [model.tok_embeddings.register_forward_hook(lambda m, i, o: states.append(o))]
    for layer in model.layers.values():
        hooks.append(layer.register_forward_hook(lambda m, i, o: states.append(o)))
    try:
        with torch.no_grad():
            logits = model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return states, logits


def _greedy(model: Transformer, tokens: list[int], steps: int) -> list[int]:
    out = list(tokens)
    with torch.no_grad():
        for _ in range(min(steps, model.cfg.max_seq_len - len(out))):
            out.append(int(model(torch.tensor([out]))[0, -1].argmax()))
    return out[len(tokens) :]


def _check_shapes(a: Transformer, b: Transformer) -> None:
    for field in ("vocab_size", "n_layers", "dim"):
        va, vb = getattr(a.cfg, field), getattr(b.cfg, field)
        if va != vb:
            raise InputError(f"compare-models: the models' {field} differ ({va} vs {vb})")


def compare(
    a: Transformer,
    b: Transformer,
    prompts: list[list[int]],
    *,
    tolerance: float = 1e-3,
    greedy_tokens: int = 8,
) -> Comparison:
    """Compare `a` and `b` on token-id prompts (each its own forward, so no padding enters)."""
    _check_shapes(a, b)
    if not prompts or not all(prompts):
        raise InputError("compare-models: every prompt needs at least one token")
    max_diff = total = agree = count = 0.0
    first, first_diff = None, 0.0
    greedy_equal = True
    for ids in prompts:
        tokens = torch.tensor([ids[: a.cfg.max_seq_len]])
        states_a, logits_a = _hidden_states(a, tokens)
        states_b, logits_b = _hidden_states(b, tokens)
        for index, (ha, hb) in enumerate(zip(states_a, states_b, strict=True)):
            # relative to the layer's largest activation: residual streams grow with depth
            # (and carry a few huge channels), logits do not
            scale = max(ha.float().abs().max().item(), 1e-6)
            diff = (ha.float() - hb.float()).abs().max().item() / scale
            name = "embeddings" if index == 0 else f"layers.{index - 1}"
            if diff > tolerance and first is None:
                first, first_diff = name, diff
                break
        delta = (logits_a.float() - logits_b.float()).abs()
        max_diff = max(max_diff, delta.max().item())
        total += delta.sum().item()
        count += delta.numel()
        agree += (logits_a.argmax(-1) == logits_b.argmax(-1)).sum().item()
        greedy_equal &= _greedy(a, ids, greedy_tokens) == _greedy(b, ids, greedy_tokens)
    positions = sum(min(len(p), a.cfg.max_seq_len) for p in prompts)
    return Comparison(
        max_logit_diff=max_diff,
        mean_logit_diff=total / count,
        top1_agreement=agree / positions,
        greedy_equal=greedy_equal,
        first_layer_differing=first,
        layer_diff=first_diff,
        tolerance=tolerance,
    )


def load_for_compare(cfg, state) -> Transformer:
    """A float32 CPU model of (cfg, state): the comparison's numbers do not depend on a GPU."""
    return build_model(cfg, state, device="cpu", dtype=torch.float32)
