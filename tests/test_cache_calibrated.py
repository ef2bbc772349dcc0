"""Issue 27: the calibrated forecast (its position on the deep features' line read off the live probe, per image,
within [0, 2]; linear without a probe) and the time schedule (full steps spread evenly in the sampler's time; the
uniform schedule at an even spacing; never more full steps than uniform's under Karras' spacing) on their own and in
a real UNet."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from models import make_unet, photo_latents, step_call

import tome_core
from benchmarks.lab import sampling as S
from tome_core.caching.forecast import PROBE_STRIDE, Forecast
from tome_core.caching.schedule import Schedule, uniform_plan


def _pair(seed: int, shape=(2, 8, 8, 8)) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def _calibrated(times=(900.0, 800.0)) -> tuple[Forecast, tuple[torch.Tensor, ...]]:
    d0, d1 = _pair(0)
    p0, p1 = _pair(1)
    track = Forecast("calibrated")
    track.add(torch.tensor(times[0]), d0, p0)
    track.add(torch.tensor(times[1]), d1, p1)
    return track, (d0, d1, p0, p1)


@pytest.mark.parametrize("a", [0.0, 0.25, 1.0, 1.7])
def test_the_calibrated_forecast_takes_the_probes_position_on_its_line_whatever_the_time(a):
    track, (d0, d1, p0, p1) = _calibrated()
    probe = p1 + a * (p1 - p0)
    for time in (700.0, 10.0, None):  # the time plays no part where the probe says where the step is
        assert torch.allclose(track.predict(time, probe), d1 + a * (d1 - d0), atol=1e-5)


def test_the_calibrated_position_is_per_image_and_kept_within_0_and_2():
    track, (d0, d1, p0, p1) = _calibrated()
    probe = p1 + torch.tensor([0.5, 5.0]).view(2, 1, 1, 1) * (p1 - p0)  # image 2 far past the line's reach
    got = track.predict(700.0, probe)
    assert torch.allclose(got[0], (d1 + 0.5 * (d1 - d0))[0], atol=1e-5)
    assert torch.allclose(got[1], (d1 + 2.0 * (d1 - d0))[1], atol=1e-5)
    backwards = p1 - 0.3 * (p1 - p0)
    assert torch.allclose(track.predict(700.0, backwards), d1)  # no negative position: DeepCache's reuse


def test_a_probe_moving_off_its_line_makes_the_calibrated_forecast_deepcaches_reuse():
    track, (d0, d1, p0, p1) = _calibrated()
    line = (p1 - p0)[0].flatten()
    off = torch.randn(line.shape, generator=torch.Generator().manual_seed(5))
    off = off - (off @ line) / (line @ line) * line  # orthogonal to the line, as fresh noise nearly is
    probe = p1.clone()
    probe[0] = probe[0] + off.view_as(probe[0])
    probe[1] = probe[1] + 0.5 * (p1 - p0)[1]
    sub = slice(None, None, PROBE_STRIDE)
    if PROBE_STRIDE == 1 or torch.allclose(probe[0][..., sub, sub], p1[0][..., sub, sub]):
        pytest.skip("the off-line move vanished in the subsample")
    got = track.predict(700.0, probe)
    # image 1's position is the subsampled least squares: small where the move is off the line
    a = float(((probe - p1)[0][..., sub, sub] * (p1 - p0)[0][..., sub, sub]).sum()) / float(
        ((p1 - p0)[0][..., sub, sub] ** 2).sum()
    )
    assert torch.allclose(got[0], d1[0] + max(0.0, min(2.0, a)) * (d1 - d0)[0], atol=1e-5)
    assert abs(a) < 0.5
    assert torch.allclose(got[1], (d1 + 0.5 * (d1 - d0))[1], atol=1e-5)


def test_without_a_probe_calibrated_is_linear_and_holds_what_linear_holds_plus_the_subsampled_probe():
    track, (d0, d1, _p0, p1) = _calibrated()
    linear = Forecast("linear")
    linear.add(torch.tensor(900.0), d0)
    linear.add(torch.tensor(800.0), d1)
    assert torch.equal(track.predict(torch.tensor(650.0)), linear.predict(torch.tensor(650.0)))
    assert torch.allclose(linear.predict(650.0), d1 + 1.5 * (d1 - d0), atol=1e-5)
    probe_bytes = 2 * p1[..., ::PROBE_STRIDE, ::PROBE_STRIDE].numel() * 4
    assert track.nbytes() == linear.nbytes() + probe_bytes
    assert Forecast("linear").probe is None


def test_one_full_step_known_every_forecast_is_the_last_features():
    d0, _ = _pair(3)
    p0, p1 = _pair(4)
    track = Forecast("calibrated")
    track.add(900.0, d0, p0)
    assert track.predict(800.0, p1) is d0


# --- the time schedule ------------------------------------------------------------------------------------------------


def _plan(settings: tome_core.ToMeSettings, times: list[float], report_steps: bool = True, begin: int = 0) -> str:
    """The plan of a pass at ``times`` (its steps' times), the patch applied at step ``begin`` (a refiner's switch)."""
    resolved = settings.resolved("calibrated", settings.cache_schedule if settings.cache_schedule != "auto" else "time")
    refresh, last_full, out = Schedule(resolved), 0, ""
    for k, (i, t) in enumerate(list(enumerate(times))[begin:]):
        call = replace(step_call(i, len(times), torch.tensor(t)), step=k)  # the patch counts its own calls
        if refresh.may_cache(call, k - last_full, None, timed=report_steps):
            out += "c"
        else:
            refresh.full(call, None)
            last_full, out = k, out + "f"
    return out


def _uniform(settings: tome_core.ToMeSettings, steps: int) -> str:
    return "".join("c" if c else "f" for c in uniform_plan(settings, steps))


@pytest.mark.parametrize("interval", [2, 3, 4, 5])
@pytest.mark.parametrize("sampler", ["euler", "ddim"])
def test_the_time_schedule_is_the_uniform_one_at_an_even_spacing(interval, sampler):
    settings = tome_core.ToMeSettings(cache=True, cache_interval=interval, cache_schedule="time")
    sigmas = S.schedule(sampler, 20)
    times = [S.sigma_to_t(s) for s in (sigmas[:-1] if sigmas[-1] == 0 else sigmas)]
    uniform = tome_core.ToMeSettings(cache=True, cache_interval=interval)
    assert _plan(settings, times) == _uniform(uniform, len(times))


@pytest.mark.parametrize("interval", [3, 4, 5])
def test_under_karras_the_time_schedule_runs_full_steps_where_the_time_goes_and_no_more_of_them(interval):
    settings = tome_core.ToMeSettings(cache=True, cache_interval=interval, cache_schedule="time")
    times = [S.sigma_to_t(s) for s in S.schedule("dpmpp_2m", 20)[:-1]]
    plan = _plan(settings, times)
    uniform = _uniform(tome_core.ToMeSettings(cache=True, cache_interval=interval), 20)
    assert plan.count("f") <= uniform.count("f") and plan[0] == plan[-1] == "f"
    assert "c" * (2 * interval - 1) not in plan  # the cap: at most 2N - 1 cached steps in a row
    budget = interval * times[0] / 20  # N average steps' worth of sampler time

    def reach(plan: str) -> float:  # the most sampler time a cached step lies past its full step
        last, out = times[0], 0.0
        for t, kind in zip(times, plan):
            last, out = (t, out) if kind == "f" else (last, max(out, last - t))
        return out

    assert reach(plan) < budget < reach(uniform)


@pytest.mark.parametrize("sampler", ["dpmpp_2m", "dpmpp_2m_sde"])
def test_at_any_step_count_the_time_schedule_runs_no_more_full_steps_than_the_uniform_one(sampler):
    """Left to the time alone, 38 of these passes ran one full step more (DPM++ 2M Karras at 10 steps, N=3: 5, where
    the uniform schedule runs 4; seen in the real A1111)."""
    for steps in range(6, 61):
        times = [S.sigma_to_t(s) for s in S.schedule(sampler, steps)[:-1]]
        for interval in (2, 3, 4, 5):
            settings = tome_core.ToMeSettings(cache=True, cache_interval=interval, cache_schedule="time")
            plan = _plan(settings, times)
            uniform = _uniform(tome_core.ToMeSettings(cache=True, cache_interval=interval), steps)
            assert plan.count("f") <= uniform.count("f"), (steps, interval, plan, uniform)
            assert plan[0] == plan[-1] == "f" and "c" * (2 * interval - 1) not in plan
    times = [S.sigma_to_t(s) for s in S.schedule("dpmpp_2m", 10)[:-1]]
    plan = _plan(tome_core.ToMeSettings(cache=True, cache_interval=3, cache_schedule="time"), times)
    assert plan == "fccfcfcccf"


@pytest.mark.parametrize("sampler", ["dpmpp_2m", "dpmpp_2m_sde"])
def test_from_a_refiners_switch_the_time_schedule_runs_no_more_full_steps_than_the_uniform_one(sampler):
    """A patch applied mid-pass counts its calls from 0 while the pass's progress goes on: the count it may not
    exceed is the uniform schedule's from that step, and the steps left are the pass's."""
    for steps in range(10, 41, 3):
        times = [S.sigma_to_t(s) for s in S.schedule(sampler, steps)[:-1]]
        for interval, begin in itertools.product((2, 3, 4, 5), range(1, steps - 3)):
            timed, uniform = (
                _plan(tome_core.ToMeSettings(cache=True, cache_interval=interval, cache_schedule=s), times, begin=begin)
                for s in ("time", "uniform")
            )
            assert timed.count("f") <= uniform.count("f"), (steps, interval, begin, timed, uniform)


def test_an_even_spacing_rounded_to_integer_timesteps_stays_the_uniform_schedule():
    """diffusers' UniPC runs ``linspace(0, 999, 21).round()``: steps of 49, 50 or 51, never exactly N averages."""
    times = torch.linspace(0, 999, 21).round().flip(0)[:-1].tolist()
    for interval in (2, 3, 4, 5):
        settings = tome_core.ToMeSettings(cache=True, cache_interval=interval, cache_schedule="time")
        assert _plan(settings, times) == _uniform(tome_core.ToMeSettings(cache=True, cache_interval=interval), 20)


