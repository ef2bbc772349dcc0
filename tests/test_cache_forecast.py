"""The step cache's forecast and adaptive schedule (issue 23): the linear forecast is exact on trajectories linear in
the sampler's time, whatever their spacing; the adaptive schedule keeps the guard rails for any threshold, runs every
step in full at threshold 0, and refreshes where the input bends; cached steps get exactly the forecast features; the
steps of each pass are counted; bad values are named."""

from __future__ import annotations

import pytest
import torch
from models import make_unet, photo_latents, step_call

import tome_core
from tome_core.caching.forecast import Forecast
from tome_core.caching.schedule import Schedule, may_cache

KARRAS_LIKE = (999.0, 962.0, 876.0, 640.0, 474.0, 197.0, 35.0, 2.0)
"""Uneven timesteps, as DPM++ 2M Karras runs them."""


def _feature(t: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 8, 4, 4, generator=gen), torch.randn(2, 8, 4, 4, generator=gen)


@pytest.mark.parametrize("as_tensor", [True, False])
def test_the_linear_forecast_of_a_trajectory_linear_in_time_is_exact_at_any_spacing(as_tensor):
    a, b = _feature(0)
    track = Forecast("linear")
    time = (lambda t: torch.tensor(t)) if as_tensor else float
    for i, t in enumerate(KARRAS_LIKE[:-1]):
        if i >= 2:  # two full steps known: every later time is forecast exactly
            for ahead in KARRAS_LIKE[i:]:
                assert torch.allclose(track.predict(time(ahead)), a + b * (ahead / 1000), atol=1e-5), (i, ahead)
        track.add(time(t), a + b * (t / 1000))


def test_the_forecast_of_a_constant_is_the_constant_and_off_is_the_last_full_step_itself():
    a, _ = _feature(1)
    linear, off = Forecast("linear"), Forecast("off")
    for t in KARRAS_LIKE[:3]:
        linear.add(torch.tensor(t), a.clone())
        off.add(torch.tensor(t), a.clone())
    assert torch.equal(linear.predict(torch.tensor(100.0)), a)
    assert off.predict(torch.tensor(100.0)) is off.deep  # DeepCache: the features themselves, no arithmetic
    assert off.change is None and off.nbytes() == a.numel() * 4 and linear.nbytes() == 2 * a.numel() * 4


def test_one_full_step_or_no_time_or_no_elapsed_time_gives_the_last_features():
    a, b = _feature(2)
    track = Forecast("linear")
    assert track.predict(torch.tensor(5.0)) is None
    track.add(torch.tensor(900.0), a)
    assert track.predict(torch.tensor(800.0)) is a  # one full step: nothing to extrapolate from
    track.add(torch.tensor(900.0), b)  # the same time again (a repeated call): no slope, no division by zero
    assert torch.equal(track.predict(torch.tensor(800.0)), b)
    track.add(torch.tensor(800.0), a)
    assert track.predict(None) is a


def test_a_forecast_needs_features_of_one_shape():
    a, _ = _feature(3)
    track = Forecast("linear")
    track.add(1.0, a)
    track.add(0.5, a[:1])  # the batch changed: start again from these features
    assert track.change is None and track.predict(0.25) is track.deep


@pytest.mark.parametrize("threshold", [0.0, 0.005, 0.05, 0.3, 1.0])
@pytest.mark.parametrize("interval, start, end", [(3, 0.0, 1.0), (5, 0.2, 0.8), (10, 0.0, 1.0)])
def test_the_adaptive_schedule_keeps_the_guard_rails_for_any_threshold(threshold, interval, start, end):
    settings = tome_core.ToMeSettings(
        cache=True,
        cache_interval=interval,
        cache_start=start,
        cache_end=end,
        cache_schedule="adaptive",
        cache_threshold=threshold,
    )
    steps = 20
    gen = torch.Generator().manual_seed(int(threshold * 1000) + interval)
    x = torch.randn(1, 4, 16, 16, generator=gen)
    refresh, last_full, cached = Schedule(settings.resolved("calibrated", "time")), 0, []
    for i in range(steps):
        x = x * 0.9 + 0.1 * torch.randn(x.shape, generator=gen)  # a wandering trajectory
        call = step_call(i, steps, torch.tensor(999.0 - 50 * i))
        ok = refresh.may_cache(call, i - last_full, x)
        assert not ok or may_cache(settings, i, i / steps, i == steps - 1, i - last_full)
        if not ok:
            refresh.full(call, x)
            last_full = i
        cached.append(ok)
    assert not cached[0] and not cached[-1]
    runs = "".join("c" if c else "f" for c in cached)
    assert "c" * interval not in runs  # never cache_interval steps without a full one
    assert all(not c for i, c in enumerate(cached) if not start <= i / steps < end)
    if threshold == 0.0:
        assert not any(cached)


