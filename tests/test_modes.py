"""The modes beyond the paper's default: plan reuse (share_plan, plan_interval), token downsampling
(ToDo), the step schedule, and the exact mode still against tomesd — on the real ldm UNet."""

from __future__ import annotations

import pytest
import tomesd
import torch
from models import Holder, make_unet, photo_latents, rel

import tome_core
from tome_core.families import transformer_blocks
from tome_core.merging import merge as tm


def inputs(batch=2, h=32, w=40, t=601.0, seed=0):
    ctx = torch.randn(batch, 7, 64, generator=torch.Generator().manual_seed(seed))
    return photo_latents(batch, h, w, seed), torch.full((batch,), t), ctx


# --- exact mode ---------------------------------------------------------------------------------


def test_exact_mode_with_many_small_chunks_still_equals_tomesd(holder, monkeypatch):
    monkeypatch.setattr(tm, "CPU_CHUNK_BYTES", 4096)  # dozens of chunks per plan, some of MIN_CHUNK_ROWS rows
    unet = holder.model.diffusion_model
    x, t, ctx = inputs(batch=2, h=48, w=56)
    tomesd.apply_patch(holder, ratio=0.6, use_rand=False)
    ref = unet(x, t, ctx)
    tomesd.remove_patch(holder)
    base = unet(x, t, ctx)
    tome_core.apply_patch(holder, ratio=0.6, use_rand=False)
    assert rel(ref, base) > 1e-4 and rel(unet(x, t, ctx), ref) < 1e-5


# --- plan reuse ------------------------------------------------------------------------------------


LEVEL1_BLOCKS = 5  # SD1.5 layout: 2 down + 3 up transformer blocks at full resolution


