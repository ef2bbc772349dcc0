"""ToMe for Stable Diffusion WebUI: the one AlwaysVisible script.

It builds the UI from the settings record, reads its arguments (UI, API list or dict, XYZ cell),
patches the model that samples, for this generation only, and writes the infotext. Everything that
needs no WebUI lives in ``webui_tome`` (this host family's adapter) and ``tome_core`` (the engine, and the run record
and infotext every host shares).

Lifecycle: ``setup`` ties clean-up to ``p.close()`` (which the WebUI calls in a ``with closing(p)``
even after an error), ``before_process`` removes anything of ours left from before and validates,
``process_before_every_sampling`` patches the model about to sample (first pass, hires pass, img2img)
and Mikubill's ControlNet models, the first denoiser call of each pass patches Forge's ControlNet models
(a ControlLora's exists only once sampling has started) and a model the refiner switched in,
``post_sample`` writes what could not be merged and removes the patches (nested generations in
``postprocess_image``, such as ADetailer's, never meet them), ``postprocess`` and ``p.close()`` remove every patch.
The model is always resolved by ``tome_core.find_unet`` (WebUI, Forge Classic, Forge engine alike).
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

import gradio as gr
import modules.scripts as scripts
from modules import script_callbacks, shared
from modules.ui_components import InputAccordion

from tome_core import run as R
from tome_core import settings as S
from tome_core.session import get_patch
from webui_tome import extension as ext
from webui_tome import forge_caches, forge_controlnet
from webui_tome.controlnet import control_models

log = logging.getLogger("tome_core")
registry = ext.PatchRegistry()
RUN_ATTR = "tome_run"

FIRST_VIEW: tuple[tuple[str, ...], ...] = (
    ("ratio", "hires_ratio"),
    ("method", "max_downsample"),
    ("cache",),
)
"""Rows shown when the accordion opens: what most people set."""
ADVANCED: tuple[tuple[str, ...], ...] = (
    ("sx", "sy"),  # the stride cap note follows this row
    ("use_rand", "seed"),
    ("merge_attn", "merge_crossattn", "merge_mlp"),
    ("share_plan", "plan_interval"),
    ("start", "end"),
    ("min_size", "downsample_factor"),
    ("merge_controlnet",),
    ("cache_interval", "hires_cache_interval"),
    ("cache_start", "cache_end", "cache_branch"),
    ("cache_forecast", "cache_schedule", "cache_threshold"),
    ("cache_device", "cache_correction"),
)
"""Rows of the closed "Advanced" accordion inside: every other setting."""
LAYOUT = FIRST_VIEW + ADVANCED
SCALE = {"method": 2, "max_downsample": 3}
"""Relative widths in a row (default 1): the five choices of max downsample stay on one line at a 600 px column."""
ADVANCED_LABEL = "Advanced: strides, random seed, merge targets, plan reuse, schedule, step cache"
INTRO = (
    "Merging gains from about 1024 px (large images, the hires. fix pass); the step cache gains at 512 px too. "
    "Hover a control for details."
)
NOTE_CLASS = "tome-note"  # style.css
CAPPED = ("ratio", "hires_ratio")
"""Sliders whose largest allowed value depends on the strides."""
METHOD_SPECIFIC = tuple(name for name in S.NAMES if S.spec(name).method)
"""Controls greyed out unless ``method`` is the one that reads them."""


def _capped_max(slider: Any, sx: float, sy: float) -> float:
    """The largest value on ``slider``'s steps that ``sx x sy`` strides and its maximum allow (2/3 → 0.66 on 0.01
    steps, 0.65 on 0.05 ones). Read from the slider itself: the WebUI's ui-config.json may have replaced the
    record's step or maximum (it saves them by label on the first start and restores them on later ones)."""
    low, step = float(slider.minimum), float(slider.step)
    top = min(S.ratio_cap(int(sx), int(sy)), float(slider.maximum))
    return round(low + max(math.floor((top - low) / step + 1e-9), 0) * step, 10)


def _cap_text(ratio: Any, sx: float, sy: float) -> str:
    cap = _capped_max(ratio, sx, sy)
    return f"With {int(sx)}×{int(sy)} strides the ratios go up to **{cap:g}** (at most 1 − 1/(stride x · stride y))."


def _on_strides(sliders: list[Any], sx: float, sy: float, ratio: float, hires_ratio: float) -> tuple[Any, ...]:
    """Any stride or ratio change: pull a ratio above the strides' cap down to it (one that fits is left
    alone), and say the cap. The sliders' maximum never moves, so a pasted ratio is always drawn where it is."""
    updates = []
    for slider, value in zip(sliders, (ratio, hires_ratio)):
        cap = _capped_max(slider, sx, sy)
        updates.append(gr.update(value=cap) if value is not None and value > cap + 1e-9 else gr.update())
    return (*updates, _cap_text(sliders[0], sx, sy))


