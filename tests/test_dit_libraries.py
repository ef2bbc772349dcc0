"""The real libraries as anchors (``benchmarks.lab.libraries``, ``benchmarks.quality.dit_libraries``; issue 36):
cache-dit and diffusers run through their own APIs on the FLUX-layout model, what each call executed is recorded by
hooks and priced at FLUX.1's width, the model comes back bit for bit, and the command finds each library's frontier."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from benchmarks.lab import dit
from benchmarks.lab import libraries as L
from benchmarks.lab.subjects import SUBJECTS
from benchmarks.lab.trained import data, flux
from benchmarks.quality import dit_libraries
from benchmarks.speed import dit_costs

STEPS = 8


@pytest.fixture(scope="module")
def costs() -> dit.BlockCosts:
    seconds = {k: [1.0] for k in dit_costs.KINDS} | {"double": [2.0], "signal": [0.1], "calibrated": [0.5]}
    return dit.BlockCosts(asdict(dit.REAL), seconds)


def _model():
    return flux.build(len(data.CLASSES), seed=1).eval().requires_grad_(False)


def _pass(model, setting: L.Setting | None, executed: L.Executed) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    noise, labels = torch.randn(1, flux.CHANNELS, flux.SIZE, flux.SIZE, generator=gen), torch.tensor([3])
    executed.clear()
    if setting is None:
        return dit.guided_euler(model, noise, labels, STEPS)
    with setting.applied(model.transformer, STEPS):
        return dit.guided_euler(model, noise, labels, STEPS)


def test_cache_dit_given_our_schedule_computes_exactly_its_full_steps_and_the_probe_between(costs):
    model = _model()
    executed = L.Executed(model.transformer)
    plain = _pass(model, None, executed)
    assert [len(ran) for ran in executed.ran] == [9] * STEPS and L.priced(executed, costs, L.Overhead()) == 1.0
    mask = L.uniform_mask(3, STEPS)
    assert mask == (1, 0, 0, 1, 0, 0, 1, 1)  # ours at N=3: 0, 3, 6 and the last
    setting = L.Setting("cache-dit", "dbcache", (("Fn", 1), ("Bn", 0), ("mask", mask), ("policy", "static")))
    cached = _pass(model, setting, executed)
    assert [sorted(ran) for ran in executed.ran] == [list(range(9)) if m else [0] for m in mask]
    assert not torch.equal(cached, plain)
    full = costs.full_step()
    expected = STEPS * full / (4 * full + 4 * (costs.cost("outside") + costs.cost("double")))  # a mask: no signal
    assert L.priced(executed, costs, setting.overhead) == pytest.approx(expected)
    assert torch.equal(_pass(model, None, executed), plain)  # cache-dit removed: plain's samples, bit for bit


def test_diffusers_taylorseer_skips_attention_alone_and_is_priced_by_attentions_share(costs):
    model = _model()
    executed = L.Executed(model.transformer)
    plain = _pass(model, None, executed)
    params = (("cache_interval", 3), ("disable_cache_before_step", 2), ("max_order", 1), ("use_lite_mode", False))
    setting = L.Setting("diffusers", "taylorseer", params)
    _pass(model, setting, executed)
    predicted = [i for i, attended in enumerate(executed.attended) if not attended]
    assert predicted and all(len(executed.ran[i]) == 9 for i in predicted)  # every block ran, its attention did not
    share_double, share_single = costs.attention_shares()
    assert share_double == pytest.approx(7 / 15) and share_single == pytest.approx(2 / 5)  # d = 3072, N = 4608
    c = costs.blocks
    full = costs.full_step()
    predicted_step = costs.cost("outside") + c.double * 2.0 * (1 - share_double) + c.single * 1.0 * (1 - share_single)
    predicted_step += (c.double + c.single) * costs.cost("calibrated")  # a forecast per skipped attention
    computed = (STEPS - len(predicted)) * (full + costs.cost("calibration"))
    expected = STEPS * full / (computed + len(predicted) * predicted_step)
    assert L.priced(executed, costs, setting.overhead) == pytest.approx(expected)
    assert torch.equal(_pass(model, None, executed), plain)


def test_a_first_block_cache_call_that_skips_prices_the_first_block_and_the_signal(costs):
    model = _model()
    executed = L.Executed(model.transformer)
    setting = L.Setting("diffusers", "fbcache", (("threshold", 10.0),))  # skips whenever it may
    _pass(model, setting, executed)
    assert [len(ran) for ran in executed.ran] == [9] + [1] * (STEPS - 1)
    full, skip = costs.full_step(), costs.cost("outside") + costs.cost("double") + costs.cost("signal")
    assert L.priced(executed, costs, setting.overhead) == pytest.approx(STEPS * full / (full + (STEPS - 1) * skip))


def test_the_sweep_covers_each_librarys_menu():
    names = [s.name for s in L.settings(20)]
    assert len(names) == len(set(names)) > 300
    assert "diffusers fbcache threshold=0.12" in names
    assert "diffusers taylorseer cache_interval=5 disable_cache_before_step=3 max_order=1 use_lite_mode=True" in names
    assert any(n.startswith("cache-dit dbcache Fn=1 Bn=0 mask=10010010010010010011") for n in names)  # ours, N=3
    assert any("calibrator=foca" in n for n in names) and any("order=2" in n for n in names)
    assert any(n.startswith("cache-dit dbcache Fn=1 Bn=0 mask=10000000100000001001") for n in names)  # ours, N=8
    assert "diffusers pab spatial_attention_block_skip_range=4 spatial_attention_timestep_skip_range=-1,1001" in names


def test_the_frontier_keeps_what_nothing_beats():
    points = [
        {"speed": 1.0, "psnr": 50.0},
        {"speed": 2.0, "psnr": 40.0},
        {"speed": 1.5, "psnr": 39.0},
        {"speed": 2.0, "psnr": 40.0},
        {"speed": 3.0, "psnr": 30.0},
    ]
    assert L.frontier(points) == [points[0], points[1], points[4]]


def test_a_quick_run_sweeps_runs_each_frontier_and_ours_and_renders(costs):
    settings = [
        s
        for s in L.settings(4)
        if s.name
        in {
            "diffusers fbcache threshold=0.4",
            "cache-dit dbcache Fn=1 Bn=0 mask=1001 policy=static calibrator=none",
        }
    ]
    results = dit_libraries.run(SUBJECTS["flux"], 2, 2, 4, _model, settings, costs, lambda _: None)
    assert len(results["magcache_ratios"]) == 4 and len(results["sweep"]) == 2
    final = results["final"]
    assert {r["library"] for r in final.values()} == {"cache-dit", "diffusers", "ours"}
    assert all(len(r["psnr_per_seed"]) == 2 for r in final.values())
    text = dit_libraries.section(
        results,
        {"seeds": 2, "sweep_seeds": 2, "steps": 4, "seconds": 1.0, "versions": {"cache-dit": "x", "diffusers": "y"}},
    )
    assert text.startswith("<!-- dit-libraries:begin -->") and "| ≥ 2× |" in text and "ours: `ours-N3`" in text


def test_a_stopped_run_continues_from_its_progress_file_and_refuses_another_runs(costs, tmp_path, monkeypatch):
    from benchmarks.lab.results import Progress

    settings = [s for s in L.settings(4) if s.name == "diffusers fbcache threshold=0.4"]
    path, identity = tmp_path / "progress.json", {"model": "flux", "seeds": 2}
    first = dit_libraries.run(
        SUBJECTS["flux"], 2, 2, 4, _model, settings, costs, lambda _: None, Progress(path, identity)
    )
    kept = Progress(path, identity)
    assert set(kept.rows) == {f"sweep/{settings[0].name}", f"final/{settings[0].name}"} and kept.seconds() > 0

    def never(*args, **kwargs):
        raise AssertionError("a kept run was run again")

    monkeypatch.setattr(L, "run_setting", never)
    again = dit_libraries.run(SUBJECTS["flux"], 2, 2, 4, _model, settings, costs, lambda _: None, kept)
    assert again == first  # the libraries' runs from the file, ours measured anew to the same bits
    with pytest.raises(ValueError, match=r"progress\.json: written for"):
        Progress(path, {**identity, "seeds": 64})


def test_ours_again_keeps_the_libraries_runs_and_measures_ours_anew(costs):
    library_run = {"library": "diffusers", "name": "x", "psnr_per_seed": [30.0, 31.0], "psnr": 30.5, "speed": 2.5}
    stale = {"library": "ours", "name": "ours-N9", "psnr_per_seed": [1.0, 1.0], "psnr": 1.0, "speed": 9.0}
    saved = ({"magcache_ratios": [1.0], "sweep": [], "final": {"x": library_run, "ours-N9": stale}}, {"seeds": 2})
    results, meta = dit_libraries.ours_again(SUBJECTS["flux"], 2, 4, _model(), costs, saved, lambda _: None)
    assert results["final"]["x"] == library_run and "ours-N9" not in results["final"] and meta == {"seeds": 2}
    assert [k for k in results["final"] if k != "x"] == [m.name for m in dit_libraries.OURS]


def test_pyramid_attention_broadcast_reuses_attention_in_its_timestep_range_and_is_priced_by_its_share(costs):
    model = _model()
    executed = L.Executed(model.transformer)
    plain = _pass(model, None, executed)
    params = (("spatial_attention_block_skip_range", 2), ("spatial_attention_timestep_skip_range", (100, 800)))
    setting = L.Setting("diffusers", "pab", params)
    cached = _pass(model, setting, executed)
    assert (
        setting.name
        == "diffusers pab spatial_attention_block_skip_range=2 spatial_attention_timestep_skip_range=100,800"
    )
    sigmas = flux.sigmas(STEPS, (flux.SIZE // flux.PATCH) ** 2)[:-1]
    # every other call in (100, 800) on diffusers' 0–1000 scale reuses every block's attention; the blocks all run
    reused = [i for i, attended in enumerate(executed.attended) if not attended]
    inside = [i for i, s in enumerate(sigmas) if 100 < 1000 * s < 800]
    assert reused and set(reused) <= set(inside) and all(i - 1 not in reused for i in reused)
    assert all(len(ran) == 9 for ran in executed.ran) and not torch.equal(cached, plain)
    share_double, share_single = costs.attention_shares()
    c, full = costs.blocks, costs.full_step()
    reusing = costs.cost("outside") + c.double * 2.0 * (1 - share_double) + c.single * 1.0 * (1 - share_single)
    expected = STEPS * full / ((STEPS - len(reused)) * full + len(reused) * reusing)  # nothing forecast, no signal
    assert L.priced(executed, costs, setting.overhead) == pytest.approx(expected)
    assert torch.equal(_pass(model, None, executed), plain)
