"""The modes the quality and speed benchmarks compare, by one name each: plain sampling, the WebUI's built-in
token merging (tomesd 0.1.3 with A1111's settings), ComfyUI's built-in (``TomePatchModel``: queries only, the highest
level only; :mod:`benchmarks.lab.comfy_builtin`), our settings records, and the caches other UIs ship
(:mod:`benchmarks.lab.anchors`).

A mode is applied to a bare UNet for one sampling run (re-applied for the next: plan reuse starts afresh); our
modes start from the extension's defaults (``ToMeSettings()``) and change only what their name says, except that
DeepCache's modes (``cache-N``) pin ``cache_forecast`` to off, and every cached mode of :func:`cached` pins
``cache_schedule`` to uniform unless its name says adaptive or time (the modes of the earlier runs keep their names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import tomesd
from torch import nn

import tome_core
from benchmarks.lab import anchors, comfy_builtin
from benchmarks.lab.models import Holder

SEED = 1234  # the "image seed" our random partition is derived from


@dataclass(frozen=True)
class Mode:
    """``settings``: ToMeSettings fields changed from the defaults (with ``enabled``); ``tomesd``: the WebUI's
    built-in; ``comfy``: the ratio of ComfyUI's built-in; ``rule``: another cache's per-call rule
    (:mod:`benchmarks.lab.anchors`); ``full_steps``: for a pass of ``n`` steps, the full steps of our cache's schedule
    (DeepCache's non-uniform one); ``per_seed``: our patch's decisions depend on the sample, so it samples seed by seed
    (a batch would share them; the other caches' rules decide per seed inside a batch); ``family``: its colour in the
    plot."""

    name: str
    label: str
    settings: dict[str, Any] | None = None
    tomesd: bool = False
    comfy: float | None = None
    tags: tuple[str, ...] = field(default=())
    rule: Callable[[], anchors.StepRule] | None = None
    full_steps: Callable[[int], list[int]] | None = None
    per_seed: bool = False
    family: str = ""

    def apply(self, unet: nn.Module, steps: int | None = None) -> tome_core.Session | anchors.StepRule | None:
        """Leave ``unet`` as this mode wants it (anything applied before removed) for a pass of ``steps`` steps; our
        patch or the other cache's rule, if any (both take ``set_progress(fraction, steps)``)."""
        tome_core.remove_patch(unet)
        tomesd.remove_patch(Holder(unet))
        anchors.remove_rule(unet)
        comfy_builtin.remove(unet)
        if self.comfy is not None:  # ComfyUI's TomePatchModel: queries merged in attn1 at the highest level only
            comfy_builtin.apply(unet, self.comfy, SEED)
        elif self.tomesd:  # A1111's built-in: tomesd at its defaults, no randomness, self-attention only
            tomesd.apply_patch(
                Holder(unet), ratio=0.5, use_rand=False, merge_attn=True, merge_crossattn=False, merge_mlp=False
            )
        elif self.rule is not None:
            return self.rule().install(unet)
        elif self.settings is not None:
            patch = tome_core.apply_settings(unet, tome_core.ToMeSettings(enabled=True, seed=SEED, **self.settings))
            if self.full_steps is not None and patch.cache is not None:
                patch.cache.make_schedule = anchors.FixedSteps(self.full_steps(steps or 20))
            return patch
        return None

    @property
    def cached(self) -> bool:
        """Whether the mode skips work between steps (our cache or another one)."""
        return self.rule is not None or bool((self.settings or {}).get("cache"))


PLAIN = Mode("plain", "plain")
TOMESD = Mode("tomesd", "built-in (tomesd 0.5, max downsample 1)", tomesd=True)
COMFY = Mode("comfy-tome", "ComfyUI built-in (TomePatchModel 0.3)", comfy=0.3)
"""ComfyUI's built-in at its own default ratio, 0.3 (what a user who adds the node gets; beside ours at 0.3)."""
TOME = (
    Mode("exact-0.3", "ours: exact, ratio 0.3", {"ratio": 0.3}),
    Mode("exact-0.5", "ours: exact, ratio 0.5 (default)", {}),
    Mode("exact-0.7", "ours: exact, ratio 0.7", {"ratio": 0.7}),
    Mode("share+interval", "ours: share_plan + plan_interval 2", {"share_plan": True, "plan_interval": 2}),
    Mode("todo-2", "ours: ToDo, factor 2", {"method": "downsample", "downsample_factor": 2}),
    Mode("todo-3", "ours: ToDo, factor 3", {"method": "downsample", "downsample_factor": 3}),
    Mode("exact-0.5-md2", "ours: exact 0.5, max downsample 2", {"max_downsample": 2}, tags=("sd15",)),
    Mode("exact-0.5-md4", "ours: exact 0.5, max downsample 4", {"max_downsample": 4}),
)
"""Token merging alone (issue 16's list); ``tags``: the layouts where the mode differs from another one (SDXL's
auto level is 2 already)."""


def cached(
    mode: Mode,
    interval: int,
    start: float = 0.0,
    forecast: str = "off",
    threshold: float | None = None,
    schedule: str = "uniform",
) -> Mode:
    """``mode`` with the step cache (branch 0) at ``interval`` (from ``start``); on plain: the cache alone. ``forecast``
    off: DeepCache (``cache-N``); else ours (``cache-N-linear``, ``cache-N-calibrated``). ``schedule``: uniform (the
    earlier runs' modes) or time (``cache-N-calibrated-time``: the defaults since issue 27). ``threshold``: the adaptive
    schedule, with ``interval`` the longest run without a full step (``cache-adaptive-T-N-linear``)."""
    base = mode.settings if mode.settings is not None else {"ratio": 0.0}
    kind = f"adaptive-{threshold:g}-{interval}" if threshold is not None else f"{interval}"
    suffix = ("" if forecast == "off" else f"-{forecast}") + ("" if schedule == "uniform" else f"-{schedule}")
    name = f"cache-{kind}" + (f"-from-{start:g}" if start else "") + suffix + ("" if mode is PLAIN else f"+{mode.name}")
    what = f"adaptive {threshold:g} (at most {interval})" if threshold is not None else f"N={interval}"
    what = (
        f"cache {what}"
        + (f" from {start:.0%}" if start else "")
        + (f", {forecast} forecast" if forecast != "off" else "")
    )
    what += f", {schedule} schedule" if schedule != "uniform" else ""
    label = f"ours: {what}" + ("" if mode is PLAIN else f" + {mode.label.removeprefix('ours: ')}")
    settings = {**base, "cache": True, "cache_interval": interval, "cache_start": start, "cache_forecast": forecast}
    settings["cache_schedule"] = schedule
    if threshold is not None:
        settings |= {"cache_schedule": "adaptive", "cache_threshold": threshold}
    family = "deepcache" if forecast == "off" else "ours"
    return Mode(name, label, settings, tags=mode.tags, per_seed=threshold is not None, family=family)


def _threshold_sweep(family: str, label: str, rule, thresholds: tuple[float, ...], note: str = "") -> list[Mode]:
    """An anchor cache at each of its ``thresholds``: modes ``<family>-<t>``, labelled ``<label> <t><note>``."""
    return [Mode(f"{family}-{t:g}", f"{label} {t:g}{note}", rule=partial(rule, t), family=family) for t in thresholds]


CACHE = (
    *(cached(PLAIN, n) for n in (2, 3, 5)),
    *(cached(m, 3) for m in TOME if m.name in ("exact-0.3", "exact-0.5", "todo-2")),
    cached(TOME[1], 5),
    cached(PLAIN, 3, 0.2),
    cached(TOME[1], 3, 0.2),
)
"""The step cache alone (= DeepCache, branch 0) and with token merging (issue 14)."""
_TODO, _EXACT = TOME[4], TOME[1]
ADAPTIVE_THRESHOLDS = (0.04, 0.08, 0.15)
DEFAULTS = (
    *(cached(PLAIN, n, forecast="calibrated", schedule="time") for n in (2, 3, 4, 5, 6)),
    *(cached(_TODO, n, forecast="calibrated", schedule="time") for n in (3, 4, 5, 6)),
    *(cached(PLAIN, 10, forecast="calibrated", threshold=t) for t in (*ADAPTIVE_THRESHOLDS, 0.25)),
    *(cached(_TODO, 10, forecast="calibrated", threshold=t) for t in (*ADAPTIVE_THRESHOLDS[1:], 0.25)),
)
"""Issue 27: the defaults since (calibrated forecast, time schedule) at every interval, alone and with ToDo, and the
calibrated forecast with the adaptive schedule: ours on the matched-speed tables again."""
FRONTIER = (
    cached(PLAIN, 4),
    *(
        Mode(
            f"deepcache-nonuniform-{k}",
            f"DeepCache non-uniform 1:{k} (quadratic, centre 30 %)",
            {"ratio": 0.0, "cache": True, "cache_interval": 10, "cache_forecast": "off"},
            full_steps=lambda n, k=k: anchors.quadratic_full_steps(n, n // k, 0.3 * n),
            family="deepcache-nonuniform",
        )
        for k in (3, 5)
    ),
    *(cached(PLAIN, n, forecast="linear") for n in (2, 3, 4, 5)),
    *(cached(_TODO, n, forecast="linear") for n in (3, 4, 5)),
    cached(_EXACT, 3, forecast="linear"),
    *(cached(PLAIN, 10, forecast="linear", threshold=t) for t in ADAPTIVE_THRESHOLDS),
    *(cached(_TODO, 10, forecast="linear", threshold=t) for t in ADAPTIVE_THRESHOLDS[1:]),
    *DEFAULTS,
    *_threshold_sweep("fbcache", "First Block Cache", anchors.FirstBlockCache, (0.02, 0.05, 0.1, 0.2)),
    *_threshold_sweep("teacache", "TeaCache", anchors.TeaCacheInput, (0.05, 0.1, 0.15, 0.2), " (no polynomial)"),
    *_threshold_sweep("easycache", "EasyCache", anchors.EasyCache, (0.02, 0.05, 0.1, 0.2)),
    Mode("spectrum", "Spectrum (Neo's defaults, window 2)", rule=anchors.Spectrum, family="spectrum"),
    *(
        Mode(
            f"spectrum-window-{w}", f"Spectrum, window {w}", rule=partial(anchors.Spectrum, window=w), family="spectrum"
        )
        for w in (3, 4, 6)
    ),
    *(
        Mode(
            f"spectrum-window-{w}-warmup-2",
            f"Spectrum, window {w}, warmup 2",
            rule=partial(anchors.Spectrum, window=w, warmup_steps=2),
            family="spectrum",
        )
        for w in (3, 6)
    ),
)
"""Issue 23's frontier: DeepCache N=4 and its non-uniform schedule, our forecast and adaptive schedule (alone and with
ToDo), and the caches other UIs ship (:mod:`benchmarks.lab.anchors`; their thresholds span 1.5–4× here; Spectrum's
window at Neo's warmup of 6 steps reaches 2× at most, so two of its windows run with a warmup of 2 too)."""
MODES: dict[str, Mode] = {m.name: m for m in (PLAIN, TOMESD, COMFY, *TOME, *CACHE, *FRONTIER)}


def for_layout(layout: str, names: tuple[str, ...] | None = None) -> list[Mode]:
    """The modes that mean something on ``layout`` (all of ``names``, default every mode)."""
    chosen = [MODES[n] for n in names] if names else list(MODES.values())
    return [m for m in chosen if not m.tags or layout in m.tags]
