"""ToMe for Stable Diffusion WebUI: the one AlwaysVisible script.

It builds the UI from the settings record, reads its arguments (UI, API list or dict, XYZ cell),
patches the model that samples, for this generation only, and writes the infotext. Everything that
needs no WebUI lives in ``tome_core``.

Lifecycle: ``setup`` ties clean-up to ``p.close()`` (which the WebUI calls in a ``with closing(p)``
even after an error), ``before_process`` removes anything of ours left from before and validates,
``process_before_every_sampling`` patches the model about to sample (first pass, hires pass, img2img)
and Mikubill's ControlNet models, the first denoiser call of each pass patches Forge's ControlNet models
(a ControlLora's exists only once sampling has started) and a model the refiner switched in,
``post_sample`` writes what could not be merged, ``postprocess`` and ``p.close()`` remove every patch.
The model is always resolved by ``tome_core.find_unet`` (WebUI, Forge Classic, Forge engine alike).
"""

from __future__ import annotations

import logging
from typing import Any

import gradio as gr
import modules.scripts as scripts
from modules import script_callbacks, shared
from modules.ui_components import InputAccordion

from tome_core import extension as ext
from tome_core import forge_controlnet
from tome_core import settings as S
from tome_core.controlnet import control_models

log = logging.getLogger("tome_core")
registry = ext.PatchRegistry()
RUN_ATTR = "tome_run"

LAYOUT: tuple[tuple[str, ...], ...] = (
    ("ratio", "max_downsample"),
    ("sx", "sy"),
    ("use_rand", "seed"),
    ("merge_attn", "merge_crossattn", "merge_mlp"),
    ("hires_ratio", "min_size"),
    ("merge_controlnet",),
    ("method", "downsample_factor"),
    ("start", "end"),
    ("share_plan", "plan_interval"),
)


def _cap_text(sx: float, sy: float) -> str:
    cap = S.ratio_cap(int(sx), int(sy))
    return f"Ratio at most 1 - 1/(stride x · stride y) = **{cap:.3g}** for {int(sx)}×{int(sy)} strides."


def _no_builtin_ratio(for_hr: bool = False) -> float:
    return 0.0


def _report(p: Any, message: str) -> None:
    """The WebUI swallows script exceptions: say it in the console and in the response's info/infotext."""
    print(f"[ToMe] {message}")
    log.error(message)
    p.extra_generation_params[ext.ERROR_KEY] = message


