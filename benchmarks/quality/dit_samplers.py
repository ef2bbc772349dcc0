"""Our cache and the real libraries' under the samplers people run beside Euler (``python -m
benchmarks.quality.dit_samplers``; issue 53): on the trained FLUX-layout model (or the Wan-layout video model,
``--model wan``), under ComfyUI's ``euler``, ``dpmpp_2m``, ``deis``, ``res_multistep``, ``uni_pc`` and ``uni_pc_bh2``
(its own functions where a checkout is named, ``TOME_COMFYUI``; else the core's own) and diffusers'
``UniPCMultistepScheduler`` and ``DPMSolverMultistepScheduler`` (:mod:`benchmarks.lab.samplers`), each at 20 steps.
Plain under that sampler is the reference.

1. Ours: the transformers' default (linear forecast, uniform schedule) at N = 2 … 8 with the correction at its default
   (0.75, told the sampler as a host tells it) and without it (0), and the early schedule at the default, all seeds.
2. The real libraries (cache-dit, diffusers' hooks; :mod:`benchmarks.lab.libraries`) under the same sampler: the
   settings of each library within :data:`SLACK` dB of its frontier in ``dit_libraries``' recorded Euler sweep, at
   :data:`SWEPT_FROM`× or faster, swept again under this sampler on :data:`SWEEP_SEEDS` seeds, image by image; each
   library's frontier of that sweep then on all seeds (MagCache calibrated under this sampler by its own
   ``calibrate=True``).
3. At 2×, 3× and 4×: each side's best run at least that fast, and ours minus the best library's, paired per seed.

Per-seed PSNR (mean and worst seed); speed priced at the real model's width from the blocks each call executed.

    python -m benchmarks.quality.dit_samplers            # 64 seeds; writes its RESULTS.md section
    python -m benchmarks.quality.dit_samplers --quick    # 2 seeds, untrained weights, a few settings: prints only
    python -m benchmarks.quality.dit_samplers --render   # the section again from benchmarks/runs/dit-samplers.json
    python -m benchmarks.quality.dit_samplers --model wan   # the Wan-layout model (run dit-samplers-wan)
    python -m benchmarks.quality.dit_samplers --progress PATH   # keep each finished run in PATH, continue from it
    python -m benchmarks.quality.dit_samplers --ours-only   # ours alone, no library
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.lab import dit
from benchmarks.lab import libraries as L
from benchmarks.lab import samplers as S
from benchmarks.lab.results import Progress, command, load_run_data, run_command
from benchmarks.lab.subjects import SUBJECTS, Subject, add_model_option, of_run, section_of
from benchmarks.lab.trained.metrics import bootstrap, psnr_ssim
from tome_core.settings import DEFAULTS, ToMeSettings

COMMAND = "dit-samplers"
STEPS = 20
INTERVALS = (2, 3, 4, 5, 7, 8)
GAINS = (0.0, DEFAULTS.cache_correction)
EARLY = (DEFAULTS.cache_correction, "early")
"""The early schedule (``cache_schedule`` early) is measured at the default gain."""
SWEEP_SEEDS = 8
SLACK = 1.0
"""dB: a library's setting is swept again under each sampler where no other setting of that library was, under Euler,
at least as fast and this much closer."""
SWEPT_FROM = 1.5
"""A library's settings slower than this under Euler are not swept again (the targets are 2× and more)."""
FINAL_FROM = 1.8
"""Frontier points of a sampler's sweep slower than this are not run on all seeds."""
TARGETS = (2.0, 3.0, 4.0)
CALIBRATION_SEEDS = range(1000, 1008)


def candidates(subject: Subject, calls: int) -> list[L.Setting]:
    """Each library's settings near its frontier of ``dit_libraries``' recorded Euler sweep (see :data:`SLACK`,
    :data:`SWEPT_FROM`), built for a pass of ``calls`` steps (a step mask of that length; the same place in
    :func:`benchmarks.lab.libraries.settings`)."""
    sweep = load_run_data(subject.run_name("dit-libraries"))[0]["sweep"]
    near = set()
    for library in L.LIBRARIES:
        points = [p for p in sweep if p["library"] == library]
        near |= {
            p["name"]
            for p in points
            if p["speed"] >= SWEPT_FROM
            and not any(o["speed"] >= p["speed"] and o["psnr"] >= p["psnr"] + SLACK for o in points)
        }
    euler, here = L.settings(STEPS, subject.transformer), L.settings(calls, subject.transformer)
    if [(s.library, s.method) for s in euler] != [(s.library, s.method) for s in here]:
        raise ValueError(f"the libraries' settings for {calls} steps are not those for {STEPS}")
    return [h for e, h in zip(euler, here) if e.name in near]


