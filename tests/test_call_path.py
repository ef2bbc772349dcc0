"""Where one cached step runs in the engine (issue 38's newcomer's walk): traced, not read.

One call of the model at a cached step, on the SD1.5-layout ldm UNet with token merging and on diffusers' FLUX
transformer, runs code in the session and its clock, the family, the step cache and (on the UNet) token merging, and
nowhere else in ``tome_core``: no settings, report, compile or host module is on the per-call path. Before the
restructuring the same step ran in eight places on FLUX (``patch``, ``steps``, ``settings``, ``planning``, ``cache``,
``schedule``, ``forecast``, ``families/``) and ten on the UNet (also ``merge``, ``neighbours``). Folders count as one
place: a capability is read as one room."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from models import make_unet

import tome_core
from benchmarks.lab.trained import flux

ENGINE = Path(tome_core.__file__).resolve().parent


def _places(run) -> dict[str, set[str]]:
    """The places of ``tome_core`` (a top-level file, or a folder) whose functions ``run()`` calls, with their names."""
    seen: dict[str, set[str]] = {}

    def profile(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(ENGINE):
                place = path.relative_to(ENGINE).parts[0]
                seen.setdefault(place, set()).add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def _cached_call(model: torch.nn.Module, calls: list, settings: dict) -> dict[str, set[str]]:
    """The places the fourth of ``calls`` (a cached step at ``cache_interval`` 2) runs in."""
    session = tome_core.apply_settings(model, tome_core.from_dict({"enabled": True, **settings}))
    try:
        with torch.no_grad():
            for i, call in enumerate(calls):
                session.set_progress(i / len(calls), len(calls))
                if i == 3:
                    assert session.cache is not None
                    places = _places(call)
                    assert session.cache.cached_now
                else:
                    call()
    finally:
        tome_core.remove_patch(model)
    return places


def test_a_cached_step_on_flux_runs_in_the_session_its_clock_the_family_and_the_cache():
    model = flux.build(10, seed=3).eval().requires_grad_(False)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    inputs = [model.inputs(x, torch.tensor(s), torch.tensor([2, -1])) for s in (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)]
    calls = [lambda kw=kw: model.transformer(**kw, return_dict=False) for kw in inputs]
    places = _cached_call(model.transformer, calls, dict(ratio=0.0, cache=True, cache_interval=2))
    assert set(places) == {"session.py", "steps.py", "families", "caching"}
    assert {"predict", "may_cache"} <= places["caching"]  # the forecast and the schedule did act


def test_a_cached_step_on_the_unet_adds_only_token_merging():
    unet = make_unet("sd15")
    gen = torch.Generator().manual_seed(0)
    x, context = torch.randn(2, 4, 32, 32, generator=gen), torch.randn(2, 7, 64, generator=gen)
    calls = [lambda t=t: unet(x, timesteps=torch.full((2,), 999.0 * (1 - t / 6)), context=context) for t in range(6)]
    places = _cached_call(unet, calls, dict(ratio=0.5, cache=True, cache_interval=2))
    assert set(places) == {"session.py", "steps.py", "families", "caching", "merging"}
    assert {"plan_merge", "merge", "unmerge"} <= places["merging"]  # the blocks a cached step runs are merged
