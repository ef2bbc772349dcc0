"""The step cache on FLUX as ComfyUI and Forge Neo run it, and on HunyuanVideo as ComfyUI runs it (issue 26): Black
Forest Labs' layout as a model family (``tome_core.families.bfl``), on the double ``tests/bfl_flux_double.py`` (blocks
that add in place, ControlNet residuals added in place between blocks, ``patches_replace["dit"]``)."""

from __future__ import annotations

import pytest
import torch
from bfl_flux_double import Flux, HunyuanVideo

import tome_core
from tome_core.families import BflFlux, layout_for
from tome_core.settings import SettingsError, ToMeSettings

OFF = ToMeSettings(ratio=0.0, cache=True, cache_interval=2, cache_forecast="off", cache_schedule="uniform")


@pytest.fixture(scope="module", params=[Flux, HunyuanVideo])
def model(request):
    """FLUX's loop, and HunyuanVideo's (the same blocks and names, the streams joined image first)."""
    return request.param(seed=3).eval().requires_grad_(False)


def _calls(sigmas=(0.9, 0.8, 0.7, 0.6), control=None):
    gen = torch.Generator().manual_seed(1)
    x, context = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 5, 32, generator=gen)
    y = torch.randn(2, 8, generator=gen)
    return [
        {"x": x + 0.1 * i, "timestep": torch.full((2,), s), "context": context, "y": y, "control": control}
        for i, s in enumerate(sigmas)
    ]


def _run(model, calls, patch=None, options=None):
    outs = []
    with torch.no_grad():
        for i, kwargs in enumerate(calls):
            if patch is not None:
                patch.set_progress(i / len(calls), len(calls))
            control = kwargs["control"]
            control = None if control is None else {k: [a.clone() for a in v] for k, v in control.items()}
            call = {**kwargs, "control": control}
            outs.append(model(call.pop("x"), call.pop("timestep"), transformer_options=dict(options or {}), **call))
    return outs


def _cached(model, calls, settings=OFF, options=None):
    patch = tome_core.apply_settings(model, settings)
    try:
        outs = _run(model, calls, patch, options)
        report = patch.report()
    finally:
        tome_core.remove_patch(model)
    return outs, report


def test_the_family_is_found_by_its_blocks_and_names_its_branch_bound(model):
    layout = layout_for(model, 0)
    assert isinstance(layout, BflFlux) and layout.start is model.double_blocks[0]
    assert layout.skipped == [model.double_blocks[1], *model.single_blocks] and layout.entry is model.final_layer
    assert layout.doubles == 1 and len(layout_for(model, 1).skipped) == 3
    with pytest.raises(SettingsError, match=r"cache_branch.*from 0 to 1 for this model"):
        layout_for(model, 2)


def test_the_cache_acts_and_leaves_the_model_bit_identical(model):
    calls = _calls((0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6))
    plain = _run(model, calls)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    settings = ToMeSettings(ratio=0.0, cache=True, cache_interval=3, cache_schedule="uniform")
    cached, report = _cached(model, calls, settings)
    assert [p.to_dict() for p in report.cache.passes] == [{"full": 3, "cached": 4, "skipped": 0}]
    assert report.notes == ()  # merging was not asked for: no "nothing merged"
    assert torch.equal(cached[0], plain[0]) and not torch.equal(cached[1], plain[1])
    assert (cached[1] - plain[1]).abs().max() < 0.1 * plain[1].abs().max()  # near the full step, not beside it
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(a, b) for a, b in zip(_run(model, calls), plain))


def _seen(model, calls):
    """What left the probe (a copy, before the next block adds to it in place) and what entered ``final_layer``, per
    call of the plain model, and the ``vec`` of each call."""
    seen: dict[str, list] = {"left": [], "final": [], "vec": []}
    handles = [
        model.double_blocks[1].register_forward_pre_hook(
            lambda m, a, k: seen["left"].append(k["img"].clone()), with_kwargs=True
        ),
        model.final_layer.register_forward_pre_hook(lambda m, a: seen["final"].append(a[0])),
        model.final_layer.register_forward_pre_hook(lambda m, a: seen["vec"].append(a[1])),
    ]
    try:
        _run(model, calls)
    finally:
        for h in handles:
            h.remove()
    return seen


