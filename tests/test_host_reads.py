"""No host round-trips in a patched forward: with sampling progress reported (as the WebUI script does every
step) a patched UNet forward reads nothing back from the device, so on a GPU it never synchronises.

Every way Python reads a tensor's value on the host is instrumented (``item``, ``float()``, ``int()``,
``bool()``, ``__index__``, ``tolist``, ``cpu``, ``numpy``); on CPU tensors these calls are still observable."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from models import photo_latents

import tome_core

READS = ("item", "__float__", "__int__", "__bool__", "__index__", "tolist", "cpu", "numpy")


@contextmanager
def host_reads() -> Iterator[collections.Counter]:
    """Count the host reads of any tensor made inside the block, by kind."""
    counts: collections.Counter = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name, method):
        def read(self, *args, **kwargs):
            counts[name] += 1
            return method(self, *args, **kwargs)

        return read

    for name, method in originals.items():
        setattr(torch.Tensor, name, counting(name, method))
    try:
        yield counts
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


def inputs(batch=2, side=24, t=601.0):
    ctx = torch.randn(batch, 7, 64, generator=torch.Generator().manual_seed(0))
    return photo_latents(batch, side, side), torch.full((batch,), t), ctx


def test_the_instrument_sees_reads():
    with host_reads() as counts:
        float(torch.ones(1))
        torch.ones(2).tolist()
        bool(torch.ones(1))
    assert counts == {"__float__": 1, "tolist": 1, "__bool__": 1}


@pytest.mark.parametrize(
    "settings",
    [
        {},  # the defaults: exact merge, random partition from the seed
        {"share_plan": True, "plan_interval": 2},
        {"method": "downsample"},
        {"start": 0.2, "end": 0.8, "max_downsample": "auto"},
    ],
    ids=["defaults", "share+interval", "todo", "schedule"],
)
def test_patched_forward_with_reported_progress_reads_nothing_back(holder, settings):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    with host_reads() as counts:
        unet(x, t, ctx)
    assert not counts  # the unpatched ldm UNet itself reads nothing back
    patch = tome_core.apply_patch(holder, seed=5, **settings)
    with host_reads() as counts:
        for step in range(4):  # steps inside and outside the schedule, plans computed and reused
            patch.set_progress(step / 4)
            unet(x, t - 50 * step, ctx)
            unet(x[:1], t[:1] - 50 * step, ctx[:1])  # cond and uncond as separate calls
    assert not counts, dict(counts)
    assert patch.merger.planner.plans_computed > 0 or settings.get("method") == "downsample"


def test_without_reported_progress_one_read_per_call_when_a_setting_needs_the_timestep(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    tome_core.apply_patch(holder, seed=5)  # use_rand: the partition is keyed on the timestep
    with host_reads() as counts:
        unet(x, t, ctx)
        unet(x, t - 20, ctx)
    assert counts == {"__float__": 2}
    tome_core.apply_patch(holder, use_rand=False)  # nothing needs the timestep
    with host_reads() as counts:
        unet(x, t, ctx)
    assert not counts


def test_reported_progress_keys_the_partition_seeded_and_shared_by_cond_and_uncond(holder):
    unet = holder.model.diffusion_model
    x, t, ctx = inputs()
    uncond = torch.zeros_like(ctx)
    patch = tome_core.apply_patch(holder, seed=7)
    patch.set_progress(0.25)
    batched = unet(torch.cat([x, x]), torch.cat([t, t]), torch.cat([ctx, uncond]))
    patch.set_progress(0.25)
    separate = torch.cat([unet(x, t, ctx), unet(x, t, uncond)])
    # a different partition would differ by about 1e-2; batching alone changes rounding only
    assert ((separate - batched).norm() / batched.norm()).item() < 1e-5
    patch.set_progress(0.3)
    next_step = unet(x, t, ctx)
    assert ((next_step - separate[:2]).norm() / next_step.norm()).item() > 1e-4  # a new step, a new partition
    patch = tome_core.apply_patch(holder, seed=7)  # the same seed and progress give the same image
    patch.set_progress(0.25)
    assert torch.equal(unet(x, t, ctx), separate[:2])
    patch = tome_core.apply_patch(holder, seed=8)
    patch.set_progress(0.25)
    assert ((unet(x, t, ctx) - separate[:2]).norm() / separate[:2].norm()).item() > 1e-4
