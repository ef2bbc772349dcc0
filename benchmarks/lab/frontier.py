"""The step caches side by side at matched speeds (issue 23): per case, the best PSNR each family of caches reaches
within ±5 % of 2×, 3× and 4× (speed of a 20-step run at 1024 px, real width), our margin over the best of the others,
the speed each reaches at DeepCache N=3's fidelity, and what the data-dependent modes ran per seed.

Speed: for a mode whose steps the run counted (:attr:`ModeResult.steps`), the mean over seeds of each seed's steps
priced with the real-width costs (:func:`benchmarks.lab.prices.priced`); else the real-width runs' figure
(:func:`benchmarks.lab.prices.speedups`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from benchmarks.lab import modes as modes_
from benchmarks.lab.fidelity import Case, ModeResult
from benchmarks.lab.prices import priced, speedups

TARGETS = (2.0, 3.0, 4.0)
TOLERANCE = 0.05
FAMILIES = {
    "deepcache": "DeepCache uniform (ours before; ± token merging)",
    "deepcache-nonuniform": "DeepCache non-uniform",
    "fbcache": "First Block Cache",
    "teacache": "TeaCache (no polynomial)",
    "easycache": "EasyCache",
    "spectrum": "Spectrum",
    "ours": "ours: forecast (± adaptive, ± token merging)",
}
"""Every family of step caches, in the order the tables and the plot show them; ``ours`` last among equals."""
COLOURS = {
    "": "tab:blue",
    "deepcache": "tab:orange",
    "deepcache-nonuniform": "tab:brown",
    "fbcache": "tab:purple",
    "teacache": "tab:pink",
    "easycache": "tab:olive",
    "spectrum": "tab:cyan",
    "ours": "tab:red",
}
"""The plot's colour per family ("": token merging alone)."""


@dataclass(frozen=True)
class Point:
    name: str
    family: str
    speed: float
    low: float  # the slowest seed's speed (= speed for a fixed schedule)
    high: float
    psnr: float | None
    accuracy: float


def speed_of(case: Case, name: str, result: ModeResult, fixed: dict[str, float]) -> tuple[float, float, float] | None:
    """``(mean, slowest, fastest)`` speed-up of a mode in a case, or None where nothing priced it."""
    if result.steps:
        speeds = [priced(case.layout, name, counts) for counts in result.steps]
        if any(s is None for s in speeds):
            return None
        return statistics.mean(speeds), min(speeds), max(speeds)
    value = fixed.get(name)
    return None if value is None else (value, value, value)


def points(case: Case, results: dict[str, ModeResult]) -> list[Point]:
    fixed = speedups(case.layout)
    out = []
    for name, r in results.items():
        speed = speed_of(case, name, r, fixed)
        if speed is None or name == "plain":
            continue
        psnr = None if r.psnr is None else r.psnr.mean
        out.append(Point(name, modes_.MODES[name].family, *speed, psnr, r.accuracy.mean))
    return out


def best_near(pts: list[Point], family: str, target: float) -> Point | None:
    """The family's most faithful mode within ±5 % of ``target``."""
    near = [p for p in pts if p.family == family and p.psnr is not None and abs(p.speed / target - 1) <= TOLERANCE]
    return max(near, key=lambda p: p.psnr, default=None)


def envelope_at(pts: list[Point], family: str, target: float) -> tuple[float, Point, Point] | None:
    """The family's best PSNR at ``target`` on its frontier and the two frontier modes it comes from: the line
    between the two frontier modes around the target, or, where none is slower, the most faithful mode at least that
    fast (as both ends); None where no mode is that fast."""
    mine = [p for p in pts if p.family == family and p.psnr is not None]
    frontier = sorted(
        (p for p in mine if not any(o.speed >= p.speed and o.psnr > p.psnr for o in mine)), key=lambda p: p.speed
    )
    faster = [p for p in frontier if p.speed >= target]
    if not faster:
        return None
    slower = [p for p in frontier if p.speed < target]
    if not slower:
        best = max(faster, key=lambda p: p.psnr)
        return best.psnr, best, best
    a, b = slower[-1], faster[0]
    return a.psnr + (b.psnr - a.psnr) * (target - a.speed) / (b.speed - a.speed), a, b