def test_a_cached_step_gives_the_output_layer_what_left_its_probe_plus_the_full_steps_residual(model):
    """The blocks add to their input in place: the residual is taken against a copy of what left the probe."""
    calls = _calls()[:2]
    seen = _seen(model, calls)
    with torch.no_grad():
        expected = model.final_layer(seen["left"][1] + (seen["final"][0] - seen["left"][0]), seen["vec"][1])
    outs, report = _cached(model, _calls())
    assert report.cache.cached == 1  # step 1 of 0-3
    got = outs[1].reshape(2, 4, 4, 2, 4, 2).permute(0, 2, 4, 1, 3, 5).reshape(2, 16, 16)  # back to tokens
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def _control(scale: float, double: int = 2, single: int = 3):
    gen = torch.Generator().manual_seed(7)
    return {
        "input": [scale * torch.randn(2, 16, 32, generator=gen) for _ in range(double)],
        "output": [scale * torch.randn(2, 16, 32, generator=gen) for _ in range(single)],
    }


def test_control_residuals_of_skipped_blocks_come_from_the_forecast_and_the_probes_stay_live(model):
    """ComfyUI adds a ControlNet's residual in place after every block. At a cached step the skipped blocks' residuals
    are replaced with the forecast (which carries them from the full steps); the probe's is added live."""
    control = _control(0.5)
    with_control, _ = _cached(model, _calls(control=control))
    plain = _run(model, _calls(control=control))
    assert torch.equal(with_control[0], plain[0])  # a full step adds all of them
    # at the cached step 1, the skipped blocks' residuals change nothing: only step 0's reach it, through the forecast
    later = {"input": [control["input"][0], 9 * control["input"][1]], "output": [9 * a for a in control["output"]]}
    steps = [{**c, "control": control if i != 1 else later} for i, c in enumerate(_calls())]
    swapped, _ = _cached(model, steps)
    assert torch.equal(swapped[1], with_control[1])
    probe = {"input": [9 * control["input"][0], control["input"][1]], "output": control["output"]}
    steps = [{**c, "control": control if i != 1 else probe} for i, c in enumerate(_calls())]
    live, _ = _cached(model, steps)
    assert not torch.equal(live[1], with_control[1])
    # and the control effect of the cached step follows the full model's (what a ControlNet adds shows in the image)
    effect = (with_control[1] - _cached(model, _calls())[0][1]).flatten()
    full = (plain[1] - _run(model, _calls())[1]).flatten()
    assert torch.corrcoef(torch.stack([effect, full]))[0, 1] > 0.7


def test_blocks_called_through_another_nodes_dit_replacement_are_still_skipped(model):
    replaced, computed = [], []

    def replace(args, extra):
        replaced.append(1)
        return extra["original_block"](args)

    options = {"patches_replace": {"dit": {("double_block", 1): replace, ("single_block", 0): replace}}}
    plain = _run(model, _calls(), options=options)
    handle = model.single_blocks[0].linear1.register_forward_hook(lambda *a: computed.append(1))
    try:
        outs, report = _cached(model, _calls(), options=options)
    finally:
        handle.remove()
    assert report.cache.cached == 1 and len(replaced) == 8 + 8 and len(computed) == 3  # not at the cached step
    ours, _ = _cached(model, _calls())
    assert torch.equal(outs[1], ours[1]) and torch.equal(outs[0], plain[0])


def test_auto_is_the_linear_forecast_on_the_uniform_schedule_on_flux_and_calibrated_time_on_a_unet(model, sd15_unet):
    from tome_core.caching.cache import StepCache

    settings = ToMeSettings(ratio=0.0, cache=True)
    assert (settings.cache_forecast, settings.cache_schedule) == ("auto", "auto")
    flux = StepCache(model, settings, layout_for(model, 0)).settings
    unet = StepCache(sd15_unet, settings, layout_for(sd15_unet, 0)).settings
    assert (flux.cache_forecast, flux.cache_schedule) == ("linear", "uniform")
    assert (unet.cache_forecast, unet.cache_schedule) == ("calibrated", "time")
    chosen = StepCache(
        model, settings.replace(cache_forecast="calibrated", cache_schedule="time"), layout_for(model, 0)
    ).settings
    assert (chosen.cache_forecast, chosen.cache_schedule) == ("calibrated", "time")  # a choice is kept
    auto, _ = _cached(model, _calls(), settings)
    explicit, _ = _cached(model, _calls(), settings.replace(cache_forecast="linear", cache_schedule="uniform"))
    assert all(torch.equal(a, b) for a, b in zip(auto, explicit))
