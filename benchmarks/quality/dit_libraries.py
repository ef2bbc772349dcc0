"""Our cache against the real libraries' caches on the trained FLUX-layout model and the Wan-layout video model
(``python -m benchmarks.quality.dit_libraries``; issue 36): cache-dit and diffusers applied through their own APIs
(:mod:`benchmarks.lab.libraries`), each swept over its settings so that each library's frontier (the best PSNR at each
priced speed) is found, not only its defaults.

1. The sweep: every setting of :func:`benchmarks.lab.libraries.settings` on :data:`SWEEP_SEEDS` seeds, image by
   image (each image under a fresh cache, as a user runs one), PSNR against plain's sample and the speed-up its
   executed blocks price at the real model's width (FLUX.1's; Wan 2.1 1.3B's at 480p and 81 frames).
2. Each library's frontier on the sweep (no other setting of that library both faster and closer) run again on all
   64 seeds, as is ours (the linear forecast on the uniform schedule, N = 2 … 6, the transformers' default).
3. At each target speed (2×, 3×, 4×): each side's best run at least that fast, and ours minus the best library's,
   paired over the 64 seeds (bootstrap 95 %).

    python -m benchmarks.quality.dit_libraries            # the run; writes its RESULTS.md section
    python -m benchmarks.quality.dit_libraries --quick    # 2 seeds, 4 steps, untrained weights, a few settings
    python -m benchmarks.quality.dit_libraries --render   # the section again from benchmarks/runs/dit-libraries.json
    python -m benchmarks.quality.dit_libraries --ours-again   # ours measured again, the libraries' runs kept
    python -m benchmarks.quality.dit_libraries --model wan    # the Wan-layout model (run dit-libraries-wan)
    python -m benchmarks.quality.dit_libraries --model wan --weights PATH   # other weights of its architecture
    python -m benchmarks.quality.dit_libraries --model wan --progress PATH  # keep each finished run in PATH and
                                                                             # continue from it (a stopped run)
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from benchmarks.lab import libraries as L
from benchmarks.lab.dit import CFG, SEEDS, STEPS, BlockCosts, Mode, guided_euler, sample
from benchmarks.lab.results import Progress, command, load_run_data, run_command
from benchmarks.lab.subjects import SUBJECTS, Subject, add_model_option, of_run, section_of
from benchmarks.lab.trained.metrics import bootstrap, psnr_ssim

SWEEP_SEEDS = 8
CALIBRATION_SEEDS = range(1000, 1008)
TARGETS = (2.0, 3.0, 4.0)
OURS = tuple(Mode(f"ours-N{n}", "linear", "uniform", n) for n in (2, 3, 4, 5, 7, 8))
"""Our transformers' default (``cache_forecast`` auto = linear, ``cache_schedule`` auto = uniform) at N = 2 … 8 (at
20 steps N=6 runs as many full steps as N=5: 0, 6, 12, 18 and the last)."""


def run(
    subject: Subject,
    seeds: int,
    sweep_seeds: int,
    steps: int,
    load,
    settings: list[L.Setting],
    costs: BlockCosts,
    log,
    progress: Progress | None = None,
) -> dict:
    """The sweep (``settings`` on the first ``sweep_seeds`` seeds), each library's frontier and ours on ``seeds``, on
    ``subject``; ``load()`` gives a model: one per library, as cache-dit patches its blocks' forwards for the
    process's life. The libraries' runs already in ``progress`` are taken from it, each new one is put there."""
    progress = progress or Progress(None, {})
    models = {"cache-dit": load(), "diffusers": load(), "ours": load()}
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    plain, _ = sample(models["ours"], noise, labels, steps)
    cal_noise, cal_labels = subject.noise(CALIBRATION_SEEDS), subject.labels(CALIBRATION_SEEDS)
    diffusers_model = models["diffusers"]
    ratios = L.magcache_ratios(
        diffusers_model.transformer,
        lambda i: guided_euler(diffusers_model, cal_noise[i : i + 1], cal_labels[i : i + 1], steps),
        len(CALIBRATION_SEEDS),
        steps,
    )
    sweep, final = L.sweep_and_frontiers(
        models, settings, noise, labels, plain, steps, ratios, costs, progress, log, sweep_seeds
    )
    final.update(ours(models["ours"], noise, labels, plain, steps, costs, log))
    return {"magcache_ratios": ratios, "sweep": sweep, "final": final}


def ours(model, noise, labels, plain, steps: int, costs: BlockCosts, log) -> dict:
    """Each mode of :data:`OURS` on the batch, priced as :meth:`BlockCosts.priced` prices our steps."""
    out = {}
    for mode in OURS:
        samples, counts = sample(model, noise, labels, steps, mode)
        psnr, _ = psnr_ssim(samples, plain)
        speed = costs.priced(counts)
        out[mode.name] = {
            "library": "ours",
            "name": mode.name,
            "psnr_per_seed": psnr.tolist(),
            "psnr": float(psnr.mean()),
            "speed": speed,
        }
        log(f"{mode.name}: {psnr.mean():.1f} dB at {speed:.2f}x")
    return out


def ours_again(
    subject: Subject, seeds: int, steps: int, model, costs: BlockCosts, saved: tuple[dict, dict], log
) -> tuple[dict, dict]:
    """The saved run with ours measured again (after a change to ours): the libraries' sweep and runs are kept."""
    results, meta = saved
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    plain, _ = sample(model, noise, labels, steps)
    final = {k: v for k, v in results["final"].items() if v["library"] != "ours"}
    final.update(ours(model, noise, labels, plain, steps, costs, log))
    return {**results, "final": final}, meta


