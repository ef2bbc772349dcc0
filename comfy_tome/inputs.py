"""The nodes' inputs, derived from the settings record (:data:`tome_core.settings.FIELDS`): the HTTP API names of the
WebUI extension, with its defaults, bounds and steps, and its hints as tooltips. A field added to the record appears
as an input of the node it belongs to without a change here.

Which node takes a field: ``ToMeStepCache`` every step-cache field (those named ``cache_*``), ``ToMe`` every other
one, except what a ComfyUI graph says by its shape: ``enabled`` and ``cache`` (the node being in the chain turns
each on), and the WebUI's hires-fix settings ``hires_ratio`` and ``hires_cache_interval`` (in ComfyUI a hires pass is
another KSampler, whose model gets a ToMe node of its own with the values that pass should use).
"""

from __future__ import annotations

from typing import Any

from tome_core import settings as S

BY_THE_GRAPH = ("enabled", "cache")
"""Fields a node stands for: chaining ``ToMe`` enables merging, chaining ``ToMeStepCache`` turns the cache on."""
HIRES = ("hires_ratio", "hires_cache_interval")
"""The WebUI's hires-fix pass settings: a ComfyUI hires pass is another KSampler, with its own nodes."""
FIRST = ("ratio", "method", "max_downsample")
"""The merging inputs shown first; the others follow in the record's order."""


def cache_fields() -> tuple[str, ...]:
    """The step cache's settings, in the record's order: every field named ``cache_*``."""
    return tuple(name for name in S.NAMES if name.startswith("cache_"))


def merge_fields() -> tuple[str, ...]:
    """Token merging's settings: :data:`FIRST`, then every other field that is neither the cache's nor one of
    :data:`BY_THE_GRAPH` / :data:`HIRES`, in the record's order."""
    skip = {*BY_THE_GRAPH, *HIRES, *cache_fields()}
    rest = tuple(name for name in S.NAMES if name not in skip and name not in FIRST)
    return (*FIRST, *rest)


def input_type(name: str) -> tuple[Any, dict[str, Any]]:
    """The ComfyUI input of one setting: its widget type and options (default, bounds, step, tooltip)."""
    spec, default = S.spec(name), getattr(S.DEFAULTS, name)
    options: dict[str, Any] = {"tooltip": spec.hint}
    if spec.kind == "bool":
        return "BOOLEAN", {"default": default, **options}
    if spec.kind == "choice":
        return list(spec.choices), {"default": str(default), **options}
    number = int if spec.kind == "int" else float
    options.update(default=default, min=number(spec.minimum), max=number(spec.maximum), step=number(spec.step))
    if name == "seed":
        options["control_after_generate"] = False  # -1 (the image seed) is the value to keep, not to randomise
    return ("INT" if spec.kind == "int" else "FLOAT"), options


def input_types(names: tuple[str, ...], model_tooltip: str) -> dict[str, dict[str, Any]]:
    """``INPUT_TYPES()`` of a node taking a model and ``names``: the settings are optional inputs with the record's
    defaults, so a workflow that names only ``model`` runs with them."""
    return {
        "required": {"model": ("MODEL", {"tooltip": model_tooltip})},
        "optional": {name: input_type(name) for name in names},
    }