def family_at(pts: list[Point], family: str, target: float) -> tuple[float | None, str]:
    """The family's PSNR at ``target`` and where it comes from: its best mode within ±5 %, or its frontier's value
    there (:func:`envelope_at`) where that is higher."""
    near, line = best_near(pts, family, target), envelope_at(pts, family, target)
    if near is not None and (line is None or near.psnr >= line[0]):
        return near.psnr, f"{modes_.MODES[near.name].label}, {near.speed:.2f}×"
    if line is None:
        return None, ""
    value, a, b = line
    if a is b:  # no mode of the family is slower than the target: its best faster one bounds it from below
        return value, f"{modes_.MODES[a.name].label}, {a.speed:.2f}×, faster"
    return (
        value,
        f"frontier of {modes_.MODES[a.name].label} {a.speed:.2f}× and {modes_.MODES[b.name].label} {b.speed:.2f}×",
    )


def matched(pts: list[Point], target: float) -> tuple[tuple[float | None, str], dict[str, float | None]]:
    """Every family's PSNR at ``target`` by the same rule (:func:`family_at`): ours, with where it comes from, and
    the others'."""
    others = {family: family_at(pts, family, target)[0] for family in FAMILIES if family != "ours"}
    return family_at(pts, "ours", target), others


def matched_table(runs: list[tuple[Case, dict[str, ModeResult]]]) -> str:
    """Per case and target speed: every family's PSNR at that speed, ours with the mode (or the two modes of its
    frontier) it comes from, and ours minus the best of the others."""
    header = ["case, speed", "ours (mode, speed)", *(v for k, v in FAMILIES.items() if k != "ours"), "margin (dB)"]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for case, results in runs:
        pts = points(case, results)
        if not any(p.family == "ours" for p in pts):
            continue
        for target in TARGETS:
            (value, source), others = matched(pts, target)
            mine = "—" if value is None else f"{value:.1f} ({source})"
            cells = [f"{case.name}, {target:g}×", mine, *("—" if v is None else f"{v:.1f}" for v in others.values())]
            known = [v for v in others.values() if v is not None]
            margin = "—" if value is None or not known else f"{value - max(known):+.1f}"
            lines.append("| " + " | ".join(cells) + f" | {margin} |")
    return "\n".join(lines)


def at_fidelity_table(runs: list[tuple[Case, dict[str, ModeResult]]], reference: str = "cache-3") -> str:
    """Per case: the fastest mode of each family at least as faithful as ``reference`` (DeepCache N=3)."""
    header = ["case (DeepCache N=3: PSNR, speed)", *FAMILIES.values()]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for case, results in runs:
        pts = points(case, results)
        ref = next((p for p in pts if p.name == reference), None)
        if ref is None or ref.psnr is None or not any(p.family == "ours" for p in pts):
            continue
        cells = [f"{case.name} ({ref.psnr:.1f} dB, {ref.speed:.2f}×)"]
        for family in FAMILIES:
            ok = [p for p in pts if p.family == family and p.psnr is not None and p.psnr >= ref.psnr]
            best = max(ok, key=lambda p: p.speed, default=None)
            cells.append(
                "—"
                if best is None
                else f"{best.speed:.2f}× ({best.speed / ref.speed:.2f}× N=3; {modes_.MODES[best.name].label})"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_seed_table(runs: list[tuple[Case, dict[str, ModeResult]]]) -> str:
    """The modes sampled seed by seed: their full, cached (partial), first-block and skipped steps per seed (mean
    [min, max]) and the spread of their speed over seeds."""
    lines = [
        "| case | mode | full steps | cached steps | first block only | skipped | speed-up: mean [slowest, fastest seed] |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for case, results in runs:
        for p in points(case, results):
            r = results[p.name]
            if len(r.steps) < 2:
                continue
            cells = []
            for kind in ("full", "partial", "first", "skip"):
                values = [c[kind] for c in r.steps]
                cells.append(f"{statistics.mean(values):.1f} [{min(values)}, {max(values)}]")
            speed = f"{p.speed:.2f}× [{p.low:.2f}, {p.high:.2f}]"
            lines.append(f"| {case.name} | {modes_.MODES[p.name].label} | " + " | ".join(cells) + f" | {speed} |")
    return "\n".join(lines)
