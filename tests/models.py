"""The tests' models: the UNet builders and latents of :mod:`benchmarks.lab.models` (the lab owns them: the
dependency runs tests -> benchmarks.lab), and two helpers of the tests' own."""

from __future__ import annotations

import torch

from benchmarks.lab.models import (
    REAL,
    Holder,
    install_sdp_attention,
    install_unet_cat_hijack,
    make_real_unet,
    make_unet,
    one_context_per_block,
    photo_latents,
    reinit_zero_modules,
)
from tome_core.steps import Call

__all__ = [
    "REAL",
    "Holder",
    "install_sdp_attention",
    "install_unet_cat_hijack",
    "make_real_unet",
    "make_unet",
    "one_context_per_block",
    "photo_latents",
    "reinit_zero_modules",
    "rel",
    "step_call",
]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative difference ``|a - b| / |b|`` (Frobenius norms)."""
    return ((a - b).norm() / b.norm()).item()


def step_call(step: int, steps: int, time: torch.Tensor | float) -> Call:
    """Step ``step`` of a ``steps``-step pass, its progress reported, called at ``time``: as a schedule sees it."""
    return Call(
        size=None,
        batch=None,
        progress=step / steps,
        key=step / steps,
        step=step,
        index=0,
        restarted=False,
        steps=steps,
        time=time,
    )