def _on_method(method: str) -> tuple[Any, ...]:
    """Only the controls that the chosen method reads are interactive."""
    return tuple(gr.update(interactive=S.spec(name).method == method) for name in METHOD_SPECIFIC)


def _on_change(trigger: Any, fn: Any, inputs: list[Any], outputs: list[Any]) -> None:
    """``fn`` on every change of ``trigger``, and once more when it returns: gradio 3 drops a change that comes
    while the same listener is still running (a typed "0.9" after "0"), so the second call reads the values the
    first one missed (gradio 4 reruns it itself; the second call then changes nothing)."""
    trigger.change(fn, inputs=inputs, outputs=outputs, show_progress=False).then(
        fn, inputs=inputs, outputs=outputs, show_progress=False
    )


def _no_builtin_ratio(for_hr: bool = False) -> float:
    return 0.0


def _report(p: Any, message: str) -> None:
    """The WebUI swallows script exceptions: say it in the console and in the response's info/infotext."""
    print(f"[ToMe] {message}")
    log.error(message)
    p.extra_generation_params[R.ERROR_KEY] = message


def _off(p: Any, message: str) -> None:
    """ToMe is off for the rest of this generation: no run, none of our infotext keys but the error (and the built-in
    ratio it replaced)."""
    setattr(p, RUN_ATTR, None)
    p.extra_generation_params = {
        k: v for k, v in p.extra_generation_params.items() if not str(k).startswith("ToMe") or k == R.BUILTIN_KEY
    }
    _report(p, f"{message}; ToMe is off for this generation")


