"""ToMe's core beside other extensions' changes to the UNet, on the real ldm UNet (no WebUI): features resized inside
the UNet (Kohya's Deep Shrink), attention layers another extension takes over (Hypertile, ControlNet-LLLite, Layer
Diffuse's attention sharing: in the Forge tests, where it runs), frames in the batch (AnimateDiff) and tiles in the batch (tiled diffusion)."""

from __future__ import annotations

import pytest
import torch
from models import Holder, make_unet, photo_latents, rel
from neighbours import animatediff, controlnet_lllite
from neighbours.kohya_hiresfix.scripts.khrfix import Scaler

import tome_core
from tome_core.families import transformer_blocks
from tome_core.merging import merge as tm


def inputs(batch=2, h=32, w=48, t=601.0, seed=0):
    ctx = torch.randn(batch, 7, 64, generator=torch.Generator().manual_seed(seed))
    return photo_latents(batch, h, w, seed), torch.full((batch,), t), ctx


@pytest.fixture
def unet():
    """A fresh SD1.5-layout UNet per test (the tests change its block lists and modules)."""
    return make_unet("sd15")


@pytest.fixture
def grids(monkeypatch):
    """Every ``(h, w)`` a merge partition or a ToDo downsampling was made for, in order."""
    seen: list[tuple[str, int, int]] = []
    partition, downsample = tm.make_partition, tm.downsample_tokens

    def make_partition(h, w, *args, **kwargs):
        seen.append(("merge", h, w))
        return partition(h, w, *args, **kwargs)

    def downsample_tokens(x, h, w, factor):
        seen.append(("downsample", h, w))
        return downsample(x, h, w, factor)

    monkeypatch.setattr(tm, "make_partition", make_partition)
    monkeypatch.setattr(tm, "downsample_tokens", downsample_tokens)
    return seen


def shrink(unet, depth=2, down=0.75, up=4 / 3, mode="bicubic"):
    """Kohya's Deep Shrink for the WebUI (``khrfix.Scaler``): ``input_blocks[depth]`` runs on its input resized by
    ``down``, ``output_blocks[-(depth + 1)]`` on its input resized by ``up``."""
    unet.input_blocks[depth] = Scaler(down, unet.input_blocks[depth], mode)
    unet.output_blocks[-(depth + 1)] = Scaler(up, unet.output_blocks[-(depth + 1)], mode)


def unshrink(unet):
    for blocks in (unet.input_blocks, unet.output_blocks):
        for i, block in enumerate(blocks):
            if isinstance(block, Scaler):
                blocks[i] = block.block


# --- Kohya HRFix / Deep Shrink: the grid from the live input ----------------------------------------------------------


@pytest.mark.parametrize("method", ["merge", "downsample"])
def test_blocks_resized_inside_the_unet_are_merged_on_their_live_grid(unet, grids, method):
    """A 32 x 48 latent shrunk by 0.75 at input block 2 runs that block on a 24 x 36 grid, and output block 9 on
    32 x 48 again (4/3): neither fits a level of the latent size as a token count alone, so before this fix those
    blocks ran unmerged ("token count does not fit"); now each is merged as the grid it is, rows and columns the
    right way round."""
    holder = Holder(unet)
    shrink(unet)
    x, t, ctx = inputs()
    base = unet(x, t, ctx)
    patch = tome_core.apply_patch(holder, ratio=0.5, method=method, max_downsample=1, use_rand=True, seed=1)
    out = unet(x, t, ctx)
    tome_core.remove_patch(holder)
    assert ("merge" if method == "merge" else "downsample", 24, 36) in grids
    assert {(h, w) for _, h, w in grids} == {(32, 48), (24, 36)}
    assert patch.report().notes == () and rel(out, base) > 1e-4
    assert torch.equal(unet(x, t, ctx), base)


