"""The step cache under ComfyUI's context windows (issue 37): each call of a window carries the window in
``transformer_options["context_window"]`` (an ``IndexListContextWindow``: ``index_list``, the frames it covers along
``dim``; comfy/context_windows.py:53-59, 273), one call (cond and uncond batched) per window and step. A window's calls
are one stream, whatever their order or number in the step; schedules whose windows move every step leave the cache
off with a note."""

from __future__ import annotations

import types

import pytest
import torch
from wan_double import WanModel

import tome_core
from comfy_tome import sampling
from tome_core import run as R
from tome_core.settings import ToMeSettings

OFF = ToMeSettings(ratio=0.0, cache=True, cache_interval=2, cache_forecast="off", cache_schedule="uniform")


class Window:
    """What the cache reads of ComfyUI's ``IndexListContextWindow``."""

    def __init__(self, frames, dim=2):
        self.index_list, self.dim = list(frames), dim


A, B = Window(range(0, 4)), Window(range(2, 6))


@pytest.fixture(scope="module")
def model():
    return WanModel(seed=3).eval().requires_grad_(False)


def _steps(model, order, steps=6, settings=OFF):
    """Each step calls the windows in ``order(step)``; the outputs of window A, step by step."""
    gen = torch.Generator().manual_seed(1)
    x, context = torch.randn(1, 4, 6, 8, 8, generator=gen), torch.randn(1, 5, 32, generator=gen)
    patch, outs = tome_core.apply_settings(model, settings), []
    try:
        with torch.no_grad():
            for step in range(steps):
                patch.set_progress(step / steps, steps)
                for window in order(step):
                    sub = (x * (1 - 0.1 * step))[:, :, window.index_list]
                    t = torch.full((1,), 1000.0 * (1 - step / steps))
                    out = model(sub, t, context, transformer_options={"context_window": window})
                    if window is A:
                        outs.append(out)
        return outs, patch.report().cache
    finally:
        tome_core.remove_patch(model)


def test_a_window_never_gets_another_windows_residual_when_the_windows_change_order(model):
    """Streams are keyed by the call's number in the step and the frames it covers: where the windows swap order, the
    window now second finds no stream of its own there and runs in full (keyed by position alone it took the other
    window's residual); a window kept in place is cached from its own stream."""
    alone, report = _steps(model, lambda step: [A])
    assert report.cached == 2  # steps 1 and 3 (0, 2, 4 full; the last, 5, full)
    plain, _ = _steps(model, lambda step: [A], settings=OFF.replace(cache=False))
    assert not torch.equal(alone[1], plain[1])  # a cached step differs from plain here
    swapping, _ = _steps(model, lambda step: [A, B] if step % 2 == 0 else [B, A])
    for got, expected in zip(swapping, plain):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)  # never B's residual: in full where A moved
    steady, _ = _steps(model, lambda step: [A, B])
    for got, expected in zip(steady, alone):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)  # in place: cached from its own stream


@pytest.mark.parametrize("schedule", ["standard_uniform", "looped_uniform", "standard_static", "batched"])
def test_windows_that_move_every_step_leave_the_cache_off_with_a_note(schedule):
    handler = types.SimpleNamespace(context_schedule=types.SimpleNamespace(name=schedule))
    run = R.Run(OFF)
    settings = sampling._beside_windows(OFF, {"context_handler": handler}, run)
    if schedule in ("standard_static", "batched"):
        assert settings is OFF and not run.note_text
    else:
        assert settings is None and f"step cache off: context windows {schedule} move every step" in run.note_text
