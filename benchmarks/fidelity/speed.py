"""Speed for the fidelity benchmark's modes, from the real-width runs (``benchmarks/runs/``), never from the small
models: the step-cache benchmark's CPU run (``benchmarks.cache``: a full and a cached step of every mode, SD1.5 and
SDXL at 1024 px, the 20-step speed-up derived with the cache's schedule), else the suite's real-width run for the
modes it has. A mode that no run measured has no speed."""

from __future__ import annotations

from benchmarks.results import RUNS, load_run_data

SUITE_VARIANT = {"tomesd": "tomesd", "exact-0.5": "exact", "share+interval": "share+interval", "todo-2": "downsample"}
"""Our fidelity modes as the suite's ``--real`` variants (the same settings)."""
CONFIG = {"sd15": "SD1.5 1024 px", "sdxl": "SDXL 1024 px"}
FORECAST_COSTS = {"linear": ("slope", "forecast"), "calibrated": ("calibration", "calibrated")}
"""Per forecast, ``benchmarks.cache_costs``' kinds of its update on a full step and of its forecast on a cached one."""


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
    if layout == "sdxl":
        out["tomesd"] = 1.0  # the built-in's max downsample 1 merges nothing on SDXL: it runs as plain
    return out


def _from_cache_run(layout: str, runs=None) -> dict[str, float]:
    """Every mode the step-cache benchmark's CPU run can price at 1024 px: ToMe alone, the cache alone and both."""
    from benchmarks import modes
    from benchmarks.cache import StepCosts

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


def _step_costs(layout: str, runs=None):
    """The step-cache benchmark's real-width costs at 1024 px for ``layout``, or None."""
    from benchmarks.cache import StepCosts

    try:
        results, _ = load_run_data("cache-cpu", runs or RUNS)
    except FileNotFoundError:
        return None
    for data in results:
        costs = StepCosts(**data)
        if costs.config.get("real") and costs.config["layout"] == layout and costs.config["px"] == 1024:
            return costs
    return None


def _extra_costs(layout: str, runs=None):
    """``benchmarks.cache_costs``' real-width costs at 1024 px for ``layout`` (kind → seconds), or None."""
    from benchmarks.cache_costs import ExtraCosts

    try:
        results, _ = load_run_data("cache-costs-cpu", runs or RUNS)
    except FileNotFoundError:
        return None
    for data in results:
        extra = ExtraCosts(**data)
        if extra.config.get("real") and extra.config["layout"] == layout and extra.config["px"] == 1024:
            return {kind: extra.cost(kind) for kind in extra.seconds}
    return None


def priced(layout: str, name: str, counts: dict[str, int], runs=None) -> float | None:
    """The speed-up over plain at 1024 px, real width, of a run of mode ``name`` whose steps were counted (``counts``:
    kind → steps, :data:`benchmarks.anchors.KINDS`), priced with the real-width costs: our modes' full and cached steps
    from ``benchmarks.cache`` (with their token merging), the forecast's (:data:`FORECAST_COSTS`) and the adaptive signal's extra, the
    other caches' skipped steps from ``benchmarks.cache_costs``. None where a cost was never measured."""
    from benchmarks import modes

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
