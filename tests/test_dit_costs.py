"""FLUX.1's real-width block costs (``benchmarks.speed.dit_costs``, issue 26): what it measures and what it derives."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from benchmarks.lab import dit
from benchmarks.speed import dit_costs as D


def test_a_quick_run_times_every_kind_and_the_whole_model_and_renders():
    costs = D.measure(dit.QUICK, 1, lambda _: None, whole=True)
    assert set(costs.seconds) == set(D.KINDS) and all(len(v) == 1 and v[0] > 0 for v in costs.seconds.values())
    assert len(costs.whole) == 1
    meta = {"torch": "x", "threads": 1, "rounds": 1, "finished": "now", "seconds": 1.0}
    text = D.section([costs], meta)
    assert text.startswith(D.BEGIN) and text.endswith(D.END) and "| tiny |" in text and "N=5" in text


def test_the_speed_up_prices_full_and_cached_steps_of_the_uniform_schedule():
    seconds = {"double": [2.0], "single": [1.0], "outside": [0.5], "forecast": [0.01], "calibrated": [0.02]}
    costs = dit.BlockCosts(asdict(dit.REAL), seconds | {"calibration": [0.03], "signal": [0.001]})
    full = 0.5 + 19 * 2.0 + 38 * 1.0
    assert costs.full_step() == pytest.approx(full)
    assert costs.cached_step() == pytest.approx(0.5 + 2.0 + 0.02)  # the outside, the probe block, the forecast
    # N=3 over 20 steps: full at 0, 3, …, 18 and the last (8), cached the other 12
    expected = 20 * full / (8 * (full + 0.03) + 12 * (0.5 + 2.0 + 0.02))
    assert costs.speedup(3) == pytest.approx(expected)
