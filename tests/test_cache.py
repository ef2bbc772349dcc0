"""The step cache on the real ldm UNet: off or interval 1 changes nothing, streams and passes keep their own caches,
it composes with token merging, and it leaves the model exactly as it was (DeepCache equality:
tests/test_cache_oracle.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from models import make_unet, photo_latents, rel

import tome_core
from tome_core.caching.schedule import uniform_plan


@pytest.fixture(scope="module")
def unet():
    return make_unet("sd15")


def _inputs(batch=2, h=16, w=16, seed=0):
    ctx = torch.randn(batch, 7, 64, generator=torch.Generator().manual_seed(seed))
    return photo_latents(batch, h, w, seed), ctx


def run(unet, patch, steps=7, batch=2, separate=False, h=16, w=16):
    """``steps`` UNet calls as a sampler makes them (progress and step count reported before each), at the timesteps
    of SD's schedule; the outputs. ``separate``: the two halves of the batch as two calls (cond, then uncond)."""
    x, ctx = _inputs(batch, h, w)
    outs = []
    with torch.no_grad():
        for i in range(steps):
            if patch is not None:
                patch.set_progress(i / steps, steps)
            t = torch.full((batch,), 999.0 * (1 - i / steps))
            xi = x * (1 - 0.05 * i)
            if separate:
                half = batch // 2
                parts = [unet(xi[s], t[s], ctx[s]) for s in (slice(0, half), slice(half, batch))]
                outs.append(torch.cat(parts))
            else:
                outs.append(unet(xi, t, ctx))
    return outs


def plain(unet, **kwargs):
    tome_core.remove_patch(unet)
    return run(unet, None, **kwargs)


def with_patch(unet, **settings):
    patch = tome_core.apply_patch(unet, **settings)
    try:
        return run(unet, patch), patch.report()
    finally:
        tome_core.remove_patch(unet)


def test_cache_off_or_interval_1_is_bit_identical_to_today(unet):
    base = run(unet, tome_core.apply_patch(unet, ratio=0.5, seed=3))
    tome_core.remove_patch(unet)
    for extra in ({"cache": False}, {"cache": True, "cache_interval": 1}):
        outs, report = with_patch(unet, ratio=0.5, seed=3, **extra)
        assert len(outs) == len(base) and all(torch.equal(a, b) for a, b in zip(outs, base)), extra
        assert report.cache is None
    alone = run(unet, tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=1))
    tome_core.remove_patch(unet)
    assert all(torch.equal(a, b) for a, b in zip(alone, plain(unet)))


def test_cached_steps_follow_the_schedule_and_the_first_and_last_are_full(unet):
    outs, report = with_patch(unet, ratio=0.0, cache=True, cache_interval=3)
    base = plain(unet)
    expected = uniform_plan(tome_core.ToMeSettings(cache=True, cache_interval=3), 7)
    assert expected == [False, True, True, False, True, True, False]
    assert (report.cache.full, report.cache.cached) == (3, 4)
    for i, cached in enumerate(expected):
        same = torch.equal(outs[i], base[i])
        assert same != cached, i  # full steps are plain's exactly; cached ones are not


def test_the_early_schedule_runs_the_second_full_step_one_sooner_in_every_pass(unet):
    settings = dict(ratio=0.0, cache=True, cache_interval=3, cache_schedule="early")
    expected = [False, True, False, True, True, False, True, False]  # full at 0, N - 1 = 2, 5 and the last
    assert uniform_plan(tome_core.ToMeSettings(**settings), 8) == expected
    uniform = uniform_plan(tome_core.ToMeSettings(**{**settings, "cache_schedule": "uniform"}), 8)
    assert uniform != expected and uniform.count(False) == expected.count(False)
    base = plain(unet, steps=8)
    patch = tome_core.apply_patch(unet, **settings)
    try:
        passes = [run(unet, patch, steps=8), run(unet, patch, steps=8)]  # a new pass begins the schedule again
        report = patch.report()
    finally:
        tome_core.remove_patch(unet)
    assert (report.cache.full, report.cache.cached) == (8, 8)
    for outs in passes:
        assert [not torch.equal(a, b) for a, b in zip(outs, base)] == expected


def test_the_early_schedule_is_the_uniform_one_where_moving_would_add_a_full_step(unet):
    # below N=3; and at 7 steps, where the uniform grid (0, 3, 6) ends on the last step
    for n in (2, 3):
        early, _ = with_patch(unet, ratio=0.0, cache=True, cache_interval=n, cache_schedule="early")
        uniform, _ = with_patch(unet, ratio=0.0, cache=True, cache_interval=n, cache_schedule="uniform")
        assert all(torch.equal(a, b) for a, b in zip(early, uniform)), n
    plan = uniform_plan(tome_core.ToMeSettings(cache=True, cache_interval=3, cache_schedule="early"), 19)
    assert [i for i, cached in enumerate(plan) if not cached] == [*range(0, 19, 3)]


