"""The step cache in whole generations: the WebUI double (with Mikubill's ControlNet double) and the Forge double
(with its built-in ControlNet): which steps are cached, per pass and per cond/uncond call, what the infotext says,
and that nothing is left on the model whatever ends the generation."""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path

import controlnet_double as cnd
import generation
import harness
import pytest
import tiny_models
import torch
from forge_double import backend
from forge_double import harness as forge
from forge_double.unet import controlnet_from_ldm
from generation import Spy, identical, tome_args
from models import rel
from modules import devices, infotext_utils, processing, scripts, shared
from modules.api import api

import tome_core
from tome_core import run as R
from tome_core import settings as S
from tome_core.caching.schedule import uniform_plan
from tome_core.families import layout_for
from webui_tome import extension as ext

ROOT = Path(__file__).resolve().parents[1]
F, C = False, True  # a full call, a cached one


def cached_schedule(steps: int, interval: int) -> list[bool]:
    return uniform_plan(S.ToMeSettings(cache=True, cache_interval=interval), steps)


def untouched(model: torch.nn.Module, root_forward: bool = False) -> bool:
    """No patch, hook or instance-level forward anywhere in ``model`` (``root_forward``: except the root's own, which
    Mikubill's ControlNet leaves as an instance attribute after its restore)."""
    return all(
        tome_core.get_patch(m) is None
        and ("forward" not in m.__dict__ or (root_forward and m is model))
        and not (m._forward_pre_hooks or m._forward_hooks)
        for m in model.modules()
    )


@pytest.fixture(scope="module")
def sd_model():
    return tiny_models.make_tiny_sd_model("sd1", seed=0)


@pytest.fixture
def webui(sd_model):
    txt, img = harness.start_webui([str(ROOT)], sd_model=sd_model)
    yield txt, img
    tome_core.remove_patch(sd_model)
    shared.opts.batch_cond_uncond = True
    harness.reset_webui()


def generate(runner, script_args, model, **kwargs):
    res, (spy,) = generation.generate(
        harness.make_txt2img, runner, script_args, [model.model.diffusion_model], **kwargs
    )
    return res, spy


# --- the WebUI ------------------------------------------------------------------------------------------------


def test_a_generation_caches_the_scheduled_steps_says_so_and_leaves_nothing(webui, sd_model):
    txt, _ = webui
    harness.start_webui([], sd_model=sd_model)
    _, base = generate(scripts.scripts_txt2img, None, sd_model, steps=5)
    txt, _ = harness.start_webui([str(ROOT)], sd_model=sd_model)
    res, spy = generate(txt, tome_args(txt, ratio=0.0, cache=True, cache_interval=2), sd_model, steps=5)
    assert spy.cached == cached_schedule(5, 2) == [F, C, F, C, F]
    assert identical(spy.outputs[:1], base.outputs[:1])  # the first step is a full, unmerged one: plain's
    assert not torch.equal(spy.outputs[1], base.outputs[1])
    text = res.infotexts[0]
    assert "ToMe cache: True" in text and "ToMe cache interval: 2" in text and "ToMe ratio: 0.0" in text
    assert untouched(sd_model)
    _, after = generate(txt, None, sd_model, steps=5)
    assert identical(after.outputs, base.outputs)


def test_cond_and_uncond_called_separately_each_keep_their_cache(webui, sd_model):
    txt, _ = webui
    args = tome_args(txt, ratio=0.5, cache=True, cache_interval=2)
    _, batched = generate(txt, args, sd_model, steps=5)
    shared.opts.batch_cond_uncond = False
    _, separate = generate(txt, args, sd_model, steps=5)
    assert separate.cached == [c for c in cached_schedule(5, 2) for _ in (0, 1)]
    joined = [torch.cat(separate.outputs[i : i + 2]) for i in range(0, len(separate.outputs), 2)]
    assert len(joined) == len(batched.outputs) and max(map(rel, joined, batched.outputs)) < 1e-4