class ToMeScript(scripts.Script):
    def title(self) -> str:
        return ext.TITLE

    def show(self, is_img2img: bool) -> Any:
        return scripts.AlwaysVisible

    # --- UI ---------------------------------------------------------------------------------------
    def _control(self, name: str, hidden: frozenset[str] = frozenset()) -> gr.components.Component:
        s, default = S.spec(name), getattr(S.DEFAULTS, name)
        common = dict(label=s.label, elem_id=self.elem_id(name), scale=SCALE.get(name, 1))
        if name in hidden:  # it cannot act in this host: kept for the arguments' order, the paste and the API
            common["visible"] = False
        if s.method is not None:
            common["interactive"] = s.method == S.DEFAULTS.method
        if s.kind == "bool":
            return gr.Checkbox(value=default, **common)
        if s.kind == "choice":
            return gr.Radio(choices=list(s.choices), value=str(default), **common)
        if name == "seed":
            return gr.Number(value=default, precision=0, minimum=s.minimum, maximum=s.maximum, **common)
        return gr.Slider(minimum=s.minimum, maximum=s.maximum, step=s.step, value=default, **common)

    def _rows(
        self, rows: tuple[tuple[str, ...], ...], controls: dict[str, Any], hidden: frozenset[str] = frozenset()
    ) -> None:
        for row in rows:
            with gr.Row():
                for name in row:
                    controls[name] = self._control(name, hidden)
            if row == ("sx", "sy"):
                text = _cap_text(controls["ratio"], S.DEFAULTS.sx, S.DEFAULTS.sy)
                controls["ratio_cap"] = self._note(text, "ratio_cap")

    def _note(self, text: str, name: str) -> gr.Markdown:
        return gr.Markdown(text, elem_id=self.elem_id(name), elem_classes=[NOTE_CLASS])

    def ui(self, is_img2img: bool) -> list[Any]:
        controls: dict[str, Any] = {}
        hidden = ext.hidden_controls(ext.host_version())  # what can never act in this host
        enabled_spec = S.spec("enabled")
        with InputAccordion(S.DEFAULTS.enabled, label=enabled_spec.label, elem_id=self.elem_id("enabled")) as enabled:
            controls["enabled"] = enabled
            self._note(INTRO, "intro")
            self._rows(FIRST_VIEW, controls)
            with gr.Accordion(ADVANCED_LABEL, open=False, elem_id=self.elem_id("advanced")):
                self._rows(ADVANCED, controls, hidden)
        capped = [controls[name] for name in CAPPED]
        on_strides = functools.partial(_on_strides, capped)
        for trigger in (controls["sx"], controls["sy"], *capped):
            _on_change(trigger, on_strides, [controls["sx"], controls["sy"], *capped], [*capped, controls["ratio_cap"]])
        _on_change(controls["method"], _on_method, [controls["method"]], [controls[n] for n in METHOD_SPECIFIC])
        components = [controls[name] for name in S.NAMES]
        self.infotext_fields = ext.paste_fields(components)
        self.paste_field_names = [key for _, key in self.infotext_fields]
        return components

    # --- generation lifecycle -----------------------------------------------------------------------
    def setup(self, p: Any, *args: Any) -> None:
        """Tie the clean-up to ``p.close()``: the WebUI closes every processing object in a ``finally``."""
        if getattr(p.close, "_tome_cleanup", False):
            return
        original_close = p.close

        def close() -> None:
            try:
                registry.clear(shared.sd_model)
            finally:
                original_close()

        close._tome_cleanup = True  # type: ignore[attr-defined]
        p.close = close

    def before_process(self, p: Any, *args: Any) -> None:
        registry.clear(shared.sd_model)  # nothing of ours survives an earlier generation, whatever ended it
        # XYZ cells share one dict with each other and the template: give this run its own, without our keys
        p.extra_generation_params = {
            k: v for k, v in p.extra_generation_params.items() if not str(k).startswith("ToMe")
        }
        setattr(p, RUN_ATTR, None)
        try:
            settings = ext.parse(args, getattr(p, ext.OVERRIDES_ATTR, None))
        except S.SettingsError as error:
            _off(p, str(error))
            return
        if not settings.enabled:
            return
        setattr(p, RUN_ATTR, R.Run(settings))
        p.extra_generation_params.update(R.infotext(settings, used_seed=None))
        builtin = max(p.get_token_merging_ratio(), p.get_token_merging_ratio(for_hr=True))
        if builtin > 0:
            # one token merging at a time: ours, for this generation; the WebUI setting itself is untouched
            p.get_token_merging_ratio = _no_builtin_ratio
            p.extra_generation_params[R.BUILTIN_KEY] = builtin

    def before_hr(self, p: Any, *args: Any) -> None:
        run = getattr(p, RUN_ATTR, None)
        if run is not None:
            run.hires_pending = True

    def process_before_every_sampling(self, p: Any, *args: Any, **kwargs: Any) -> None:
        run: R.Run | None = getattr(p, RUN_ATTR, None)
        if run is None:
            return
        # the hires pass: p.is_hr_pass in 1.10; before_hr's flag where it is missing (consumed here, so
        # that the next batch iteration's first pass is not taken for a hires pass)
        hires, run.hires_pending = bool(getattr(p, "is_hr_pass", run.hires_pending)), False
        _unpatch(run)
        run.pass_name = "hires" if hires else "first"
        if not hires:  # a new batch: its own count of cached steps
            run.cache_steps.clear()
        x = kwargs.get("x")
        height, width = (int(x.shape[-2]) * 8, int(x.shape[-1]) * 8) if x is not None else (p.height, p.width)
        seeds = getattr(p, "seeds", None)
        settings = run.pass_settings(seeds[0] if seeds else getattr(p, "seed", None), hires)
        run.refined = ext.REFINER_KEY in p.extra_generation_params  # a switch during this pass adds the key
        other = forge_caches.other_cache(shared.sd_model) if settings.caches else None
        if other is not None:  # one step cache at a time: theirs (its script ran before ours: a built-in)
            run.note(f"step cache off: {other} caches the steps")
            settings = settings.replace(cache=False)
        if run.too_small(width, height):
            run.note(
                f"{'hires' if hires else 'first'} pass {width}x{height} is below the minimum size {run.settings.min_size} px: not merged"
            )
            if not settings.caches:
                _write_note(p, run)
                return
            settings = settings.replace(ratio=0.0, method="merge")  # the step cache alone
        if not _patch(p, run, settings, *_pass_models(p, run, settings)):
            return
        if R.records_seed(settings):
            p.extra_generation_params[S.spec("seed").infotext] = settings.seed
        _write_note(p, run)

    def post_sample(self, p: Any, ps: Any, *args: Any) -> None:
        """After the sampling passes of a batch, before its infotext: say what could not be merged, and unpatch. What
        runs the UNet after this (ADetailer's inpainting passes in ``postprocess_image``) is another generation with a
        lifecycle of its own, never the stale patch of this one; the next batch is patched again before it samples."""
        run: R.Run | None = getattr(p, RUN_ATTR, None)
        if run is not None:
            _unpatch(run)
            _write_note(p, run)

    def postprocess(self, p: Any, processed: Any, *args: Any) -> None:
        registry.clear(shared.sd_model)


def _pass_models(p: Any, run: R.Run, settings: S.ToMeSettings) -> tuple[list[Any], list[Any]]:
    """What a sampling pass patches: the model that samples, and Mikubill's ControlNet models (run inside the UNet's
    call), with ``merge_controlnet`` or the step cache (which shortens them on cached steps); Forge's are added at
    the pass's first denoiser call."""
    control = control_models(p, run.notes) if settings.merge_controlnet or settings.caches else ()
    return [shared.sd_model], list(control)


