"""The speed the step cache's steps imply (issue 37: "speak in speed"): each family's estimate of the share of a full
step's block work that a cached step skips, held against the work counted by torch's FLOP counter; the report's work
and speed-up per pass; the infotext value; ComfyUI's node text is in ``test_comfy_dit.py``."""

from __future__ import annotations

import pytest
import torch
from models import make_unet
from torch.utils.flop_counter import FlopCounterMode

import tome_core
from benchmarks.lab.trained import flux
from tome_core import run as R
from tome_core.families import layout_for
from tome_core.report import PassCount

STEPS = 6


def _counted_share(model: torch.nn.Module, calls: list) -> tuple[float, tome_core.CacheReport]:
    """1 − (FLOPs of a cached call / FLOPs of a full one), counted by torch at cache_interval 2; and the report."""
    session = tome_core.apply_settings(
        model, tome_core.from_dict({"enabled": True, "cache": True, "cache_interval": 2})
    )
    flops: dict[bool, int] = {}
    try:
        with torch.no_grad():
            for i, call in enumerate(calls):
                session.set_progress(i / len(calls), len(calls))
                with FlopCounterMode(display=False) as counter:
                    call()
                flops.setdefault(session.cache.cached_now, counter.get_total_flops())
        report = session.cache.report()
    finally:
        tome_core.remove_patch(model)
    return 1 - flops[True] / flops[False], report


def _unet_calls(unet: torch.nn.Module, side: int) -> list:
    gen = torch.Generator().manual_seed(0)
    x, context = torch.randn(2, 4, side, side, generator=gen), torch.randn(2, 7, 64, generator=gen)
    return [
        lambda t=t: unet(x, timesteps=torch.full((2,), 999.0 * (1 - t / STEPS)), context=context) for t in range(STEPS)
    ]


@pytest.mark.parametrize("layout", ["sd15", "sdxl"])
@pytest.mark.parametrize("side", [8, 32])
def test_the_unets_estimate_is_within_a_few_percent_of_the_counted_work(layout, side):
    unet = make_unet(layout)
    counted, report = _counted_share(unet, _unet_calls(unet, side))
    estimated = layout_for(unet, 0).skipped_share((side, side))
    assert abs(estimated - counted) < 0.03, (estimated, counted)
    (count,) = report.passes
    assert (count.full, count.cached) == (4, 2)  # first, last and every second step full
    assert count.work == pytest.approx(4 + 2 * (1 - estimated))
    assert count.speedup == pytest.approx(6 / (4 + 2 * (1 - estimated)))


def test_flux_estimate_is_within_a_few_percent_of_the_counted_work_and_errs_low():
    """The text tokens' weights count as if they ran over the image's tokens: the estimate is a little low (a
    cached step skips more than it says), never high."""
    model = flux.build(10, seed=3).eval().requires_grad_(False)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    inputs = [model.inputs(x, torch.tensor(1 - i / STEPS), torch.tensor([2, -1])) for i in range(STEPS)]
    calls = [lambda kw=kw: model.transformer(**kw, return_dict=False) for kw in inputs]
    counted, _ = _counted_share(model.transformer, calls)
    estimated = layout_for(model.transformer, 0).skipped_share(None)
    assert counted - 0.06 < estimated <= counted


def test_the_infotext_says_the_speed_of_each_pass_that_cached_and_the_refiners_part_adds_in():
    run = R.Run(tome_core.from_dict({"enabled": True, "cache": True}))
    run.count_cache([PassCount(4, 2, work=4.2)])
    run.pass_name = "hires"
    run.count_cache([PassCount(2, 0, work=2.0), PassCount(1, 3, work=1.3)])  # the refiner switched in mid-pass
    assert run.cache_steps_text == "4 full, 2 cached; hires 3 full, 3 cached"
    assert run.cache_speed_text == f"{6 / 4.2:.2f}x; hires {6 / 3.3:.2f}x"
    nothing = R.Run(tome_core.from_dict({"enabled": True, "cache": True}))
    nothing.count_cache([PassCount(5, 0, work=5.0)])
    assert nothing.cache_speed_text is None  # no cached step: no speed-up to speak of
    assert PassCount(1, 1).speedup is None and (PassCount(1, 1) + PassCount(1, 1, work=1.5)).work is None


def test_a_layer_wrapping_another_counts_once():
    """A LoRA wrapper (peft's ``lora.Linear``: in/out features around its ``base_layer``) is one layer's work."""

    class Wrapped(torch.nn.Module):
        def __init__(self, base: torch.nn.Linear) -> None:
            super().__init__()
            self.in_features, self.out_features, self.base_layer = base.in_features, base.out_features, base

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base_layer(x)

    model = flux.build(10, seed=3)
    share = layout_for(model.transformer, 0).skipped_share(None)
    for block in model.transformer.single_transformer_blocks:
        block.proj_out = Wrapped(block.proj_out)
    assert layout_for(model.transformer, 0).skipped_share(None) == pytest.approx(share, abs=1e-12)
