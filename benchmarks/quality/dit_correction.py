"""Deferred correction of a cached pass (``python -m benchmarks.quality.dit_correction``; issue 36; the setting
``cache_correction`` is its order 2, equal to it on the FLUX layout, ``tests/test_dit_correction.py``): on the trained FLUX-layout model (or the Wan-layout video model, ``--model wan``), our cache
(linear forecast, uniform schedule) at N = 2, 3, 4, 5 and 7, and the same passes with the correction of
:mod:`benchmarks.lab.correction`: at each full step, the cached steps since the one before re-estimated by
interpolating the skipped blocks' residual, and what their outputs should have added to ``x`` carried by the full
step's output (exact for the flow-matching Euler sampler only). Variants: the parabola (order 2) with all of the
difference (gain 1), three quarters or half of it (0.75, 0.5), and the line (order 1, gain 1).

PSNR against plain's sample (mean [bootstrap 95 %]) and the paired difference from the uncorrected pass; then the
corrected pass against the best real-library run at 2×, 3× and 4× (``dit_libraries``' saved run, the same seeds,
paired), for the setting at its default (gain 0.75) and for the best variant. The correction runs the output layer
once more per cached step, at the next full step: not priced (an output layer is well under a block's work).

    python -m benchmarks.quality.dit_correction              # 64 seeds, 20 steps; writes its RESULTS.md section
    python -m benchmarks.quality.dit_correction --quick      # 2 seeds, 8 steps, untrained weights: prints only
    python -m benchmarks.quality.dit_correction --render     # the section again from benchmarks/runs/dit-correction.json
    python -m benchmarks.quality.dit_correction --model wan  # the Wan-layout model (run dit-correction-wan)
"""

from __future__ import annotations

import time

import torch

from benchmarks.lab import libraries as L
from benchmarks.lab.correction import DEFAULT, DeferredCorrection
from benchmarks.lab.dit import CFG, SEEDS, STEPS, Mode, sample
from benchmarks.lab.results import command, load_run_data, run_command
from benchmarks.lab.subjects import SUBJECTS, Subject, add_model_option, of_run, section_of
from benchmarks.lab.trained.metrics import Estimate, bootstrap, psnr_ssim

COMMAND = "dit-correction"
INTERVALS = (2, 3, 4, 5, 7)
VARIANTS = {
    "order 2, gain 1": (2, 1.0),
    "order 2, gain 0.75": (2, 0.75),
    "order 2, gain 0.5": (2, 0.5),
    "order 1, gain 1": (1, 1.0),
}
TARGETS = (2.0, 3.0, 4.0)
assert DEFAULT in VARIANTS


def run(seeds: int, steps: int, model, log, subject: Subject = SUBJECTS["flux"], intervals=INTERVALS) -> dict:
    """Plain, ours at each of ``intervals`` and each of :data:`VARIANTS` on it, on ``subject``'s ``model``: PSNR per
    seed and the pass's speed-up."""
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    plain, _ = sample(model, noise, labels, steps)
    out = {}
    for n in intervals:
        mode = Mode(f"linear-{n}", "linear", "uniform", n)
        samples, counts = sample(model, noise, labels, steps, mode)
        row = {"interval": n, "counts": counts, "speed": subject.priced(counts)}
        row["ours"] = psnr_ssim(samples, plain)[0].tolist()
        for name, (order, gain) in VARIANTS.items():
            corrected, _ = sample(model, noise, labels, steps, mode, correction=DeferredCorrection(order, gain))
            row[name] = psnr_ssim(corrected, plain)[0].tolist()
        out[f"N{n}"] = row
        log(f"N={n} {counts}: " + ", ".join(f"{k} {torch.tensor(row[k]).mean():.2f}" for k in ("ours", *VARIANTS)))
    return out


