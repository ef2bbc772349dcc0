"""How far a forecast or a correction can take the cache past 3× (``python -m benchmarks.quality.correction_ceiling``;
issue 53): on the trained FLUX-layout model (or the Wan-layout video model, ``--model wan``), under flow-matching
Euler, the cache emulated by hooks (:mod:`benchmarks.lab.emulated`: every block runs, a cached step's output layer
fed what left the probe plus the residual each idea chooses), at N = 2, 3, 4, 5 and 7:

* the cache uncorrected and with its ``cache_correction`` (0.75, and gain 1), each held to the cache's own pass;
* other forecasts: the slope times 0.8, the parabola through three full steps, the step index as the time;
* corrections that do more at each full step: the cached steps replayed from where they began with the re-estimated
  residual and their probe live (a cached step's cost again, each), and that with the full step's blocks run again
  at the replayed input (a full step's cost again);
* the future known: the cached steps' residual interpolated from plain's own full steps on both sides (no method:
  the forecast's ceiling).

PSNR per seed against plain's sample (mean, worst seed); speed priced at the real model's width from what each idea
would run (the emulation runs every block).

    python -m benchmarks.quality.correction_ceiling            # 64 seeds; writes its RESULTS.md section
    python -m benchmarks.quality.correction_ceiling --quick    # 2 seeds, 8 steps, untrained weights: prints only
    python -m benchmarks.quality.correction_ceiling --render   # the section again from its run
"""

from __future__ import annotations

import time

import torch

from benchmarks.lab import emulated as E
from benchmarks.lab.dit import CFG, SEEDS, STEPS, Mode, sample
from benchmarks.lab.results import command, run_command
from benchmarks.lab.subjects import SUBJECTS, Subject, add_model_option, of_run, section_of
from benchmarks.lab.trained.metrics import psnr_ssim
from tome_core.settings import DEFAULTS

COMMAND = "correction-ceiling"
INTERVALS = (2, 3, 4, 5, 7)
SHIPPED = DEFAULTS.cache_correction
VARIANTS = (
    E.Variant("uncorrected"),
    E.Variant(f"correction {SHIPPED:g} (the default)", correction="linear", gain=SHIPPED),
    E.Variant("correction 1", correction="linear"),
    E.Variant("slope × 0.8", slope=0.8),
    E.Variant("parabola", forecast="parabola"),
    E.Variant("step index as time", time="step"),
    E.Variant("replay", correction="replay"),
    E.Variant("replay, full step again", correction="replay-full"),
    E.Variant("the future known", known=True),
)
CHECKED = {"uncorrected": 0.0, VARIANTS[1].name: SHIPPED}
"""The variants held to the cache's own pass (the setting ``cache_correction`` at this gain)."""


def priced(subject: Subject, counts: dict[str, int]) -> float | None:
    """The speed-up of a pass that runs ``counts``' full and cached steps and, once more, ``again`` full and
    ``probes`` cached ones, at the real model's width (:meth:`BlockCosts.priced` of all it runs, over its steps)."""
    steps = counts["full"] + counts["cached"]
    runs = {"full": counts["full"] + counts["again"], "cached": counts["cached"] + counts["probes"]}
    speed = subject.priced(runs)
    return None if speed is None else speed * steps / (runs["full"] + runs["cached"])


def run(seeds: int, steps: int, model, log, subject: Subject = SUBJECTS["flux"], intervals=INTERVALS) -> dict:
    """Each of :data:`VARIANTS` at each of ``intervals``: PSNR per seed, counts and priced speed; and, for the
    variants of :data:`CHECKED`, the PSNR of the emulated pass against the cache's own."""
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    schedule = model.schedule(steps, noise)
    guided = E.Guided(model, labels)
    out = {}
    with guided.hooks.on(model.transformer):
        reference, residuals = E.plain(guided, noise, schedule)
    for n in intervals:
        row: dict = {"interval": n, "variants": {}, "check": {}}
        for variant in VARIANTS:
            with guided.hooks.on(model.transformer):
                samples, counts = E.sample(guided, noise, schedule, n, variant, residuals)
            row["variants"][variant.name] = {
                "psnr_per_seed": psnr_ssim(samples, reference)[0].tolist(),
                "counts": counts,
                "speed": priced(subject, counts),
            }
            if variant.name in CHECKED:
                mode = Mode(f"linear-{n}", "linear", "uniform", n, correction=CHECKED[variant.name])
                own, _ = sample(model, noise, labels, steps, mode, short_passes=True)
                row["check"][variant.name] = psnr_ssim(samples, own)[0].min().item()
        out[f"N{n}"] = row
        log(
            f"N={n}: "
            + ", ".join(f"{k} {torch.tensor(v['psnr_per_seed']).mean():.2f}" for k, v in row["variants"].items())
        )
    return out


def _cell(values: list[float]) -> str:
    return f"{sum(values) / len(values):.1f} ({min(values):.1f})"


def section(data_: dict, meta: dict) -> str:
    subject = of_run(meta)
    _, begin, end = subject.markers(COMMAND)
    rows = data_["rows"]
    checks = [c for row in rows.values() for c in row["check"].values()]
    lines = [
        begin,
        f"## How far a forecast or a correction can go (`python -m benchmarks.quality.correction_ceiling{subject.option}`)",
        "",
        f"{subject.heading} (`{subject.card}`), {meta['seeds']} seeds, {meta['steps']} flow-matching Euler steps on "
        f"{subject.schedule}, CFG {CFG:g}; {meta['seconds'] / 60:.0f} min (1 torch thread). The cache emulated by "
        "hooks (`benchmarks.lab.emulated`: every block runs; a cached step's output layer is fed what left the probe "
        "plus the residual each idea chooses); the emulated cache, uncorrected and with its correction at the "
        f"default, gives the cache's own samples to within float rounding ({min(checks):.0f} dB PSNR between them or "
        "more, every seed and N). PSNR against "
        "plain's sample, per-seed mean (worst seed); speed priced at "
        f"{subject.width} from what each idea would run: *replay* runs each cached step's probe and output layer "
        "once more, *replay, full step again* also each full step after cached ones; *the future known* is no "
        "method (it reads plain's full steps on both sides).",
        "",
        "| N | speed | " + " | ".join(v.name for v in VARIANTS) + " |",
        "|---:|---:|" + "---|" * len(VARIANTS),
    ]
    for row in rows.values():
        found = row["variants"]
        speed = found["uncorrected"]["speed"]
        cells = [str(row["interval"]), "—" if speed is None else f"{speed:.2f}×"]
        for variant in VARIANTS:
            run = found[variant.name]
            cell = _cell(run["psnr_per_seed"])
            if run["speed"] is not None and run["speed"] != speed:
                cell += f" at {run['speed']:.2f}×"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, end])


def main(argv: list[str] | None = None) -> None:
    def measure(args) -> tuple[dict, dict]:
        subject = SUBJECTS[args.model]
        seeds, steps = (2, 8) if args.quick else (SEEDS, STEPS)
        model = subject.random() if args.quick else subject.load()
        start = time.perf_counter()
        rows = run(seeds, steps, model, print, subject)
        meta = {"seeds": seeds, "steps": steps, "seconds": round(time.perf_counter() - start, 1)}
        return {"rows": rows}, subject.stamped(meta)

    parser = command(__doc__, quick="2 seeds, 8 steps, untrained weights: print only", threads=1)
    add_model_option(parser)
    run_command(parser, section_of(COMMAND, section), argv, measure)


if __name__ == "__main__":
    main()