def test_the_hires_pass_starts_a_fresh_cache_with_its_own_interval(webui, sd_model):
    txt, _ = webui
    args = tome_args(txt, cache=True, cache_interval=2, hires_cache_interval=3)
    res, spy = generate(txt, args, sd_model, steps=4, enable_hr=True, hr_scale=1.5, hr_second_pass_steps=4)
    assert spy.cached == [*cached_schedule(4, 2), *cached_schedule(4, 3)] == [F, C, F, F, F, C, C, F]
    assert [s.cache_interval for s in spy.calls] == [2] * 4 + [3] * 4
    assert 'ToMe cache steps: "3 full, 1 cached; hires 2 full, 2 cached"' in res.infotexts[0]
    share = [layout_for(sd_model.model.diffusion_model, 0).skipped_share(size) for size in ((8, 8), (12, 12))]
    speed = f"{4 / (3 + (1 - share[0])):.2f}x; hires {4 / (2 + 2 * (1 - share[1])):.2f}x"
    assert f"ToMe cache speed-up: {speed}," in res.infotexts[0]  # what those steps imply for the UNet's blocks


@pytest.mark.parametrize("forecast", ["off", "linear"])
def test_cached_steps_take_the_forecast_the_setting_names(webui, sd_model, forecast):
    txt, _ = webui
    unet = sd_model.model.diffusion_model
    entry, seen = unet.output_blocks[-1][0], []  # branch 0: the first layer of the block the deep features enter
    handle = entry.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))  # its input as it ran
    try:
        args = tome_args(txt, ratio=0.0, cache=True, cache_interval=2, cache_forecast=forecast)
        res, spy = generate(txt, args, sd_model, steps=6)
    finally:
        handle.remove()
    assert spy.cached == cached_schedule(6, 2) == [F, C, F, C, F, F]
    deep = [x[:, : x.shape[1] // 2] for x in seen]  # what enters from below, beside the skip connection
    assert torch.equal(deep[1], deep[0])  # one full step known: the last one's features either way
    assert torch.equal(deep[3], deep[2]) == (forecast == "off")  # two known: linear extrapolates from them
    assert 'ToMe cache steps: "4 full, 2 cached"' in res.infotexts[0]
    assert "ToMe seed" not in res.infotexts[0]  # the cache alone draws no random partition: no seed to tell
    assert ("ToMe cache forecast: off" in res.infotexts[0]) == (forecast == "off")  # linear is the default
    assert untouched(sd_model)


def test_the_adaptive_schedule_at_threshold_0_is_plain_and_says_every_step_was_full(webui, sd_model):
    txt, _ = webui
    _, base = generate(txt, tome_args(txt, ratio=0.0), sd_model, steps=5)
    args = tome_args(txt, ratio=0.0, cache=True, cache_schedule="adaptive", cache_threshold=0.0)
    res, spy = generate(txt, args, sd_model, steps=5)
    assert spy.cached == [F] * 5 and identical(spy.outputs, base.outputs)
    text = res.infotexts[0]
    assert "ToMe cache schedule: adaptive" in text and "ToMe cache threshold: 0.0" in text
    assert 'ToMe cache steps: "5 full, 0 cached"' in text


def test_img2img_starts_a_fresh_cache(webui, sd_model):
    _, img = webui
    args = tome_args(img, cache=True, cache_interval=2)
    _, (spy,) = generation.generate(generation.img2img, img, args, [sd_model.model.diffusion_model], steps=8)
    assert spy.cached and spy.cached[0] is F and C in spy.cached and spy.cached[-1] is F
    assert untouched(sd_model)


def test_below_the_minimum_size_the_cache_runs_alone(webui, sd_model):
    txt, _ = webui
    res, spy = generate(txt, tome_args(txt, ratio=0.5, min_size=100, cache=True), sd_model, steps=4)
    assert [s.ratio for s in spy.calls] == [0.0] * 4 and spy.cached == cached_schedule(4, 3)
    assert "below the minimum size" in json.loads(res.js())["extra_generation_params"][R.NOTE_KEY]


@pytest.mark.parametrize(
    "failure",
    [
        lambda: devices.NansException("A tensor with all NaNs was produced in Unet."),
        lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        lambda: RuntimeError("something inside the UNet broke"),
    ],
)
def test_failure_on_a_cached_step_leaves_nothing_behind(webui, sd_model, failure):
    txt, _ = webui
    p = harness.make_txt2img(txt, script_args=tome_args(txt, cache=True, cache_interval=3), steps=4)
    unet = sd_model.model.diffusion_model
    seen = []

    def fail_when_cached(module, args):  # inside the UNet, in the one output block a cached step runs
        patch = tome_core.get_patch(unet)
        seen.append(patch.cache.cached_now)
        if patch.cache.cached_now:
            raise failure()

    handle = unet.output_blocks[-1].register_forward_pre_hook(fail_when_cached)
    try:
        with pytest.raises((devices.NansException, RuntimeError)), closing(p):
            processing.process_images(p)
    finally:
        handle.remove()
    assert seen == [F, C]
    assert untouched(sd_model)


def test_infotext_round_trip_restores_the_cache_settings(webui, sd_model):
    txt, _ = webui
    chosen = dict(
        enabled=True,
        cache=True,
        cache_interval=4,
        cache_branch=1,
        cache_start=0.1,
        cache_end=0.9,
        hires_cache_interval=2,
        cache_forecast="off",
        cache_schedule="adaptive",
        cache_threshold=0.12,
    )
    res, _ = generate(txt, tome_args(txt, **chosen), sd_model, seed=77)
    text = res.infotexts[0]
    assert "ToMe cache branch: 1" in text and "ToMe hires cache interval: 2" in text
    script = generation.tome_script(txt)
    pasted = infotext_utils.apply_paste_fields(script.infotext_fields, text)
    restored = S.from_args([pasted[c] for c, _ in script.infotext_fields])
    assert restored == S.from_dict({**chosen, "seed": 77})


def test_xyz_cells_take_their_own_forecast_and_schedule(webui, sd_model):
    txt, _ = webui
    xyz = next(d.module for d in scripts.scripts_data if d.script_class.__module__ == "xyz_grid.py")
    options = {o.label: o for o in xyz.axis_options}
    p = harness.make_txt2img(txt, script_args=tome_args(txt, ratio=0.0, cache=True), width=64, height=64, steps=4)
    spy = Spy(sd_model.model.diffusion_model)
    try:
        cells = [xyz.run_cell(p, options["[ToMe] Cache forecast"], v) for v in ("off", "linear")]
        cells += [xyz.run_cell(p, options["[ToMe] Cache threshold"], "0")]
    finally:
        spy.close()
    assert [s.cache_forecast for s in spy.calls] == ["off"] * 4 + ["linear"] * 4 + ["auto"] * 4
    assert [c.infotexts[0].count("ToMe cache forecast: off") for c in cells] == [1, 0, 0]
    assert all('ToMe cache steps: "2 full, 2 cached"' in c.infotexts[0] for c in cells)  # threshold: uniform ignores it
    assert not hasattr(p, ext.OVERRIDES_ATTR)


def test_xyz_cells_turn_the_cache_on_and_off_for_themselves(webui, sd_model):
    txt, _ = webui
    xyz = next(d.module for d in scripts.scripts_data if d.script_class.__module__ == "xyz_grid.py")
    axis = {o.label: o for o in xyz.axis_options}["[ToMe] Step cache"]
    p = harness.make_txt2img(txt, script_args=tome_args(txt), width=64, height=64, steps=4)
    spy = Spy(sd_model.model.diffusion_model)
    try:
        cells = [xyz.run_cell(p, axis, v) for v in ("True", "False", "True")]
    finally:
        spy.close()
    assert spy.cached == [*cached_schedule(4, 3), *[F] * 4, *cached_schedule(4, 3)]
    assert ["ToMe cache: True" in c.infotexts[0] for c in cells] == [True, False, True]
    assert not hasattr(p, ext.OVERRIDES_ATTR)


@pytest.mark.parametrize(
    "values, field, fragment",
    [
        ({"cache_interval": 0}, "cache_interval", "an integer from 1 to 10"),
        ({"cache": "on"}, "cache", "true or false"),
        ({"cache_start": 0.6, "cache_end": 0.4}, "cache_end", "greater than cache_start"),
        ({"cache": True, "cache_branch": 12}, "cache_branch", "from 0 to 11"),
        ({"cache": True, "cache_forecast": "cubic"}, "cache_forecast", "one of 'off', 'linear'"),
        ({"cache": True, "cache_schedule": "adaptive", "cache_threshold": 2}, "cache_threshold", "from 0 to 1"),
    ],
)
def test_bad_cache_settings_patch_nothing_and_say_why(webui, sd_model, values, field, fragment):
    txt, _ = webui
    spy = Spy(sd_model.model.diffusion_model)
    try:
        body = {"prompt": "a cat", "steps": 2, "width": 64, "height": 64, "seed": 5}
        body["alwayson_scripts"] = {"ToMe": {"args": [{"enabled": True, **values}]}}
        response = api.text2imgapi(body, txt)
    finally:
        spy.close()
    assert spy.calls and all(s is None for s in spy.calls)
    message = json.loads(response["info"])["extra_generation_params"][R.ERROR_KEY]
    assert f"'{field}'" in message and fragment in message


def test_a_branch_sdxl_lacks_is_named_with_the_model_s_range():
    model = tiny_models.make_tiny_sd_model("sdxl", seed=0)
    txt, _ = harness.start_webui([str(ROOT)], sd_model=model)
    try:
        res, spy = generate(txt, tome_args(txt, cache=True, cache_branch=10), model, width=128, height=128, steps=2)
    finally:
        harness.reset_webui()
    assert spy.calls and all(s is None for s in spy.calls) and untouched(model)
    message = json.loads(res.js())["extra_generation_params"][R.ERROR_KEY]
    assert "'cache_branch' = 10" in message and "from 0 to 8 for this UNet" in message


# --- Mikubill's ControlNet (its own UNet forward) ------------------------------------------------------------


class ControlNetScript(cnd.ControlNetScript, scripts.Script):
    """The ControlNet double as one of the WebUI double's AlwaysVisible scripts."""


def _hint(kind: int) -> torch.Tensor:
    """Two control images that differ in structure: 1 is noise, 2 a smooth ramp."""
    if kind == 1:
        return torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    return torch.linspace(0, 1, 64).view(1, 1, 1, 64).expand(1, 3, 64, 64).contiguous()


@pytest.fixture
def controlnet(webui):
    """One ControlNet script for the whole test, as in the WebUI (its hook is restored by its next generation)."""
    txt, _ = webui
    script = ControlNetScript([])
    txt.alwayson_scripts.append(script)
    txt.scripts.append(script)
    return script


def test_controlnet_generation_caches_its_steps_and_leaves_nothing(webui, controlnet, sd_model):
    txt, _ = webui
    control = cnd.make_control_net(context_dim=tiny_models.CONTEXT_DIM, model_channels=32, seed=7)
    controlnet.units = [cnd.ControlNetUnit(model=control, image=_hint(1), module="canny")]
    res, spy = generate(txt, tome_args(txt, ratio=0.5, cache=True, cache_interval=3), sd_model, steps=4)
    assert spy.cached == cached_schedule(4, 3) == [F, C, C, F]
    assert R.ERROR_KEY not in res.js() and R.NOTE_KEY not in res.js()
    assert untouched(sd_model.model.diffusion_model, root_forward=True)
    assert untouched(control.control_model)  # a control model is merged, never cached


def test_controlnet_cached_step_is_deepcache_with_that_steps_control_residual(webui, sd_model):
    """Through Mikubill's own UNet loop: a cached step's output is the last output block run on [the deep features
    cached at the full step, the first input block's output plus the control residual of THIS step (its hint)],
    computed here by hand."""
    from ldm.modules.diffusionmodules.util import timestep_embedding

    unet = sd_model.model.diffusion_model
    control = cnd.make_control_net(context_dim=tiny_models.CONTEXT_DIM, model_channels=32, seed=7)
    x0 = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    x1 = x0 * 0.9
    ctx = torch.randn(2, 7, tiny_models.CONTEXT_DIM, generator=torch.Generator().manual_seed(1))
    t1 = torch.full((2,), 700.0)
    hook = cnd.UnetHook()
    param = cnd.ControlParams(control_model=control, hint_cond=_hint(1))
    hook.hook(model=unet, sd_ldm=cnd.FakeSDModel(unet), control_params=[param], process=None)
    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3)
    try:
        with torch.no_grad():
            patch.set_progress(0.0, 4)
            unet(x0, torch.full((2,), 999.0), context=ctx)
            deep = patch.cache.cached_features()[0].clone()
            param.hint_cond, param.used_hint_cond = _hint(2), None  # another control image for the next step
            patch.set_progress(0.25, 4)
            got = unet(x1, t1, context=ctx)
            assert patch.report().cache.cached == 1
    finally:
        tome_core.remove_patch(unet)
        hook.restore()
    with torch.no_grad():
        emb = unet.time_embed(timestep_embedding(t1, unet.model_channels, repeat_only=False))
        residual = control.control_model(x=x1, hint=_hint(2).expand(2, -1, -1, -1), timesteps=t1, context=ctx)[0]
        skip = unet.input_blocks[0](x1, emb, ctx) + residual
        expected = unet.out(unet.output_blocks[-1](torch.cat([deep, skip], dim=1), emb, ctx))
    assert rel(got, expected) < 1e-6
    assert untouched(unet, root_forward=True)


def test_controlnet_control_model_is_shortened_on_cached_steps_with_the_same_output(webui, sd_model):
    """Inside Mikubill's loop the cached step reads only residual 0 (branch 0): the control model's deeper blocks
    answer with zeros there, and the UNet's output is bit-identical to running them."""
    unet = sd_model.model.diffusion_model
    control = cnd.make_control_net(context_dim=tiny_models.CONTEXT_DIM, model_channels=32, seed=7)
    net = control.control_model
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    ctx = torch.randn(2, 7, tiny_models.CONTEXT_DIM, generator=torch.Generator().manual_seed(1))
    outs, deep_calls = {}, {}
    for shorten in (False, True):
        hook = cnd.UnetHook()
        hook.hook(model=unet, sd_ldm=cnd.FakeSDModel(unet), control_params=[cnd.ControlParams(net, hint_cond=_hint(1))])
        patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3)
        follower = tome_core.apply_settings(net, S.ToMeSettings(ratio=0.0), leader=patch.cache) if shorten else None
        calls = []
        counter = net.middle_block[0].register_forward_hook(lambda *a, calls=calls: calls.append(1))  # inside it
        try:
            with torch.no_grad():
                for i, t in enumerate((999.0, 700.0, 400.0)):
                    patch.set_progress(i / 4, 4)
                    outs[shorten, i] = unet(x * (1 - 0.1 * i), torch.full((2,), t), context=ctx)
            deep_calls[shorten] = len(calls)
            if follower is not None:
                assert follower.follower.shortened > 0
        finally:
            counter.remove()
            tome_core.remove_patch(net)
            tome_core.remove_patch(unet)
            hook.restore()
    assert all(torch.equal(outs[True, i], outs[False, i]) for i in range(3))
    assert deep_calls == {False: 3, True: 1}  # the middle block ran at the full step only
    assert untouched(net) and untouched(unet, root_forward=True)