def against_libraries(results: dict, subject: Subject, seeds: int) -> list[dict]:
    """At each of :data:`TARGETS`: the default corrected pass (:data:`DEFAULT`) and the best corrected pass at that
    speed or faster, each with the best real-library run there (``dit_libraries``' saved run on ``subject``, when it
    ran on the same ``seeds``), paired by seed."""
    try:
        libraries, meta = load_run_data(subject.run_name("dit-libraries"))
    except FileNotFoundError:
        return []
    if meta.get("seeds") != seeds:
        return []
    rows = []
    for target in TARGETS:
        fast = [r for r in results.values() if r["speed"] is not None and r["speed"] >= target]
        ours = [
            {"name": f"N={r['interval']}, {v}", "psnr_per_seed": r[v], "speed": r["speed"]}
            for r in fast
            for v in VARIANTS
        ]
        best = max(ours, key=lambda r: sum(r["psnr_per_seed"]), default=None)
        default = max(
            (r for r in ours if r["name"].endswith(DEFAULT)), key=lambda r: sum(r["psnr_per_seed"]), default=None
        )
        library = L.best_library_at(libraries["final"], target)
        if best is None or default is None or library is None:
            continue
        theirs = torch.tensor(library["psnr_per_seed"])
        rows.append(
            {
                "target": target,
                "library": {k: library[k] for k in ("name", "psnr", "speed")},
                **{
                    key: {
                        **run,
                        "psnr": bootstrap(torch.tensor(run["psnr_per_seed"])).to_json(),
                        "ahead": bootstrap(torch.tensor(run["psnr_per_seed"]) - theirs).to_json(),
                    }
                    for key, run in (("default", default), ("ours", best))
                },
            }
        )
    return rows


def section(data_: dict, meta: dict) -> str:
    subject = of_run(meta)
    _, begin, end = subject.markers(COMMAND)
    runs = data_["runs"]
    lines = [
        begin,
        f"## Deferred correction of a cached pass (`python -m benchmarks.quality.dit_correction{subject.option}`)",
        "",
        f"{subject.heading} (`{subject.card}`), {meta['seeds']} seeds, {meta['steps']} flow-matching Euler steps on "
        f"{subject.schedule}, CFG {CFG:g}; {meta['seconds'] / 60:.0f} min (1 torch thread). Our cache (linear, "
        "uniform) and the same passes corrected at each full step (`benchmarks.lab.correction`: a study of the "
        "Euler sampler; the setting `cache_correction` is its order 2). PSNR against plain's sample (mean [bootstrap 95 %]); the difference from "
        f"the uncorrected pass, paired by seed; speed-up priced at {subject.width}.",
        "",
        "| N | full / cached | speed-up | ours | " + " | ".join(VARIANTS) + " |",
        "|---:|---|---:|---|" + "---|" * len(VARIANTS),
    ]
    for row in runs.values():
        ours = torch.tensor(row["ours"])
        cells = [
            str(row["interval"]),
            f"{row['counts']['full']} / {row['counts']['cached']}",
            "—" if row["speed"] is None else f"{row['speed']:.2f}×",
            bootstrap(ours).cell(".1f"),
        ]
        for name in VARIANTS:
            fixed = torch.tensor(row[name])
            cells.append(f"{bootstrap(fixed).cell('.1f')}, {bootstrap(fixed - ours).cell('+.1f')}")
        lines.append("| " + " | ".join(cells) + " |")
    if data_["libraries"]:
        lines += [
            "",
            "Against the best real-library run (`dit_libraries`' run on the same seeds) at each speed: the setting at "
            f"its default ({DEFAULT}) and the best corrected pass, each paired by seed (dB):",
            "",
            "| at least | the default | − library | best corrected | − library | best library |",
            "|---|---|---|---|---|---|",
        ]
        for row in data_["libraries"]:
            library = row["library"]
            cells = [f"{row['target']:g}×"]
            for key in ("default", "ours"):
                run = row[key]
                cells += [
                    f"{Estimate.from_json(run['psnr']).mean:.1f} at {run['speed']:.2f}× ({run['name']})",
                    Estimate.from_json(run["ahead"]).cell("+.1f"),
                ]
            cells.append(f"{library['psnr']:.1f} at {library['speed']:.2f}× (`{library['name']}`)")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, end])


def main(argv: list[str] | None = None) -> None:
    def measure(args) -> tuple[dict, dict]:
        start = time.perf_counter()
        subject = SUBJECTS[args.model]
        seeds, steps, intervals = (2, 8, (2, 3)) if args.quick else (SEEDS, STEPS, INTERVALS)
        model = subject.random() if args.quick else subject.load()
        runs = run(seeds, steps, model, print, subject, intervals)
        results = {"runs": runs, "libraries": [] if args.quick else against_libraries(runs, subject, seeds)}
        meta = {"seeds": seeds, "steps": steps, "seconds": round(time.perf_counter() - start, 1)}
        return results, subject.stamped(meta)

    parser = command(__doc__, quick="2 seeds, 8 steps, untrained weights: print only", threads=1)
    add_model_option(parser)
    run_command(parser, section_of(COMMAND, section), argv, measure)


if __name__ == "__main__":
    main()