def section(results: dict, meta: dict) -> str:
    subject = of_run(meta)
    _, begin, end = subject.markers("dit-libraries")
    final = results["final"]
    on = "" if subject.name == "flux" else f" on the {subject.title.removeprefix('the trained ')}"
    weights = f"`{subject.card}`" if meta.get("weights") is None else f"weights `{meta['weights']}`"
    lines = [
        begin,
        f"## Our cache against the real libraries'{on} (`python -m benchmarks.quality.dit_libraries"
        + subject.option
        + "`)",
        "",
        f"{subject.heading} ({weights}), {meta['steps']} flow-matching Euler "
        f"steps, CFG {CFG:g}. cache-dit {meta['versions']['cache-dit']} and diffusers {meta['versions']['diffusers']} "
        f"through their own APIs, {subject.unit} by {subject.unit}; {len(results['sweep'])} settings swept on {meta['sweep_seeds']} seeds, "
        f"each library's frontier of that sweep and ours (linear, uniform, N = {', '.join(m.name.removeprefix('ours-N') for m in OURS)}) on {meta['seeds']} seeds; "
        f"speed-up: the blocks each call executed, priced at {subject.width}; {meta['seconds'] / 60:.0f} min "
        "(1 torch thread).",
        "",
        "| target | ours | best cache-dit | best diffusers | ours − best library (dB, paired) |",
        "|---|---|---|---|---|",
    ]

    def cell(run: dict | None) -> str:
        return "—" if run is None else f"{run['psnr']:.1f} dB at {run['speed']:.2f}× (`{run['name']}`)"

    for target in TARGETS:
        ours = L.best_at(final, "ours", target)
        libs = [L.best_at(final, lib, target) for lib in L.LIBRARIES]
        best = L.best_library_at(final, target)
        if ours is not None and best is not None:
            diff = bootstrap(np.array(ours["psnr_per_seed"]) - np.array(best["psnr_per_seed"])).cell(".1f")
        else:
            diff = "—"
        lines.append(f"| ≥ {target:g}× | {cell(ours)} | {cell(libs[0])} | {cell(libs[1])} | {diff} |")
    lines += [
        "",
        "Every run on all seeds (each library's sweep frontier, and ours):",
        "",
        "| run | PSNR (dB) | speed-up |",
        "|---|---|---:|",
    ]
    for run_ in sorted(final.values(), key=lambda r: (r["library"], r["speed"])):
        estimate = bootstrap(np.array(run_["psnr_per_seed"]))
        lines.append(f"| {run_['library']}: `{run_['name']}` | {estimate.cell('.1f')} | {run_['speed']:.2f}× |")
    ratios = ", ".join(f"{r:.3f}" for r in results["magcache_ratios"])
    lines += ["", f"diffusers' MagCache ratios, calibrated by its own `calibrate=True` on 8 other seeds: {ratios}."]
    return "\n".join([*lines, end])


def main(argv: list[str] | None = None) -> None:
    def measure(args) -> tuple[dict, dict]:
        import cache_dit
        import diffusers

        start = time.perf_counter()
        subject = SUBJECTS[args.model]
        versions = {"cache-dit": cache_dit.__version__, "diffusers": diffusers.__version__}
        costs = subject.costs()
        weights = None if args.weights is None else str(args.weights)
        if args.ours_again:
            saved = load_run_data(subject.run_name("dit-libraries"))
            model = subject.load(saved[1].get("weights"))
            results, meta = ours_again(subject, saved[1]["seeds"], saved[1]["steps"], model, costs, saved, print)
            return results, {**meta, "ours_again_seconds": round(time.perf_counter() - start, 1)}
        if args.quick:
            seeds, sweep_seeds, steps = 2, 2, 4
            settings, load = L.settings(steps, subject.transformer)[::60], subject.random
        else:
            seeds, sweep_seeds, steps = SEEDS, SWEEP_SEEDS, STEPS
            settings = L.settings(STEPS, subject.transformer)

            def load():
                return subject.load(weights)

        identity = {
            "model": subject.name,
            "weights": weights,
            "seeds": seeds,
            "sweep_seeds": sweep_seeds,
            "steps": steps,
            "versions": versions,
            "settings": [s.name for s in settings],
        }
        progress = Progress(args.progress, identity)
        results = run(subject, seeds, sweep_seeds, steps, load, settings, costs, print, progress)
        meta = {
            "seeds": seeds,
            "sweep_seeds": sweep_seeds,
            "steps": steps,
            "versions": versions,
            "seconds": round(progress.seconds(), 1),
        }
        if args.progress is not None:
            args.progress.unlink(missing_ok=True)  # the run is whole: nothing left to continue
        meta = subject.stamped(meta)
        if weights is not None:
            meta["weights"] = weights
        return results, meta

    parser = command(__doc__, quick="", threads=1)
    add_model_option(parser)
    parser.add_argument("--weights", type=Path, help="another weights file of the model's architecture")
    parser.add_argument("--ours-again", action="store_true", help="measure ours again, keep the libraries' runs")
    parser.add_argument("--progress", type=Path, help="keep each finished run here and continue from it if it exists")
    run_command(parser, section_of("dit-libraries", section), argv, measure)


if __name__ == "__main__":
    main()
