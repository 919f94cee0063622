"""SFT on Ray Train (2 workers, dp_shard=2, as `train` runs) equals the one-process run: the
same losses, and the export from its adapter-only checkpoint equals the in-process export."""

from __future__ import annotations

import pytest
import torch

from tests.training.post.test_post_trainer import _cfg, data  # noqa: F401 (fixture)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is", "ignore::FutureWarning")


@pytest.mark.slow
def test_lora_sft_on_ray_train_equals_one_process(ray_session, data, tmp_path):  # noqa: F811
    from safetensors.torch import load_file

    from kiln.model.formats.weights import read_weights
    from kiln.training.post.run import train_post, train_post_on_ray
    from kiln.training.ray_train import RayOptions

    torch.manual_seed(0)
    one = train_post(_cfg(data, steps=3, micro_batch_size=4), str(tmp_path / "one"))
    cfg = _cfg(data, steps=3, parallel={"dp_shard": 2}, micro_batch_size=2, seed=0)
    options = RayOptions(num_workers=2, cpus_per_worker=0.5, name="post-ray")
    two = train_post_on_ray(cfg, str(tmp_path / "run"), options, str(tmp_path / "two"))
    assert two["world_size"] == 2 and two["steps"] == 3
    assert two["final"]["loss"] == pytest.approx(one["final"]["loss"], abs=1e-5)
    merged = [read_weights(str(tmp_path / run / "hf"))[2] for run in ("one", "two")]
    adapter = [
        load_file(str(tmp_path / run / "adapter" / "adapter_model.safetensors"))
        for run in ("one", "two")
    ]
    for want, got in (merged, adapter):
        assert set(got) == set(want)
        for key, tensor in want.items():
            torch.testing.assert_close(got[key], tensor, rtol=0, atol=1e-5, msg=key)


def test_sft_stage_asks_for_ray_only_with_a_ray_block():
    from kiln.training.post.stages import SFTStage

    fields = {"seq_len": 32, "global_batch_size": 4, "micro_batch_size": 2, "steps": 1}
    assert SFTStage(fields).needs().ray is False
    on_ray = SFTStage({**fields, "parallel": {"dp_shard": 2}, "ray": {"cpus_per_worker": 0.5}})
    assert on_ray.needs().ray is True and on_ray.config.ray.cpus_per_worker == 0.5
