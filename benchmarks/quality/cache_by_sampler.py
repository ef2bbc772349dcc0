"""The step cache under the WebUI's samplers (``python -m benchmarks.quality.cache_by_sampler``): DeepCache, our forecasts and schedules
at N = 2, 3, 4, on the trained models, PSNR of the final sample against plain's, paired by seed.

For each layout and sampler of :data:`benchmarks.lab.sampling.SAMPLERS` (20 steps, CFG 7, on the scheduler the WebUI
gives it, timesteps as the WebUI passes them), plain runs once and every mode of :data:`FORECASTS` at every interval
samples the same seeds from the same noise (the ancestral and SDE samplers' fresh noise from each image's own
generator), and so does each of the other families' modes (:data:`OTHERS`). Reported per cell: the mean PSNR with its
bootstrap 95 % interval, the per-seed spread (5th–95th percentile) and the full steps a pass ran (out of 20); per
other mode, its PSNR and its speed-up (each seed's steps priced at real width, :mod:`benchmarks.lab.prices`), and
per N the best other family at DeepCache N's speed. ``--resume`` keeps the cells of the saved run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from benchmarks.lab import fidelity as B
from benchmarks.lab import modes as M
from benchmarks.lab import sampling as S
from benchmarks.lab.frontier import FAMILIES, Point, family_at
from benchmarks.lab.prices import priced
from benchmarks.lab.results import RUNS, command, load_run_data, save_run_data, write_section
from benchmarks.lab.trained.loading import load_model
from benchmarks.lab.trained.metrics import bootstrap, psnr_ssim

BEGIN, END = "<!-- samplers:begin -->", "<!-- samplers:end -->"
STEPS = 20


@dataclass(frozen=True)
class Forecast:
    """One column family of the table: a forecast and a schedule of our cache."""

    name: str
    label: str
    forecast: str
    schedule: str


FORECASTS = (
    Forecast("deepcache", "DeepCache (off, uniform)", "off", "uniform"),
    Forecast("linear", "linear, uniform (issue 23's default)", "linear", "uniform"),
    Forecast("calibrated", "calibrated, uniform", "calibrated", "uniform"),
    Forecast("calibrated-time", "calibrated, time", "calibrated", "time"),
)
INTERVALS = (2, 3, 4)
SUMMARY = ("deepcache", "linear", "calibrated-time")
"""The summary's columns per layout: DeepCache, issue 23's default and the default now (then the best other family)."""
OTHERS = (
    "deepcache-nonuniform-3",
    "deepcache-nonuniform-5",
    "fbcache-0.05",
    "easycache-0.05",
    "spectrum",
)
"""The other families' modes (:mod:`benchmarks.lab.anchors`, :data:`benchmarks.lab.modes.FRONTIER`) run under every sampler:
DeepCache's non-uniform schedule at two intervals (2.25× and 2.79× on SD1.5 under Euler, DeepCache N=3 and N=5's
full steps), Spectrum at Neo's defaults (1.43×), First Block Cache and EasyCache at one threshold each (about 2.2–2.4×;
their other thresholds lie further below on the fidelity run's frontier). A family's value at a speed between its
modes is read off the line between them; at a speed below all of its modes', its most faithful mode bounds it from
below. A run may hold more of them (the first runs under Euler, and on SDXL under DPM++ 2M, held TeaCache and more
settings): every one counts."""
OTHER_FAMILIES = tuple(f for f in FAMILIES if f not in ("deepcache", "ours"))


def mode(forecast: Forecast, interval: int) -> M.Mode:
    base = M.cached(M.PLAIN, interval, forecast=forecast.forecast)
    name = f"{forecast.name}-{interval}"
    return replace(base, name=name, settings={**base.settings, "cache_schedule": forecast.schedule})


def cell(psnr: np.ndarray, full: int) -> dict:
    mean = bootstrap(psnr)
    return {
        "psnr": mean.to_json(),
        "p5": float(np.percentile(psnr, 5)),
        "p95": float(np.percentile(psnr, 95)),
        "full": full,
    }


def other_cell(layout: str, name: str, psnr: np.ndarray, counts: list[dict[str, int]]) -> dict:
    """An other family's cell: as :func:`cell`, with the speed-up of its steps priced at real width (mean, slowest
    and fastest seed) in place of the full steps."""
    speeds = [priced(layout, name, c) for c in counts]
    out = cell(psnr, int(np.mean([c["full"] for c in counts])))
    return out | {"speed": [float(np.mean(speeds)), min(speeds), max(speeds)]}


def deepcache_speed(layout: str, sampler: str, n: int, row: dict) -> float | None:
    """DeepCache N's speed-up in ``row`` (its full steps of the sampler's steps, priced at real width)."""
    found = row.get(f"deepcache-{n}")
    if found is None:
        return None
    steps = len(S.schedule(sampler, STEPS)) - 1
    return priced(layout, f"cache-{n}", {"full": found["full"], "partial": steps - found["full"]})


def best_other(layout: str, sampler: str, n: int, row: dict) -> tuple[float, str] | None:
    """The most faithful other family at DeepCache N's speed (by the matched-speed tables' rule,
    :func:`benchmarks.lab.frontier.family_at`): its PSNR and name; None where no family is that fast."""
    target = deepcache_speed(layout, sampler, n, row)
    if target is None:
        return None
    points = [
        Point(name, M.MODES[name].family, *row[name]["speed"], row[name]["psnr"][0], 0.0) for name in _others(row)
    ]
    found = [(family_at(points, family, target)[0], family) for family in OTHER_FAMILIES]
    found = [(psnr, FAMILIES[family]) for psnr, family in found if psnr is not None]
    return max(found, default=None)


def run_layout(
    layout: str, samplers: tuple[str, ...], seeds: int, intervals, forecasts, others, done: dict, save, log
) -> dict:
    model = load_model(layout)
    seed_range = range(seeds)
    noise = B.noise_for(seed_range, model.size, model.channels)
    labels = B.labels_for(seed_range, len(model.classes))
    out = done
    for sampler in samplers:
        row = out.setdefault(sampler, {})
        wanted = [mode(f, n) for f in forecasts for n in intervals] + [M.MODES[name] for name in others]
        if all(m.name in row for m in wanted):
            continue
        sigmas = S.schedule(sampler, STEPS)
        start = time.perf_counter()
        plain, _ = B.run_sampling(model, M.PLAIN, noise, labels, sigmas, sampler)
        log(f"{layout} {S.LABELS[sampler]}: plain {time.perf_counter() - start:.0f} s")
        for m in wanted:
            if m.name in row:
                continue
            start = time.perf_counter()
            samples, counts = B.run_sampling(model, m, noise, labels, sigmas, sampler)
            psnr, _ = psnr_ssim(samples, plain)
            if m.name in others:
                row[m.name] = other_cell(layout, m.name, psnr, counts)
            else:
                row[m.name] = cell(psnr, counts[0]["full"] if counts else STEPS)
            log(f"{layout} {S.LABELS[sampler]}: {m.name} {row[m.name]['psnr'][0]:.1f} dB, {row[m.name]['full']} full")
            log(f"  ({time.perf_counter() - start:.0f} s)")
            save()
    return out


def _intervals(per_sampler: dict) -> list[int]:
    """The intervals our forecasts ran at (the keys ``<forecast>-<N>``)."""
    ours = {f.name for f in FORECASTS}
    keys = (k.rsplit("-", 1) for row in per_sampler.values() for k in row if "-" in k)
    return sorted({int(n) for name, n in keys if name in ours})


def section(data: dict, meta: dict) -> str:
    """The RESULTS.md section: a summary (mean PSNR and full steps of each forecast, both layouts), then per layout
    every cell with its interval and spread."""
    lines = [
        BEGIN,
        "## The step cache under the WebUI's samplers (`python -m benchmarks.quality.cache_by_sampler`)",
        "",
        f"Trained models (`benchmarks/lab/trained/weights/`), {STEPS} steps, CFG 7, each sampler on the WebUI's scheduler "
        "for it; PSNR (dB) of the final sample against plain's, paired by seed. Forecasts and schedules: `off` + "
        "`uniform` is DeepCache; `linear` + `uniform` was the default before issue 27; `calibrated` + `time` is the "
        "default now. *Full*: the steps of a pass that ran the whole UNet (of 20; a DPM++ SDE step calls the UNet "
        "twice, both calls placed by the step). "
        + ", ".join(
            f"{B.LAYOUT_NAMES[k]}: {m['seeds']} seeds, {m['minutes']:.0f} min" for k, m in meta["layouts"].items()
        )
        + " (1 torch thread).",
        "",
        "Summary: mean PSNR (full steps).",
        "",
    ]
    head = []
    for k in data:
        short = B.LAYOUT_NAMES[k].split()[0]
        head += [f"{short}: {f.label.split(' (')[0]}" for f in FORECASTS if f.name in SUMMARY]
        head.append(f"{short}: best other family")
    lines += ["| sampler, N | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for sampler in S.SAMPLERS:
        for n in INTERVALS:
            cells, any_found = [], False
            for k in data:
                row = data[k].get(sampler, {})
                for f in (f for f in FORECASTS if f.name in SUMMARY):
                    c = row.get(f"{f.name}-{n}")
                    any_found |= c is not None
                    cells.append("—" if c is None else f"{c['psnr'][0]:.1f} ({c['full']})")
                best = best_other(k, sampler, n, row)
                cells.append("—" if best is None else f"{best[0]:.1f} ({best[1]})")
            if any_found:
                lines.append(f"| {S.LABELS[sampler]}, N={n} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "*Best other family*: the most faithful of DeepCache's non-uniform schedule, First Block Cache, TeaCache, "
        "EasyCache and Spectrum at DeepCache N's speed (priced at real width, 1024 px), by the matched-speed tables' "
        "rule: a family's best mode within ±5 % of it, or its frontier's value there; — where no family is that fast. "
        "Their modes, per sampler, below.",
        "",
    ]
    for layout, per_sampler in data.items():
        lines += [f"### {B.LAYOUT_NAMES[layout]}: mean [bootstrap 95 %] (per-seed 5th–95th percentile), full steps", ""]
        names = [f for f in FORECASTS if any(f"{f.name}-{n}" in r for r in per_sampler.values() for n in INTERVALS)]
        lines += ["| sampler and N | " + " | ".join(f.label for f in names) + " |", "|---|" + "---|" * len(names)]
        for sampler, row in per_sampler.items():
            for n in _intervals(per_sampler):
                cells = []
                for f in names:
                    c = row.get(f"{f.name}-{n}")
                    if c is None:
                        cells.append("—")
                        continue
                    mean, lo, hi = c["psnr"]
                    cells.append(f"{mean:.1f} [{lo:.1f}, {hi:.1f}] ({c['p5']:.1f}–{c['p95']:.1f}), {c['full']}")
                lines.append(f"| {S.LABELS[sampler]}, N={n} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += _others_table(layout, per_sampler)
    lines.append(END)
    return "\n".join(lines)


def _others(row: dict) -> list[str]:
    """The other families' modes a sampler's row holds, :data:`OTHERS` first."""
    extra = [n for n in row if n not in OTHERS and n in M.MODES and M.MODES[n].family in OTHER_FAMILIES]
    return [n for n in OTHERS if n in row] + extra


def _others_table(layout: str, per_sampler: dict) -> list[str]:
    """The other families' modes under each sampler: mean PSNR and mean speed-up."""
    names = list(dict.fromkeys(n for row in per_sampler.values() for n in _others(row)))
    if not names:
        return []
    lines = [f"{B.LAYOUT_NAMES[layout]}, the other families: mean PSNR, mean speed-up (real width, 1024 px)", ""]
    lines += ["| sampler | " + " | ".join(M.MODES[n].label for n in names) + " |", "|---|" + "---:|" * len(names)]
    for sampler, row in per_sampler.items():
        cells = ["—" if n not in row else f"{row[n]['psnr'][0]:.1f}, {row[n]['speed'][0]:.2f}×" for n in names]
        lines.append(f"| {S.LABELS[sampler]} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> None:
    parser = command(__doc__.splitlines()[0], render="only write the RESULTS.md section from the saved runs")
    parser.add_argument("--layout", choices=("sd15", "sdxl"), default="sd15")
    parser.add_argument("--seeds", type=int, default=64)
    parser.add_argument("--samplers", default=",".join(S.SAMPLERS))
    parser.add_argument("--intervals", default=",".join(map(str, INTERVALS)))
    parser.add_argument("--forecasts", default=",".join(f.name for f in FORECASTS))
    parser.add_argument("--others", default=",".join(OTHERS), help="the other families' modes ('' for none)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--part", default="", help="a name for this part of the run (runs side by side, merged)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    name = f"samplers-{args.layout}" + (f"-{args.part}" if args.part else "")
    if args.render:
        return render()
    data, meta = load_run_data(name) if args.resume else ({}, {})
    before = meta.get("seconds", 0.0)
    start = time.perf_counter()
    forecasts = [f for f in FORECASTS if f.name in args.forecasts.split(",")]
    intervals = tuple(int(n) for n in args.intervals.split(","))

    def save() -> None:
        seconds = before + time.perf_counter() - start
        save_run_data(name, data, {"seeds": args.seeds, "seconds": round(seconds, 1), "layout": args.layout})

    others = tuple(n for n in args.others.split(",") if n)
    run_layout(
        args.layout, tuple(args.samplers.split(",")), args.seeds, intervals, forecasts, others, data, save, print
    )
    save()
    render()


def render() -> None:
    """The section from every saved part of the run (``samplers-<layout>[-<part>].json``), samplers in table order."""
    data, meta = {}, {"layouts": {}}
    for layout in ("sd15", "sdxl"):
        main = f"samplers-{layout}"
        paths = sorted(RUNS.glob(f"{main}*.json"), key=lambda p: (p.stem != main, p.stem))  # the main part first
        parts = [load_run_data(path.stem) for path in paths]
        if not parts:
            continue
        merged: dict[str, dict] = {}
        for results, _ in parts:  # a later part's cells replace the earlier's (a re-run), the others are kept
            for sampler, row in results.items():
                merged.setdefault(sampler, {}).update(row)
        data[layout] = {s: merged[s] for s in S.SAMPLERS if s in merged}
        seeds = {m["seeds"] for _, m in parts}
        assert len(seeds) == 1, f"{layout}: parts with different seeds {seeds}"
        meta["layouts"][layout] = {"seeds": seeds.pop(), "minutes": sum(m["seconds"] for _, m in parts) / 60}
    write_section(section(data, meta), BEGIN, END)


if __name__ == "__main__":
    main()