def test_the_early_schedule_is_the_uniform_one_where_the_step_count_is_not_reported(unet):
    x, ctx = _inputs()
    outs = {}
    for schedule in ("early", "uniform"):
        patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3, cache_schedule=schedule)
        try:
            with torch.no_grad():
                outs[schedule] = [
                    unet(x * (1 - 0.05 * i), torch.full((2,), 999.0 * (1 - i / 8)), ctx) for i in range(8)
                ]
            assert patch.report().cache.cached > 0
        finally:
            tome_core.remove_patch(unet)
    assert all(torch.equal(a, b) for a, b in zip(outs["early"], outs["uniform"]))


def test_the_early_plan_begins_at_a_refiners_first_step():
    settings = tome_core.ToMeSettings(cache=True, cache_interval=4, cache_schedule="early")
    plan = uniform_plan(settings, 20, first=6)
    assert [6 + i for i, cached in enumerate(plan) if not cached] == [6, 9, 13, 17, 19]
    assert [i for i, cached in enumerate(uniform_plan(settings, 20)) if not cached] == [0, 3, 7, 11, 15, 19]


def test_the_cache_window_keeps_steps_outside_it_full(unet):
    settings = dict(ratio=0.0, cache=True, cache_interval=2, cache_start=0.4, cache_end=0.8)
    outs, report = with_patch(unet, **settings)
    # progress 0, .14, .29 | .43, .57, .71 | .86: inside the window every other step is cached
    expected = [False, False, False, True, False, True, False]
    assert uniform_plan(tome_core.ToMeSettings(**settings), 7) == expected
    assert report.cache.cached == 2
    base = plain(unet)
    assert [not torch.equal(a, b) for a, b in zip(outs, base)] == expected


def test_unpatched_model_is_exactly_as_before(unet):
    before_keys = list(unet.state_dict())
    modules = [(n, type(m)) for n, m in unet.named_modules()]
    base = plain(unet)
    with_patch(unet, ratio=0.5, cache=True, cache_interval=2)
    assert list(unet.state_dict()) == before_keys and [(n, type(m)) for n, m in unet.named_modules()] == modules
    assert all("forward" not in m.__dict__ for m in unet.modules())
    assert all(not (m._forward_pre_hooks or m._forward_hooks) for m in unet.modules())
    after = plain(unet)
    assert all(torch.equal(a, b) for a, b in zip(after, base))


def test_an_instance_forward_another_extension_set_is_restored_exactly(unet):
    block = unet.input_blocks[6][0]  # a layer of a skipped block: the cache wraps the layers
    theirs = block.forward  # a bound method, set on the instance by "another extension"
    block.forward = theirs
    try:
        with_patch(unet, ratio=0.0, cache=True, cache_interval=2)
        assert block.__dict__["forward"] is theirs
    finally:
        del block.__dict__["forward"]


def test_cond_and_uncond_keep_their_own_caches_batched_or_separate(unet):
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3)
    batched = run(unet, patch)
    tome_core.remove_patch(unet)
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3)
    separate = run(unet, patch, separate=True)
    report = patch.report().cache
    tome_core.remove_patch(unet)
    assert (report.full, report.cached) == (6, 8)  # two streams, each on the schedule
    assert max(rel(a, b) for a, b in zip(separate, batched)) < 1e-5


def test_a_change_of_batch_or_latent_size_drops_the_cache(unet):
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=5)
    try:
        x, ctx = _inputs(2)
        with torch.no_grad():
            patch.set_progress(0.0, 10)
            unet(x, torch.full((2,), 999.0), ctx)
            patch.set_progress(0.1, 10)
            x3, ctx3 = _inputs(3)
            unet(x3, torch.full((3,), 900.0), ctx3)  # another batch: full
            patch.set_progress(0.2, 10)
            x3b, _ = _inputs(3, 24, 16)
            unet(x3b, torch.full((3,), 800.0), ctx3)  # another latent size: full
            patch.set_progress(0.3, 10)
            unet(x3b, torch.full((3,), 700.0), ctx3)  # same as the last: cached
        assert (patch.report().cache.full, patch.report().cache.cached) == (3, 1)
    finally:
        tome_core.remove_patch(unet)