def test_the_time_schedule_without_a_step_count_or_a_time_is_uniform():
    settings = tome_core.ToMeSettings(cache=True, cache_interval=3, cache_schedule="time")
    times = [S.sigma_to_t(s) for s in S.schedule("dpmpp_2m", 20)[:-1]]
    assert _plan(settings, times, report_steps=False) == _uniform(tome_core.ToMeSettings(cache=True), 20)


# --- in a real UNet ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def unet():
    return make_unet("sd15")


def _run(unet, patch, times, shift):
    x = photo_latents(2, 16, 16, 0)
    ctx = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for i, t in enumerate(times):
            if patch is not None:
                patch.set_progress(i / len(times), len(times))
            unet(x * (1 - shift(i)), torch.full((2,), t), ctx)


def test_a_cached_step_gets_the_calibrated_forecast_from_the_live_skip_connection(unet):
    entry = unet.output_blocks[-1][0]  # branch 0: the deep features (32 channels) next to input block 0's skip
    times = [999.0 - 100 * i for i in range(7)]

    def record(into: list[torch.Tensor]):
        return entry.register_forward_pre_hook(lambda m, args: into.append(args[0].clone()))

    plain: list[torch.Tensor] = []
    got: list[torch.Tensor] = []
    tome_core.remove_patch(unet)
    handle = record(plain)
    try:
        _run(unet, None, times, shift=lambda i: 0.05 * i * i)  # the input bends: its steps are not even in time
    finally:
        handle.remove()
    settings = dict(ratio=0.0, cache=True, cache_interval=3, cache_forecast="calibrated", cache_schedule="uniform")
    patch = tome_core.apply_patch(unet, **settings)
    handle = record(got)  # after the cache's own hook: what the entry block gets
    try:
        _run(unet, patch, times, shift=lambda i: 0.05 * i * i)
        stats = tome_core.cache_stats(unet)
    finally:
        handle.remove()
        tome_core.remove_patch(unet)
    deep = [p[:, :32] for p in plain]
    skip = [p[:, 32:, ::PROBE_STRIDE, ::PROBE_STRIDE] for p in plain]  # a cached step's skip is the live one
    for i in (4, 5):  # forecast from the full steps 0 and 3
        line, moved = skip[3] - skip[0], skip[i] - skip[3]
        a = ((moved * line).sum((1, 2, 3)) / (line * line).sum((1, 2, 3))).clamp(0, 2).view(2, 1, 1, 1)
        assert torch.allclose(got[i][:, :32], deep[3] + a * (deep[3] - deep[0]), atol=1e-5), i
        linear_a = (times[i] - times[3]) / (times[3] - times[0])
        assert not torch.allclose(a, torch.full_like(a, linear_a), atol=0.05)  # not the time's position
    assert stats == [{"full": 3, "cached": 4, "skipped": 0}]


