"""The WebUI extension's logic that needs no WebUI (A1111, Forge, Forge Classic, Forge Neo): the script's arguments,
the sampling position read from the denoiser, the registry of patched models, XYZ axes, paste-back fields and the
javascript hover hints, all derived from the settings record. ``scripts/tome.py`` wires it up; the run record and
the infotext, which ComfyUI shares, are :mod:`tome_core.run`.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from tome_core import settings as S
from tome_core.caching import samplers
from tome_core.caching.correction import why_not_corrected
from tome_core.report import PassCount
from tome_core.session import Session, apply_settings, find_unet, get_patch, remove_patch
from tome_core.settings import SettingsError, ToMeSettings

log = logging.getLogger("tome_core")

TITLE = "ToMe"
REFINER_KEY = "Refiner"  # the host's infotext key, set by its apply_refiner when it switches to the refiner
JS_PATH = "javascript/tome.js"


# --- arguments ------------------------------------------------------------------------------------


def parse(args: Iterable[Any], overrides: dict[str, Any] | None = None) -> ToMeSettings:
    """Settings from the script's arguments (positional, or one dict) plus XYZ overrides. Raises SettingsError."""
    base = S.to_dict(S.from_args(list(args)))
    return S.from_dict({**base, **(overrides or {})})


def sampling_position(params: Any) -> tuple[float, int]:
    """Fraction of the pass's sampling steps done when the denoiser is called (``CFGDenoiserParams``), and the
    pass's number of steps.

    The step index comes from the denoiser's own call count (``step``, ``steps``, ``total_steps``: the
    count the WebUI's ``skip_early_cond`` uses; ``total_steps`` is twice ``steps`` for second-order
    samplers), because ``params.sampling_step`` is set by the sampler's callback after a step's first
    call and so reads 0, 0, 1, 2, … with Euler. Denoisers without that count fall back to it.
    """
    denoiser = getattr(params, "denoiser", None)
    calls, steps, total = (getattr(denoiser, name, None) for name in ("step", "steps", "total_steps"))
    if all(isinstance(v, int) for v in (calls, steps, total)) and 0 < steps <= total:
        return min(calls // (total // steps) / steps, 1.0), steps
    total = max(int(getattr(params, "total_sampling_steps", 0) or 0), 1)
    return min(int(params.sampling_step) / total, 1.0), total


def sampler_schedule(params: Any) -> tuple[str | None, list[float] | None, Any, str | None]:
    """What ``cache_correction`` needs of this denoiser call (``CFGDenoiserParams``): the sampler's name, the pass's
    sigmas from its first step (the call's own sigma found in them, less the call's step, :func:`sampling_position`)
    and the sampler's own function (``func``), where the sampler is a linear one (k-diffusion's ``sample_euler``
    without ``s_churn``, ``sample_dpmpp_2m``, ``sample_res_multistep``, Forge Neo's ``sample_unipc``, …:
    :data:`tome_core.caching.samplers.LINEAR`), the model's output is its direction (the predictor's
    ``denoised = x − σ·out``) and the host hands its sampler's sigmas to the model (Forge Neo:
    ``transformer_options["sampling_sigmas"]``, ``sd_samplers_kdiffusion.py:193, 248``, all of them, of which img2img
    runs the tail); else Nones and why not."""
    denoiser = getattr(params, "denoiser", None)
    sampler, p = getattr(denoiser, "sampler", None), getattr(denoiser, "p", None)
    function = getattr(sampler, "func", None)
    name = samplers.name_of(str(getattr(function, "__name__", getattr(p, "sampler_name", "unknown"))))
    predictor = getattr(getattr(sampler, "model_wrap", None), "predictor", None)
    churn = float(getattr(p, "s_churn", 0.0) or 0.0)
    why_not = why_not_corrected(getattr(p, "sampler_name", name), name, churn, predictor)
    if why_not:
        return None, None, None, why_not
    unet = getattr(getattr(getattr(p, "sd_model", None), "forge_objects", None), "unet", None)
    options = getattr(unet, "model_options", {}).get("transformer_options", {})
    sigmas, sigma = options.get("sampling_sigmas"), getattr(params, "sigma", None)
    if sigmas is None or sigma is None:
        return None, None, None, "this host gives no sampler's schedule (ComfyUI and Forge Neo do)"
    values, now = [float(s) for s in sigmas], float(sigma.flatten()[0])
    fraction, steps = sampling_position(params)
    here = next((i for i, s in enumerate(values) if abs(s - now) <= 1e-5 * max(abs(now), 1e-8)), None)
    start = None if here is None else here - round(fraction * steps)
    if start is None or start < 0 or len(values) - start != steps + 1:
        return None, None, None, "the sampler's sigmas do not match this pass's steps"

    def sample(model: Any, x: Any, sigmas: Any) -> Any:
        return function(model, x, sigmas, extra_args={}, callback=None, disable=True)

    return name, values[start:], sample if callable(function) else None, None


def sampling_progress(params: Any) -> float:
    """Fraction of the pass's sampling steps done when the denoiser is called (see :func:`sampling_position`)."""
    return sampling_position(params)[0]


# --- the host -------------------------------------------------------------------------------------

NEO = "neo"
"""``modules_forge.forge_version.version`` in Forge Neo (``webui/modules_forge/forge_version.py`` at ``5692d2d``: "neo",
release "2.26"); Forge main has ``2.0.1v1.10.1`` (at ``dfdcbab``), Forge Classic ``classic`` (at ``1f95d71``), and A1111
has no ``modules_forge``."""
ONLY_IN_NEO = ("cache_correction",)
"""Settings that can act only in Forge Neo: the correction needs a diffusion transformer under a linear sampler (Euler,
DPM++ 2M, UniPC, …), with the sampler's sigmas handed to the model (:func:`sampler_schedule`). A1111 and Forge Classic run UNets only; Forge main's Flux is a
transformer, but Forge hands the model no sigmas."""


def host_version() -> str | None:
    """The Forge family member this WebUI is (``modules_forge.forge_version.version``); None: A1111 (no Forge)."""
    try:
        from modules_forge import forge_version  # type: ignore[import-not-found]
    except ImportError:
        return None
    return str(getattr(forge_version, "version", "")) or None


def hidden_controls(version: str | None) -> frozenset[str]:
    """The settings whose control the accordion hides in the host ``version`` (:func:`host_version`): those that can
    never act there. They stay in the script's arguments, the API, the infotext and the XYZ axes, hidden only: a value
    given anyway runs, and the cache names it in a ``ToMe note`` where it cannot act."""
    return frozenset() if version == NEO else frozenset(ONLY_IN_NEO)


# --- per-generation state ---------------------------------------------------------------------------


class PatchRegistry:
    """Every module this extension patched, so that one call removes them all, whatever happened since
    (a checkpoint switch keeps the old model in the WebUI's cache, with its hooks). Models are resolved with
    :func:`find_unet` (a WebUI model, a Forge engine, a control model), here as in patching."""

    def __init__(self) -> None:
        self._roots: weakref.WeakSet[nn.Module] = weakref.WeakSet()

    def apply(self, model: Any, settings: ToMeSettings, leader: Any = None) -> None:
        """Patch ``model`` (``leader``: the UNet's step cache, for a control model run inside the UNet's call)."""
        self._roots.add(apply_settings(model, settings, leader).root)

    def clear(self, *also: Any) -> None:
        """Remove our patch from every module we patched and from the UNet of each of ``also`` (defensive: a
        reloaded script has an empty registry but the model may still carry a patch of ours)."""
        for root in [*self._roots, *(find_unet(m) for m in also if m is not None)]:
            if root is not None:
                remove_patch(root)
        self._roots.clear()

    def patched(self, model: Any) -> bool:
        """Whether the UNet of ``model`` carries a patch of ours."""
        root = find_unet(model)
        return root is not None and root in self._roots and get_patch(root) is not None

    def _live(self) -> list[Session]:
        """The patches still on the modules we patched."""
        return [patch for patch in (get_patch(root) for root in list(self._roots)) if patch is not None]

    def set_progress(self, fraction: float | None, steps: int | None = None) -> None:
        """Report sampling progress (and the pass's step count) to every live patch: the step schedule, plan reuse
        and the step cache read it."""
        for patch in self._live():
            patch.set_progress(fraction, steps)

    def set_sampler(
        self, name: str | None, sigmas: list[float] | None, sample: Any = None, why_not: str | None = None
    ) -> None:
        """Say the sampler to every live patch (:meth:`tome_core.session.Session.set_sampler`): ``cache_correction``
        needs the sampler and its sigmas."""
        for patch in self._live():
            patch.set_sampler(name, sigmas, sample, why_not)

    def cache_counts(self) -> list[PassCount]:
        """The steps the live patches' step caches ran, per sampling pass (control models have no cache)."""
        out: list[PassCount] = []
        for patch in self._live():
            if patch.cache is not None:
                out.extend(patch.cache.report().passes)
        return out

    def shortfalls(self) -> list[str]:
        """What the live patches could not merge (:meth:`Session.report`): each phrase once, whichever model said it."""
        out: list[str] = []
        for patch in self._live():
            for note in patch.report().notes:
                if note not in out:
                    out.append(note)
        return out

    def __len__(self) -> int:
        return sum(1 for root in self._roots if get_patch(root) is not None)


def paste_fields(components: Iterable[Any]) -> list[tuple[Any, str]]:
    """``(component, infotext key)`` pairs in field order, for ``Script.infotext_fields``."""
    return [(c, S.spec(name).infotext) for c, name in zip(components, S.NAMES)]


# --- XYZ --------------------------------------------------------------------------------------------


OVERRIDES_ATTR = "tome_overrides"


@dataclass(frozen=True)
class Axis:
    """One XYZ axis: a label, the xyz value type, which fields a value sets, and the choices if any."""

    label: str
    type: type
    fields: tuple[str, ...]
    choices: tuple[str, ...] = ()

    def values_for(self, value: Any) -> dict[str, Any]:
        """Field values from one axis value (``"2x2"`` for the stride axis). Raises SettingsError."""
        if self.fields == ("sx", "sy"):
            parts = str(value).lower().replace("×", "x").split("x")
            if len(parts) != 2:
                raise SettingsError("stride", value, "'XxY' with X and Y from 1 to 8, e.g. 2x2")
            return {"sx": S.coerce("sx", parts[0].strip()), "sy": S.coerce("sy", parts[1].strip())}
        return {self.fields[0]: S.coerce(self.fields[0], value)}

    def apply(self, p: Any, value: Any) -> None:
        """Record the cell's value on (the shallow copy of) ``p`` without sharing the dict between cells."""
        setattr(p, OVERRIDES_ATTR, {**getattr(p, OVERRIDES_ATTR, {}), **self.values_for(value)})

    def confirm(self, values: Iterable[Any]) -> None:
        for value in values:
            self.values_for(value)


def axes() -> list[Axis]:
    """An axis for every setting (booleans as True/False choices), plus one for both strides."""
    out = []
    for name in S.NAMES:
        s = S.spec(name)
        label = f"[ToMe] {s.axis or s.label}"
        if s.kind == "bool":
            out.append(Axis(label, str, (name,), ("True", "False")))
        elif s.kind == "choice":
            out.append(Axis(label, str, (name,), s.choices))
        else:
            out.append(Axis(label, int if s.kind == "int" else float, (name,)))
    out.insert(S.NAMES.index("sy") + 1, Axis("[ToMe] Stride (XxY)", str, ("sx", "sy")))
    return out


# --- javascript hints --------------------------------------------------------------------------------


def hints_js() -> str:
    """The source of ``javascript/tome.js``: hover titles for every control, from the settings record, set when the
    UI has loaded and again after UI updates (a control gradio re-created has lost its title)."""
    hints = {name: S.spec(name).hint for name in S.NAMES}
    return (
        "// Generated from tome_core/settings.py by `python -m webui_tome.extension`; do not edit.\n"
        "(function () {\n"
        f"    const hints = {json.dumps(hints, indent=8, ensure_ascii=False)[:-1]}    }};\n"
        "    function addTitles() {\n"
        "        for (const tab of ['txt2img', 'img2img']) {\n"
        "            for (const [name, hint] of Object.entries(hints)) {\n"
        "                const el = gradioApp().getElementById(`script_${tab}_tome_${name}`);\n"
        "                if (el && !el.title) el.title = hint;\n"
        "            }\n"
        "        }\n"
        "    }\n"
        "    onUiLoaded(addTitles);\n"
        "    // gradio 3 rebuilds a control whose interactivity changes (the method greys some out): title it again\n"
        "    onAfterUiUpdate(addTitles);\n"
        "})();\n"
    )


if __name__ == "__main__":  # regenerate javascript/tome.js
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / JS_PATH
    path.write_text(hints_js(), encoding="utf-8")
    print(f"wrote {path}")