def _write_note(p: Any, run: R.Run) -> None:
    """The ``ToMe note`` infotext entry, when there is something to say, and the steps the cache ran."""
    if run.notes:
        p.extra_generation_params[R.NOTE_KEY] = run.note_text
    p.extra_generation_params.update(run.cache_entries())


def _unpatch(run: R.Run) -> None:
    """Remove every patch (keeping what they could not merge for the note, and the cache's steps): between passes and on
    failure."""
    run.note(*registry.shortfalls())
    run.count_cache(registry.cache_counts())
    registry.clear(shared.sd_model)
    run.current = None


def _patch(p: Any, run: R.Run, settings: S.ToMeSettings, models: list[Any], followers: list[Any] = ()) -> bool:
    """Patch ``models`` (the model that samples, control models) and ``followers`` (Mikubill's control models, run
    inside the UNet's call: the UNet's cached steps shorten them); all or nothing: on an error every patch is removed,
    the error reported, not raised, and ToMe is off for the rest of the generation. A control model is no UNet to
    cache: it merges (``merge_controlnet``) or follows the cache only."""
    merging = settings.replace(cache=False)
    control = merging if settings.merge_controlnet else merging.replace(ratio=0.0, method="merge")
    try:
        for model in models:
            registry.apply(model, settings if model is shared.sd_model else control)
        unet = get_patch(shared.sd_model)
        leader = unet.cache if unet is not None else None
        for model in followers:
            if settings.merge_controlnet or leader is not None:
                registry.apply(model, control, leader)
    except Exception as error:  # never leave a half-patched model behind
        _unpatch(run)
        _off(p, R.describe_error(error))
        return False
    run.current = settings
    return True


# --- callbacks --------------------------------------------------------------------------------------


def _on_cfg_denoiser(params: Any) -> None:
    """Sampling progress for the step schedule and plan reuse (each sampling pass starts again at 0). Also
    follows the model: a UNet the refiner switched in mid-sampling is patched (the old one cleaned; Neo's *Reload
    state_dict only* loads the refiner's weights into the same UNet, which is patched afresh, so that the step cache
    starts again), and at a pass's first call the control models Forge's ControlNet attached (ControlLora's exist only
    from here on)."""
    denoiser = getattr(params, "denoiser", None)
    p = getattr(denoiser, "p", None)
    run: R.Run | None = getattr(p, RUN_ATTR, None)
    if run is not None and run.current is not None:
        settings = run.current
        models, followers = [], []
        # the refiner took over at this call: another model, or (Neo) its weights loaded into the same one
        refined = not run.refined and ext.REFINER_KEY in p.extra_generation_params
        run.refined = run.refined or refined
        if refined or not registry.patched(shared.sd_model):  # follow it: a fresh patch, a fresh step cache
            _unpatch(run)
            models, followers = _pass_models(p, run, settings)
        if models or getattr(denoiser, "step", None) == 0:
            control = forge_controlnet.control_models(shared.sd_model) if settings.merge_controlnet else ()
            models += [m for m in control if not registry.patched(m)]  # Forge's: run before the UNet's call
            if models or followers:
                _patch(p, run, settings, models, followers)
    registry.set_progress(*ext.sampling_position(params))
    if run is not None and run.current is not None and run.current.caches and run.current.cache_correction > 0:
        registry.set_sampler(*ext.sampler_schedule(params))


def _on_infotext_pasted(infotext: str, params: dict[str, Any]) -> None:
    R.fill_pasted(params)


def _on_before_ui() -> None:
    xyz = next((d.module for d in scripts.scripts_data if d.script_class.__module__ == "xyz_grid.py"), None)
    if xyz is None:
        print("[ToMe] the XYZ plot script is not loaded: no ToMe axes")
        return
    known = {option.label for option in xyz.axis_options}
    for axis in ext.axes():
        if axis.label in known:
            continue  # registered once, also after a script reload
        xyz.axis_options.append(
            xyz.AxisOption(
                axis.label,
                axis.type,
                lambda p, x, xs, axis=axis: axis.apply(p, x),
                confirm=lambda p, xs, axis=axis: axis.confirm(xs),
                choices=(lambda axis=axis: list(axis.choices)) if axis.choices else None,
            )
        )


def _on_script_unloaded() -> None:
    registry.clear(shared.sd_model)


script_callbacks.on_cfg_denoiser(_on_cfg_denoiser)
script_callbacks.on_infotext_pasted(_on_infotext_pasted)
script_callbacks.on_before_ui(_on_before_ui)
script_callbacks.on_script_unloaded(_on_script_unloaded)