def test_the_time_schedule_in_a_patched_unet_counts_its_full_steps_per_pass(unet):
    times = [S.sigma_to_t(s) for s in S.schedule("dpmpp_2m", 20)[:-1]]
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3, cache_schedule="time")
    try:
        _run(unet, patch, times, shift=lambda i: 0.02 * i)
        stats = tome_core.cache_stats(unet)
    finally:
        tome_core.remove_patch(unet)
    settings = tome_core.ToMeSettings(cache=True, cache_interval=3, cache_schedule="time")
    expected = _plan(settings, times)
    assert stats == [{"full": expected.count("f"), "cached": expected.count("c"), "skipped": 0}]
    assert expected != _uniform(tome_core.ToMeSettings(cache=True), 20)


def _second_order(unet, schedule: str):
    """A DPM++ SDE pass: two calls a step, the second at the midpoint time (the last step: one call)."""
    sigmas = S.schedule("dpmpp_sde", 20)
    first = [S.sigma_to_t(s) for s in sigmas[:-1]]
    middle = [S.sigma_to_t((a * b) ** 0.5) for a, b in itertools.pairwise(sigmas[:-1])]
    x = photo_latents(2, 16, 16, 0)
    ctx = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(0))
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3, cache_schedule=schedule)
    try:
        with torch.no_grad():
            for i, t in enumerate(first):
                patch.set_progress(i / 20, 20)
                unet(x, torch.full((2,), t), ctx)
                if i < len(middle):
                    unet(x, torch.full((2,), middle[i]), ctx)
        return tome_core.cache_stats(unet), patch.report().cache
    finally:
        tome_core.remove_patch(unet)


