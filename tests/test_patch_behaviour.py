"""Reproducible randomness, clean removal, coexistence with tomesd and instance-level _forward
replacement, robustness, and the SDXL layout — all on the real ldm UNet."""

from __future__ import annotations

import copy
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomesd
import torch
from ldm.modules.attention import BasicTransformerBlock
from models import Holder, make_unet, photo_latents, rel

import tome_core
from tome_core.families import transformer_blocks

ROOT = Path(__file__).resolve().parents[1]


def inputs(batch=2, h=32, w=40, t=601.0, seed=0):
    ctx = torch.randn(batch, 7, 64, generator=torch.Generator().manual_seed(seed))
    return photo_latents(batch, h, w, seed), torch.full((batch,), t), ctx


def hook_count(unet) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in unet.modules())


# --- randomness -------------------------------------------------------------------------------


def test_seeded_random_partition_is_reproducible_and_leaves_global_rng_alone(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    base = unet(x, t, ctx)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=True, seed=1234)
    state = torch.get_rng_state()
    a = unet(x, t, ctx)
    b = unet(x, t, ctx)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(a, b)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=True, seed=1235)
    other_seed = unet(x, t, ctx)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=False)
    top_left = unet(x, t, ctx)
    assert rel(a, base) > 1e-4
    assert rel(other_seed, a) > 1e-4 and rel(top_left, a) > 1e-4


def test_cond_and_uncond_share_the_partition_batched_or_separate(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs(batch=2)
    xx, tt, cc = torch.cat([x, x]), torch.cat([t, t]), torch.cat([ctx, torch.zeros_like(ctx)])
    tome_core.apply_patch(holder, ratio=0.5, use_rand=True, seed=7)
    batched = unet(xx, tt, cc)
    cond, uncond = unet(x, t, ctx), unet(x, t, torch.zeros_like(ctx))
    # a different partition would differ by about 1e-2; batching alone changes rounding only
    assert rel(torch.cat([cond, uncond]), batched) < 1e-5
    # odd batches stay random (tomesd silently turns randomness off there)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=False)
    assert rel(unet(x[:1], t[:1], ctx[:1]), cond[:1]) > 1e-4
    # a new step (timestep) draws a new partition
    tome_core.apply_patch(holder, ratio=0.5, use_rand=True, seed=7)
    unet_t2 = unet(x, t - 20, ctx)
    tome_core.remove_patch(holder)
    base_t2 = unet(x, t - 20, ctx)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=True, seed=7)
    assert torch.equal(unet(x, t - 20, ctx), unet_t2) and rel(unet_t2, base_t2) > 1e-4


SUBPROCESS = textwrap.dedent(
    """
    import sys, hashlib, torch
    sys.path[:0] = [{root!r}, {tests!r}]
    from models import make_unet, photo_latents
    import tome_core
    unet = make_unet("sd15")
    x = photo_latents(2, 24, 32)
    ctx = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(0))
    tome_core.apply_patch(unet, ratio=0.6, use_rand=True, seed=99)
    with torch.no_grad():
        out = unet(x, torch.tensor([500.0, 500.0]), ctx)
    print(hashlib.sha256(out.numpy().tobytes()).hexdigest())
    """
)


def test_same_seed_bit_identical_across_processes():
    code = SUBPROCESS.format(root=str(ROOT), tests=str(ROOT / "tests"))
    digests = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    }
    assert len(digests) == 1 and len(digests.pop()) == 64


# --- removal and coexistence -----------------------------------------------------------------


