"""Speed for the fidelity benchmark's modes, from the real-width runs (``benchmarks/runs/``), never from the small
models: the step-cache benchmark's CPU run (``benchmarks.speed.cache``: a full and a cached step of every mode, SD1.5 and
SDXL at 1024 px, the 20-step speed-up derived with the cache's schedule), else the suite's real-width run for the
modes it has. A mode that no run measured has no speed.

The cost records the commands share live here too: :class:`StepCosts` (``benchmarks.speed.cache``'s full and cached
steps) and :class:`ExtraCosts` (``benchmarks.speed.cache_costs``' kinds of step)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import tome_core
from benchmarks.lab.models import Config
from benchmarks.lab.results import RUNS, load_run_data
from tome_core.caching.schedule import uniform_plan

STEPS = 20
"""The step cache benchmark's sampling steps: its speed-ups are of a 20-step run."""

SUITE_VARIANT = {"tomesd": "tomesd", "exact-0.5": "exact", "share+interval": "share+interval", "todo-2": "downsample"}
"""Our fidelity modes as the suite's ``--real`` variants (the same settings)."""
CONFIG = {"sd15": "SD1.5 1024 px", "sdxl": "SDXL 1024 px"}
FORECAST_COSTS = {"linear": ("slope", "forecast"), "calibrated": ("calibration", "calibrated")}
"""Per forecast, ``benchmarks.speed.cache_costs``' kinds of its update on a full step and of its forecast on a cached one."""


@dataclass
class StepCosts:
    """One configuration's seconds per full step and per cached step of each mode (lists: one per round)."""

    config: dict
    full: dict[str, list[float]] = field(default_factory=dict)
    cached: dict[str, list[float]] = field(default_factory=dict)
    held_bytes: int = 0  # the cache's deep features for this configuration's batch (one chunk)
    peak_bytes: dict[str, int | None] = field(default_factory=dict)
    sampling: dict[str, list[float]] = field(default_factory=dict)  # part 2: whole runs, seconds
    sampling_steps: int = STEPS

    @property
    def name(self) -> str:
        c = Config(**self.config)
        return f"{c.name} ({c.width}, batch {c.batch})"

    def cost(self, kind: str, mode: str) -> float:
        return statistics.median((self.full if kind == "full" else self.cached)[mode])

    def speedup(self, mode: str, interval: int | None, steps: int = STEPS, start: float = 0.0) -> float:
        """Derived speed-up of a ``steps``-step run of ``mode`` (with the cache at ``interval`` from ``start``; None:
        without) over plain's: ``steps`` full plain steps over the mode's full and cached steps in the cache's
        schedule."""
        plan = [False] * steps
        if interval is not None:
            plan = uniform_plan(tome_core.ToMeSettings(cache=True, cache_interval=interval, cache_start=start), steps)
        cached = sum(plan)  # counted, not summed step by step: a run without the cache is exactly plain's
        seconds = (steps - cached) * self.cost("full", mode) + (cached and cached * self.cost("cached", mode))
        return steps * self.cost("full", "plain") / seconds

    def measured(self, name: str) -> float:
        """Measured speed-up of a whole sampling run (part 2) over plain's."""
        return statistics.median(self.sampling["plain"]) / statistics.median(self.sampling[name])

    def spread(self) -> float:
        """The largest round-to-round spread, (max − min) / median, of the whole sampling runs."""
        return max(((max(v) - min(v)) / statistics.median(v) for v in self.sampling.values() if len(v) > 1), default=0)


@dataclass
class ExtraCosts:
    """One configuration's seconds per kind of step (lists: one per round)."""

    config: dict
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def cost(self, kind: str) -> float | None:
        """The median seconds of ``kind``; None where the run did not measure it (an older run)."""
        return statistics.median(self.seconds[kind]) if kind in self.seconds else None


FIRST_LEVEL_EMPTY = frozenset({"sdxl"})
"""Layouts with no transformer at the UNet's first level: merging at ``max_downsample`` 1 (tomesd's, the built-in's
and ``tome_core.apply_patch``'s default) merges nothing there and runs as plain."""


def speedups(layout: str, runs=None) -> dict[str, float]:
    """Mode name → speed-up over plain at 1024 px, real width, from the runs that measured it."""
    out = {"plain": 1.0}
    try:
        results, _ = load_run_data("real-cpu", runs or RUNS)
    except FileNotFoundError:
        results = []
    for result in results:
        name = result["config"]
        label = f"{'SD1.5' if name['layout'] == 'sd15' else 'SDXL'} {name['px']} px"
        if label != CONFIG[layout]:
            continue
        rows = result["rows"]
        base = _median(rows["baseline"]["cpu"])
        for mode, variant in SUITE_VARIANT.items():
            if variant in rows:
                out[mode] = base / _median(rows[variant]["cpu"])
    out.update(_from_cache_run(layout, runs))
    if layout in FIRST_LEVEL_EMPTY:
        out["tomesd"] = 1.0  # the built-in's max downsample 1 merges nothing: it runs as plain
    return out