def test_controlnet_generation_with_the_cache_shortens_the_control_model(webui, controlnet, sd_model):
    txt, _ = webui
    control = cnd.make_control_net(context_dim=tiny_models.CONTEXT_DIM, model_channels=32, seed=7)
    controlnet.units = [cnd.ControlNetUnit(model=control, image=_hint(1), module="canny")]
    calls = []
    counter = control.control_model.middle_block[0].register_forward_hook(lambda *a: calls.append(1))
    try:
        _, spy = generate(txt, tome_args(txt, merge_controlnet=False, cache=True, cache_interval=3), sd_model, steps=4)
    finally:
        counter.remove()
    assert spy.cached == [F, C, C, F] and len(calls) == 2  # the control model's middle block: full steps only
    assert untouched(control.control_model)


@pytest.mark.parametrize("mode", ["reference_only", "reference_adain+attn"])
def test_controlnet_reference_pass_inside_a_call_keeps_its_own_cache(webui, controlnet, sd_model, mode):
    """Reference-only runs a reference pass through the same blocks before the main one, inside every UNet call: the
    cache keeps one record per pass, so both passes of a cached call are served from their own full pass."""
    txt, _ = webui
    unet = sd_model.model.diffusion_model
    reference = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    controlnet.units = [cnd.ControlNetUnit(model=None, module=mode, image=_hint(1), reference_latent=reference)]
    held = []
    handle = unet.register_forward_hook(
        lambda m, a, out: held.append(len(tome_core.get_patch(m).cache.cached_features()))
    )
    seeding = unet.register_forward_pre_hook(lambda m, a: torch.manual_seed(len(held)) and None)  # its global RNG
    try:
        res, spy = generate(txt, tome_args(txt, cache=True, cache_interval=3), sd_model, steps=4)
    finally:
        handle.remove()
        seeding.remove()
    assert spy.cached == cached_schedule(4, 3) and held == [2, 2, 2, 2]  # two passes, two records
    assert R.ERROR_KEY not in res.js()
    ours = [
        b for b in unet.modules() if getattr(b.__dict__.get("forward"), "__module__", "") == "tome_core.caching.cache"
    ]
    assert not ours and tome_core.get_patch(unet) is None  # reference-only's own instance forwards are its business


