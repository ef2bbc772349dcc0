"""The adaptive schedule reads its signal on every input shape a family places (issue 37): a transformer's 3-D token
sequence (diffusers' FLUX), a video latent's 5-D grid (Wan, Cosmos Predict2) as on a 4-D image latent (BFL FLUX).
It used to read only 4-D inputs and ran every step in full on the others, without a word."""

from __future__ import annotations

import pytest
import torch
from bfl_flux_double import Flux
from chain_doubles import MiniTrainDIT
from wan_double import WanModel

import tome_core
from benchmarks.lab.trained import flux
from tome_core.caching.schedule import uniform_plan
from tome_core.settings import ToMeSettings

STEPS = 9
ADAPTIVE = dict(ratio=0.0, cache=True, cache_interval=3, cache_schedule="adaptive", cache_forecast="linear")


def _bfl(model, x, s):
    return model(x, torch.full((x.shape[0],), s), torch.zeros(x.shape[0], 5, 32))


def _video(model, x, s):
    return model(x, torch.full((x.shape[0],), 1000 * s), torch.zeros(x.shape[0], 5, 32))


def _diffusers(bundle, x, s):
    kwargs = bundle.inputs(x, torch.tensor(s), torch.tensor([2, -1]))
    return flux.unpack(bundle.transformer(**kwargs, return_dict=False)[0], *x.shape[-2:])


def _no_wrappers(cls):
    def make():
        model = cls()
        model.WRAPPERS = False
        return model

    return make


FAMILIES = {
    "bfl (4-D latent)": (_no_wrappers(Flux), _bfl, (2, 4, 16, 16)),
    "diffusers flux (3-D tokens)": (lambda: flux.build(10, seed=3), _diffusers, (2, 3, 16, 16)),
    "wan (5-D video)": (_no_wrappers(WanModel), _video, (2, 4, 3, 8, 8)),
    "cosmos (5-D video)": (MiniTrainDIT, _video, (2, 4, 2, 8, 8)),
}


def _steps(name: str, threshold: float) -> tuple[list[dict[str, int]], tuple[str, ...]]:
    make, call, shape = FAMILIES[name]
    model = make().eval().requires_grad_(False)
    root = model.transformer if hasattr(model, "transformer") else model
    patch = tome_core.apply_patch(root, **ADAPTIVE, cache_threshold=threshold)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    try:
        with torch.no_grad():
            for i in range(STEPS):
                patch.set_progress(i / STEPS, STEPS)
                x = x - call(model, x, 1 - i / STEPS) / STEPS
        return tome_core.cache_stats(root), patch.report().notes
    finally:
        tome_core.remove_patch(root)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_lax_threshold_caches_where_the_uniform_schedule_does_on_every_input_shape(name):
    stats, notes = _steps(name, threshold=1.0)
    uniform = uniform_plan(ToMeSettings(**ADAPTIVE).resolved("linear", "uniform"), STEPS)
    assert stats == [{"full": uniform.count(False), "cached": uniform.count(True), "skipped": 0}], notes


@pytest.mark.parametrize("name", list(FAMILIES))
def test_threshold_0_runs_every_step_in_full_on_every_input_shape(name):
    stats, _ = _steps(name, threshold=0.0)
    assert stats == [{"full": STEPS, "cached": 0, "skipped": 0}]