def test_share_plan_computes_one_plan_per_level_per_forward(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    patch = tome_core.apply_patch(holder, ratio=0.5, use_rand=False)
    exact = unet(x, t, ctx)
    assert patch.merger.planner.plans_computed == LEVEL1_BLOCKS
    patch = tome_core.apply_patch(holder, ratio=0.5, use_rand=False, max_downsample=2, share_plan=True)
    unet(x, t, ctx)
    unet(x, t, ctx)  # a second call of the same step plans anew: it may be the uncond pass
    assert patch.merger.planner.plans_computed == 2 * 2  # two levels, two calls
    patch = tome_core.apply_patch(holder, ratio=0.5, use_rand=False, share_plan=True)
    shared = unet(x, t, ctx)
    assert 1e-5 < rel(shared, exact) < 0.2  # a plan from another block's tokens: close, not equal


def test_plan_interval_recomputes_every_k_reported_steps(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    patch = tome_core.apply_patch(holder, ratio=0.5, use_rand=False, plan_interval=3)
    counts = []
    for step in range(7):
        patch.set_progress(step / 7)
        unet(x + 0.01 * step, t - 10 * step, ctx)
        counts.append(patch.merger.planner.plans_computed)
    assert counts == [5, 5, 5, 10, 10, 10, 15]
    patch.set_progress(0.0)  # a new pass (the hires fix): plans are dropped
    unet(x, t, ctx)
    assert patch.merger.planner.plans_computed == 20


def test_plan_interval_without_progress_counts_timesteps(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    patch = tome_core.apply_patch(holder, ratio=0.5, use_rand=False, plan_interval=2, share_plan=True)
    for step in range(4):
        unet(x, t - 100 * step, ctx)
    assert patch.merger.planner.plans_computed == 2
    unet(x, t + 100, ctx)  # the timestep went up: a new sampling run
    assert patch.merger.planner.plans_computed == 3


def test_separate_cond_uncond_calls_reuse_their_own_plans(holder):
    """Each row's plan depends only on its own tokens, so consistent reuse gives the same result whether
    cond and uncond are batched or separate calls; reusing cond's plan for uncond would not."""
    unet = holder.model.diffusion_model
    x, t, ctx = inputs(batch=1)
    uncond = torch.zeros_like(ctx)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=False, plan_interval=3, share_plan=True)
    patch = tome_core.get_patch(holder)
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    batched, separate = [], []
    for step in range(3):
        xs, ts = x + 0.3 * step * noise, t - 50 * step
        patch.set_progress(step / 3)
        batched.append(unet(torch.cat([xs, xs * 0.8]), torch.cat([ts, ts]), torch.cat([ctx, uncond])))
    tome_core.apply_patch(holder, ratio=0.5, use_rand=False, plan_interval=3, share_plan=True)
    patch = tome_core.get_patch(holder)
    for step in range(3):
        xs, ts = x + 0.3 * step * noise, t - 50 * step
        patch.set_progress(step / 3)
        separate.append(torch.cat([unet(xs, ts, ctx), unet(xs * 0.8, ts, uncond)]))
    assert patch.merger.planner.plans_computed == 2  # one per call of the first step, reused by steps 2 and 3
    for b, s in zip(batched, separate):
        assert rel(s, b) < 1e-5


def test_frozen_plans_are_never_recomputed(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    patch = tome_core.apply_patch(holder, ratio=0.5, use_rand=False)
    exact = unet(x, t, ctx)
    patch.merger.planner.freeze_plans = True
    first = unet(x, t, ctx)
    second = unet(x, t - 300, ctx)
    assert patch.merger.planner.plans_computed == 2 * LEVEL1_BLOCKS
    assert torch.equal(first, exact) and not torch.equal(second, exact)
    third = unet(x, t, ctx)
    assert patch.merger.planner.plans_computed == 2 * LEVEL1_BLOCKS and torch.equal(third, exact)


# --- token downsampling (ToDo) ---------------------------------------------------------------------


def _spy_attn1(unet):
    seen: list[tuple[int, int | None]] = []

    def spy(module, args, kwargs):
        context = kwargs.get("context")
        seen.append((args[0].shape[1], None if context is None else context.shape[1]))

    handles = [b.attn1.register_forward_pre_hook(spy, with_kwargs=True) for b in transformer_blocks(unet)]
    return seen, handles


def test_downsample_keeps_queries_and_subsamples_keys_values(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs(h=32, w=40)
    base = unet(x, t, ctx)
    tome_core.apply_patch(holder, method="downsample", downsample_factor=2, max_downsample=2)
    seen, handles = _spy_attn1(unet)  # registered after ours: sees what attn1 gets
    out = unet(x, t, ctx)
    for h in handles:
        h.remove()
    assert (32 * 40, 16 * 20) in seen  # level 1: queries kept, keys/values 2x2-subsampled
    assert (16 * 20, None) in seen  # level 2: factor 2 // 2 = 1, untouched
    assert (8 * 10, None) in seen  # level 4: above max_downsample
    assert out.shape == base.shape and rel(out, base) > 1e-4
    tome_core.remove_patch(holder)
    assert torch.equal(unet(x, t, ctx), base)


def test_downsample_factor_per_level_and_odd_sizes(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs(batch=1, h=33, w=41)
    tome_core.apply_patch(holder, method="downsample", downsample_factor=4, max_downsample=2)
    seen, handles = _spy_attn1(unet)
    out = unet(x, t, ctx)
    for h in handles:
        h.remove()
    assert (33 * 41, 9 * 11) in seen  # ceil(33/4) x ceil(41/4)
    assert (17 * 21, 9 * 11) in seen  # level 2 at factor 2
    assert torch.isfinite(out).all()


def test_downsample_on_sdxl_layout_starts_at_its_first_attention_level(sdxl_unet):
    x, t, ctx = inputs(h=40, w=48)
    base = sdxl_unet(x, t, ctx)
    patch = tome_core.apply_patch(Holder(sdxl_unet), method="downsample", downsample_factor=2, max_downsample="auto")
    seen, handles = _spy_attn1(sdxl_unet)
    try:
        out = sdxl_unet(x, t, ctx)
    finally:
        for h in handles:
            h.remove()
        tome_core.remove_patch(sdxl_unet)
    assert patch.merger.planner.auto_downsample == 2
    assert set(seen) == {(20 * 24, 10 * 12), (10 * 12, None)}
    assert rel(out, base) > 1e-4


def test_downsample_leaves_blocks_without_self_attention_alone():
    unet = make_unet("sd15", disable_self_attentions=[True, False, False, False])
    x, t, ctx = inputs()
    base = unet(x, t, ctx)
    tome_core.apply_patch(unet, method="downsample", downsample_factor=2)  # only level 1, all cross-attention
    assert torch.equal(unet(x, t, ctx), base)
    tome_core.remove_patch(unet)


# --- step schedule -----------------------------------------------------------------------------------


def test_schedule_inactive_is_bit_identical_and_follows_reported_progress(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    base = unet(x, t, ctx)
    for method in ("merge", "downsample"):
        patch = tome_core.apply_patch(holder, ratio=0.5, method=method, start=0.2, end=0.7)
        patch.set_progress(0.1)
        assert torch.equal(unet(x, t, ctx), base)
        patch.set_progress(0.2)
        assert rel(unet(x, t, ctx), base) > 1e-4
        patch.set_progress(0.7)
        assert torch.equal(unet(x, t, ctx), base)
        assert method == "downsample" or patch.merger.planner.plans_computed == LEVEL1_BLOCKS


def test_schedule_falls_back_to_the_timestep(holder):
    unet = holder.model.diffusion_model
    x, _, ctx = inputs()
    tome_core.apply_patch(holder, ratio=0.5, start=0.3, end=0.7)  # active for 300 < t <= 700
    for t, active in ((900.0, False), (650.0, True), (301.0, True), (300.0, False), (100.0, False)):
        tt = torch.full((2,), t)
        tome_core.remove_patch(holder)
        base = unet(x, tt, ctx)
        tome_core.apply_patch(holder, ratio=0.5, start=0.3, end=0.7)
        out = unet(x, tt, ctx)
        assert (not torch.equal(out, base)) == active, t


def test_end_one_includes_the_last_step(holder):
    unet = holder.model.diffusion_model
    x, _, ctx = inputs()
    t0 = torch.zeros(2)
    base = unet(x, t0, ctx)
    patch = tome_core.apply_patch(holder, ratio=0.5)
    assert not torch.equal(unet(x, t0, ctx), base)  # t = 0: progress 1.0
    patch.set_progress(1.0)
    assert not torch.equal(unet(x, t0, ctx), base)


@pytest.mark.parametrize("bad", [dict(start=0.5, end=0.5), dict(downsample_factor=0), dict(plan_interval=0)])
def test_new_settings_are_validated(bad):
    with pytest.raises(tome_core.SettingsError):
        tome_core.ToMeSettings(**bad)