def test_the_refiner_switch_starts_a_fresh_cache_on_the_model_switched_in():
    main = tiny_models.make_tiny_sd_model("sd1", seed=0)
    refiner = tiny_models.TinySdModel(tiny_models.make_tiny_sd15_unet(1), name="tiny-refiner")
    txt, _ = harness.start_webui([str(ROOT)], sd_model=refiner)
    seen = []  # (model, whether the call was cached)
    handles = [
        m.model.diffusion_model.register_forward_hook(
            lambda mod, a, out, m=m: seen.append((m, tome_core.get_patch(mod).cache.cached_now))
        )
        for m in (main, refiner)
    ]
    try:
        from modules import sd_models

        sd_models.load_model(main)
        args = tome_args(txt, cache=True, cache_interval=2)
        p = harness.make_txt2img(
            txt, script_args=args, steps=6, refiner_checkpoint="tiny-refiner", refiner_switch_at=0.5
        )
        with closing(p):
            processing.process_images(p)
    finally:
        for h in handles:
            h.remove()
        tome_core.remove_patch(main)
        tome_core.remove_patch(refiner)
        harness.reset_webui()
    assert seen == [(main, F), (main, C), (main, F), (refiner, F), (refiner, C), (refiner, F)]
    assert untouched(main.model.diffusion_model) and untouched(refiner.model.diffusion_model)


