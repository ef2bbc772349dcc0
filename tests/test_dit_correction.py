"""Deferred correction of a cached pass (``benchmarks.lab.correction``, ``benchmarks.quality.dit_correction``; issue
36): the interpolation, that the correction moves ``x`` exactly as re-running the cached step with the interpolated
residual would have (FLUX and Wan layouts), that without gain it is the cache's pass bit for bit, and the section."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

import benchmarks.lab.forecasters as forecasters
import tome_core
from benchmarks.lab import dit
from benchmarks.lab.correction import DeferredCorrection, interpolate
from benchmarks.lab.subjects import SUBJECTS
from benchmarks.lab.trained.metrics import psnr_ssim
from benchmarks.quality import dit_correction
from tome_core.caching.forecast import Forecast


def test_interpolation_is_exact_on_a_line_and_on_a_parabola():
    r = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))

    def at(s: float) -> torch.Tensor:  # a parabola in the sampler's time
        return r[0] + s * r[1] + s * s * r[2]

    fulls = [(s, at(s)) for s in (1.0, 0.8, 0.5)]
    torch.testing.assert_close(interpolate(fulls, 0.6, 2), at(0.6))
    line = [(0.8, r[0] + 0.8 * r[1]), (0.5, r[0] + 0.5 * r[1])]
    torch.testing.assert_close(interpolate(line, 0.7, 2), r[0] + 0.7 * r[1])  # two known: the line
    assert not torch.allclose(interpolate(fulls, 0.6, 1), at(0.6))  # the line misses the bend


class _Recorded(Forecast):
    """The cache's forecast, keeping every full step's residual (the reference below needs them)."""

    residuals: ClassVar[list[torch.Tensor]] = []

    def add(self, time, deep, probe=None):
        _Recorded.residuals.append(deep.clone())
        super().add(time, deep, probe)


def _inputs_seen(model) -> tuple[list[torch.Tensor], object]:
    seen: list[torch.Tensor] = []
    hook = model.register_forward_pre_hook(lambda m, args: seen.append(args[0][: len(args[0]) // 2].clone()))
    return seen, hook


@pytest.mark.parametrize("name", ["flux", "wan"])
def test_the_correction_moves_x_as_the_cached_step_rerun_with_the_interpolated_residual_would(name):
    """N=2 over 4 steps: full at 0, 2 and 3, cached at 1. At step 2 the correction re-estimates step 1's residual on
    the line through steps 0 and 2; so ``x`` entering step 3 differs from the uncorrected pass's by exactly
    ``(σ2 − σ1)`` times the change in step 1's guided output when step 1 runs again with that residual."""
    subject = SUBJECTS[name]
    model = subject.random()
    noise, labels = subject.noise(range(2)), subject.labels(range(2))
    mode = dit.Mode("n2", "linear", "uniform", 2)
    sigmas = model.schedule(4, noise)

    _Recorded.residuals = []
    seen, hook = _inputs_seen(model)
    with forecasters.swapped(_Recorded):
        plain_cached, counts = dit.sample(model, noise, labels, 4, mode, short_passes=True)
    hook.remove()
    assert counts == {"full": 3, "cached": 1, "skipped": 0}
    x1, x3, (r0, r2) = seen[1], seen[3], _Recorded.residuals[:2]
    seen, hook = _inputs_seen(model)
    corrected, _ = dit.sample(
        model, noise, labels, 4, mode, short_passes=True, correction=DeferredCorrection(order=2, gain=1.0)
    )
    hook.remove()
    assert not model._forward_pre_hooks and not model.transformer.proj_out._forward_hooks  # all removed
    assert torch.equal(seen[1], x1)  # the same pass up to the correction

    # the reference: step 1 once more, the cache handing it the interpolated residual instead of its forecast
    interpolated = r0 + (sigmas[1] - sigmas[0]) / (sigmas[2] - sigmas[0]) * (r2 - r0)

    class Given(Forecast):
        def predict(self, time, probe=None):
            return interpolated if self.deep is not None else None

    def guided(x: torch.Tensor, sigma: float) -> torch.Tensor:
        empty = torch.full_like(labels, -1)
        with torch.no_grad():
            both = model(torch.cat([x, x]), torch.tensor(sigma).expand(2 * len(x)), torch.cat([labels, empty]))
        cond, uncond = both.chunk(2)
        return uncond + dit.CFG * (cond - uncond)

    def cached_step_one(forecast: type[Forecast] | None) -> torch.Tensor:
        """Steps 0 (full) and 1 (cached) of the pass again, the cache's forecast ``forecast`` (None: its own)."""
        patch = tome_core.apply_settings(model.transformer, mode.settings())
        patch.cache.short_passes = True
        try:
            with forecasters.swapped(forecast):
                patch.set_progress(0.0, 4)
                guided(seen[0], sigmas[0])
                patch.set_progress(0.25, 4)
                out = guided(x1, sigmas[1])
                assert patch.cache.cached_now
        finally:
            tome_core.remove_patch(model.transformer)
        return out

    rerun, forecast = cached_step_one(Given), cached_step_one(None)
    expected = x3 + (sigmas[2] - sigmas[1]) * (rerun - forecast)
    torch.testing.assert_close(seen[3], expected, rtol=1e-4, atol=1e-5)
    assert (seen[3] - x3).abs().max() > 1e-4  # and it did move x
    assert not torch.equal(corrected, plain_cached)


