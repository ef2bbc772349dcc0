"""Double of modules/script_callbacks.py (WebUI 1.10.1).

Same ``callback_map`` keys (~L219-241), same registration functions (``on_*``, ~L460-613), same
``ScriptCallback(script, callback, name)`` records. Each ``*_callback`` runner calls every callback in a
try/except and only reports the exception (``report_exception`` ~L14, errors.report), so a failing
callback never stops generation. ``before_ui`` and ``script_unloaded`` run in REVERSED registration order
like the real runners (~L405-418). Extension metadata ordering (``sort_callbacks`` with metadata.ini) is
not reproduced; the user ``prioritized_callbacks_<category>`` option is.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

from modules import errors


def report_exception(c, job):
    errors.report(f"Error executing callback {job} for {c.script}", exc_info=True)


class ImageSaveParams:
    def __init__(self, image, p, filename, pnginfo):
        self.image = image
        self.p = p
        self.filename = filename
        self.pnginfo = pnginfo


class ExtraNoiseParams:
    def __init__(self, noise, x, xi):
        self.noise = noise
        self.x = x
        self.xi = xi


class CFGDenoiserParams:
    # mirrors script_callbacks.py CFGDenoiserParams ~L45-70 (same positional order)
    def __init__(
        self, x, image_cond, sigma, sampling_step, total_sampling_steps, text_cond, text_uncond, denoiser=None
    ):
        self.x = x
        self.image_cond = image_cond
        self.sigma = sigma
        self.sampling_step = sampling_step
        self.total_sampling_steps = total_sampling_steps
        self.text_cond = text_cond
        self.text_uncond = text_uncond
        self.denoiser = denoiser


class CFGDenoisedParams:
    def __init__(self, x, sampling_step, total_sampling_steps, inner_model):
        self.x = x
        self.sampling_step = sampling_step
        self.total_sampling_steps = total_sampling_steps
        self.inner_model = inner_model


class AfterCFGCallbackParams:
    def __init__(self, x, sampling_step, total_sampling_steps):
        self.x = x
        self.sampling_step = sampling_step
        self.total_sampling_steps = total_sampling_steps


@dataclasses.dataclass
class ScriptCallback:
    script: str
    callback: Any
    name: str = "unnamed"


def add_callback(callbacks, fun, *, name=None, category="unknown", filename=None):
    # mirrors add_callback ~L127-147: the registering file is the first stack frame outside this module
    if filename is None:
        stack = [x for x in inspect.stack() if x.filename != __file__]
        filename = stack[0].filename if stack else "unknown file"

    callback_name = f"base/{os.path.basename(filename)}/{category}"
    if name is not None:
        callback_name += f"/{name}"

    unique = callback_name
    for index in range(1000):
        if not any(x.name == unique for x in callbacks):
            break
        unique = f"{callback_name}-{index + 1}"

    callbacks.append(ScriptCallback(filename, fun, unique))


def sort_callbacks(category, unordered_callbacks, *, enable_user_sort=True):
    from modules import shared

    callbacks = list(unordered_callbacks)
    if enable_user_sort:
        for name in reversed(getattr(shared.opts, "prioritized_callbacks_" + category, None) or []):
            index = next((i for i, c in enumerate(callbacks) if c.name == name), None)
            if index is not None:
                callbacks.insert(0, callbacks.pop(index))
    return callbacks


def ordered_callbacks(category, unordered_callbacks=None, *, enable_user_sort=True):
    if unordered_callbacks is None:
        unordered_callbacks = callback_map.get("callbacks_" + category, [])
    return sort_callbacks(category, unordered_callbacks, enable_user_sort=enable_user_sort)


callback_map = {
    "callbacks_app_started": [],
    "callbacks_model_loaded": [],
    "callbacks_ui_tabs": [],
    "callbacks_ui_train_tabs": [],
    "callbacks_ui_settings": [],
    "callbacks_before_image_saved": [],
    "callbacks_image_saved": [],
    "callbacks_extra_noise": [],
    "callbacks_cfg_denoiser": [],
    "callbacks_cfg_denoised": [],
    "callbacks_cfg_after_cfg": [],
    "callbacks_before_component": [],
    "callbacks_after_component": [],
    "callbacks_image_grid": [],
    "callbacks_infotext_pasted": [],
    "callbacks_script_unloaded": [],
    "callbacks_before_ui": [],
    "callbacks_on_reload": [],
    "callbacks_list_optimizers": [],
    "callbacks_list_unets": [],
    "callbacks_before_token_counter": [],
}


def clear_callbacks():
    for callback_list in callback_map.values():
        callback_list.clear()


def _run(category, job, *args, reverse=False, **kwargs):
    callbacks = ordered_callbacks(category)
    for c in reversed(callbacks) if reverse else callbacks:
        try:
            c.callback(*args, **kwargs)
        except Exception:
            report_exception(c, job)


def app_started_callback(demo, app):
    _run("app_started", "app_started_callback", demo, app)


def app_reload_callback():
    _run("on_reload", "callbacks_on_reload")


def model_loaded_callback(sd_model):
    _run("model_loaded", "model_loaded_callback", sd_model)


def ui_tabs_callback():
    res = []
    for c in ordered_callbacks("ui_tabs"):
        try:
            res += c.callback() or []
        except Exception:
            report_exception(c, "ui_tabs_callback")
    return res


def ui_settings_callback():
    _run("ui_settings", "ui_settings_callback")


def before_image_saved_callback(params: ImageSaveParams):
    _run("before_image_saved", "before_image_saved_callback", params)


def image_saved_callback(params: ImageSaveParams):
    _run("image_saved", "image_saved_callback", params)


def extra_noise_callback(params: ExtraNoiseParams):
    _run("extra_noise", "callbacks_extra_noise", params)


def cfg_denoiser_callback(params: CFGDenoiserParams):
    _run("cfg_denoiser", "cfg_denoiser_callback", params)


def cfg_denoised_callback(params: CFGDenoisedParams):
    _run("cfg_denoised", "cfg_denoised_callback", params)


def cfg_after_cfg_callback(params: AfterCFGCallbackParams):
    _run("cfg_after_cfg", "cfg_after_cfg_callback", params)


def before_component_callback(component, **kwargs):
    _run("before_component", "before_component_callback", component, **kwargs)


def after_component_callback(component, **kwargs):
    _run("after_component", "after_component_callback", component, **kwargs)


def infotext_pasted_callback(infotext: str, params: dict[str, Any]):
    _run("infotext_pasted", "infotext_pasted", infotext, params)


def script_unloaded_callback():
    _run("script_unloaded", "script_unloaded", reverse=True)


def before_ui_callback():
    _run("before_ui", "before_ui", reverse=True)


def remove_current_script_callbacks():
    # mirrors ~L434-445: removes callbacks registered from the CALLING file
    stack = [x for x in inspect.stack() if x.filename != __file__]
    filename = stack[0].filename if stack else "unknown file"
    if filename == "unknown file":
        return
    for callback_list in callback_map.values():
        for cb in [cb for cb in callback_list if cb.script == filename]:
            callback_list.remove(cb)


def remove_callbacks_for_function(callback_func):
    for callback_list in callback_map.values():
        for cb in [cb for cb in callback_list if cb.callback == callback_func]:
            callback_list.remove(cb)


def _register(category):
    def register(callback, *, name=None):
        add_callback(callback_map["callbacks_" + category], callback, name=name, category=category)

    register.__name__ = "on_" + category
    return register


on_app_started = _register("app_started")
on_before_reload = _register("on_reload")
on_model_loaded = _register("model_loaded")
on_ui_tabs = _register("ui_tabs")
on_ui_train_tabs = _register("ui_train_tabs")
on_ui_settings = _register("ui_settings")
on_before_image_saved = _register("before_image_saved")
on_image_saved = _register("image_saved")
on_extra_noise = _register("extra_noise")
on_cfg_denoiser = _register("cfg_denoiser")
on_cfg_denoised = _register("cfg_denoised")
on_cfg_after_cfg = _register("cfg_after_cfg")
on_before_component = _register("before_component")
on_after_component = _register("after_component")
on_image_grid = _register("image_grid")
on_infotext_pasted = _register("infotext_pasted")
on_script_unloaded = _register("script_unloaded")
on_before_ui = _register("before_ui")
on_list_optimizers = _register("list_optimizers")
on_list_unets = _register("list_unets")
on_before_token_counter = _register("before_token_counter")