class ToMeScript(scripts.Script):
    def title(self) -> str:
        return ext.TITLE

    def show(self, is_img2img: bool) -> Any:
        return scripts.AlwaysVisible

    # --- UI ---------------------------------------------------------------------------------------
    def _control(self, name: str) -> gr.components.Component:
        s, default = S.spec(name), getattr(S.DEFAULTS, name)
        common = dict(label=s.label, elem_id=self.elem_id(name))
        if s.kind == "bool":
            return gr.Checkbox(value=default, **common)
        if s.kind == "choice":
            return gr.Radio(choices=list(s.choices), value=str(default), **common)
        if name == "seed":
            return gr.Number(value=default, precision=0, minimum=s.minimum, maximum=s.maximum, **common)
        return gr.Slider(minimum=s.minimum, maximum=s.maximum, step=s.step, value=default, **common)

    def ui(self, is_img2img: bool) -> list[Any]:
        controls: dict[str, Any] = {}
        enabled_spec = S.spec("enabled")
        with InputAccordion(S.DEFAULTS.enabled, label=enabled_spec.label, elem_id=self.elem_id("enabled")) as enabled:
            controls["enabled"] = enabled
            for row in LAYOUT:
                with gr.Row():
                    for name in row:
                        controls[name] = self._control(name)
                if row == ("sx", "sy"):
                    cap = gr.Markdown(_cap_text(S.DEFAULTS.sx, S.DEFAULTS.sy), elem_id=self.elem_id("ratio_cap"))
        for stride in (controls["sx"], controls["sy"]):
            stride.change(
                self._on_stride,
                inputs=[controls["sx"], controls["sy"], controls["ratio"], controls["hires_ratio"]],
                outputs=[controls["ratio"], controls["hires_ratio"], cap],
                show_progress=False,
            )
        components = [controls[name] for name in S.NAMES]
        self.infotext_fields = ext.paste_fields(components)
        self.paste_field_names = [key for _, key in self.infotext_fields]
        return components

    @staticmethod
    def _on_stride(sx: float, sy: float, ratio: float, hires_ratio: float) -> tuple[Any, Any, str]:
        cap = round(S.ratio_cap(int(sx), int(sy)), 4)
        return (
            gr.update(maximum=cap, value=min(ratio, cap)),
            gr.update(maximum=cap, value=min(hires_ratio, cap)),
            _cap_text(sx, sy),
        )

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
            _report(p, f"{error}; ToMe is off for this generation")
            return
        if not settings.enabled:
            return
        setattr(p, RUN_ATTR, ext.Run(settings))
        p.extra_generation_params.update(ext.infotext(settings, used_seed=None))
        builtin = max(p.get_token_merging_ratio(), p.get_token_merging_ratio(for_hr=True))
        if builtin > 0:
            # one token merging at a time: ours, for this generation; the WebUI setting itself is untouched
            p.get_token_merging_ratio = _no_builtin_ratio
            p.extra_generation_params[ext.BUILTIN_KEY] = builtin

    def before_hr(self, p: Any, *args: Any) -> None:
        run = getattr(p, RUN_ATTR, None)
        if run is not None:
            run.hires_pending = True

    def process_before_every_sampling(self, p: Any, *args: Any, **kwargs: Any) -> None:
        run: ext.Run | None = getattr(p, RUN_ATTR, None)
        if run is None:
            return
        # the hires pass: p.is_hr_pass in 1.10; before_hr's flag where it is missing (consumed here, so
        # that the next batch iteration's first pass is not taken for a hires pass)
        hires, run.hires_pending = bool(getattr(p, "is_hr_pass", run.hires_pending)), False
        _unpatch(run)
        x = kwargs.get("x")
        height, width = (int(x.shape[-2]) * 8, int(x.shape[-1]) * 8) if x is not None else (p.height, p.width)
        if run.too_small(width, height):
            run.note(
                f"{'hires' if hires else 'first'} pass {width}x{height} is below the minimum size {run.settings.min_size} px: not merged"
            )
            p.extra_generation_params[ext.NOTE_KEY] = run.note_text
            return
        seeds = getattr(p, "seeds", None)
        settings = run.pass_settings(seeds[0] if seeds else getattr(p, "seed", None), hires)
        control = [*control_models(p, run.notes)] if settings.merge_controlnet else []
        if not _patch(p, run, settings, [shared.sd_model, *control]):
            return
        if settings.use_rand:
            p.extra_generation_params[S.spec("seed").infotext] = settings.seed
        if run.notes:
            p.extra_generation_params[ext.NOTE_KEY] = run.note_text

    def post_sample(self, p: Any, ps: Any, *args: Any) -> None:
        """After the sampling passes of a batch, before its infotext: say what could not be merged."""
        run: ext.Run | None = getattr(p, RUN_ATTR, None)
        if run is not None:
            run.note(*registry.shortfalls())
            if run.notes:
                p.extra_generation_params[ext.NOTE_KEY] = run.note_text

    def postprocess(self, p: Any, processed: Any, *args: Any) -> None:
        registry.clear(shared.sd_model)


def _unpatch(run: ext.Run) -> None:
    """Remove every patch (keeping what they could not merge for the note): between passes and on failure."""
    run.note(*registry.shortfalls())
    registry.clear(shared.sd_model)
    run.current = None


def _patch(p: Any, run: ext.Run, settings: S.ToMeSettings, models: list[Any]) -> bool:
    """Patch ``models`` (the model that samples, control models); all or nothing: on an error every patch is
    removed and the error reported, not raised."""
    try:
        for model in models:
            registry.apply(model, settings)
    except Exception as error:  # never leave a half-patched model behind
        _unpatch(run)
        _report(p, ext.describe_error(error))
        return False
    run.current = settings
    return True


# --- callbacks --------------------------------------------------------------------------------------


def _on_cfg_denoiser(params: Any) -> None:
    """Sampling progress for the step schedule and plan reuse (each sampling pass starts again at 0). Also
    follows the model: a UNet the refiner switched in mid-sampling is patched (the old one cleaned), and at a
    pass's first call the control models Forge's ControlNet attached (ControlLora's exist only from here on)."""
    denoiser = getattr(params, "denoiser", None)
    p = getattr(denoiser, "p", None)
    run: ext.Run | None = getattr(p, RUN_ATTR, None)
    if run is not None and run.current is not None:
        settings = run.current
        models = []
        if not registry.patched(shared.sd_model):  # the refiner switched models: follow it
            _unpatch(run)
            models = (
                [shared.sd_model, *control_models(p, run.notes)] if settings.merge_controlnet else [shared.sd_model]
            )
        if models or getattr(denoiser, "step", None) == 0:
            control = forge_controlnet.control_models(shared.sd_model) if settings.merge_controlnet else ()
            models += [m for m in control if not registry.patched(m)]
            _patch(p, run, settings, models)
    registry.set_progress(ext.sampling_progress(params))


def _on_infotext_pasted(infotext: str, params: dict[str, Any]) -> None:
    ext.fill_pasted(params)


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
