"""Tests of the WebUI 1.10.1 test double itself (tests/webui_double)."""

import inspect
import json
import os
import sys
from typing import ClassVar

import gradio as gr
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "webui_double"))

import harness
import tiny_models
from modules import (
    devices,
    errors,
    infotext_utils,
    processing,
    script_callbacks,
    scripts,
    sd_models,
    shared,
)
from modules.api import api
from modules.ui_components import InputAccordion


@pytest.fixture(scope="module")
def sd15():
    return tiny_models.make_tiny_sd_model("sd1", seed=0)


class Recorder(scripts.Script):
    calls: ClassVar[list] = []
    fail_in: ClassVar[tuple] = ()

    def title(self):
        return "Recorder Ext"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, is_img2img):
        with InputAccordion(False, label="Recorder") as enabled:
            ratio = gr.Slider(minimum=0.0, maximum=0.9, step=0.05, value=0.5, label="Ratio")
            mode = gr.Radio(choices=["a", "b"], value="a", label="Mode")
        self.infotext_fields = [(enabled, "Rec enabled"), (ratio, "Rec ratio"), (mode, "Rec mode")]
        return [enabled, ratio, mode]

    def _hook(self, name, args):
        type(self).calls.append((name, args))
        if name in type(self).fail_in:
            raise ValueError(f"boom in {name}")

    def setup(self, p, *args):
        self._hook("setup", args)

    def before_process(self, p, *args):
        self._hook("before_process", args)

    def process(self, p, *args):
        self._hook("process", args)
        p.extra_generation_params["Rec ratio"] = args[1]

    def process_batch(self, p, *args, **kwargs):
        self._hook("process_batch", args)

    def process_before_every_sampling(self, p, *args, **kwargs):
        self._hook("process_before_every_sampling", args)

    def before_hr(self, p, *args):
        self._hook("before_hr", args)

    def postprocess_batch(self, p, *args, **kwargs):
        self._hook("postprocess_batch", args)

    def postprocess(self, p, processed, *args):
        self._hook("postprocess", args)


@pytest.fixture
def webui(sd15):
    harness.reset_webui()
    Recorder.calls = []
    Recorder.fail_in = ()
    scripts.scripts_data.append(scripts.ScriptClassData(Recorder, "/ext/scripts/recorder.py", "/ext", None))
    harness.register_xyz_grid()
    sd_models.load_model(sd15)
    script_callbacks.before_ui_callback()
    runner = harness.build_runner(False)
    yield runner
    harness.reset_webui()


def names(calls):
    return [c[0] for c in calls]


def tome_blocks(model):
    return sum(type(m).__name__ == "ToMeBlock" for m in model.modules())


def test_script_hook_names_match_webui_1_10_1():
    methods = {n for n, _ in inspect.getmembers(scripts.Script, inspect.isfunction)}
    assert set(scripts.HOOK_NAMES) == methods
    assert "before_hires_pass" not in methods
    assert list(inspect.signature(scripts.Script.postprocess).parameters) == ["self", "p", "processed", "args"]
    assert list(inspect.signature(scripts.Script.before_hr).parameters) == ["self", "p", "args"]


def test_ui_slots_and_hook_order(webui):
    rec = next(s for s in webui.alwayson_scripts if isinstance(s, Recorder))
    assert (rec.args_from, rec.args_to) == (1, 4)
    assert webui.inputs[1].accordion.open is False and webui.inputs[1].visible is False
    p = harness.make_txt2img(webui, [0, True, 0.3, "b"], enable_hr=True, hr_scale=1.5)
    res = processing.process_images(p)
    assert names(Recorder.calls) == [
        "setup",
        "before_process",
        "process",
        "process_batch",
        "process_before_every_sampling",
        "before_hr",
        "process_before_every_sampling",
        "postprocess_batch",
        "postprocess",
    ]
    assert all(args == (True, 0.3, "b") for _, args in Recorder.calls)
    assert res.images[0].size == (96, 96)