def _cell(values: list[float]) -> str:
    return f"{sum(values) / len(values):.1f} ({min(values):.1f})"


def ours(model, noise, labels, steps: int, name: str, function: Callable, plain, subject: Subject, progress, log):
    """Our cache under the sampler ``name`` at each N of :data:`INTERVALS`: on the uniform schedule at each gain of
    :data:`GAINS`, on the early one at the default gain (:data:`EARLY`)."""
    out = {}
    for n in INTERVALS:
        for gain, schedule in [*((g, "uniform") for g in GAINS), EARLY]:
            key = f"{name}/N{n}/{gain:g}" + ("" if schedule == "uniform" else f"/{schedule}")
            row = progress.get(key)
            if row is None:
                settings = ToMeSettings(
                    ratio=0.0, cache=True, cache_interval=n, cache_correction=gain, cache_schedule=schedule
                )
                samples, counts = S.sample(model, noise, labels, steps, name, function, settings)
                psnr, _ = psnr_ssim(samples, plain)
                row = {"sampler": name, "interval": n, "gain": gain, "counts": counts, "psnr_per_seed": psnr.tolist()}
                row = progress.put(key, {**row, "schedule": schedule, "speed": subject.priced(counts)})
            out[key] = row
            log(f"{key}: {row['counts']}, {_cell(row['psnr_per_seed'])} dB")
    return out


def libraries(
    models, noise, labels, steps: int, name: str, function: Callable, plain, subject, settings, progress, log
):
    """The libraries' ``settings`` under the sampler ``name``: the sweep on :data:`SWEEP_SEEDS` seeds, each library's
    frontier of it (from :data:`FINAL_FROM`×) on all seeds; MagCache calibrated under this sampler."""
    calls, costs = S.calls(name, steps), subject.costs()

    def sampler(model, x, y, uncond_first: bool):
        return S.sample(model, x, y, steps, name, function, uncond_first=uncond_first)[0]

    ratios = progress.get(f"{name}/ratios")
    if ratios is None:
        cal_noise, cal_labels = subject.noise(CALIBRATION_SEEDS), subject.labels(CALIBRATION_SEEDS)
        diffusers_model = models["diffusers"]
        ratios = progress.put(
            f"{name}/ratios",
            L.magcache_ratios(
                diffusers_model.transformer,
                lambda i: sampler(diffusers_model, cal_noise[i : i + 1], cal_labels[i : i + 1], False),
                len(CALIBRATION_SEEDS),
                calls,
            ),
        )
    sweep, final = L.sweep_and_frontiers(
        models,
        settings,
        noise,
        labels,
        plain,
        calls,
        ratios,
        costs,
        progress,
        log,
        SWEEP_SEEDS,
        sampler,
        prefix=f"{name}/",
        final_from=FINAL_FROM,
    )
    return {"ratios": ratios, "sweep": sweep, "final": final}


def run(
    seeds: int,
    steps: int,
    load: Callable,
    log,
    subject: Subject = SUBJECTS["flux"],
    names=S.NAMES,
    settings: Callable[[int], list[L.Setting]] | None = None,
    progress: Progress | None = None,
) -> dict:
    """Per sampler of ``names``: ours (:func:`ours`) and, given ``settings`` (the libraries' settings for a pass of so
    many calls), the libraries (:func:`libraries`). ``load()`` gives a model: one per library, as cache-dit patches its
    blocks' forwards for the process's life."""
    progress = progress or Progress(None, {})
    models = {"ours": load(), **({"cache-dit": load(), "diffusers": load()} if settings is not None else {})}
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    functions, _ = S.functions()
    out: dict = {"ours": {}, "libraries": {}}
    plains = {name: S.sample(models["ours"], noise, labels, steps, name, functions[name])[0] for name in names}
    for name in names:  # ours under every sampler first, then the libraries (a long run's first part)
        out["ours"].update(
            ours(models["ours"], noise, labels, steps, name, functions[name], plains[name], subject, progress, log)
        )
    for name in names if settings is not None else ():
        chosen = settings(S.calls(name, steps))
        out["libraries"][name] = libraries(
            models, noise, labels, steps, name, functions[name], plains[name], subject, chosen, progress, log
        )
    return out


