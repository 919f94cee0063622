"""`kiln serve` slows Ray Serve's controller loop (its largest idle cost) through the environment
an embedded Ray inherits, unless the user chose a value."""

from __future__ import annotations

import os

from kiln.serving.ray_idle import IDLE_ENV, quiet_idle_ray

NAME = "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"


def test_the_controller_loop_slows_to_once_a_second(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    quiet_idle_ray()
    assert float(os.environ[NAME]) == 1.0 and NAME in IDLE_ENV


def test_a_value_the_user_set_wins(monkeypatch):
    monkeypatch.setenv(NAME, "0.05")
    quiet_idle_ray()
    assert os.environ[NAME] == "0.05"