def test_hook_exceptions_are_swallowed_and_reported(webui):
    Recorder.fail_in = ("before_process", "process", "postprocess")
    res = processing.process_images(harness.make_txt2img(webui))
    assert len(res.images) == 1
    assert "postprocess" in names(Recorder.calls)
    messages = [m for m, _ in errors.reported]
    assert any(m.startswith("Error running process: /ext/scripts/recorder.py") for m in messages)
    assert any(m.startswith("Error running postprocess:") for m in messages)


def test_nans_propagate_skip_postprocess_and_remove_tome(webui):
    shared.opts.token_merging_ratio = 0.5
    p = harness.make_txt2img(webui)
    p._test_fail_at_step = lambda i, x: x * float("nan") if i == 2 else None
    with pytest.raises(devices.NansException):
        processing.process_images(p)
    assert "postprocess" not in names(Recorder.calls)
    assert shared.sd_model.applied_token_merged_ratio == 0
    assert tome_blocks(shared.sd_model) == 0


def test_oom_propagates_and_skips_postprocess(webui):
    p = harness.make_txt2img(webui)

    def oom(i, x):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    p._test_fail_at_step = oom
    with pytest.raises(torch.OutOfMemoryError):
        processing.process_images(p)
    assert "postprocess" not in names(Recorder.calls)


def test_interrupt_is_handled_inside_sampler(webui):
    shared.state.begin()
    p = harness.make_txt2img(webui, steps=4, n_iter=2)
    p._test_fail_at_step = lambda i, x: shared.state.interrupt() if i == 1 else None
    before = shared.sd_model.unet_calls
    res = processing.process_images(p)
    assert "postprocess" in names(Recorder.calls)
    assert shared.sd_model.unet_calls - before == 1  # step 1 raised InterruptedException, batch 2 skipped
    assert len(res.images) == 1


def test_builtin_token_merging_is_applied_during_sampling_only(webui):
    seen = []
    script_callbacks.on_cfg_denoiser(lambda params: seen.append((params.sampling_step, tome_blocks(shared.sd_model))))
    shared.opts.token_merging_ratio = 0.5
    res = processing.process_images(harness.make_txt2img(webui))
    assert [s for s, _ in seen] == [0, 0, 1]  # callback_state runs after each step's denoiser call
    assert all(n > 0 for _, n in seen)
    assert tome_blocks(shared.sd_model) == 0 and shared.sd_model.applied_token_merged_ratio == 0
    assert sd_models.apply_token_merging_calls == [0.5, 0]
    assert "Token merging ratio: 0.5" in res.info
    assert json.loads(res.js())["extra_generation_params"]["Rec ratio"] == 0.5

    shared.opts.token_merging_ratio = 0.0
    plain = processing.process_images(harness.make_txt2img(webui))
    assert "Token merging" not in plain.info
    assert list(res.images[0].getdata()) != list(plain.images[0].getdata())


def test_batch_cond_uncond_flag_changes_unet_calls(webui):
    model = shared.sd_model
    start = model.unet_calls
    processing.process_images(harness.make_txt2img(webui, steps=3))
    batched = model.unet_calls - start
    shared.opts.batch_cond_uncond = False
    start = model.unet_calls
    processing.process_images(harness.make_txt2img(webui, steps=3))
    assert (batched, model.unet_calls - start) == (3, 6)


def test_img2img_ratio_and_odd_latent_size(webui):
    from PIL import Image

    shared.opts.token_merging_ratio = 0.2
    shared.opts.token_merging_ratio_img2img = 0.4
    p = processing.StableDiffusionProcessingImg2Img(
        init_images=[Image.new("RGB", (72, 56), "red")], prompt="x", steps=2, width=72, height=56, seed=3
    )
    assert p.get_token_merging_ratio() == 0.4 and p.get_token_merging_ratio(for_hr=True) == 0.4
    p.override_settings = {"token_merging_ratio": 0.2}
    assert p.get_token_merging_ratio() == 0.2
    res = processing.process_images(p)
    assert res.images[0].size == (72, 56)  # 9x7 latent works thanks to the th.cat hijack
    assert shared.opts.token_merging_ratio == 0.2


