"""The benchmarks' anchor for ComfyUI's built-in token merging (``benchmarks.lab.comfy_builtin``, mode ``comfy-tome``): on
the real ldm UNet it merges the queries of the highest level's self-attention only, and nothing on SDXL's layout."""

from __future__ import annotations

import torch
from models import make_unet, photo_latents

from benchmarks.lab import modes
from tome_core.families import transformer_blocks

MODE = modes.MODES["comfy-tome"]


def _inputs(batch=2, side=16):
    ctx = torch.randn(batch, 7, 64, generator=torch.Generator().manual_seed(0))
    return photo_latents(batch, side, side), torch.full((batch,), 500.0), ctx


def _tokens(unet):
    """Per transformer block: the token counts its attn1 q/k/v, attn2 queries and MLP projections get."""
    seen: dict[tuple[int, str], int] = {}
    handles = []
    for i, block in enumerate(transformer_blocks(unet)):
        for name, layer in (
            ("q", block.attn1.to_q),
            ("k", block.attn1.to_k),
            ("v", block.attn1.to_v),
            ("q2", block.attn2.to_q),
            ("ff", block.ff.net[0].proj),
        ):
            handles.append(
                layer.register_forward_pre_hook(lambda m, a, key=(i, name): seen.__setitem__(key, a[0].shape[1]))
            )
    return seen, handles


def test_comfy_builtin_merges_only_the_queries_of_the_highest_levels_self_attention():
    unet = make_unet("sd15")
    x, t, ctx = _inputs()
    plain = unet(x, t, ctx)
    MODE.apply(unet)
    seen, handles = _tokens(unet)
    try:
        merged = unet(x, t, ctx)
    finally:
        for h in handles:
            h.remove()
        modes.PLAIN.apply(unet)
    blocks = list(transformer_blocks(unet))
    top = [i for i in range(len(blocks)) if seen[(i, "k")] == 16 * 16]
    assert len(top) == 5  # SD1.5: two input blocks and three output blocks at the full resolution
    kept = 16 * 16 - int(16 * 16 * MODE.comfy)
    for i in range(len(blocks)):
        full = seen[(i, "k")]
        queries = kept if i in top else full
        assert (seen[(i, "q")], seen[(i, "v")], seen[(i, "q2")], seen[(i, "ff")]) == (queries, full, full, full), i
    assert not torch.equal(merged, plain)
    assert torch.equal(unet(x, t, ctx), plain) and not any(m._forward_pre_hooks for m in unet.modules())


def test_comfy_builtin_changes_nothing_on_sdxl_which_has_no_block_at_the_highest_level():
    unet = make_unet("sdxl")
    x, t, ctx = _inputs()
    plain = unet(x, t, ctx)
    MODE.apply(unet)
    try:
        assert torch.equal(unet(x, t, ctx), plain)
    finally:
        modes.PLAIN.apply(unet)
