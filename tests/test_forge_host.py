"""The extension (scripts/tome.py) in the Forge double: full generations through Forge's processing order, on
the Forge-layout UNet that really runs (``forge_objects.unet.model.diffusion_model``)."""

from __future__ import annotations

import copy
import json
from contextlib import closing
from pathlib import Path

import generation
import numpy as np
import pytest
import torch
from forge_double import backend, processing, sd_models
from forge_double import harness as forge
from forge_double.unet import controlnet_from_ldm
from generation import Spy, identical, pixels, tome_script
from modules import devices, errors, infotext_utils, script_callbacks, scripts, shared
from modules.api import api

import tome_core
from tome_core import run as R
from tome_core import settings as S
from tome_core.caching.schedule import uniform_plan
from tome_core.families import transformer_blocks
from webui_tome import extension as ext

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def builders():
    """One Forge-layout UNet per checkpoint for the whole module (each load is a fresh engine around it)."""
    return {
        "sd15": forge.engine_builder("sd15", seed=0, name="forge-sd15"),
        "refiner": forge.engine_builder("sd15", seed=1, name="refiner"),
        "sdxl": forge.engine_builder("sdxl", seed=0, name="forge-sdxl"),
        "flux": forge.engine_builder("flux", seed=0, name="forge-flux"),
    }


def unet_of(build) -> torch.nn.Module:
    return build().forge_objects.unet.model.diffusion_model


@pytest.fixture
def start(builders):
    """``start(extensions, checkpoint="sd15", **start_forge kwargs)``; every UNet clean and the WebUI double back after."""

    def _start(extension_dirs=(str(ROOT),), checkpoint="sd15", **kwargs):
        order = [checkpoint, *(k for k in builders if k != checkpoint)]
        return forge.start_forge(list(extension_dirs), checkpoints={k: builders[k] for k in order}, **kwargs)

    yield _start
    for build in builders.values():
        tome_core.remove_patch(unet_of(build))
    forge.reset_forge()


def tome_args(runner, **values):
    """:func:`generation.tome_args` with ToMe's seed 3 unless said otherwise."""
    return generation.tome_args(runner, **{"seed": 3, **values})


def set_units(runner, args, units):
    cn = next(s for s in runner.alwayson_scripts if s.title() == "ControlNet")
    args[cn.args_from] = units
    return args


def generate(runner, script_args, modules=(), img2img=False, **kwargs):
    """One generation through Forge's ``process_images``; spies on ``modules``."""
    return generation.generate(
        forge.make_img2img if img2img else forge.make_txt2img, runner, script_args, modules, **kwargs
    )


def no_hooks_anywhere(module: torch.nn.Module) -> bool:
    return all(
        not (m._forward_pre_hooks or m._forward_hooks) and tome_core.get_patch(m) is None for m in module.modules()
    )


def engine() -> backend.ForgeDiffusionEngine:
    return sd_models.model_data.get_sd_model()


# --- the UNet that really runs ------------------------------------------------------------------------------------


