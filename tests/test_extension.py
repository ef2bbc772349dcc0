"""The WebUI extension (scripts/tome.py) in the WebUI 1.10.1 double, on a real ldm UNet."""

from __future__ import annotations

import importlib.util
import inspect
import json
import runpy
from contextlib import closing
from pathlib import Path

import generation
import harness
import pytest
import tiny_models
import torch
from generation import Spy, identical, tome_script
from modules import devices, infotext_utils, processing, script_callbacks, scripts, sd_models, shared
from modules.api import api

import tome_core
from tome_core import run as R
from tome_core import settings as S
from webui_tome import extension as ext

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sd_model():
    return tiny_models.make_tiny_sd_model("sd1", seed=0)


@pytest.fixture
def webui(sd_model):
    """A started WebUI with our extension (and the XYZ script); everything reset afterwards."""
    txt, img = harness.start_webui([str(ROOT)], sd_model=sd_model)
    yield txt, img
    tome_core.remove_patch(sd_model)
    harness.reset_webui()


def args_with(runner, value):
    """The UI defaults with ToMe's first slot replaced (a dict there is the API's dict form)."""
    args = harness.default_script_args(runner)
    script = tome_script(runner)
    if isinstance(value, dict):
        args[script.args_from] = value
    else:
        args[script.args_from : script.args_from + len(value)] = value
    return args


def generate(runner, script_args, model, **kwargs):
    """One txt2img generation; a spy on ``model``'s UNet."""
    res, (spy,) = generation.generate(
        harness.make_txt2img, runner, script_args, [model.model.diffusion_model], **kwargs
    )
    return res, spy


# --- the Script surface ---------------------------------------------------------------------------