def _from_cache_run(layout: str, runs=None) -> dict[str, float]:
    """Every mode the step-cache benchmark's CPU run can price at 1024 px: ToMe alone, the cache alone and both."""
    from benchmarks.lab import modes

    try:
        results, _ = load_run_data("cache-cpu", runs or RUNS)
    except FileNotFoundError:
        return {}
    out: dict[str, float] = {}
    for data in results:
        costs = StepCosts(**data)
        if not costs.config.get("real") or costs.config["layout"] != layout or costs.config["px"] != 1024:
            continue
        for name, mode in modes.MODES.items():
            if mode in modes.FRONTIER:  # priced from the steps counted in the run (:func:`priced`)
                continue
            settings = mode.settings or {}
            tome = _tome_of(name)
            if tome not in costs.full:
                continue
            if settings.get("cache"):
                if tome in costs.cached:
                    out[name] = costs.speedup(tome, settings["cache_interval"], start=settings.get("cache_start", 0.0))
            else:
                out[name] = costs.speedup(tome, None)
    return out


def _tome_of(name: str) -> str:
    """The token-merging mode a fidelity mode runs ("plain" for the cache alone): ``cache-3+exact-0.5`` → ``exact-0.5``."""
    if name.startswith("cache-"):
        return name.split("+", 1)[1] if "+" in name else "plain"
    return name


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# --- modes whose steps were counted in the run ----------------------------------------------------------------------


def _real_1024(run: str, record, layout: str, runs=None):
    """The record (``record(**data)``) of ``run``'s real-width measurement at 1024 px for ``layout``, or None."""
    try:
        results, _ = load_run_data(run, runs or RUNS)
    except FileNotFoundError:
        return None
    for data in results:
        found = record(**data)
        if found.config.get("real") and found.config["layout"] == layout and found.config["px"] == 1024:
            return found
    return None


def _step_costs(layout: str, runs=None):
    """The step-cache benchmark's real-width costs at 1024 px for ``layout``, or None."""
    return _real_1024("cache-cpu", StepCosts, layout, runs)


def _extra_costs(layout: str, runs=None):
    """``benchmarks.speed.cache_costs``' real-width costs at 1024 px for ``layout`` (kind → seconds), or None."""
    extra = _real_1024("cache-costs-cpu", ExtraCosts, layout, runs)
    return None if extra is None else {kind: extra.cost(kind) for kind in extra.seconds}


def priced(layout: str, name: str, counts: dict[str, int], runs=None) -> float | None:
    """The speed-up over plain at 1024 px, real width, of a run of mode ``name`` whose steps were counted (``counts``:
    kind → steps, :data:`benchmarks.lab.anchors.KINDS`), priced with the real-width costs: our modes' full and cached steps
    from ``benchmarks.speed.cache`` (with their token merging), the forecast's (:data:`FORECAST_COSTS`) and the adaptive signal's extra, the
    other caches' skipped steps from ``benchmarks.speed.cache_costs``. None where a cost was never measured."""
    from benchmarks.lab import modes

    costs, extra = _step_costs(layout, runs), _extra_costs(layout, runs)
    mode = modes.MODES[name]
    if costs is None or extra is None:
        return None
    steps = sum(counts.values())
    plain = costs.cost("full", "plain")
    if mode.rule is not None:
        skip = extra["spectrum"] if name.startswith("spectrum") else extra["skip"]
        seconds = counts["full"] * plain + counts["first"] * extra["first"] + counts["skip"] * skip
        return steps * plain / seconds
    tome = _tome_of(name)
    tome = "plain" if tome.startswith("deepcache-") else tome
    if tome not in costs.full or tome not in costs.cached:
        return None
    settings = mode.settings or {}
    full, partial = costs.cost("full", tome), costs.cost("cached", tome)
    forecast = settings.get("cache_forecast", "off")
    if forecast != "off":
        update, predict = FORECAST_COSTS[forecast]
        full, partial = full + extra[update], partial + extra[predict]
    if settings.get("cache_schedule") == "adaptive":
        full, partial = full + extra["signal"], partial + extra["signal"]
    return steps * plain / (counts["full"] * full + counts["partial"] * partial)