def _steps_and_speed(row: dict) -> list[str]:
    counts = row["counts"] or {}
    speed = "" if row["speed"] is None else f"{row['speed']:.2f}×"
    return [f"{counts.get('full', '?')} + {counts.get('cached', '?')}", speed]


def _as_final(row: dict) -> dict:
    values = row["psnr_per_seed"]
    schedule = row.get("schedule", "uniform")
    return {
        "library": schedule if schedule != "uniform" else "ours" if row["gain"] else "uncorrected",
        "name": f"N={row['interval']}",
        "psnr": sum(values) / len(values),
        "psnr_per_seed": values,
        "speed": row["speed"] or 0.0,
    }


def section(data_: dict, meta: dict) -> str:
    subject = of_run(meta)
    _, begin, end = subject.markers(COMMAND)
    rows_ = data_.get("ours", data_)
    lines = [
        begin,
        f"## The cache under other samplers (`python -m benchmarks.quality.dit_samplers{subject.option}`)",
        "",
        f"{subject.heading}, {meta['seeds']} seeds, {meta['steps']} steps on {subject.schedule}, CFG {dit.CFG:g}, "
        f"under {meta['source']} and diffusers' schedulers; {meta['seconds'] / 60:.0f} min "
        f"({meta.get('threads', 1)} torch threads). PSNR (dB) against plain "
        "under the same sampler, per-seed mean (worst seed), of our cache (linear forecast, uniform schedule) at N with "
        "`cache_correction` 0 and at its default (0.75), which acts under each of these samplers through its linear "
        "map (`tome_core.caching.samplers`), and on the early schedule (`cache_schedule` early: the second full "
        "step at N − 1, then every N) at that default, paired against the uniform one (bootstrap 95 %); speed priced at "
        f"{subject.width}. `uni_pc` and `uni_pc_bh2` run one step fewer (ComfyUI drops their next-to-last sigma).",
        "",
        *(
            [
                f"On this model ({subject.transformer}, whose output layer is not one module) the correction stands "
                "aside, as it says: both columns are the uncorrected cache.",
                "",
            ]
            if all(
                r["gain"] == 0
                or r.get("schedule", "uniform") != "uniform"
                or r["psnr_per_seed"] == rows_[f"{r['sampler']}/N{r['interval']}/0"]["psnr_per_seed"]
                for r in rows_.values()
            )
            else []
        ),
        "| sampler | N | steps (full + cached) | speed | uncorrected | corrected (default) | gain "
        "| early schedule: steps | speed | corrected | − uniform (paired) |",
        "|---|---:|---|---:|---|---|---:|---|---:|---|---|",
    ]
    rows: dict[tuple[str, int], dict[tuple[float, str], dict]] = {}
    for row in rows_.values():
        rows.setdefault((row["sampler"], row["interval"]), {})[row["gain"], row.get("schedule", "uniform")] = row
    for (name, n), by_kind in rows.items():
        off, on = by_kind[0.0, "uniform"], by_kind[DEFAULTS.cache_correction, "uniform"]
        gain = (sum(on["psnr_per_seed"]) - sum(off["psnr_per_seed"])) / len(on["psnr_per_seed"])
        cells = [name, str(n), *_steps_and_speed(on), _cell(off["psnr_per_seed"]), _cell(on["psnr_per_seed"])]
        cells.append(f"{gain:+.1f}")
        early = by_kind.get(EARLY)
        if early is None:
            cells += ["—"] * 4
        else:
            diff = np.array(early["psnr_per_seed"]) - np.array(on["psnr_per_seed"])
            cells += [*_steps_and_speed(early), _cell(early["psnr_per_seed"]), bootstrap(diff).cell(".1f")]
        lines.append("| " + " | ".join(cells) + " |")
    found = data_.get("libraries") or {}
    if found:
        lines += [
            "",
            f"Against the real libraries under the same samplers (cache-dit {meta['versions']['cache-dit']}, diffusers "
            f"{meta['versions']['diffusers']}, through their own APIs, {subject.unit} by {subject.unit}): each "
            f"library's settings within {SLACK:g} dB of its frontier in `dit-libraries`' Euler sweep (at "
            f"{SWEPT_FROM:g}× or faster) swept again under each sampler on {meta['sweep_seeds']} seeds, that sweep's "
            f"frontier (from {FINAL_FROM:g}×) on all {meta['seeds']}; at each target the best run of each side at "
            "least that fast, PSNR mean (worst seed) and speed, and ours (the default) minus the best library's, "
            "paired per seed (bootstrap 95 %).",
            "",
            "| sampler | target | ours (default) | uncorrected | early schedule | best cache-dit | best diffusers "
            "| ours − best library | early − best library |",
            "|---|---|---|---|---|---|---|---|---|",
        ]

        def cell(run: dict | None) -> str:
            return "—" if run is None else f"{_cell(run['psnr_per_seed'])} at {run['speed']:.2f}×"

        def lead(run: dict | None, best: dict | None) -> str:
            if run is None or best is None:
                return "—"
            return bootstrap(np.array(run["psnr_per_seed"]) - np.array(best["psnr_per_seed"])).cell(".1f")

        for name, part in found.items():
            final = {**part["final"]}
            for key, row in rows_.items():
                if row["sampler"] == name:
                    final[key] = _as_final(row)
            for target in TARGETS:
                mine, off, early = (L.best_at(final, kind, target) for kind in ("ours", "uncorrected", "early"))
                libs = [L.best_at(final, library, target) for library in L.LIBRARIES]
                best = L.best_library_at(final, target)
                lines.append(
                    f"| {name} | ≥ {target:g}× | {cell(mine)} | {cell(off)} | {cell(early)} | {cell(libs[0])} "
                    f"| {cell(libs[1])} | {lead(mine, best)} | {lead(early, best)} |"
                )
        lines += ["", "Each library's runs on all seeds, per sampler (its sweep's frontier):", ""]
        for name, part in found.items():
            runs = sorted(part["final"].values(), key=lambda r: (r["library"], r["speed"]))
            listed = "; ".join(f"`{r['name']}` {r['psnr']:.1f} dB at {r['speed']:.2f}×" for r in runs) or "none"
            lines.append(f"- {name} ({len(part['sweep'])} swept): {listed}.")
    return "\n".join([*lines, end])