def test_patch_keeps_module_tree_and_removal_is_bit_identical(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    base = unet(x, t, ctx)
    names = [(n, type(m)) for n, m in unet.named_modules()]
    keys = list(unet.state_dict())
    hooks = hook_count(unet)
    tome_core.apply_patch(holder, ratio=0.5, max_downsample=4)
    assert [(n, type(m)) for n, m in unet.named_modules()] == names
    assert list(unet.state_dict()) == keys
    assert rel(unet(x, t, ctx), base) > 1e-4
    tome_core.remove_patch(holder)
    assert hook_count(unet) == hooks and tome_core.get_patch(holder) is None
    assert torch.equal(unet(x, t, ctx), base)


def test_reapplying_reconfigures_instead_of_stacking(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    tome_core.apply_patch(holder, ratio=0.5, use_rand=False)
    once, hooks = unet(x, t, ctx), hook_count(unet)
    tome_core.apply_patch(holder, ratio=0.3, use_rand=False)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=False)
    assert hook_count(unet) == hooks
    assert torch.equal(unet(x, t, ctx), once)


def test_tomesd_remove_patch_leaves_ours_and_ours_leaves_tomesd(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    base = unet(x, t, ctx)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=False)
    ours = unet(x, t, ctx)
    tomesd.remove_patch(holder)  # what the WebUI's built-in does whenever its ratio changes
    assert torch.equal(unet(x, t, ctx), ours)
    tome_core.remove_patch(holder)

    tomesd.apply_patch(holder, ratio=0.3, use_rand=False)
    theirs = unet(x, t, ctx)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=False)
    assert torch.equal(unet(x, t, ctx), theirs)  # no double merge: ours steps aside on those blocks
    tome_core.remove_patch(holder)
    assert torch.equal(unet(x, t, ctx), theirs)
    tomesd.remove_patch(holder)
    assert torch.equal(unet(x, t, ctx), base)


def _instance_forward(self, x, context=None):
    """Like ControlNet's reference-only: a body of its own, bound on the block instance, that calls
    the block's submodules (here with the original math)."""
    x = self.attn1(self.norm1(x), context=None) + x
    x = self.attn2(self.norm2(x), context=context) + x
    return self.ff(self.norm3(x)) + x


