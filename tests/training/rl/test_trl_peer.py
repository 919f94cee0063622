"""Kiln's GRPO losses against TRL's real GRPOTrainer (the peer, not a transcription):
bench/trl_peer.py runs `GRPOTrainer._compute_loss` in TRL's own venv (TRL 1.x cannot live beside
this project's pins) on the log-probs, advantages and masks made here, and each case's loss and
gradient must equal `grpo_loss`'s. Skipped when the venv is absent; make it as bench/trl_peer.py's
docstring says (KILN_TRLVENV, default /tmp/trlvenv).

TRL's KL term is compared with `use_bias_correction_kl=False`: TRL 1.16 defaults to True, which
multiplies the k3 KL by the (differentiable) importance ratio, so its KL gradient differs from
the plain k3 one even on-policy; Kiln's `beta` is the plain k3 penalty (TRL < 1.0's)."""

import itertools
import os
import subprocess

import pytest
import torch

from kiln.model.formats.hf import write_hf_dir
from kiln.training.rl.objectives import group_advantages, grpo_loss, tis_weights
from tests.engine.tiny import tiny_model, train_tokenizer

TRL_VENV = os.environ.get("KILN_TRLVENV", "/tmp/trlvenv")
PEER = os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "trl_peer.py")
B, T, G, MAX_LEN = 6, 7, 3, 9
LOSS_TYPE = {"token": "bnpo", "sequence": "grpo", "dr_grpo": "dr_grpo"}
GRID = list(itertools.product(["token", "sequence", "dr_grpo"], [0.0, 0.04], [0.2, 0.28],
                              ["token", "sequence"]))  # fmt: skip
TIS_CASE = len(GRID)  # the last case: token weights min(pi_trainer / pi_sampler, 2)

MAKE_VENV = (
    f"python3.11 -m venv {TRL_VENV} && {TRL_VENV}/bin/pip install torch==2.13.0 "
    f"&& {TRL_VENV}/bin/pip install torch==2.13.0 trl==1.16.0"
)
pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(TRL_VENV, "bin", "python")),
    reason=f"TRL venv absent ({TRL_VENV}); make it with: {MAKE_VENV}",
)


def _batch():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    # ratios spread well past 1 +- 0.28 so both clip bounds are exercised
    logp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4
    ref = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    sampler = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    mask = torch.ones(B, T, dtype=torch.float64)
    mask[1, 4:] = 0
    mask[4, 2:] = 0
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0], dtype=torch.float64)
    tis = tis_weights(old, sampler, mask, cap=2.0)
    return logp, old, ref, mask, group_advantages(rewards, G), tis


def _case(aggregation, beta, epsilon_high, level, tis=None) -> dict:
    return {"loss_type": LOSS_TYPE[aggregation], "beta": beta, "epsilon_low": 0.2,
            "epsilon_high": epsilon_high, "importance_sampling_level": level,
            "max_completion_length": MAX_LEN, "use_bias_correction_kl": False,
            "tis": tis}  # fmt: skip


@pytest.fixture(scope="module")
def trl_results(tmp_path_factory):
    """Every case's (loss, gradient) from TRL's GRPOTrainer, one subprocess for all."""
    work = tmp_path_factory.mktemp("trl")
    tok = train_tokenizer()
    net = tiny_model("llama", tok.get_vocab_size())
    write_hf_dir(net.cfg, net.state_dict(), str(work / "model"), tok=tok, tok_dir=None)
    logp, old, ref, mask, adv, tis = _batch()
    cases = [_case(*c) for c in GRID] + [_case("sequence", 0.0, 0.2, "token", tis)]
    torch.save({"logp": logp, "old": old, "ref": ref, "mask": mask, "advantages": adv,
                "group_size": G, "cases": cases}, work / "in.pt")  # fmt: skip
    proc = subprocess.run(
        [os.path.join(TRL_VENV, "bin", "python"), PEER, "loss", str(work / "model"),
         str(work / "in.pt"), str(work / "out.pt")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(work / "out.pt")


def _ours(aggregation, beta, epsilon_high, level, tis=None):
    logp, old, ref, mask, adv, _ = _batch()
    logp.requires_grad_()
    loss, _ = grpo_loss(
        logp, old, adv, mask, ref_logp=ref, beta=beta, epsilon_low=0.2,
        epsilon_high=epsilon_high, aggregation=aggregation, importance_level=level,
        max_completion_length=MAX_LEN, tis=tis,
    )  # fmt: skip
    loss.backward()
    return loss.detach(), logp.grad


@pytest.mark.parametrize("case", range(len(GRID)), ids=["-".join(map(str, c)) for c in GRID])
def test_loss_and_gradient_equal_trls_grpo_trainer(trl_results, case):
    loss, grad = _ours(*GRID[case])
    theirs = trl_results[case]
    assert loss.item() != 0.0
    torch.testing.assert_close(loss, theirs["loss"], rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, theirs["grad"], rtol=0, atol=1e-12)


def test_truncated_importance_weights_equal_trls(trl_results):
    *_, tis = _batch()
    assert tis.max() == 2.0 and tis.min() < 1.0  # the cap binds and some tokens weigh less
    loss, grad = _ours("sequence", 0.0, 0.2, "token", tis)
    theirs = trl_results[TIS_CASE]
    torch.testing.assert_close(loss, theirs["loss"], rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, theirs["grad"], rtol=0, atol=1e-12)