def main(argv: list[str] | None = None) -> None:
    def measure(args) -> tuple[dict, dict]:
        import cache_dit
        import diffusers

        subject = SUBJECTS[args.model]
        seeds, steps = (2, 10) if args.quick else (dit.SEEDS, STEPS)  # (cache-dit's presets need 8 calls)

        def load():
            return subject.random() if args.quick else subject.load()

        if args.ours_only:
            settings = None
        elif args.quick:
            settings = lambda calls: L.settings(calls, subject.transformer)[::60]  # noqa: E731
        else:
            settings = lambda calls: candidates(subject, calls)  # noqa: E731
        _, source = S.functions()
        versions = {"cache-dit": cache_dit.__version__, "diffusers": diffusers.__version__}
        identity = {"model": subject.name, "seeds": seeds, "steps": steps}  # an ours-only run's rows serve a full one
        progress = Progress(args.progress, {**identity, "source": source, "versions": versions})
        results = run(seeds, steps, load, print, subject, settings=settings, progress=progress)
        meta = {
            "seeds": seeds,
            "steps": steps,
            "sweep_seeds": SWEEP_SEEDS,
            "source": source,
            "versions": versions,
            "seconds": round(progress.seconds(), 1),
            "threads": args.threads,
        }
        if args.progress is not None and not args.ours_only:
            args.progress.unlink(missing_ok=True)  # the run is whole (an ours-only run's rows serve the whole one)
        return results, subject.stamped(meta)

    parser = command(__doc__, quick="", threads=1)
    add_model_option(parser)
    parser.add_argument("--progress", type=Path, help="keep each finished run here and continue from it if it exists")
    parser.add_argument("--ours-only", action="store_true", help="ours alone, no library")
    run_command(parser, section_of(COMMAND, section), argv, measure)


if __name__ == "__main__":
    main()
