"""The step cache under the WebUI's samplers (``python -m benchmarks.samplers``): DeepCache, our forecasts and schedules
at N = 2, 3, 4, on the trained models, PSNR of the final sample against plain's, paired by seed.

For each layout and sampler of :data:`benchmarks.sampler.SAMPLERS` (20 steps, CFG 7, on the scheduler the WebUI
gives it, timesteps as the WebUI passes them), plain runs once and every mode of :data:`FORECASTS` at every interval
samples the same seeds from the same noise (the ancestral and SDE samplers' fresh noise from each image's own
generator). Reported per cell: the mean PSNR with its bootstrap 95 % interval, the per-seed spread (5th–95th
percentile) and the full steps a pass ran (out of 20). ``--resume`` keeps the cells of the saved run.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from benchmarks import modes as M
from benchmarks import sampler as S
from benchmarks.fidelity import benchmark as B
from benchmarks.fidelity.loading import load_model
from benchmarks.fidelity.metrics import bootstrap, psnr_ssim
from benchmarks.results import RUNS, load_run_data, save_run_data, write_section

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
"""The summary's columns per layout: DeepCache, issue 23's default and the default now."""


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


def run_layout(layout: str, samplers: tuple[str, ...], seeds: int, intervals, forecasts, done: dict, save, log) -> dict:
    model = load_model(layout)
    seed_range = range(seeds)
    noise = B.noise_for(seed_range, model.size, model.channels)
    labels = B.labels_for(seed_range, len(model.classes))
    out = done
    for sampler in samplers:
        row = out.setdefault(sampler, {})
        wanted = [mode(f, n) for f in forecasts for n in intervals]
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
            row[m.name] = cell(psnr, counts[0]["full"] if counts else STEPS)
            log(f"{layout} {S.LABELS[sampler]}: {m.name} {row[m.name]['psnr'][0]:.1f} dB, {row[m.name]['full']} full")
            log(f"  ({time.perf_counter() - start:.0f} s)")
            save()
    return out


def _intervals(per_sampler: dict) -> list[int]:
    return sorted({int(k.rsplit("-", 1)[1]) for row in per_sampler.values() for k in row})


def section(data: dict, meta: dict) -> str:
    """The RESULTS.md section: a summary (mean PSNR and full steps of each forecast, both layouts), then per layout
    every cell with its interval and spread."""
    lines = [
        BEGIN,
        "## The step cache under the WebUI's samplers (`python -m benchmarks.samplers`)",
        "",
        f"Trained models (`benchmarks/fidelity/weights/`), {STEPS} steps, CFG 7, each sampler on the WebUI's scheduler "
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
    columns = [(k, f) for k in data for f in FORECASTS if f.name in SUMMARY]
    head = [f"{B.LAYOUT_NAMES[k].split()[0]}: {f.label.split(' (')[0]}" for k, f in columns]
    lines += ["| sampler, N | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for sampler in S.SAMPLERS:
        for n in INTERVALS:
            found = [data[k].get(sampler, {}).get(f"{f.name}-{n}") for k, f in columns]
            if any(found):
                cells = ["—" if c is None else f"{c['psnr'][0]:.1f} ({c['full']})" for c in found]
                lines.append(f"| {S.LABELS[sampler]}, N={n} | " + " | ".join(cells) + " |")
    lines.append("")
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
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=("sd15", "sdxl"), default="sd15")
    parser.add_argument("--seeds", type=int, default=64)
    parser.add_argument("--samplers", default=",".join(S.SAMPLERS))
    parser.add_argument("--intervals", default=",".join(map(str, INTERVALS)))
    parser.add_argument("--forecasts", default=",".join(f.name for f in FORECASTS))
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--part", default="", help="a name for this part of the run (runs side by side, merged)")
    parser.add_argument("--render", action="store_true", help="only write the RESULTS.md section from the saved runs")
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

    run_layout(args.layout, tuple(args.samplers.split(",")), args.seeds, intervals, forecasts, data, save, print)
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