# --- Forge -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def forge_build():
    return forge.engine_builder("sd15", seed=0, name="forge-sd15-cache")


@pytest.fixture
def start_forge(forge_build):
    txt, img = forge.start_forge([str(ROOT)], checkpoints={"sd15": forge_build})
    yield txt, img
    tome_core.remove_patch(forge_build().forge_objects.unet.model.diffusion_model)
    forge.reset_forge()


def test_forge_caches_its_chunks_and_is_bit_identical_after(start_forge, forge_build):
    txt, _ = start_forge
    unet = forge_build().forge_objects.unet.model.diffusion_model
    _, (base,) = generation.generate(forge.make_txt2img, txt, None, [unet], steps=5)
    res, (spy,) = generation.generate(
        forge.make_txt2img, txt, tome_args(txt, cache=True, cache_interval=2), [unet], steps=5
    )
    assert spy.cached == cached_schedule(5, 2)
    assert "ToMe cache: True" in res.infotexts[0] and untouched(unet)
    _, (after,) = generation.generate(forge.make_txt2img, txt, None, [unet], steps=5)
    assert identical(after.outputs, base.outputs)


def test_forge_chunks_each_decide_on_the_adaptive_schedule_and_the_infotext_counts_the_steps(start_forge, forge_build):
    txt, _ = start_forge
    unet = forge_build().forge_objects.unet.model.diffusion_model
    args = tome_args(txt, ratio=0.0, cache=True, cache_interval=4, cache_schedule="adaptive", cache_threshold=1.0)
    res, (spy,) = generation.generate(forge.make_txt2img, txt, args, [unet], steps=6)
    # a threshold of 1 never refreshes early: the guard rails alone (the interval caps a run of cached steps at 3)
    assert spy.cached == [F, C, C, C, F, F]
    assert 'ToMe cache steps: "3 full, 3 cached"' in res.infotexts[0] and untouched(unet)


