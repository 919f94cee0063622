"""The train stage's config and `kiln train`'s config loading (no Ray launch)."""

from __future__ import annotations

import pytest

from kiln.platform.errors import ConfigError, InputError
from kiln.platform.registry import stage_class
from kiln.training.commands import load_config
from kiln.training.ray_train import RayOptions, world_size


def test_stage_is_registered_with_optional_tokens_and_model():
    cls = stage_class("train")
    assert cls.__name__ == "TrainStage"
    assert cls.input_kinds == {"tokens": "TokenDataset", "model": "Checkpoint"}
    assert {"tokens", "model"} <= set(cls.optional_inputs)
    assert cls.output_kinds == {"checkpoint": "Checkpoint"}
    stage = cls(
        {"steps": 3, "parallel": {"tp": 2}, "ray": {"max_failures": 2, "cpus_per_worker": 0.5}}
    )
    train_cfg = stage.config.train_config()
    assert train_cfg.steps == 3 and not hasattr(train_cfg, "ray")
    assert world_size(train_cfg, stage.config.ray) == 2


def test_cli_config_with_overrides(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("train:\n  model: tiny\n  steps: 5\n  checkpoint: {async: true}\n")
    cfg = load_config(
        str(f), ["parallel.tp=2", "ray.max_failures=3", "checkpoint.interval_steps=2"]
    )
    assert cfg.parallel.tp == 2 and cfg.ray.max_failures == 3
    assert cfg.checkpoint.async_save and cfg.checkpoint.interval_steps == 2
    with pytest.raises(ConfigError, match="stepz"):  # the --set that named it
        load_config(str(f), ["stepz=1"])
    with pytest.raises(InputError):
        load_config(str(tmp_path / "missing.yaml"), [])


def test_world_size_from_parallel_dims():
    cfg = load_config_dict({"parallel": {"pp": 2, "tp": 2, "dp_shard": 2}})
    assert world_size(cfg, RayOptions()) == 8
    with pytest.raises(ConfigError):
        world_size(cfg, RayOptions(num_workers=4))


def load_config_dict(body):
    from kiln.training.config import TrainConfig

    return TrainConfig.model_validate(body)