def test_a_grid_shrunk_to_the_next_level_counts_as_that_level(unet, grids):
    """Deep Shrink's default halves the features: the shrunk block's grid is the next level's, and ToMe's levels are
    resolutions, so with max downsample 1 it is left as such blocks always are (no note: nothing was lost)."""
    holder = Holder(unet)
    shrink(unet, down=0.5, up=2.0, mode="nearest")
    x, t, ctx = inputs(h=32, w=32)
    patch = tome_core.apply_patch(holder, ratio=0.5, max_downsample=1, use_rand=True, seed=1)
    unet(x, t, ctx)
    # input 1, output 9 (at full size again), 10, 11; input 2 is at 16 x 16 now: level 2, not merged
    assert grids == [("merge", 32, 32)] * 4 and patch.report().notes == ()
    tome_core.apply_patch(holder, ratio=0.5, max_downsample=2, use_rand=True, seed=1)
    grids.clear()
    unet(x, t, ctx)
    # the shrunk block joins level 2; the blocks below it run a level lower too (8 x 8: downsample 4)
    assert sorted(grids) == sorted([("merge", 32, 32)] * 4 + [("merge", 16, 16)])


@pytest.mark.parametrize("size", [(64, 64), (65, 97), (24, 160)])
def test_without_resizing_the_live_grid_is_the_latent_size_level(unet, grids, size):
    """Where nothing is resized the live grid is what the token count gave before (and tomesd gives: the oracle tests
    stay equal), at every level, odd sizes included."""
    holder = Holder(unet)
    x, t, ctx = inputs(batch=1, h=size[0], w=size[1])
    tome_core.apply_patch(holder, ratio=0.5, max_downsample=8, use_rand=True, seed=1)
    unet(x, t, ctx)
    tome_core.remove_patch(holder)
    levels = [(h, w) for _, h, w in tome_core.merging.planning.level_sizes(*size)][
        :4
    ]  # SD1.5: blocks down to the middle one
    assert {(h, w) for _, h, w in grids} == set(levels)


def test_step_cache_beside_deep_shrink_steps_aside_with_a_note(unet):
    """The step cache checks the UNet's block lists at every call: with a Scaler in them it runs the call in full
    (the same output as without the cache) and says so; token merging still merges on the live grids."""
    holder = Holder(unet)
    x, t, ctx = inputs()
    outs = {}
    for cache in (True, False):
        patch = tome_core.apply_patch(holder, ratio=0.5, cache=cache, cache_interval=2)
        shrink(unet)  # as Kohya's callback does at the first step, after ToMe patched the UNet
        for step in range(3):
            patch.set_progress(step / 3, 3)
            outs.setdefault(cache, []).append(unet(x, t - step, ctx))
        report = patch.report()
        if cache:
            assert report.notes == ("step cache off: another extension replaced the UNet's blocks",)
            assert report.cache.cached == 0
        unshrink(unet)
    tome_core.remove_patch(holder)
    assert all(torch.equal(a, b) for a, b in zip(outs[True], outs[False]))
    assert report.merge.unfit == 0


# --- attention layers another extension takes over --------------------------------------------------------------------


def test_controlnet_lllite_gets_its_full_grid_and_tome_steps_aside_on_its_layers(unet):
    """Mikubill's ControlNet-LLLite adds an embedding of the control image, laid out as the block's h x w grid, inside
    to_q/to_k/to_v: merged (or downsampled) tokens made ``torch.cat`` fail. ToMe now leaves those layers alone; the
    image is LLLite's own, and the note names it."""
    holder = Holder(unet)
    x, t, ctx = inputs()
    base = unet(x, t, ctx)
    hint = torch.rand(1, 3, 32 * 8, 48 * 8, generator=torch.Generator().manual_seed(1))
    lllite = controlnet_lllite.hook(unet, hint, blocks="top")
    alone = unet(x, t, ctx)
    assert rel(alone, base) > 1e-4  # LLLite acts
    for method in ("merge", "downsample"):
        patch = tome_core.apply_patch(holder, ratio=0.5, method=method, merge_crossattn=True)
        out = unet(x, t, ctx)
        assert torch.equal(out, alone)
        assert patch.report().notes == (
            "self-attention not merged in 5 of 16 blocks (ControlNet-LLLite patches it)",
            *(
                ("cross-attention not merged in 5 of 16 blocks (ControlNet-LLLite patches it)",)
                if method == "merge"
                else ()
            ),
        )
    tome_core.remove_patch(holder)
    controlnet_lllite.clear_all_lllite()
    assert lllite.calls and all(n == h * w for n, h, w in lllite.calls)
    patch = tome_core.apply_patch(holder, ratio=0.5)  # cleared: ToMe merges there again
    assert rel(unet(x, t, ctx), alone) > 1e-4 and patch.report().notes == ()
    tome_core.remove_patch(holder)


