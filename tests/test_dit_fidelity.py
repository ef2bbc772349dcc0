"""The DiT fidelity benchmark (``benchmarks.quality.dit_fidelity``, issue 26) runs our cache's modes on the
FLUX-layout model and prices their steps with the real-width costs."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from benchmarks.lab import dit
from benchmarks.lab.trained import data, flux
from benchmarks.quality import dit_fidelity
from benchmarks.speed import dit_costs


def test_a_quick_run_reports_every_mode_against_plain_and_renders():
    model = flux.build(len(data.CLASSES), seed=1).eval()
    results = dit_fidelity.run(2, 4, model, lambda _: None)
    ours, anchors = [m.name for m in dit_fidelity.MODES], [a.name for a in dit_fidelity.ANCHORS]
    assert list(results) == ["plain", *ours, "teacache-polynomial", "magcache-ratios", *anchors]
    assert len(results["teacache-polynomial"]) == 5  # fitted to this model: degree 4
    assert len(results["magcache-ratios"]) == 4 and results["magcache-ratios"][0] == 1.0  # one per step
    assert all(sum(results[a]["counts"].values()) == 4 for a in anchors)  # every step of each image, by kind
    counts = results["off-uniform-3"]["counts"]
    assert counts == {"full": 2, "cached": 2, "skipped": 0}  # steps 0 and 3 (the last) of 4
    assert results["off-uniform-3"]["psnr"][0] < 100  # cached steps changed the samples (identical counts as 100)
    text = dit_fidelity.section(results, {"seeds": 2, "steps": 4, "seconds": 1.0})
    assert text.startswith(dit_fidelity.BEGIN) and text.endswith(dit_fidelity.END)
    assert "| ours: calibrated, time, N=5 |" in text and "| First Block Cache 0.07 |" in text
    assert "| TaylorSeer order 1, interval 6, 3 first steps |" in text and "MagCache's magnitude ratios" in text
    assert "| ours: FoCa's predictor-corrector, uniform, N=3, 3 first steps full |" in text
    assert results["trapezoid-uniform-3-start"]["counts"]["full"] == 4  # 4 steps: the first three and the last


def test_a_pass_is_priced_with_the_real_width_costs(monkeypatch):
    seconds = {k: [1.0] for k in dit_costs.KINDS} | {"double": [2.0], "calibrated": [0.5], "calibration": [0.25]}
    costs = dit.BlockCosts(asdict(dit.REAL), seconds)
    monkeypatch.setattr(dit, "load_run_data", lambda name: ([vars(costs)], {}))
    full = 1.0 + 19 * 2.0 + 38 * 1.0
    expected = 20 * full / (8 * (full + 0.25) + 12 * (1.0 + 2.0 + 0.5))
    assert dit.priced({"full": 8, "cached": 12}) == pytest.approx(expected)


def test_the_frontier_plot_draws_every_family_the_runs_measured():
    from benchmarks.quality import dit_frontier

    points = dit_frontier.points()
    assert {family for family, *_ in points} <= set(dit_frontier.FAMILIES)  # none left out of the legend
    ours = {label for family, label, *_ in points if family == "ours"}
    assert ours == {"N=2", "N=3", "N=4", "N=5"}  # auto's rows only: the start and study rows are "ours-other"


def test_on_the_wan_model_the_run_is_ours_alone_and_renders_its_own_section():
    from benchmarks.lab.subjects import SUBJECTS

    wan = SUBJECTS["wan"]
    results = dit_fidelity.run(2, 6, wan.random(), lambda _: None, wan)
    assert list(results) == ["plain", *(m.name for m in dit_fidelity.MODES)]  # the anchors hook FLUX's blocks
    counts = results["linear-uniform-2"]["counts"]
    assert counts["cached"] > 0 and results["linear-uniform-2"]["psnr"][0] < 100  # cached steps on a clip
    text = dit_fidelity.section(results, {"seeds": 2, "steps": 6, "seconds": 1.0, "model": "wan"})
    assert text.startswith("<!-- dit-fidelity-wan:begin -->") and text.endswith("<!-- dit-fidelity-wan:end -->")
    assert "Wan 2.1's schedule (shift 3)" in text and "`benchmarks.speed.wan_costs`" in text
    assert f"{wan.priced(counts):.2f}×" in text  # priced at Wan 2.1's width, not FLUX.1's