def _adaptive_plan(threshold: float, bend: bool) -> str:
    settings = tome_core.ToMeSettings(
        cache=True, cache_interval=8, cache_schedule="adaptive", cache_threshold=threshold
    )
    a, b = _feature(4)
    refresh, last_full, out = Schedule(settings.resolved("calibrated", "time")), 0, ""
    for i in range(16):
        t = 999.0 - 60 * i
        x = a + b * (t / 1000) + (torch.sin(torch.tensor(i / 2.0)) * a if bend else 0)  # straight, or bending
        call = step_call(i, 16, torch.tensor(t))
        if refresh.may_cache(call, i - last_full, x):
            out += "c"
        else:
            refresh.full(call, x)
            last_full, out = i, out + "f"
    return out


def test_the_adaptive_schedule_caches_a_straight_trajectory_to_the_interval_and_refreshes_a_bending_one_sooner():
    straight, bending = _adaptive_plan(0.02, bend=False), _adaptive_plan(0.02, bend=True)
    # step 1: one full step known, the input moved from it; then the forecast is exact: only the rails make steps full
    assert straight == "ffcccccccfcccccf"
    assert bending.count("f") > straight.count("f") + 2


# --- on the real UNet -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def unet():
    return make_unet("sd15")


def _steps(unet, patch, steps=7, hook=None):
    """``steps`` calls as a sampler makes them, on inputs fixed in advance (they do not depend on the outputs)."""
    x = photo_latents(2, 16, 16, 0)
    ctx = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(0))
    outs = []
    with torch.no_grad():
        for i in range(steps):
            if patch is not None:
                patch.set_progress(i / steps, steps)
            t = torch.full((2,), 999.0 * (1 - i / steps))
            outs.append(unet(x * (1 - 0.05 * i), t, ctx))
    return outs


def test_a_cached_step_gets_exactly_the_linear_forecast_of_the_deep_features(unet):
    entry = unet.output_blocks[-1][0]  # branch 0: the first layer of the block the deep features enter
    seen: list[torch.Tensor] = []
    handle = entry.register_forward_pre_hook(lambda m, args: seen.append(args[0][:, :32].clone()))
    try:
        tome_core.remove_patch(unet)
        _steps(unet, None)
    finally:
        handle.remove()
    times = [999.0 * (1 - i / 7) for i in range(7)]
    # interval 3: full at 0, 3, 6; steps 4 and 5 forecast from steps 0 and 3
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3, cache_forecast="linear")
    got: list[torch.Tensor] = []
    handle = entry.register_forward_pre_hook(lambda m, args: got.append(args[0][:, :32].clone()))
    try:
        outs = _steps(unet, patch)
        stats = tome_core.cache_stats(unet)
    finally:
        handle.remove()
        tome_core.remove_patch(unet)
    for i in (4, 5):
        slope = (seen[3] - seen[0]) / (torch.tensor(times[3]) - torch.tensor(times[0]))
        expected = seen[3] + slope * (torch.tensor(times[i]) - torch.tensor(times[3]))
        assert torch.allclose(got[i], expected, atol=1e-6), i
    for i in (1, 2):  # one full step known: DeepCache's reuse
        assert torch.equal(got[i], seen[0])
    assert len(outs) == 7 and stats == [{"full": 3, "cached": 4, "skipped": 0}]


def test_adaptive_at_threshold_0_is_plain_bit_for_bit_and_counts_every_step_full(unet):
    tome_core.remove_patch(unet)
    base = _steps(unet, None)
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_schedule="adaptive", cache_threshold=0.0)
    try:
        outs = _steps(unet, patch)
        stats = tome_core.cache_stats(unet)
    finally:
        tome_core.remove_patch(unet)
    assert all(torch.equal(a, b) for a, b in zip(outs, base))
    assert stats == [{"full": 7, "cached": 0, "skipped": 0}]


def test_each_pass_is_counted_on_its_own(unet):
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=2)
    try:
        _steps(unet, patch, steps=5)
        _steps(unet, patch, steps=4)  # progress starts again at 0: a new pass (hires fix, img2img)
        stats = tome_core.cache_stats(unet)
    finally:
        tome_core.remove_patch(unet)
    assert stats == [{"full": 3, "cached": 2, "skipped": 0}, {"full": 3, "cached": 1, "skipped": 0}]
    assert tome_core.cache_stats(unet) == []  # no patch: nothing to say


@pytest.mark.parametrize(
    "values, field, fragment",
    [
        ({"cache_forecast": "quadratic"}, "cache_forecast", "one of 'off', 'linear'"),
        ({"cache_schedule": "sometimes"}, "cache_schedule", "one of 'uniform', 'adaptive'"),
        ({"cache_threshold": 1.5}, "cache_threshold", "from 0 to 1"),
        ({"cache_threshold": -0.1}, "cache_threshold", "from 0 to 1"),
        ({"cache_threshold": "often"}, "cache_threshold", "a number"),
    ],
)
def test_bad_forecast_or_schedule_values_are_named_and_patch_nothing(unet, values, field, fragment):
    tome_core.remove_patch(unet)
    with pytest.raises(tome_core.SettingsError) as error:
        tome_core.apply_patch(unet, ratio=0.0, cache=True, **values)
    assert error.value.name == field and fragment in str(error.value) and repr(values[field]) in str(error.value)
    assert tome_core.get_patch(unet) is None
    assert all("forward" not in m.__dict__ for m in unet.modules()) and not unet._forward_pre_hooks
