"""`kiln serve` slows Ray Serve's controller loop (its largest idle cost), its metrics export and
its proxy's second event loop through the environment an embedded Ray inherits, unless the user
chose a value."""

from __future__ import annotations

import os
from pathlib import Path

from kiln.serving.ray_idle import IDLE_ENV, quiet_idle_ray

NAME = "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"
EXPECTED = {
    NAME: 1.0,
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": 1000,
    "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": 0,
}


def test_the_controller_loop_slows_to_once_a_second(monkeypatch):
    for name in EXPECTED:
        monkeypatch.delenv(name, raising=False)
    quiet_idle_ray()
    assert {name: float(os.environ[name]) for name in EXPECTED} == EXPECTED
    assert set(IDLE_ENV) == set(EXPECTED)


def test_the_values_reach_ray_serve():
    """Ray Serve reads them where we think it does (a renamed variable would do nothing)."""
    import ray.serve._private.constants as serve_constants

    source = Path(serve_constants.__file__).read_text(encoding="utf-8")
    assert all(f'"{name}"' in source for name in EXPECTED)


def test_a_value_the_user_set_wins(monkeypatch):
    monkeypatch.setenv(NAME, "0.05")
    quiet_idle_ray()
    assert os.environ[NAME] == "0.05"