def test_under_a_sampler_calling_the_unet_at_two_times_a_step_the_time_schedule_stands_down_and_says_so(unet):
    """DPM++ SDE's steps call the UNet twice, the second at a midpoint time: there the time schedule lost to the
    uniform one (the sampler table), so the pass runs the uniform schedule, both calls of a step alike, with a note."""
    stats, report = _second_order(unet, "time")
    uniform_stats, uniform_report = _second_order(unet, "uniform")
    plan = _uniform(tome_core.ToMeSettings(cache=True), 20)
    assert stats == uniform_stats == [{"full": plan.count("f"), "cached": plan.count("c"), "skipped": 0}]
    assert report.full == uniform_report.full == 2 * plan.count("f") - 1  # both calls of a full step; the last: one
    assert "cache schedule uniform: the sampler calls the UNet at two times a step" in report.notes
    assert not uniform_report.notes


def test_two_calls_a_step_at_one_time_keep_the_time_schedule(unet):
    """Cond and uncond called one after the other (or extra guidance passes) run at the step's time: no stand-down."""
    times = [S.sigma_to_t(s) for s in S.schedule("dpmpp_2m", 20)[:-1]]
    x = photo_latents(2, 16, 16, 0)
    ctx = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(0))
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3, cache_schedule="time")
    try:
        with torch.no_grad():
            for i, t in enumerate(times):
                patch.set_progress(i / 20, 20)
                unet(x, torch.full((2,), t), ctx)
                unet(x, torch.full((2,), t), ctx)
        stats, report = tome_core.cache_stats(unet), patch.report().cache
    finally:
        tome_core.remove_patch(unet)
    plan = _plan(tome_core.ToMeSettings(cache=True, cache_interval=3, cache_schedule="time"), times)
    assert stats == [{"full": plan.count("f"), "cached": plan.count("c"), "skipped": 0}] and not report.notes
    assert plan != _uniform(tome_core.ToMeSettings(cache=True), 20)


def test_the_probe_kept_is_a_copy_not_a_view_of_the_callers_tensor():
    d0, _ = _pair(6)
    entry_input = torch.randn(2, 16, 8, 8)  # the entry block's input: deep features then the skip connection
    track = Forecast("calibrated")
    track.add(900.0, d0, entry_input[:, 8:])
    assert track.probe._base is None and track.probe.untyped_storage().nbytes() == track.probe.numel() * 4
    entry_input.zero_()  # the caller's tensor changes or goes: the probe kept does not
    assert track.probe.abs().sum() > 0