def test_forge_builtin_controlnet_generation_caches_its_steps_and_leaves_nothing(start_forge, forge_build):
    txt, _ = start_forge
    unet = forge_build().forge_objects.unet.model.diffusion_model
    net = controlnet_from_ldm(cnd.make_control_net().control_model)
    backend.CONTROL_MODELS["canny"] = backend.ControlNet(net)
    cn = next(s for s in txt.alwayson_scripts if s.title() == "ControlNet")
    args = tome_args(txt, ratio=0.5, cache=True, cache_interval=3)
    args[cn.args_from] = [{"model": "canny", "image": _hint(1)}]
    res, (spy,) = generation.generate(forge.make_txt2img, txt, args, [unet], steps=4)
    assert spy.cached == cached_schedule(4, 3) and R.ERROR_KEY not in res.js()
    assert untouched(unet) and untouched(net)


def test_forge_cached_step_is_deepcache_with_that_steps_control_residual():
    """Forge's loop adds each control residual into the block outputs in place, skipped blocks' zeros included; the
    cached step's output is the last output block on [cached deep features, first input block + this step's residual]."""
    from forge_double.unet import unet_from_ldm
    from models import make_unet

    unet = unet_from_ldm(make_unet("sd15"))
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 4, 8, 8, generator=gen)
    x1, ctx, t1 = x0 * 0.9, torch.randn(2, 7, 64, generator=gen), torch.full((2,), 700.0)

    def control(seed: int) -> dict:
        g = torch.Generator().manual_seed(seed)
        sizes = [(32, 8)] * 3 + [(32, 4)] + [(64, 4)] * 2 + [(64, 2)] + [(128, 2)] * 2 + [(128, 1)] * 3
        shapes = [(2, c, s, s) for c, s in sizes]  # input_blocks[i]'s output, the skip it adds to
        return {"output": [0.1 * torch.randn(s, generator=g) for s in shapes], "middle": [torch.zeros(2, 128, 1, 1)]}

    patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3)
    try:
        with torch.no_grad():
            patch.set_progress(0.0, 4)
            unet(x0, torch.full((2,), 999.0), context=ctx, control=control(1), transformer_options={})
            deep = patch.cache.cached_features()[0].clone()
            patch.set_progress(0.25, 4)
            got = unet(x1, t1, context=ctx, control=control(2), transformer_options={})
            assert patch.report().cache.cached == 1
    finally:
        tome_core.remove_patch(unet)
    with torch.no_grad():
        emb = unet._embed(x1, t1, None)
        skip = unet.input_blocks[0](x1, emb, ctx, {}) + control(2)["output"][0]
        expected = unet.out(unet.output_blocks[-1](torch.cat([deep, skip], dim=1), emb, ctx, {}, None))
    assert rel(got, expected) < 1e-6 and untouched(unet)