def test_forge_unet_is_merged_exactly_as_tome_core_applied_directly_and_clean_after(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start(extension_dirs=())  # a Forge that never had the extension: the reference
    plain, (plain_spy,) = generate(txt, None, [unet], width=72, height=56, batch_size=2)
    settings = S.from_dict({"enabled": True, "ratio": 0.5, "seed": 3})
    patch = tome_core.apply_settings(unet, settings)  # tome_core on the same UNet, no extension involved,
    # told the sampling progress at each denoiser call as the WebUI reports it (the partitions are keyed on it)
    script_callbacks.on_cfg_denoiser(lambda params: patch.set_progress(ext.sampling_progress(params)))
    direct, (direct_spy,) = generate(txt, None, [unet], width=72, height=56, batch_size=2)
    tome_core.remove_patch(unet)

    state = {k: v.clone() for k, v in unet.state_dict().items()}
    classes = [type(m) for m in unet.modules()]
    txt, _ = start()
    res, (spy,) = generate(txt, tome_args(txt, ratio=0.5), [unet], width=72, height=56, batch_size=2)
    assert spy.calls and all(s is not None and s.ratio == 0.5 and s.seed == 3 for s in spy.calls)
    assert identical(spy.outputs, direct_spy.outputs)
    assert not any(torch.equal(a, b) for a, b in zip(spy.outputs, plain_spy.outputs))
    assert identical(pixels(res), pixels(direct))
    assert R.ERROR_KEY not in res.js() and R.NOTE_KEY not in res.js()
    assert "ToMe: True" in res.infotexts[0]
    # nothing left: no hook, same classes, same weights; the next ToMe-off generation is the plain one
    assert no_hooks_anywhere(unet) and [type(m) for m in unet.modules()] == classes
    assert all(torch.equal(v, unet.state_dict()[k]) for k, v in state.items())
    off, (off_spy,) = generate(txt, tome_args(txt, enabled=False), [unet], width=72, height=56, batch_size=2)
    assert off_spy.calls and all(s is None for s in off_spy.calls)
    assert identical(off_spy.outputs, plain_spy.outputs)
    assert off.infotexts == plain.infotexts and identical(pixels(off), pixels(plain))


def test_sdxl_engine_merges_at_its_first_attention_level_by_default(start, builders):
    txt, _ = start(checkpoint="sdxl")
    unet = unet_of(builders["sdxl"])
    res, (spy,) = generate(txt, tome_args(txt), [unet], width=64, height=64)
    assert spy.calls and all(s is not None and s.max_downsample == "auto" for s in spy.calls)
    assert R.ERROR_KEY not in res.js() and R.NOTE_KEY not in res.js()
    assert no_hooks_anywhere(unet)
    _off, (off_spy,) = generate(txt, None, [unet], width=64, height=64)
    assert not any(torch.equal(a, b) for a, b in zip(spy.outputs, off_spy.outputs))  # merged: SDXL changes


@pytest.mark.parametrize(
    "failure",
    [
        lambda i, x: (_ for _ in ()).throw(devices.NansException("A tensor with all NaNs was produced in Unet.")),
        lambda i, x: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")),
        lambda i, x: (_ for _ in ()).throw(RuntimeError("something inside the UNet broke")),
        lambda i, x: x * float("nan"),  # the NaN check after sampling raises
        lambda i, x: shared.state.interrupt(),  # caught by the sampler: postprocess still runs
    ],
    ids=["nans", "oom", "exception", "nan-latent", "interrupt"],
)
def test_after_any_failure_the_next_generation_is_bit_identical_to_a_forge_without_the_extension(
    start, builders, failure
):
    unet = unet_of(builders["sd15"])
    txt, _ = start(extension_dirs=())
    plain, _ = generate(txt, None)
    txt, _ = start()
    p = forge.make_txt2img(txt, script_args=tome_args(txt), steps=3)
    seen = []

    def fail(i, x):
        seen.append(tome_core.get_patch(unet) is not None)
        return failure(i, x) if i == 1 else None

    p._test_fail_at_step = fail
    try:
        with closing(p):
            processing.process_images(p)
    except (devices.NansException, RuntimeError):
        pass
    assert seen[:2] == [True, True]
    assert no_hooks_anywhere(unet)
    shared.state.interrupted = False
    off, _ = generate(txt, None)
    assert identical(pixels(off), pixels(plain)) and off.infotexts == plain.infotexts


def test_a_patch_left_by_a_caller_without_closing_is_removed_before_the_next_generation(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    p = forge.make_txt2img(txt, script_args=tome_args(txt), steps=2)
    p._test_fail_at_step = lambda i, x: (_ for _ in ()).throw(RuntimeError("boom")) if i == 1 else None
    with pytest.raises(RuntimeError):
        processing.process_images(p)
    assert tome_core.get_patch(engine()) is not None  # left behind on the UNet inside the engine
    _, (spy,) = generate(txt, None, [unet])
    assert spy.calls and all(s is None for s in spy.calls) and no_hooks_anywhere(unet)


def test_script_unload_clears_the_forge_unet(start, builders):
    _txt, _ = start()
    tome_core.apply_settings(engine(), S.from_dict({"enabled": True}))
    assert tome_core.get_patch(unet_of(builders["sd15"])) is not None
    script_callbacks.script_unloaded_callback()
    assert no_hooks_anywhere(unet_of(builders["sd15"]))


# --- the built-in token merging ---------------------------------------------------------------------------------


def test_builtin_token_merging_is_taken_over_and_settings_untouched(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    shared.opts.token_merging_ratio = 0.5
    builtin, (builtin_spy,) = generate(txt, None, [unet])  # ToMe off: Forge's own q-only attn1 patch runs
    assert all("attn1_patch" in patches for patches in builtin_spy.patches)
    assert "Token merging ratio: 0.5" in builtin.infotexts[0]
    sd_models.apply_token_merging_calls.clear()
    res, (spy,) = generate(txt, tome_args(txt), [unet])
    assert spy.calls and all(s is not None for s in spy.calls)
    assert all("attn1_patch" not in patches for patches in spy.patches)  # the built-in's clone never applied
    assert sd_models.apply_token_merging_calls and set(sd_models.apply_token_merging_calls) == {0.0}
    assert f"{R.BUILTIN_KEY}: 0.5" in res.infotexts[0] and "Token merging ratio" not in res.infotexts[0]
    assert shared.opts.token_merging_ratio == 0.5
    assert R.NOTE_KEY not in res.js()  # no attn1 patch in the way: full merging, nothing to say


# --- hires, img2img, batches, XYZ, step schedule ------------------------------------------------------------------


def test_hires_pass_is_patched_after_forges_second_process_before_every_sampling(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    tome = tome_script(txt)
    hook_calls = []
    original = tome.process_before_every_sampling

    def counting(p, *args, **kwargs):
        hook_calls.append((p.is_hr_pass, engine().forge_objects is engine().forge_objects_after_applying_lora))
        return original(p, *args, **kwargs)

    tome.process_before_every_sampling = counting
    args = tome_args(txt, ratio=0.3, hires_ratio=0.6)
    res, (spy,) = generate(txt, args, [unet], enable_hr=True, hr_scale=2.0, hr_upscaler="Latent", steps=2)
    assert [hires for hires, _ in hook_calls] == [False, True, True]  # Forge calls it twice for the hires pass
    sizes = [int(o.shape[-1]) for o in spy.outputs]
    assert [s.ratio for s in spy.calls] == [0.3 if size == 8 else 0.6 for size in sizes]
    assert 16 in sizes and all(s is not None for s in spy.calls)
    assert "ToMe hires ratio: 0.6" in res.infotexts[0] and R.ERROR_KEY not in res.js()
    assert no_hooks_anywhere(unet)


def test_img2img_is_patched_and_differs_from_plain(start, builders):
    from PIL import Image

    unet = unet_of(builders["sd15"])
    _txt, img = start()
    image = Image.fromarray((np.arange(64 * 64 * 3) % 251).astype(np.uint8).reshape(64, 64, 3))
    res, (spy,) = generate(img, tome_args(img, ratio=0.4), [unet], img2img=True, init_images=[image], steps=4)
    _off, (off_spy,) = generate(img, None, [unet], img2img=True, init_images=[image], steps=4)
    assert spy.calls and all(s is not None and s.ratio == 0.4 for s in spy.calls)
    assert off_spy.calls and all(s is None for s in off_spy.calls)
    assert not any(torch.equal(a, b) for a, b in zip(spy.outputs, off_spy.outputs))
    assert R.ERROR_KEY not in res.js() and no_hooks_anywhere(unet)


def test_batch_count_two_patches_every_batch_with_its_own_seed(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    res, (spy,) = generate(txt, tome_args(txt, seed=-1), [unet], n_iter=2, seed=11, steps=2)
    assert len(spy.calls) == 4 and [s.seed for s in spy.calls] == [11, 11, 12, 12]
    assert "ToMe seed: 11" in res.infotexts[0] and no_hooks_anywhere(unet)


def test_step_schedule_and_progress_come_from_forges_cfg_denoiser(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    _, (spy,) = generate(txt, tome_args(txt, start=0.5), [unet], steps=4)
    assert spy.progress == [0.0, 0.25, 0.5, 0.75]
    assert spy.active == [False, False, True, True]


def test_plan_reuse_counts_forges_sampling_steps(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    _, (every,) = generate(txt, tome_args(txt), [unet], steps=3)
    _, (reused,) = generate(txt, tome_args(txt, plan_interval=3), [unet], steps=3)
    per_step = every.plans[0]
    assert per_step > 0 and every.plans == [per_step, 2 * per_step, 3 * per_step]
    assert reused.plans == [per_step] * 3  # planned at the first step, reused at the next two


def test_xyz_cells_on_forge_each_get_their_value(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    xyz = next(d.module for d in scripts.scripts_data if d.script_class.__module__ == "xyz_grid.py")
    axis = next(o for o in xyz.axis_options if o.label == "[ToMe] Merge ratio")
    p = forge.make_txt2img(txt, script_args=tome_args(txt), steps=2)
    spy = Spy(unet)
    try:
        results = xyz.run_axis(p, axis, [0.2, 0.6])
    finally:
        spy.close()
    assert [s.ratio for s in spy.calls] == [0.2, 0.2, 0.6, 0.6]
    assert all(R.ERROR_KEY not in r.js() for r in results) and no_hooks_anywhere(unet)


def test_xyz_axes_register_on_forge_classic_grid_without_format_value_add_label(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start(grid="classic")
    xyz = next(d.module for d in scripts.scripts_data if d.script_class.__module__ == "xyz_grid.py")
    assert not hasattr(xyz, "format_value_add_label")
    labels = [o.label for o in xyz.axis_options]
    assert [a.label for a in ext.axes()] == [label for label in labels if label.startswith("[ToMe]")]
    assert not errors.reported
    axis = next(o for o in xyz.axis_options if o.label == "[ToMe] Stride (XxY)")
    assert axis.format_value(None, axis, "1x2") == "[ToMe] Stride (XxY): 1x2"  # the grid's default label
    p = forge.make_txt2img(txt, script_args=tome_args(txt, ratio=0.3), steps=2)
    spy = Spy(unet)
    try:
        res = xyz.run_cell(p, axis, "1x2")
    finally:
        spy.close()
    assert (
        spy.calls and all(s is not None and (s.sx, s.sy) == (1, 2) for s in spy.calls) and R.ERROR_KEY not in res.js()
    )


# --- API and paste-back ------------------------------------------------------------------------------------------


def test_api_alwayson_scripts_list_and_dict_merge_alike_on_forge(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    spy = Spy(unet)
    body = {"prompt": "a cat", "steps": 2, "width": 64, "height": 64, "seed": 5}
    try:
        listed = api.text2imgapi(
            {**body, "alwayson_scripts": {"ToMe": {"args": [True, 0.4, "2", 2, 2, True, 77]}}}, txt
        )
        n = len(spy.calls)
        as_dict = api.text2imgapi(
            {
                **body,
                "alwayson_scripts": {
                    "tome": {"args": [{"enabled": True, "ratio": 0.4, "max_downsample": 2, "seed": 77}]}
                },
            },
            txt,
        )
    finally:
        spy.close()
    assert n and spy.calls[0] == spy.calls[n] and spy.calls[0].ratio == 0.4 and spy.calls[0].max_downsample == 2
    assert identical(spy.outputs[:n], spy.outputs[n:])
    assert json.loads(listed["info"])["infotexts"] == json.loads(as_dict["info"])["infotexts"]
    assert "ToMe: True" in json.loads(listed["info"])["infotexts"][0] and no_hooks_anywhere(unet)


@pytest.mark.parametrize("grid", ["forge", "classic"])
def test_the_cache_correction_is_hidden_in_forge_and_classic_and_still_named_through_the_api(start, builders, grid):
    """*Cache correction* acts only on a transformer whose host hands the model the sampler's sigmas (Neo, ComfyUI):
    in Forge and Forge Classic its control is hidden, in the arguments still; a value given through the API (list or
    dict) runs, named in a ``ToMe note`` (issue 54)."""
    unet = unet_of(builders["sd15"])
    txt, img = start(grid=grid)
    for runner in (txt, img):
        script = tome_script(runner)
        got = dict(zip(S.NAMES, runner.inputs[script.args_from : script.args_to]))
        assert list(got) == list(S.NAMES) and got["cache_correction"].visible is False
        assert [n for n, c in got.items() if c.visible is False] == ["enabled", "cache_correction"]  # the accordion's
        assert [key for _, key in script.infotext_fields] == [S.spec(n).infotext for n in S.NAMES]
    body = {"prompt": "a cat", "steps": 6, "width": 64, "height": 64, "seed": 5}
    given = {"enabled": True, "ratio": 0.0, "cache": True, "cache_correction": 0.5}
    listed = S.to_args(S.from_dict(given))  # the positional form, every field
    spy = Spy(unet)
    try:
        infos = [
            json.loads(api.text2imgapi({**body, "alwayson_scripts": {"ToMe": {"args": args}}}, txt)["info"])
            for args in (listed, [given], [{**given, "cache_correction": S.DEFAULTS.cache_correction}])
        ]
    finally:
        spy.close()
    texts = [info["infotexts"][0] for info in infos]
    note = "cache correction off: it acts on diffusion transformers"
    assert note in texts[0] and texts[0] == texts[1] and R.ERROR_KEY not in texts[0], texts[0]
    assert "ToMe cache correction: 0.5" in texts[0] and 'ToMe cache steps: "' in texts[0]
    assert note not in texts[2] and R.NOTE_KEY not in texts[2]  # the default: quiet where it cannot act
    assert spy.calls and all(s is not None and s.cache_correction in (0.5, 0.75) for s in spy.calls)
    assert no_hooks_anywhere(unet) and not errors.reported


def test_forge_infotext_pastes_back_every_setting(start):
    txt, _ = start()
    chosen = {"enabled": True, "ratio": 0.35, "sx": 1, "merge_crossattn": True, "method": "merge", "plan_interval": 2}
    res, _ = generate(txt, tome_args(txt, **chosen), seed=1234)
    script = tome_script(txt)
    pasted = infotext_utils.apply_paste_fields(script.infotext_fields, res.infotexts[0])
    assert S.from_args([pasted[c] for c, _ in script.infotext_fields]) == S.from_dict({**chosen, "seed": 3})


# --- Forge's built-in ControlNet ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def control_module():
    import controlnet_double as cnd

    return controlnet_from_ldm(cnd.make_control_net().control_model)


def hint() -> torch.Tensor:
    return torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(5))


def test_builtin_controlnet_model_merges_like_the_unet_and_is_clean_after(start, builders, control_module):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    backend.CONTROL_MODELS["canny"] = backend.ControlNet(control_module)
    units = [{"model": "canny", "image": hint()}]
    res, (unet_spy, cn_spy) = generate(txt, set_units(txt, tome_args(txt), units), [unet, control_module])
    assert cn_spy.calls and cn_spy.calls == unet_spy.calls and all(s is not None for s in cn_spy.calls)
    assert R.ERROR_KEY not in res.js() and R.NOTE_KEY not in res.js()
    assert no_hooks_anywhere(control_module) and no_hooks_anywhere(unet)
    args = set_units(txt, tome_args(txt, merge_controlnet=False), units)
    _, (unet_off, cn_off) = generate(txt, args, [unet, control_module])
    assert (
        cn_off.calls
        and all(s is None for s in cn_off.calls)
        and unet_off.calls
        and all(s is not None for s in unet_off.calls)
    )
    assert not torch.equal(cn_spy.outputs[0][-1], cn_off.outputs[0][-1])  # merging changed the control residuals


def test_control_lora_model_built_at_sampling_start_is_patched_from_the_first_denoiser_call(
    start, builders, control_module
):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    built, calls = [], []

    def make_control_model(diffusion_model):  # ControlLora.pre_run: a new module every sampling pass
        module = copy.deepcopy(control_module)
        module.register_forward_pre_hook(lambda m, a: calls.append(tome_core.get_patch(m) is not None))
        built.append(module)
        return module

    backend.CONTROL_MODELS["lora"] = backend.ControlLora(make_control_model)
    units = [{"model": "lora", "image": hint()}]
    res, (unet_spy,) = generate(txt, set_units(txt, tome_args(txt), units), [unet], steps=3)
    assert len(built) == 1 and calls == [True, True, True]
    assert unet_spy.calls and all(s is not None for s in unet_spy.calls) and R.ERROR_KEY not in res.js()
    assert all(tome_core.get_patch(m) is None for m in built[0].modules())  # cleaned up with the rest
    res, _ = generate(txt, set_units(txt, tome_args(txt), units), enable_hr=True, hr_upscaler="Latent", steps=2)
    assert len(built) == 3 and calls[3:] == [True] * 4  # a new one for each pass, each patched


def test_t2i_adapter_runs_as_it_is_while_the_unet_merges(start, builders):
    unet = unet_of(builders["sd15"])
    txt, _ = start()
    adapter = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, stride=8, padding=1))
    backend.CONTROL_MODELS["t2i"] = backend.T2IAdapter(lambda h: [adapter(h)])
    res, (spy, adapter_spy) = generate(
        txt, set_units(txt, tome_args(txt), [{"model": "t2i", "image": hint()}]), [unet, adapter]
    )
    assert adapter_spy.outputs and all(s is None for s in adapter_spy.calls)
    assert (
        spy.calls
        and all(s is not None for s in spy.calls)
        and R.ERROR_KEY not in res.js()
        and R.NOTE_KEY not in res.js()
    )


# --- the refiner ------------------------------------------------------------------------------------------------


def test_refiner_switched_in_mid_sampling_is_patched_and_the_old_unet_cleaned(start, builders):
    first, refiner = unet_of(builders["sd15"]), unet_of(builders["refiner"])
    txt, _ = start()
    args = tome_args(txt, ratio=0.4)
    res, (first_spy, refiner_spy) = generate(
        txt, args, [first, refiner], steps=4, refiner_checkpoint="refiner", refiner_switch_at=0.5
    )
    assert sd_models.loads == ["sd15", "refiner"]  # start-up, then the switch (the batch's reload kept sd15)
    assert len(first_spy.calls) == 2 and len(refiner_spy.calls) == 2
    assert all(s is not None and s.ratio == 0.4 for s in first_spy.calls + refiner_spy.calls)
    assert refiner_spy.progress == [0.5, 0.75]
    assert "Refiner: refiner" in res.infotexts[0] and R.ERROR_KEY not in res.js()
    assert no_hooks_anywhere(first) and no_hooks_anywhere(refiner)
    _, (spy,) = generate(txt, None, [first], steps=2)  # the next batch/generation swaps back, unpatched
    assert sd_models.loads == ["sd15", "refiner", "sd15"] and spy.calls and all(s is None for s in spy.calls)


# --- where ToMe cannot act, it says so ----------------------------------------------------------------------------


def test_model_without_transformer_blocks_runs_unmerged_with_a_note(start, builders):
    flux = unet_of(builders["flux"])
    txt, _ = start(checkpoint="flux")
    res, (spy,) = generate(txt, tome_args(txt), [flux])
    _off, (off_spy,) = generate(txt, None, [flux])
    note = "nothing merged (Flux is a diffusion transformer: only the step cache acts on it, and it is off)"
    assert note in res.infotexts[0]
    assert note in res.js() and R.ERROR_KEY not in res.js()
    assert identical(spy.outputs, off_spy.outputs)
    assert no_hooks_anywhere(flux)


def test_the_step_cache_acts_on_forges_flux_and_the_plain_image_follows(start, builders):
    flux = unet_of(builders["flux"])
    txt, _ = start(checkpoint="flux")
    _plain, (plain_spy,) = generate(txt, None, [flux], steps=6)
    res, (spy,) = generate(txt, tome_args(txt, ratio=0.0, cache=True), [flux], steps=6)
    _after, (after_spy,) = generate(txt, None, [flux], steps=6)
    assert 'ToMe cache steps: "3 full, 3 cached"' in res.infotexts[0] and R.NOTE_KEY not in res.js()
    assert spy.cached == uniform_plan(S.ToMeSettings(cache=True), 6)  # auto: the uniform schedule on a transformer
    assert not identical(spy.outputs, plain_spy.outputs) and identical(after_spy.outputs, plain_spy.outputs)
    assert no_hooks_anywhere(flux)


def _patching_extension(tmp_path: Path, body: str) -> str:
    """A built-in-like extension that patches the UNet patcher in process_before_every_sampling (loaded before ours)."""
    folder = tmp_path / "patcher_ext" / "scripts"
    folder.mkdir(parents=True)
    (folder / "patcher.py").write_text(
        "import modules.scripts as scripts\n\n\n"
        "class Patcher(scripts.Script):\n"
        "    def title(self):\n        return 'patcher'\n\n"
        "    def show(self, is_img2img):\n        return scripts.AlwaysVisible\n\n"
        "    def process_before_every_sampling(self, p, *args, **kwargs):\n"
        "        unet = p.sd_model.forge_objects.unet.clone()\n"
        f"        {body}\n"
        "        p.sd_model.forge_objects.unet = unet\n"
    )
    return str(tmp_path / "patcher_ext")


@pytest.mark.parametrize(
    "body,method,note",
    [
        (
            "unet.set_model_replace_all(lambda q, k, v, extra: q, 'attn1')",  # reference-only / StyleAlign
            "merge",
            "self-attention not merged",
        ),
        (
            "unet.set_model_attn1_patch(lambda n, c, v, extra: (n, c * 1.0, v * 1.0))",  # ControlLLLite-like
            "merge",
            "only queries merged",
        ),
        (
            "unet.set_model_attn1_patch(lambda n, c, v, extra: (n, c * 1.0, v * 1.0))",
            "downsample",
            "no token downsampling",
        ),
    ],
    ids=["attn1-replaced", "attn1-patch-query-only", "attn1-patch-todo-off"],
)
def test_what_another_extensions_attn1_patch_leaves_unmerged_is_noted(start, builders, tmp_path, body, method, note):
    unet = unet_of(builders["sd15"])
    txt, _ = start(extension_dirs=(_patching_extension(tmp_path, body), str(ROOT)))
    res, (spy,) = generate(txt, tome_args(txt, method=method), [unet])
    assert spy.calls and all(s is not None for s in spy.calls) and R.ERROR_KEY not in res.js()
    assert f"{R.NOTE_KEY}: " in res.infotexts[0] and note in res.infotexts[0] and note in res.js()
    assert no_hooks_anywhere(unet) and all(tome_core.get_patch(b) is None for b in transformer_blocks(unet))
