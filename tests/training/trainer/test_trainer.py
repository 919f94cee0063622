"""Single-process trainer pieces: schedules, stage splits, clipping, precision, entry points."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from kiln.model import ModelConfig, Transformer
from kiln.platform.errors import ConfigError
from kiln.training.config import ScheduleConfig, TrainConfig
from kiln.training.metrics import flops_per_token
from kiln.training.optimizer import clip_grads_, global_grad_norm, lr_factor
from kiln.training.parallel.dims import ParallelDims
from kiln.training.parallel.pipeline_parallel import split_layers, stage_ids
from kiln.training.precision import LossScaler
from tests.training.trainer.layouts import tiny_config, train_losses

METRIC_KEYS = {
    "step",
    "loss",
    "grad_norm",
    "lr",
    "tokens_per_s",
    "mfu",
    "peak_mem_gb",
    "tokens_seen",
}


def test_warmup_cosine_and_wsd_schedules():
    cos = ScheduleConfig(kind="cosine", warmup_steps=4, min_lr_ratio=0.1)
    assert [lr_factor(s, 20, cos) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 20, cos) == pytest.approx(1.0)
    assert lr_factor(12, 20, cos) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lr_factor(20, 20, cos) == pytest.approx(0.1)
    wsd = ScheduleConfig(kind="wsd", warmup_steps=2, decay_fraction=0.25, min_lr_ratio=0.0)
    factors = [lr_factor(s, 20, wsd) for s in range(20)]
    assert factors[2:15] == [1.0] * 13  # stable phase
    assert factors[15:] == pytest.approx([0.8, 0.6, 0.4, 0.2, 0.0])  # linear decay to the floor


def test_pipeline_split_balances_parameters_and_keeps_global_names():
    # Heavy embeddings on the first stage push layers to the later stages.
    assert split_layers([10] * 8, first_extra=25, last_extra=0, n_stages=2) == [
        [0, 1, 2],
        [3, 4, 5, 6, 7],
    ]
    assert split_layers([10] * 4, 0, 0, 4) == [[0], [1], [2], [3]]
    with pytest.raises(ConfigError, match="n_layers"):
        split_layers([10] * 2, 0, 0, 4)
    assert stage_ids(0, 2, 2, "interleaved_1f1b") == [0, 2]
    assert stage_ids(0, 2, 2, "zbv") == [0, 3] and stage_ids(1, 2, 2, "zbv") == [1, 2]


def test_global_grad_norm_and_clipping_match_torch():
    torch.manual_seed(0)
    a, b = Transformer(ModelConfig.preset("tiny")), Transformer(ModelConfig.preset("tiny"))
    b.load_state_dict(a.state_dict())
    tokens = torch.randint(0, 256, (2, 8))
    for m in (a, b):
        m(tokens).square().mean().backward()
    expected = torch.nn.utils.clip_grad_norm_(b.parameters(), 0.1)
    params = list(a.parameters())
    norm = global_grad_norm(params)
    clip_grads_(params, 0.1, norm)
    assert float(norm) == pytest.approx(float(expected), rel=1e-6)
    for p, q in zip(a.parameters(), b.parameters(), strict=False):
        torch.testing.assert_close(p.grad, q.grad)


def test_loss_scaler_skips_overflow_and_grows():
    scaler = LossScaler(enabled=True, init_scale=8.0, growth_interval=2)
    assert not scaler.update(torch.tensor(float("inf"))) and scaler.scale == 4.0
    assert (
        scaler.update(torch.tensor(1.0))
        and scaler.update(torch.tensor(1.0))
        and scaler.scale == 8.0
    )


def test_bf16_trains_and_stays_near_fp32():
    fast = {"optimizer": {"lr": 1e-2}, "steps": 8, "repeat_batch": True}
    fp32 = train_losses(**fast)
    bf16 = train_losses(precision="bf16", **fast)
    assert bf16[-1] < bf16[0] - 0.1  # it learns
    assert bf16[:3] == pytest.approx(fp32[:3], abs=3e-2)


def test_fp16_with_loss_scaling_trains():
    losses = train_losses(precision="fp16", optimizer={"lr": 1e-2}, steps=6, repeat_batch=True)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.1


def test_config_errors_name_the_field():
    if not torch.cuda.is_available():
        from kiln.training.trainer import Trainer

        with pytest.raises(ConfigError, match="fp8"):
            Trainer(tiny_config(precision="fp8", fp8_backend="te")).setup()
    with pytest.raises(ConfigError, match="global_batch_size"):
        tiny_config(global_batch_size=6).grad_accum_steps(dp_size=2)
    with pytest.raises(ConfigError, match="world size"):
        ParallelDims.from_config(tiny_config(parallel={"tp": 2, "dp_shard": 2}).parallel, 8)
    with pytest.raises(ConfigError, match="tie_embeddings"):
        TrainConfig(model={"preset": "tiny", "tie_embeddings": True}, parallel={"pp": 2})
    assert TrainConfig(model={"preset": "tiny", "n_layers": 2}).model.n_layers == 2


def test_train_entry_point_reports_every_metric(tmp_path):
    from kiln.training import train

    cfg = tiny_config(
        steps=2, metrics_file=str(tmp_path / "m.jsonl"), model={"preset": "tiny", "n_layers": 2}
    )
    history = train(cfg)
    assert [m["step"] for m in history] == [1, 2]
    assert set(history[0]) >= METRIC_KEYS
    assert history[-1]["tokens_seen"] == 2 * cfg.global_batch_size * cfg.seq_len
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 2


def test_mfu_flops_formula():
    cfg = ModelConfig.preset("llama3_8b")
    n = cfg.num_params(exclude_embedding=True)
    # causal: a query attends (T + 1) / 2 keys on average
    assert flops_per_token(cfg, 8192) == 6 * n + 12 * 32 * 32 * 128 * (8192 + 1) / 2


@pytest.mark.slow
def test_train_launches_torchrun_for_a_multi_rank_layout():
    from kiln.training import train

    layout = {"parallel": {"dp_shard": 2}, "steps": 2, "model": {"preset": "tiny", "n_layers": 2}}
    # The one-process reference trains here while torchrun and its ranks start.
    with ThreadPoolExecutor(1) as pool:
        reference = pool.submit(
            train_losses, **{k: v for k, v in layout.items() if k != "parallel"}
        )
        history = train(tiny_config(**layout))
        reference = reference.result()
    assert [m["loss"] for m in history] == pytest.approx(reference, abs=1e-5)


def test_a_loaded_optimizer_keeps_this_runs_kernels():
    """The saving run's foreach/fused flags are not this run's: resuming keeps its own."""
    from kiln.training.checkpoint.state import apply_optimizer_state, optimizer_state
    from kiln.training.config import OptimizerConfig
    from kiln.training.optimizer import build_optimizer

    torch.manual_seed(0)
    model = Transformer(ModelConfig.preset("tiny"))
    saver = build_optimizer(model, OptimizerConfig(implementation="foreach"))
    model(torch.randint(0, 256, (2, 8))).square().mean().backward()
    saver.step()
    saved, _ = optimizer_state([model], [saver])
    model.zero_grad(set_to_none=True)  # as a resuming run is: no gradients yet
    loader = build_optimizer(model, OptimizerConfig(implementation="for_loop"))
    state, keys = optimizer_state([model], [loader])  # the placeholders a resume fills (as DCP)
    for k, v in saved.items():
        if isinstance(v, torch.Tensor):
            state[k].copy_(v)
        else:
            state[k] = v
    apply_optimizer_state([model], [loader], state, keys)
    assert {g["foreach"] for g in loader.param_groups} == {False}
    assert {g["foreach"] for g in saver.param_groups} == {True}
    first = next(iter(model.parameters()))
    torch.testing.assert_close(loader.state[first]["exp_avg"], saver.state[first]["exp_avg"])


def test_auto_steps_plain_cpu_tensors_fused_as_foreach_does():
    """`auto` on CPU: the fused kernel for plain tensors (bench/optimizer_cpu.py), the same
    parameters after three steps as torch's foreach kernel, weight decay on matrices only."""
    from kiln.training.config import OptimizerConfig
    from kiln.training.optimizer import build_optimizer

    models = []
    for impl in ("auto", "foreach"):
        torch.manual_seed(0)
        model = Transformer(ModelConfig.preset("tiny"))
        opt = build_optimizer(model, OptimizerConfig(lr=1e-2, implementation=impl))
        for step in range(3):
            torch.manual_seed(step)
            model(torch.randint(0, 256, (2, 8))).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        models.append(model)
        if impl == "auto":
            assert [(g["fused"], g["foreach"]) for g in opt.param_groups] == [(True, False)] * 2
            assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    fused, foreach = (dict(m.named_parameters()) for m in models)
    for name, param in fused.items():
        torch.testing.assert_close(param, foreach[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("async_save", [False, True])
def test_one_process_saves_and_resumes_without_a_warning(tmp_path, async_save):
    """DCP warns "torch.distributed is disabled ..." unless told a save is one process's: a
    successful run's log holds no warning."""
    import warnings

    from kiln.training.trainer import Trainer

    checkpoint = {"dir": str(tmp_path / "ckpt"), "interval_steps": 1, "async": async_save}
    small = {"preset": "tiny", "n_layers": 2}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", append=True)  # behind kiln's own filters
        Trainer(tiny_config(steps=1, model=small, checkpoint=checkpoint)).train()
        resumed = Trainer(tiny_config(steps=2, model=small, checkpoint=checkpoint)).train()
    assert [m["step"] for m in resumed] == [2]  # the second run loaded step 1's checkpoint
    assert [str(w.message) for w in caught] == []