def test_patch_follows_instance_level_forward_replacement(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    base = unet(x, t, ctx)
    tome_core.apply_patch(holder, ratio=0.5, use_rand=False)
    merged = unet(x, t, ctx)
    blocks = list(transformer_blocks(unet))
    for block in blocks:
        block._forward = _instance_forward.__get__(block, BasicTransformerBlock)
    try:
        assert torch.equal(unet(x, t, ctx), merged)  # still merging, not bypassed
        tome_core.remove_patch(holder)
        assert torch.equal(unet(x, t, ctx), base)  # and nothing stale pinned after removal
        tome_core.apply_patch(holder, ratio=0.5, use_rand=False)
    finally:
        for block in blocks:
            del block._forward
    assert torch.equal(unet(x, t, ctx), merged)  # the replacement going away changes nothing either


# --- robustness -------------------------------------------------------------------------------


@pytest.mark.parametrize("batch,h,w", [(1, 9, 13), (3, 17, 5), (2, 3, 40), (1, 8, 8), (2, 31, 1)])
def test_any_latent_and_batch_size(holder, batch, h, w):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs(batch, h, w)
    tome_core.apply_patch(holder, ratio=0.5, max_downsample=8, use_rand=True, seed=3)
    out = unet(x, t, ctx)
    assert out.shape == x.shape and torch.isfinite(out).all()


def test_block_with_unexpected_token_count_runs_unmerged_and_warns_once(holder, caplog):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    tome_core.apply_patch(holder, ratio=0.5)
    unet(x, t, ctx)  # records the latent size 32x40
    block = next(transformer_blocks(unet))
    tokens = torch.randn(2, 77, block.norm1.normalized_shape[0])
    with caplog.at_level(logging.WARNING, logger="tome_core"):
        patched = [block(tokens, context=ctx) for _ in range(3)]
    tome_core.remove_patch(holder)
    assert all(torch.equal(p, block(tokens, context=ctx)) for p in patched)
    assert len([r for r in caplog.records if "does not fit" in r.message]) == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_unet(dtype):
    unet = make_unet("sd15").to(dtype)
    unet.dtype = dtype  # ldm's use_fp16 flag, for any half type
    for m in unet.modules():
        if isinstance(m, torch.nn.GroupNorm):
            m.float()  # ldm's GroupNorm32 computes in float32; on the CPU its parameters must be float32 too
    # the WebUI casts the timestep embedding to the UNet's dtype; so do we
    unet.time_embed.register_forward_pre_hook(lambda m, args: (args[0].to(dtype),))
    x, t, ctx = inputs()
    ref = make_unet("sd15")
    tome_core.apply_patch(ref, ratio=0.5, use_rand=False)
    expected = ref(x, t, ctx)
    tome_core.apply_patch(unet, ratio=0.5, use_rand=False)
    out = unet(x.to(dtype), t, ctx.to(dtype))
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert rel(out.float(), expected) < 0.1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    cpu = make_unet("sd15")
    gpu = copy.deepcopy(cpu).cuda()
    x, t, ctx = inputs()
    for m in (cpu, gpu):
        tome_core.apply_patch(m, ratio=0.5, use_rand=True, seed=5)
    out = gpu(x.cuda(), t.cuda(), ctx.cuda()).cpu()
    assert rel(out, cpu(x, t, ctx)) < 1e-3


# --- SDXL layout --------------------------------------------------------------------------------


def test_sdxl_layout_auto_level_and_oracle(sdxl_unet):
    holder = Holder(sdxl_unet)
    x, t, ctx = inputs(h=40, w=48)
    base = sdxl_unet(x, t, ctx)
    patch = tome_core.apply_patch(holder, ratio=0.5, max_downsample="auto", use_rand=False)
    assert patch.merger.planner.auto_downsample == 2
    ours = sdxl_unet(x, t, ctx)
    tome_core.apply_patch(holder, ratio=0.5, max_downsample=1, use_rand=False)
    assert torch.equal(sdxl_unet(x, t, ctx), base)  # what tomesd's default does on SDXL: nothing
    tome_core.remove_patch(holder)
    tomesd.apply_patch(holder, ratio=0.5, max_downsample=2, use_rand=False)
    ref = sdxl_unet(x, t, ctx)
    tomesd.remove_patch(holder)
    assert rel(ours, base) > 1e-4 and rel(ours, ref) < 1e-5


class SgmStyleBlock(BasicTransformerBlock):
    """The sgm BasicTransformerBlock's call signature (extra arguments), same submodules."""

    def forward(self, x, context=None, additional_tokens=None, n_times_crossframe_attn_in_self=0):
        return self._forward(x, context, additional_tokens, n_times_crossframe_attn_in_self)

    def _forward(self, x, context=None, additional_tokens=None, n_times_crossframe_attn_in_self=0):
        x = self.attn1(self.norm1(x), context=context if self.disable_self_attn else None) + x
        x = self.attn2(self.norm2(x), context=context) + x
        return self.ff(self.norm3(x)) + x


def test_sgm_style_blocks_are_patched(sdxl_unet):
    sgm = copy.deepcopy(sdxl_unet)
    for block in transformer_blocks(sgm):
        block.__class__ = SgmStyleBlock
    x, t, ctx = inputs(h=40, w=48)
    base = sgm(x, t, ctx)
    tome_core.apply_patch(sgm, ratio=0.5, max_downsample="auto", use_rand=True, seed=1)
    tome_core.apply_patch(sdxl_unet, ratio=0.5, max_downsample="auto", use_rand=True, seed=1)
    try:
        out = sgm(x, t, ctx)
        assert rel(out, base) > 1e-4 and torch.equal(out, sdxl_unet(x, t, ctx))
    finally:
        tome_core.remove_patch(sdxl_unet)


def test_a_failing_install_leaves_no_hook(holder, monkeypatch):
    unet = holder.model.diffusion_model
    hooks = hook_count(unet)
    blocks = list(transformer_blocks(unet))
    real = type(blocks[3].ff).register_forward_hook

    def fail_on_fourth_block(self, *args, **kwargs):
        if self is blocks[3].ff:
            raise RuntimeError("simulated failure while registering hooks")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(blocks[3].ff), "register_forward_hook", fail_on_fourth_block)
    with pytest.raises(RuntimeError, match="simulated"):
        tome_core.apply_patch(holder, ratio=0.5)
    assert hook_count(unet) == hooks and tome_core.get_patch(holder) is None