def test_hooks_are_ones_webui_1_10_1_calls():
    spec = importlib.util.spec_from_file_location("tome_script_module", ROOT / "scripts" / "tome.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls = module.ToMeScript
    overridden = {n for n, v in vars(cls).items() if inspect.isfunction(v) and not n.startswith("_")}
    assert overridden <= set(scripts.HOOK_NAMES), overridden - set(scripts.HOOK_NAMES)
    assert {"before_process", "process_before_every_sampling", "before_hr", "postprocess", "setup"} <= overridden
    for name in overridden:  # same parameters as the WebUI's own declaration
        ours = [
            p for p in inspect.signature(getattr(cls, name)).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        real = [
            p
            for p in inspect.signature(getattr(scripts.Script, name)).parameters.values()
            if p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        assert [p.name for p in ours] == [p.name for p in real], name
    assert list((ROOT / "scripts").iterdir()) == [ROOT / "scripts" / "tome.py"]


def test_javascript_hints_are_generated_from_the_record():
    assert (ROOT / ext.JS_PATH).read_text(encoding="utf-8") == ext.hints_js()
    for name in S.NAMES:
        assert f'"{name}":' in ext.hints_js()


def test_install_py_installs_nothing(monkeypatch, capsys):
    import sys
    import types

    calls = []
    launch = types.ModuleType("launch")
    launch.run_pip = lambda *a, **k: calls.append(("run_pip", a))
    launch.run = lambda *a, **k: calls.append(("run", a))
    launch.is_installed = lambda name: calls.append(("is_installed", name)) or True
    monkeypatch.setitem(sys.modules, "launch", launch)
    source = (ROOT / "install.py").read_text()
    runpy.run_path(str(ROOT / "install.py"), run_name="__main__")
    assert calls == [] and capsys.readouterr().out == ""
    assert "import launch" not in source and "pip" not in source.replace("pip install", "")


# --- lifecycle ---------------------------------------------------------------------------------------


def test_patched_while_sampling_unpatched_after_and_next_generation_bit_identical(sd_model):
    harness.start_webui([], sd_model=sd_model)  # a WebUI that never had the extension
    baseline, base_spy = generate(scripts.scripts_txt2img, None, sd_model, width=96, height=96)
    txt, _ = harness.start_webui([str(ROOT)], sd_model=sd_model)
    try:
        _, spy = generate(txt, args_with(txt, [True, 0.5]), sd_model, width=96, height=96)
        assert spy.calls and all(s is not None and s.ratio == 0.5 for s in spy.calls)
        assert tome_core.get_patch(sd_model) is None
        assert not all(torch.equal(a, b) for a, b in zip(spy.outputs, base_spy.outputs))
        off, off_spy = generate(txt, None, sd_model, width=96, height=96)
        assert off_spy.calls and all(s is None for s in off_spy.calls)
        assert identical(off_spy.outputs, base_spy.outputs)
        assert off.infotexts == baseline.infotexts
    finally:
        harness.reset_webui()


@pytest.mark.parametrize(
    "failure",
    [
        lambda: devices.NansException("A tensor with all NaNs was produced in Unet."),
        lambda: torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        lambda: RuntimeError("something inside the UNet broke"),
    ],
)
def test_failure_mid_sampling_leaves_no_patch(webui, sd_model, failure):
    txt, _ = webui
    p = harness.make_txt2img(txt, script_args=args_with(txt, [True, 0.5]), steps=3)
    seen = []

    def fail(i, x):
        seen.append(tome_core.get_patch(sd_model) is not None)
        if i == 1:
            raise failure()

    p._test_fail_at_step = fail
    with pytest.raises((devices.NansException, RuntimeError)), closing(p):
        processing.process_images(p)
    assert seen == [True, True]
    assert tome_core.get_patch(sd_model) is None  # postprocess was skipped; p.close() cleaned up


def test_leftover_patch_is_removed_by_the_next_generation(webui, sd_model):
    txt, _ = webui
    p = harness.make_txt2img(txt, script_args=args_with(txt, [True, 0.5]), steps=2)
    p._test_fail_at_step = lambda i, x: (_ for _ in ()).throw(RuntimeError("boom")) if i == 1 else None
    with pytest.raises(RuntimeError):
        processing.process_images(p)  # no closing(p): as if a caller forgot it
    assert tome_core.get_patch(sd_model) is not None
    _, spy = generate(txt, None, sd_model)
    assert spy.calls and all(s is None for s in spy.calls) and tome_core.get_patch(sd_model) is None


def test_interrupt_still_unpatches(webui, sd_model):
    txt, _ = webui
    p = harness.make_txt2img(txt, script_args=args_with(txt, [True, 0.5]), steps=4)
    p._test_fail_at_step = lambda i, x: shared.state.interrupt() if i == 1 else None
    with closing(p):
        processing.process_images(p)
    assert tome_core.get_patch(sd_model) is None


def test_hires_pass_uses_its_own_ratio_and_size(webui, sd_model):
    txt, _ = webui
    args = args_with(txt, {"enabled": True, "ratio": 0.3, "hires_ratio": 0.6, "min_size": 100})
    res, spy = generate(txt, args, sd_model, width=64, height=64, enable_hr=True, hr_scale=2.0, steps=2)
    ratios = [s.ratio if s else None for s in spy.calls]
    # 64 px first pass is below the minimum size: unmerged; the 128 px hires pass merges at 0.6
    assert ratios == [None, None, 0.6, 0.6]
    info = res.js()
    assert "below the minimum size" in info and "ToMe hires ratio" in res.infotexts[0]
    assert tome_core.get_patch(sd_model) is None


def test_every_batch_iteration_starts_with_the_first_pass_ratio(webui, sd_model):
    txt, _ = webui
    args = args_with(txt, {"enabled": True, "ratio": 0.3, "hires_ratio": 0.6})
    _, spy = generate(txt, args, sd_model, width=64, height=64, enable_hr=True, hr_scale=1.5, steps=1, n_iter=2)
    assert [s.ratio for s in spy.calls] == [0.3, 0.6, 0.3, 0.6]


def test_img2img_is_patched(webui, sd_model):
    _, img = webui
    args = args_with(img, [True, 0.4])
    _, (spy,) = generation.generate(generation.img2img, img, args, [sd_model.model.diffusion_model])
    assert spy.calls and all(s is not None and s.ratio == 0.4 for s in spy.calls)
    assert tome_core.get_patch(sd_model) is None


@pytest.mark.parametrize(
    "sampler, progress",
    [
        ("Euler", [0, 1 / 4, 2 / 4, 3 / 4]),  # the WebUI's own sampling_step reads 0, 0, 1, 2 here
        ("Heun", [0, 0, 1 / 4, 1 / 4, 2 / 4, 2 / 4, 3 / 4]),  # two calls a step, one on the last
    ],
)
def test_progress_counts_sampling_steps_not_calls(webui, sd_model, sampler, progress):
    txt, _ = webui
    _, spy = generate(txt, args_with(txt, [True, 0.5]), sd_model, steps=4, sampler_name=sampler)
    assert spy.progress == pytest.approx(progress)


@pytest.mark.parametrize("sampler, active", [("Euler", 2), ("Heun", 4)])
def test_end_leaves_the_last_steps_unpatched(webui, sd_model, sampler, active):
    txt, _ = webui
    args = args_with(txt, {"enabled": True, "ratio": 0.5, "end": 0.5})
    _, spy = generate(txt, args, sd_model, steps=4, sampler_name=sampler)
    assert spy.active == [True] * active + [False] * (len(spy.active) - active)


def test_the_hires_pass_counts_its_own_steps(webui, sd_model):
    txt, _ = webui
    args = args_with(txt, {"enabled": True, "ratio": 0.5, "start": 0.5})
    _, spy = generate(txt, args, sd_model, steps=2, enable_hr=True, hr_scale=1.5, hr_second_pass_steps=4)
    assert spy.progress == pytest.approx([0, 1 / 2, 0, 1 / 4, 2 / 4, 3 / 4])
    assert spy.active == [False, True, False, False, True, True]


def test_progress_falls_back_to_sampling_step_without_a_call_count():
    class Params:
        sampling_step, total_sampling_steps, denoiser = 3, 4, object()

    assert ext.sampling_progress(Params()) == 3 / 4


def test_checkpoint_switch_leaves_no_patch_on_the_old_model(webui, sd_model):
    txt, _ = webui
    other = tiny_models.make_tiny_sd_model("sd1", seed=1)
    script = tome_script(txt)
    p = harness.make_txt2img(txt, script_args=args_with(txt, [True, 0.5]))
    p._test_fail_at_step = lambda i, x: sd_models.load_model(other) if i == 0 else None  # switch mid-generation
    with closing(p):
        processing.process_images(p)
    assert tome_core.get_patch(sd_model) is None and tome_core.get_patch(other) is None
    assert script is tome_script(txt)
    sd_models.load_model(sd_model)


# --- built-in token merging ---------------------------------------------------------------------------


def test_builtin_ratio_is_replaced_for_this_generation_and_said(webui, sd_model):
    txt, _ = webui
    shared.opts.token_merging_ratio = 0.3
    res, spy = generate(txt, args_with(txt, [True, 0.5]), sd_model)
    assert all(r == 0 for r in sd_models.apply_token_merging_calls)  # tomesd never applied
    assert spy.calls and all(s is not None and s.ratio == 0.5 for s in spy.calls)
    assert "ToMe replaced built-in ratio: 0.3" in res.infotexts[0] and "Token merging ratio" not in res.infotexts[0]
    assert shared.opts.token_merging_ratio == 0.3  # the setting itself untouched
    sd_models.apply_token_merging_calls.clear()
    res, spy = generate(txt, None, sd_model)  # ToMe off: the built-in works as before
    assert 0.3 in sd_models.apply_token_merging_calls and "Token merging ratio: 0.3" in res.infotexts[0]
    assert spy.calls and all(s is None for s in spy.calls)


# --- API -----------------------------------------------------------------------------------------------


def _api(txt, tome_args, **payload):
    body = {"prompt": "a cat", "steps": 2, "width": 64, "height": 64, "seed": 5, "subseed": 6, **payload}
    if tome_args is not None:
        body["alwayson_scripts"] = {"tome": {"args": tome_args}}  # title matched case-insensitively
    return api.text2imgapi(body, txt)


def test_api_positional_list_and_dict_give_the_same_generation(webui, sd_model):
    txt, _ = webui
    spy = Spy(sd_model.model.diffusion_model)
    try:
        listed = _api(txt, [True, 0.4, "2", 2, 2, True, 77])
        n = len(spy.calls)
        as_dict = _api(txt, [{"enabled": True, "ratio": 0.4, "max_downsample": 2, "seed": 77}])
    finally:
        spy.close()
    assert spy.calls[0] == spy.calls[n] and spy.calls[0].ratio == 0.4 and spy.calls[0].max_downsample == 2
    assert identical(spy.outputs[:n], spy.outputs[n:])
    listed, as_dict = json.loads(listed["info"]), json.loads(as_dict["info"])
    assert listed["infotexts"] == as_dict["infotexts"] and listed["extra_generation_params"]["ToMe seed"] == 77
    assert tome_core.get_patch(sd_model) is None


@pytest.mark.parametrize(
    "tome_args,field,fragment",
    [
        ([{"enabled": True, "ratoi": 0.5}], "ratoi", "known setting name"),
        ([{"enabled": True, "ratio": "half"}], "ratio", "a number from 0 to 0.95"),
        ([{"enabled": True, "ratio": 1.5}], "ratio", "a number from 0 to 0.95"),
        ([{"enabled": True, "ratio": 0.9}], "ratio", "at most 1 - 1/(sx*sy) = 0.75"),
        ([{"enabled": True, "ratio": 0.6, "sx": 1, "sy": 2}], "ratio", "= 0.5"),
        ([{"enabled": "yes"}], "enabled", "true or false"),
        ([{"enabled": True, "sx": 2.5}], "sx", "an integer from 1 to 8"),
        ([{"enabled": True, "max_downsample": 3}], "max_downsample", "one of '1', '2', '4', '8', 'auto'"),
        ([{"enabled": True, "start": 0.8, "end": 0.5}], "end", "greater than start"),
        ([True, 0.5, "3"], "max_downsample", "one of"),
        (
            [True, 0.5, "auto", 2, 2, True, -1, True, False, False, 0.0, 0, True, "todo"],
            "method",
            "'merge', 'downsample'",
        ),
    ],
)
def test_api_invalid_input_patches_nothing_and_says_why(webui, sd_model, tome_args, field, fragment):
    txt, _ = webui
    spy = Spy(sd_model.model.diffusion_model)
    try:
        response = _api(txt, tome_args)
    finally:
        spy.close()
    assert spy.calls and all(s is None for s in spy.calls)
    message = json.loads(response["info"])["extra_generation_params"][R.ERROR_KEY]
    assert f"'{field}'" in message and fragment in message


def test_api_missing_keys_take_defaults(webui, sd_model):
    txt, _ = webui
    spy = Spy(sd_model.model.diffusion_model)
    try:
        _api(txt, [{"enabled": True}])
    finally:
        spy.close()
    assert spy.calls[0] == S.DEFAULTS.replace(enabled=True, seed=5)


def test_api_cache_correction_is_accepted_and_named_where_it_cannot_act(webui, sd_model):
    """A1111's models are UNets: *Cache correction* is hidden in its accordion (tests/test_ui.py), and a value given
    through the API (list or dict) still runs, with a ``ToMe note`` saying why it does nothing; the default is quiet
    (issue 54)."""
    txt, _ = webui
    given = {"enabled": True, "ratio": 0.0, "cache": True, "cache_correction": 0.5}
    spy = Spy(sd_model.model.diffusion_model)
    try:
        answers = [
            _api(txt, args, steps=6)
            for args in (S.to_args(S.from_dict(given)), [given], [{**given, "cache_correction": 0.75}])
        ]
    finally:
        spy.close()
    listed, as_dict, default = (json.loads(a["info"])["infotexts"][0] for a in answers)
    note = "cache correction off: it acts on diffusion transformers whose output layer runs as one module"
    assert note in listed and listed == as_dict and R.ERROR_KEY not in listed and "ToMe cache correction: 0.5" in listed
    assert R.NOTE_KEY not in default and 'ToMe cache steps: "' in default
    assert spy.calls and all(s is not None and s.cache for s in spy.calls) and tome_core.get_patch(sd_model) is None


# --- infotext ---------------------------------------------------------------------------------------


def test_infotext_round_trip_restores_every_control(webui, sd_model):
    txt, _ = webui
    chosen = {
        "enabled": True,
        "ratio": 0.35,
        "max_downsample": 2,
        "sx": 1,
        "sy": 2,
        "seed": -1,
        "merge_mlp": True,
        "hires_ratio": 0.25,
        "min_size": 32,
        "method": "merge",
        "start": 0.1,
        "end": 0.8,
        "plan_interval": 2,
    }
    res, _ = generate(txt, args_with(txt, chosen), sd_model, seed=1234)
    text = res.infotexts[0]
    assert "ToMe ratio: 0.35" in text and "ToMe seed: 1234" in text and "ToMe stride x: 1" in text
    assert "ToMe merge attn" not in text  # defaults are omitted
    script = tome_script(txt)
    pasted = infotext_utils.apply_paste_fields(script.infotext_fields, text)
    restored = S.from_args([pasted[c] for c, _ in script.infotext_fields])
    assert restored == S.from_dict({**chosen, "seed": 1234})
    # an infotext from a generation without ToMe turns it off
    plain = infotext_utils.apply_paste_fields(script.infotext_fields, "a dog\nSteps: 20, Seed: 1")
    assert plain[script.infotext_fields[0][0]] is False


# --- XYZ -----------------------------------------------------------------------------------------------


def xyz_module():
    return next(d.module for d in scripts.scripts_data if d.script_class.__module__ == "xyz_grid.py")


def test_xyz_axes_registered_once(webui):
    xyz = xyz_module()
    labels = [o.label for o in xyz.axis_options if o.label.startswith("[ToMe]")]
    assert labels == [a.label for a in ext.axes()]
    script_callbacks.before_ui_callback()
    assert [o.label for o in xyz.axis_options if o.label.startswith("[ToMe]")] == labels
    for needed in ("Enabled", "Merge ratio", "Hires. fix ratio", "Max downsample", "Stride (XxY)", "Random seed"):
        assert any(needed in label for label in labels), needed


def test_xyz_missing_is_guarded(sd_model, capsys):
    harness.start_webui([str(ROOT)], sd_model=sd_model, with_xyz=False)
    harness.reset_webui()
    assert "XYZ plot script is not loaded" in capsys.readouterr().out


def test_xyz_cells_override_without_touching_globals(webui, sd_model):
    txt, _ = webui
    xyz = xyz_module()
    axis = {o.label: o for o in xyz.axis_options}
    p = harness.make_txt2img(txt, script_args=args_with(txt, [False]), width=64, height=64)
    template_params = p.extra_generation_params
    opts_before = dict(shared.opts.data)
    spy = Spy(sd_model.model.diffusion_model)
    try:
        enabled = xyz.run_cell(p, axis["[ToMe] Enabled"], "True")
        cells = [xyz.run_cell(p, axis["[ToMe] Merge ratio"], v) for v in (0.3, 0.6)]
        stride = xyz.run_cell(p, axis["[ToMe] Stride (XxY)"], "1x2")
    finally:
        spy.close()
    assert "ToMe: True" in enabled.infotexts[0]
    assert "ToMe" not in cells[0].infotexts[0]  # ratio alone does not enable it
    assert all("ToMe" not in c.infotexts[0] for c in cells)
    assert "ToMe" not in stride.infotexts[0]
    assert template_params == {} and shared.opts.data == opts_before and not hasattr(p, ext.OVERRIDES_ATTR)
    both = harness.make_txt2img(txt, script_args=args_with(txt, [True]), width=64, height=64)
    spy = Spy(sd_model.model.diffusion_model)
    try:
        results = [xyz.run_cell(both, axis["[ToMe] Merge ratio"], v) for v in (0.3, 0.6)]
        stride = xyz.run_cell(both, axis["[ToMe] Stride (XxY)"], "1x2")
    finally:
        spy.close()
    assert {s.ratio for s in spy.calls if s} == {0.3, 0.6, 0.5}
    assert "ToMe ratio: 0.3" in results[0].infotexts[0] and "ToMe ratio: 0.6" in results[1].infotexts[0]
    assert "ToMe stride x: 1" in stride.infotexts[0] and "ToMe ratio" not in stride.infotexts[0]
    with pytest.raises(S.SettingsError, match="'sx' = '9'"):
        axis["[ToMe] Stride (XxY)"].confirm(both, ["2x2", "9x1"])


def test_sdxl_generation_merges_with_default_settings():
    model = tiny_models.make_tiny_sd_model("sdxl", seed=0)
    harness.start_webui([], sd_model=model)
    _, base_spy = generate(scripts.scripts_txt2img, None, model, width=128, height=128, steps=2)
    txt, _ = harness.start_webui([str(ROOT)], sd_model=model)
    try:
        patches = []
        hook = model.model.diffusion_model.register_forward_pre_hook(
            lambda m, a: patches.append(tome_core.get_patch(m))
        )
        try:
            _, spy = generate(txt, args_with(txt, [True]), model, width=128, height=128, steps=2)
        finally:
            hook.remove()
        assert patches and all(p is not None and p.merger.planner.auto_downsample == 2 for p in patches)
        assert spy.calls and all(s.max_downsample == "auto" for s in spy.calls)
        assert not any(torch.equal(a, b) for a, b in zip(spy.outputs, base_spy.outputs))  # really merged
        assert tome_core.get_patch(model) is None
    finally:
        harness.reset_webui()


def test_with_the_cache_on_the_infotext_always_says_its_forecast_schedule_and_correction():
    on = R.infotext(S.ToMeSettings(enabled=True, cache=True), None)
    assert on["ToMe cache forecast"] == "auto" and on["ToMe cache schedule"] == "auto"
    assert on["ToMe cache correction"] == 0.75
    off = R.infotext(S.ToMeSettings(enabled=True), None)
    assert not {"ToMe cache forecast", "ToMe cache schedule", "ToMe cache correction"} & set(off)


@pytest.mark.parametrize(
    "pasted, correction",
    [
        ({"ToMe": "True", "ToMe cache": "True", "ToMe cache forecast": "auto"}, "0"),  # before 0.75 was the default
        ({"ToMe": "True", "ToMe cache": "True", "ToMe cache correction": "1.0"}, "1.0"),
        ({"ToMe": "True"}, "0.75"),  # no cache: the default
    ],
)
def test_an_older_infotext_with_the_cache_and_no_correction_pastes_it_off(pasted, correction):
    params = dict(pasted)
    R.fill_pasted(params)
    assert params["ToMe cache correction"] == correction
    assert S.from_dict({"cache_correction": params["ToMe cache correction"]}).cache_correction == float(correction)


@pytest.mark.parametrize(
    "pasted, forecast, schedule",
    [
        ({"ToMe": "True", "ToMe cache": "True", "ToMe cache steps": "8 full, 12 cached"}, "linear", "uniform"),
        ({"ToMe": "True", "ToMe cache": "True"}, "off", "uniform"),  # before the forecast existed: DeepCache
        ({"ToMe": "True", "ToMe cache": "True", "ToMe cache forecast": "calibrated"}, "calibrated", "uniform"),
        (
            {"ToMe": "True", "ToMe cache": "True", "ToMe cache forecast": "off", "ToMe cache schedule": "time"},
            "off",
            "time",
        ),
        ({"ToMe": "True"}, "auto", "auto"),  # no cache: the defaults
    ],
)
def test_an_older_infotext_with_the_cache_pastes_the_forecast_and_schedule_it_ran(pasted, forecast, schedule):
    params = dict(pasted)
    R.fill_pasted(params)
    assert params["ToMe cache forecast"] == forecast and params["ToMe cache schedule"] == schedule
