"""Speed for the fidelity benchmark's modes, from the real-width runs (``benchmarks/runs/``), never from the small
models: the step-cache benchmark's CPU run (``benchmarks.cache``: a full and a cached step of every mode, SD1.5 and
SDXL at 1024 px, the 20-step speed-up derived with the cache's schedule), else the suite's real-width run for the
modes it has. A mode that no run measured has no speed."""

from __future__ import annotations

from benchmarks.results import RUNS, load_run_data

SUITE_VARIANT = {"tomesd": "tomesd", "exact-0.5": "exact", "share+interval": "share+interval", "todo-2": "downsample"}
"""Our fidelity modes as the suite's ``--real`` variants (the same settings)."""
CONFIG = {"sd15": "SD1.5 1024 px", "sdxl": "SDXL 1024 px"}


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