def test_without_gain_the_pass_is_the_caches_and_the_trained_model_gains_from_it():
    subject = SUBJECTS["flux"]
    model = subject.load()
    noise, labels = subject.noise(range(4)), subject.labels(range(4))
    mode = dit.Mode("n3", "linear", "uniform", 3)
    plain, _ = dit.sample(model, noise, labels, 12)
    ours, _ = dit.sample(model, noise, labels, 12, mode)
    same, _ = dit.sample(model, noise, labels, 12, mode, correction=DeferredCorrection(gain=0.0))
    assert torch.equal(same, ours)
    corrected, _ = dit.sample(model, noise, labels, 12, mode, correction=DeferredCorrection(order=2, gain=0.5))
    assert psnr_ssim(corrected, plain)[0].mean() > psnr_ssim(ours, plain)[0].mean()


def test_the_run_and_its_section():
    subject = SUBJECTS["wan"]
    runs = dit_correction.run(2, 6, subject.random(), lambda _: None, subject, (2,))
    assert list(runs) == ["N2"] and runs["N2"]["counts"]["cached"] == 2
    assert set(dit_correction.VARIANTS) <= set(runs["N2"])
    text = dit_correction.section(
        {"runs": runs, "libraries": []}, {"seeds": 2, "steps": 6, "seconds": 6.0, "model": "wan"}
    )
    assert text.startswith("<!-- dit-correction-wan:begin -->") and "dit_correction --model wan" in text
    assert "| 2 | 4 / 2 |" in text and "best library" not in text


def test_against_the_libraries_the_default_and_the_best_gain_each_meet_the_best_library(monkeypatch):
    """At each speed: the default gain (0.75) at its best interval that fast, the best variant, and the best library
    run there, each difference paired by seed."""
    runs = {
        f"N{n}": {"interval": n, "speed": speed, "counts": {"full": 1, "cached": 1}, "ours": [0.0, 0.0]}
        | {name: [base + k, base + k + 2] for k, name in enumerate(reversed(dit_correction.VARIANTS))}
        for n, speed, base in ((2, 1.8, 50.0), (3, 2.4, 40.0), (4, 3.1, 30.0))
    }
    final = {
        "slow": {"library": "cache-dit", "name": "slow", "psnr_per_seed": [60.0, 60.0], "psnr": 60.0, "speed": 1.9},
        "fast": {"library": "diffusers", "name": "fast", "psnr_per_seed": [30.0, 31.0], "psnr": 30.5, "speed": 2.5},
    }
    monkeypatch.setattr(dit_correction, "load_run_data", lambda name: ({"final": final}, {"seeds": 2}))
    rows = dit_correction.against_libraries(runs, SUBJECTS["flux"], 2)
    assert [row["target"] for row in rows] == [2.0]  # nothing of either at 3x
    (row,) = rows
    assert row["library"]["name"] == "fast"  # the slow one is under 2x
    # N=2 is under 2x; at N=3 the variants keep 40 + k (k = 0 for order 1, 1 for gain 0.5, 2 for 0.75, 3 for gain 1)
    assert row["default"]["name"] == "N=3, order 2, gain 0.75" and row["default"]["psnr_per_seed"] == [42.0, 44.0]
    assert row["ours"]["name"] == "N=3, order 2, gain 1"
    assert row["default"]["ahead"][0] == pytest.approx(12.5) and row["ours"]["ahead"][0] == pytest.approx(13.5)
    text = dit_correction.section(
        {"runs": runs, "libraries": rows}, {"seeds": 2, "steps": 6, "seconds": 6.0, "model": "flux"}
    )
    assert (
        "| 2× | 43.0 at 2.40× (N=3, order 2, gain 0.75) | +12.5 [" in text
        and "44.0 at 2.40× (N=3, order 2, gain 1)" in text
    )


@pytest.mark.parametrize("interval", [2, 3])
def test_the_caches_own_correction_is_this_studys_order_2(interval):
    """``cache_correction`` (the product's, :mod:`tome_core.caching.correction`) gives this study's order 2 on the
    FLUX layout, to float rounding: the study's figures are the setting's."""
    subject = SUBJECTS["flux"]
    model = subject.random()
    noise, labels = subject.noise(range(2)), subject.labels(range(2))
    mode = dit.Mode("n", "linear", "uniform", interval)
    ours, _ = dit.sample(model, noise, labels, 10, mode)
    study, _ = dit.sample(model, noise, labels, 10, mode, correction=DeferredCorrection(order=2, gain=0.5))
    setting, _ = dit.sample(model, noise, labels, 10, dit.Mode("n", "linear", "uniform", interval, correction=0.5))
    assert (study - ours).abs().max() > 1e-3
    torch.testing.assert_close(setting, study, rtol=0, atol=1e-5)