def test_init_script_args_semantics(webui):
    defaults = api.init_default_script_args(webui)
    rec = next(s for s in webui.alwayson_scripts if isinstance(s, Recorder))
    assert defaults[rec.args_from : rec.args_to] == [False, 0.5, "a"]
    args = api.init_script_args({"recorder EXT": {"args": [True]}}, webui, defaults)
    assert args[rec.args_from : rec.args_to] == [True, 0.5, "a"]
    args = api.init_script_args({"Recorder Ext": {"args": ["yes", 7, "c", "extra"]}}, webui, defaults)
    assert args[rec.args_from : rec.args_to] == ["yes", 7, "c"] and len(args) == len(defaults)
    with pytest.raises(api.HTTPException) as e:
        api.init_script_args({"nope": {"args": []}}, webui, defaults)
    assert e.value.status_code == 422
    with pytest.raises(api.HTTPException):
        api.init_script_args({"X/Y/Z plot": {"args": []}}, webui, defaults)
    info = api.script_info_entries(rec)
    assert [(a["label"], a["value"], a["minimum"], a["maximum"], a["step"]) for a in info[:2]] == [
        ("Recorder", False, None, None, None),
        ("Ratio", 0.5, 0.0, 0.9, 0.05),
    ]
    out = api.text2imgapi(
        {
            "prompt": "a",
            "steps": 2,
            "width": 64,
            "height": 64,
            "alwayson_scripts": {"recorder ext": {"args": [True, 0.25]}},
        },
        webui,
        defaults,
    )
    assert json.loads(out["info"])["extra_generation_params"]["Rec ratio"] == 0.25
    assert Recorder.calls[0] == ("setup", (True, 0.25, "a"))


def test_infotext_round_trip_and_paste(webui):
    p = harness.make_txt2img(webui, prompt="a, b", negative_prompt="ugly")
    p.extra_generation_params.update({"Rec enabled": True, "Rec mode": "b: c, d", "Lone": "Lone"})
    res = processing.process_images(p)
    assert 'Rec mode: "b: c, d"' in res.info and ", Lone," in res.info
    params = infotext_utils.parse_generation_parameters(res.info)
    assert params["Prompt"] == "a, b" and params["Negative prompt"] == "ugly"
    assert params["Rec ratio"] == "0.5" and params["Rec mode"] == "b: c, d" and params["Size-1"] == "64"
    assert params["Clip skip"] == "1" and "Lone" not in params
    values = infotext_utils.apply_paste_fields(webui.infotext_fields, res.info)
    rec = next(s for s in webui.alwayson_scripts if isinstance(s, Recorder))
    enabled, ratio, mode = rec.controls
    assert values[enabled] is True and values[ratio] == 0.5 and values[mode] == "b: c, d"
    assert infotext_utils.apply_paste_fields([(enabled, "Rec enabled")], {"Rec enabled": "False"}) == {enabled: False}


def test_xyz_double_is_found_like_the_real_one(webui):
    xyz = next(x for x in scripts.scripts_data if x.script_class.__module__ == "xyz_grid.py").module
    axis = next(a for a in xyz.axis_options if a.label == "Token merging ratio")
    p = harness.make_txt2img(webui)
    results = xyz.run_axis(p, axis, xyz.parse_axis_values(axis, "0.3, 0.6"))
    assert ["Token merging ratio: 0.3" in r.info for r in results] == [True, False]
    assert "Token merging ratio: 0.6" in results[1].info
    assert p.override_settings == {"token_merging_ratio": 0.6}  # shallow copy: the dict is shared
    assert shared.opts.token_merging_ratio == 0.0
    assert names(Recorder.calls).count("before_process") == 2
