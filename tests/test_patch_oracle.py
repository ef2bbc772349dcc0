"""The patched real ldm UNet against tomesd 0.1.3 (the oracle), with top-left destinations."""

from __future__ import annotations

import pytest
import tomesd
import torch
from models import photo_latents, rel

import tome_core


def run(holder, x, seed=0):
    t = torch.full((x.shape[0],), 601.0)
    ctx = torch.randn(x.shape[0], 7, 64, generator=torch.Generator().manual_seed(seed))
    return holder.model.diffusion_model(x, t, ctx)


CASES = [
    # ratio, max_downsample, sx, sy, batch, (h, w)
    (0.5, 1, 2, 2, 2, (64, 64)),
    (0.1, 1, 2, 2, 1, (65, 97)),
    (0.75, 2, 2, 2, 3, (73, 129)),
    (0.3, 4, 1, 2, 2, (65, 97)),
    (0.5, 8, 4, 4, 1, (73, 129)),
    (0.6, 2, 3, 1, 2, (40, 56)),
    (0.4, 4, 2, 2, 1, (24, 160)),
]


@pytest.mark.parametrize("ratio,max_downsample,sx,sy,batch,size", CASES)
def test_unet_output_equals_tomesd(holder, ratio, max_downsample, sx, sy, batch, size):
    x = photo_latents(batch, *size)
    base = run(holder, x)
    args = dict(ratio=ratio, max_downsample=max_downsample, sx=sx, sy=sy, use_rand=False)
    tomesd.apply_patch(holder, **args)
    ref = run(holder, x)
    tomesd.remove_patch(holder)
    tome_core.apply_patch(holder, **args)
    ours = run(holder, x)
    tome_core.remove_patch(holder)
    assert rel(ref, base) > 1e-4, "the merge must change the output, or the comparison proves nothing"
    assert rel(ours, ref) < 1e-5


def test_one_row_latent_where_tomesd_crashes(holder):
    x = photo_latents(2, 1, 97)
    tomesd.apply_patch(holder, ratio=0.5, sx=2, sy=1, use_rand=False)
    with pytest.raises(RuntimeError):
        run(holder, x)
    tomesd.remove_patch(holder)
    base = run(holder, x)
    tome_core.apply_patch(holder, ratio=0.5, sx=2, sy=1, use_rand=False)
    out = run(holder, x)
    assert out.shape == base.shape and torch.isfinite(out).all()
    assert rel(out, base) > 1e-4  # merged, not skipped