# --- frames and tiles in the batch -------------------------------------------------------------------------------------


def test_animatediff_frames_share_one_partition_and_motion_modules_see_every_token(unet):
    """AnimateDiff's frames are the batch and its motion modules sit between the blocks: they attend across frames at
    every token, so they need the full grid (ToMe has unmerged by then) and frames merged alike (one partition per
    call; a partition per frame would flicker). With the motion modules' output at zero, as AnimateDiff initialises
    them, identical frames must stay identical under a random partition."""
    holder = Holder(unet)
    frames = 4
    mm = animatediff.inject(unet, frames=frames, zero_out=True)
    x, t, ctx = inputs(batch=1, h=32, w=32)
    xs, ts, cs = x.expand(frames, -1, -1, -1), t.expand(frames), ctx.expand(frames, -1, -1)
    plain = unet(xs, ts, cs)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=True, seed=3)
    out = unet(xs, ts, cs)
    assert all(torch.equal(out[0], out[i]) for i in range(1, frames))
    assert rel(out, plain) > 1e-4  # merged
    mm.set_zero(False)
    mm.calls.clear()
    out = unet(xs + torch.randn_like(xs) * 0.1, ts, cs)
    assert torch.isfinite(out).all()
    assert mm.calls and all(d == h * w for d, h, w in mm.calls)
    assert all(not (m._forward_pre_hooks or m._forward_hooks) for m in mm.modules())
    assert all(b not in set(mm.modules()) for b in transformer_blocks(unet))
    tome_core.remove_patch(holder)
    animatediff.restore(unet, mm)


def test_animatediff_context_windows_of_a_step_share_its_partitions(unet, monkeypatch):
    """More frames than AnimateDiff's *Context batch size*: its ``mm_sd_forward`` (animatediff_infv2v.py l.154-169)
    calls the UNet once per context window of a step (the window's frames, cond then uncond), at the step's timestep.
    Every window must get the step's partitions (a frame in two windows, or next to a frame of another window, is
    merged alike), and the next step others. Seen so in the real A1111 (8 frames, context 4: 4 windows a step)."""
    drawn: list[torch.Tensor] = []
    partition = tm.make_partition

    def make_partition(h, w, *args, **kwargs):
        part = partition(h, w, *args, **kwargs)
        drawn.append(part.dst.clone())
        return part

    monkeypatch.setattr(tm, "make_partition", make_partition)
    holder = Holder(unet)
    context, video = 2, 4
    mm = animatediff.inject(unet, frames=context)
    x, _, ctx = inputs(batch=video, h=16, w=16)
    windows = [[0, 1], [2, 3], [3, 0]]
    tome_core.apply_patch(holder, ratio=0.5, use_rand=True, seed=3)
    per_step = []
    for t in (601.0, 401.0):
        calls = []
        for window in windows:
            drawn.clear()
            idx = window + window  # cond and uncond of the window's frames, as with batch_cond_uncond
            out = unet(x[idx], torch.full((2 * context,), t), ctx[idx])
            assert torch.isfinite(out).all()
            calls.append([d.tolist() for d in drawn])
        assert calls[0] and all(c == calls[0] for c in calls[1:])
        per_step.append(calls[0])
    assert per_step[0] != per_step[1]
    tome_core.remove_patch(holder)
    animatediff.restore(unet, mm)


def test_tiles_in_the_batch_are_merged_each_as_an_image_of_its_own(unet):
    """Tiled diffusion calls the UNet on a batch of tile-sized latents: each tile is merged from its own tokens, on the
    tile's grid: a batch of tiles gives, tile for tile, what each tile gives alone (same step, same partition)."""
    holder = Holder(unet)
    x, t, ctx = inputs(batch=1, h=64, w=64)
    tiles = torch.cat([x[..., :32, :32], x[..., 32:, 16:48], x[..., 16:48, 32:]])
    tome_core.apply_patch(holder, ratio=0.5, use_rand=True, seed=5)
    batched = unet(tiles, t.expand(3), ctx.expand(3, -1, -1))
    alone = torch.cat([unet(tile[None], t, ctx) for tile in tiles])
    tome_core.remove_patch(holder)
    assert rel(batched, alone) < 1e-5
    assert rel(batched, unet(tiles, t.expand(3), ctx.expand(3, -1, -1))) > 1e-4