def test_a_new_pass_starts_with_no_cache(unet):
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=5)
    try:
        run(unet, patch, steps=4)
        first = patch.report().cache
        run(unet, patch, steps=4)  # progress starts at 0 again: the hires pass, img2img
        second = patch.report().cache
    finally:
        tome_core.remove_patch(unet)
    assert (first.full, first.cached) == (2, 2)
    assert (second.full - first.full, second.cached - first.cached) == (2, 2)


def test_token_merging_acts_on_the_shallow_path_of_cached_steps(unet):
    alone, _ = with_patch(unet, ratio=0.0, cache=True, cache_interval=3)
    patch = tome_core.apply_patch(unet, ratio=0.5, seed=1, cache=True, cache_interval=3)
    plans = []
    hook = unet.output_blocks[11].register_forward_hook(lambda *a: plans.append(patch.merger.planner.plans_computed))
    try:
        both = run(unet, patch)
    finally:
        hook.remove()
        tome_core.remove_patch(unet)
    merged, _ = with_patch(unet, ratio=0.5, seed=1)
    cached = [i for i, c in enumerate(uniform_plan(patch.settings, 7)) if c]
    assert all(plans[i] > plans[i - 1] for i in cached)  # a plan was made in the block that ran
    assert all(rel(both[i], alone[i]) > 1e-4 for i in cached)
    assert all(torch.equal(both[i], merged[i]) for i in (0, 3, 6))  # full steps: ToMe's output as without the cache


def test_a_branch_the_model_lacks_is_a_named_error_and_patches_nothing(unet):
    with pytest.raises(tome_core.SettingsError, match=r"'cache_branch' = 11 .*from 0 to 8"):
        tome_core.apply_patch(make_unet("sdxl"), ratio=0.5, cache=True, cache_branch=11)
    with pytest.raises(tome_core.SettingsError, match="'cache_interval'"):
        tome_core.apply_patch(unet, cache=True, cache_interval=11)
    assert tome_core.get_patch(unet) is None
    assert all("forward" not in m.__dict__ and not m._forward_pre_hooks for m in unet.modules())


def test_a_block_swapped_by_another_extension_makes_the_cache_step_aside(unet):
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3)
    original = unet.input_blocks[4]
    try:
        x, ctx = _inputs()
        with torch.no_grad():
            patch.set_progress(0.0, 6)
            unet(x, torch.full((2,), 999.0), ctx)
            unet.input_blocks[4] = copy.deepcopy(original)  # e.g. Kohya HRFix's wrapper for the WebUI
            patch.set_progress(1 / 6, 6)
            out = unet(x, torch.full((2,), 800.0), ctx)
        report = patch.report()
    finally:
        tome_core.remove_patch(unet)
        unet.input_blocks[4] = original
    assert report.cache.cached == 0 and any("another extension replaced" in n for n in report.notes)
    with torch.no_grad():
        assert torch.equal(out, unet(x, torch.full((2,), 800.0), ctx))


def test_an_error_inside_a_cached_step_leaves_nothing_behind(unet):
    patch = tome_core.apply_patch(unet, ratio=0.5, cache=True, cache_interval=3)
    boom = unet.output_blocks[11].register_forward_pre_hook(lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    try:
        x, ctx = _inputs()
        with torch.no_grad():
            patch.set_progress(0.0, 6)
            with pytest.raises(RuntimeError):
                unet(x, torch.full((2,), 999.0), ctx)
            boom.remove()
            unet(x, torch.full((2,), 999.0), ctx)
            patch.set_progress(1 / 6, 6)
            boom = unet.output_blocks[11].register_forward_pre_hook(
                lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))
            )
            with pytest.raises(RuntimeError):
                unet(x, torch.full((2,), 800.0), ctx)
    finally:
        boom.remove()
        tome_core.remove_patch(unet)
    assert all("forward" not in m.__dict__ for m in unet.modules())
    assert all(torch.equal(a, b) for a, b in zip(plain(unet), plain(unet)))


@pytest.mark.parametrize("forecast, chunks", [("off", 1), ("linear", 2)])
def test_the_held_features_are_one_chunk_of_the_entry_blocks_input_and_its_slope(unet, forecast, chunks):
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3, cache_forecast=forecast)
    try:
        run(unet, patch, steps=2)  # two full steps: the linear forecast has its slope
        held = patch.cache.cached_bytes()
    finally:
        tome_core.remove_patch(unet)
    # branch 0: what output_blocks[10] gives output_blocks[11], 32 channels at 16 x 16, batch 2, float32; linear also
    # keeps the features' slope, of the same size
    assert held == chunks * 2 * 32 * 16 * 16 * 4
