"""The step cache on a diffusion transformer (issue 26): diffusers' FLUX transformer as a model family
(``tome_core.families.flux``), through the same engine as the UNets."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import tome_core
from benchmarks.lab.trained import flux
from tome_core.families import DiffusersFlux, UNetLayout, layout_for
from tome_core.settings import SettingsError, ToMeSettings


@pytest.fixture(scope="module")
def model():
    return flux.build(10, seed=3).eval().requires_grad_(False)


def _calls(model, sigmas=(0.9, 0.8, 0.7, 0.6)):
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    return [model.inputs(x + 0.1 * i, torch.tensor(s), torch.tensor([2, -1])) for i, s in enumerate(sigmas)]


def _run(model, calls, patch=None):
    outs = []
    with torch.no_grad():
        for i, kwargs in enumerate(calls):
            if patch is not None:
                patch.set_progress(i / len(calls), len(calls))
            outs.append(model.transformer(**kwargs, return_dict=False)[0])
    return outs


def test_the_family_is_found_by_its_blocks_and_names_its_branch_bound(model):
    layout = layout_for(model.transformer, 0)
    assert isinstance(layout, DiffusersFlux) and layout.start is model.transformer.transformer_blocks[0]
    assert layout.skipped == [*model.transformer.transformer_blocks[1:], *model.transformer.single_transformer_blocks]
    assert layout.entry is model.transformer.norm_out
    assert len(layout_for(model.transformer, 2).skipped) == 6  # the probe: the first three double blocks
    with pytest.raises(SettingsError, match="cache_branch"):
        layout_for(model.transformer, 3)
    assert layout_for(nn.Linear(2, 2), 0) is None
    assert not isinstance(layout_for(model.transformer, 0), UNetLayout)


def test_a_cached_step_adds_the_last_full_steps_residual_to_what_left_its_probe(model):
    """``cache_forecast: off`` (DeepCache's reuse) at N=2 of 4 steps: step 1 is cached; its image stream enters the norm
    as the probe's output at step 1 plus (what entered the norm − what left the probe) at step 0."""
    calls = _calls(model)
    t = model.transformer
    seen: dict[str, list] = {"left": [], "norm": []}
    handles = [
        t.transformer_blocks[1].register_forward_pre_hook(
            lambda m, a, k: seen["left"].append(k["hidden_states"]), with_kwargs=True
        ),
        t.norm_out.register_forward_pre_hook(lambda m, a: seen["norm"].append(a)),
    ]
    try:
        _run(model, calls[:2])
    finally:
        for h in handles:
            h.remove()
    (norm0, _), (_, temb1) = seen["norm"]
    with torch.no_grad():
        expected = t.proj_out(t.norm_out(seen["left"][1] + (norm0 - seen["left"][0]), temb1))
    settings = ToMeSettings(ratio=0.0, cache=True, cache_interval=2, cache_forecast="off", cache_schedule="uniform")
    patch = tome_core.apply_settings(t, settings)
    try:
        outs = _run(model, calls, patch)
        report = patch.report()
    finally:
        tome_core.remove_patch(t)
    assert [p.to_dict() for p in report.cache.passes] == [{"full": 3, "cached": 1, "skipped": 0}]  # 0, 2, 3
    torch.testing.assert_close(outs[1], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("forecast", ["off", "linear", "calibrated"])
def test_the_cache_acts_and_leaves_the_model_bit_identical(model, forecast):
    calls = _calls(model, (0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6))
    t = model.transformer
    plain = _run(model, calls)
    state = {k: v.clone() for k, v in t.state_dict().items()}
    classes = [type(m) for m in t.modules()]
    settings = ToMeSettings(ratio=0.0, cache=True, cache_interval=3, cache_forecast=forecast, cache_schedule="uniform")
    patch = tome_core.apply_settings(t, settings)
    try:
        cached = _run(model, calls, patch)
        report = patch.report()
        assert "forward" in t.single_transformer_blocks[0].__dict__  # compute skipped on the instance
    finally:
        tome_core.remove_patch(t)
    assert [p.to_dict() for p in report.cache.passes] == [{"full": 3, "cached": 4, "skipped": 0}]  # 0, 3, 6
    assert report.notes == ()  # merging was not asked for: no "nothing merged"
    assert torch.equal(cached[0], plain[0]) and not torch.equal(cached[1], plain[1])
    assert all("forward" not in m.__dict__ for m in t.modules())
    assert [type(m) for m in t.modules()] == classes
    assert all(torch.equal(state[k], v) for k, v in t.state_dict().items())
    assert all(torch.equal(a, b) for a, b in zip(_run(model, calls), plain))


@pytest.mark.parametrize("steps, cached", [(4, 0), (5, 2), (None, 2)])
def test_a_pass_too_short_for_a_forecast_runs_in_full_and_says_so(model, steps, cached):
    """At N=2 a 4-step pass caches only step 1, before its second full step: it could only reuse step 0's residual,
    which lost to plain with fewer steps (``benchmarks.quality.dit_steps``), so it runs in full; a 5-step pass caches (step 3
    gets a forecast), and so does a pass whose step count nobody reported."""
    calls = _calls(model, (0.9, 0.8, 0.7, 0.6, 0.5)[: steps or 5])
    t = model.transformer
    plain = _run(model, calls)
    patch = tome_core.apply_settings(t, ToMeSettings(ratio=0.0, cache=True, cache_interval=2))  # auto: linear
    try:
        outs = []
        with torch.no_grad():
            for i, kwargs in enumerate(calls):
                if steps is not None:
                    patch.set_progress(i / steps, steps)
                outs.append(t(**kwargs, return_dict=False)[0])
        report = patch.report()
    finally:
        tome_core.remove_patch(t)
    assert report.cache.cached == cached
    short = "step cache off: 4 steps are too few to forecast at cache_interval 2 (from 5)"
    assert (short in report.notes) == (cached == 0)
    assert all(torch.equal(a, b) for a, b in zip(outs, plain)) == (cached == 0)
    assert not UNetLayout.transformer and DiffusersFlux.transformer  # the UNets' few-step passes were not measured


def test_a_block_swapped_by_another_extension_makes_the_cache_step_aside(model):
    t = model.transformer
    calls = _calls(model)
    plain = _run(model, calls)
    patch = tome_core.apply_settings(t, ToMeSettings(ratio=0.0, cache=True, cache_interval=2))
    try:  # another extension wraps a block in a module of its own, in the model's list
        t.transformer_blocks[2] = wrapped = _Wrapper(t.transformer_blocks[2])
        outs = _run(model, calls, patch)
        report = patch.report()
    finally:
        t.transformer_blocks[2] = wrapped.inner
        tome_core.remove_patch(t)
    assert "step cache off: another extension replaced the UNet's blocks" in report.cache.notes
    assert report.cache.cached == 0 and all(torch.equal(a, b) for a, b in zip(outs, plain))


class _Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)
