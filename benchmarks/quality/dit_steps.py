"""The step cache at few steps (``python -m benchmarks.quality.dit_steps``; issue 26: what the cache does at the 4–8 steps
of distilled models): on the trained FLUX-layout model (or the Wan-layout video model, ``--model wan``), at each step count, our cache (the transformers' ``auto``)
against plain at that count, and against what a user could do instead: run plain with as many steps as the cached
pass runs in full (about its cost: a cached step costs 2 % of a full one at FLUX.1's real width, 3 % at Wan 2.1's).

Per step count S: plain with S steps is the reference; PSNR/SSIM of our cache at N = 2 and 3 against it, and of plain
with the cached pass's count of full steps against it. Where the cache is below those fewer plain steps, it only
loses: a user gets a closer image at no more cost by lowering the step count.

    python -m benchmarks.quality.dit_steps            # 64 seeds (a few minutes); writes its RESULTS.md section
    python -m benchmarks.quality.dit_steps --quick    # 2 seeds, untrained weights: prints only
    python -m benchmarks.quality.dit_steps --render   # the section again from benchmarks/runs/dit-steps.json
    python -m benchmarks.quality.dit_steps --model wan   # the Wan-layout model (run dit-steps-wan)
"""

from __future__ import annotations

import time

import torch

from benchmarks.lab import dit
from benchmarks.lab.correction import DeferredCorrection
from benchmarks.lab.results import command, run_command
from benchmarks.lab.subjects import SUBJECTS, Subject, add_model_option, of_run, section_of
from benchmarks.lab.trained.metrics import Estimate, bootstrap, psnr_ssim
from tome_core.caching.schedule import too_short
from tome_core.settings import DEFAULTS

GAIN = DEFAULTS.cache_correction
"""The correction's gain, ``cache_correction``'s default, run as its study (:mod:`benchmarks.lab.correction`, order 2:
the setting on FLUX's layout, to float rounding; on diffusers' Wan, where the setting stands aside, its re-creation)."""

COMMAND = "dit-steps"
_, BEGIN, END = SUBJECTS["flux"].markers(COMMAND)
STEP_COUNTS = (4, 5, 6, 8, 12, 20)
INTERVALS = (2, 3)


def run(seeds: int, counts: tuple[int, ...], model, log, subject: Subject = SUBJECTS["flux"]) -> dict:
    """At each step count of ``counts``: our cache at each N of :data:`INTERVALS` and plain with fewer steps, on
    ``subject``'s ``model``."""
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    plain = {}

    def fewer(steps: int) -> torch.Tensor:
        if steps not in plain:
            plain[steps] = dit.sample(model, noise, labels, steps)[0]
        return plain[steps]

    out: dict[str, dict] = {}
    for steps in counts:
        reference = fewer(steps)
        for n in INTERVALS:
            if n >= steps:
                continue
            mode = dit.Mode(f"auto-{n}", "auto", "auto", n)
            samples, kinds = dit.sample(model, noise, labels, steps, mode, short_passes=True)
            row = {"steps": steps, "interval": n, "full": kinds["full"]}
            psnr = {}
            for name, image in (
                ("cache", samples),
                ("corrected", dit.sample(model, noise, labels, steps, mode, True, DeferredCorrection(2, GAIN))[0]),
                ("fewer", fewer(kinds["full"])),
            ):
                psnr[name], ssim = psnr_ssim(image, reference)
                row[name] = {"psnr": bootstrap(psnr[name]).to_json(), "ssim": bootstrap(ssim).to_json()}
            row["gain"] = bootstrap(psnr["cache"] - psnr["fewer"]).to_json()  # paired by seed
            row["corrected gain"] = bootstrap(psnr["corrected"] - psnr["fewer"]).to_json()
            out[f"{steps}-{n}"] = row
            log(
                f"{steps} steps, N={n}: {kinds}, cache {row['cache']['psnr'][0]:.1f} dB, fewer {row['fewer']['psnr'][0]:.1f} dB"
            )
    return out


def loses(row: dict, gain: str = "gain") -> bool:
    """Whether the cache (``gain``: or, "corrected gain", the cache at its defaults under Euler, corrected) is below
    plain with its count of full steps: the paired gain's whole interval below 0."""
    return Estimate.from_json(row[gain]).high < 0


def section(data_: dict, meta: dict) -> str:
    subject = of_run(meta)
    _, begin, end = subject.markers(COMMAND)
    lines = [
        begin,
        f"## The step cache at few steps (`python -m benchmarks.quality.dit_steps{subject.option}`)",
        "",
        f"{subject.heading}, {meta['seeds']} seeds, flow-matching Euler on {subject.schedule}, CFG "
        f"{dit.CFG:g}; {meta['seconds'] / 60:.0f} min (1 torch thread). At each step count, PSNR (dB, mean "
        "[bootstrap 95 %]) against plain with that many steps: our cache (`auto`: linear forecast, uniform schedule) "
        "at N without and with `cache_correction` at its default (0.75, which acts under this Euler sampler; its study, "
        "`benchmarks.lab.correction`, on the Wan layout), and plain "
        "run with only the cached pass's full steps (about the same cost); each one's gain over those fewer steps, "
        "paired by seed; and what the cache does there now (`tome_core.caching.schedule.too_short`: it "
        "stands aside on a pass of at most N + 2 steps, whose cached steps could only reuse its first full step).",
        "",
        "| steps | N | full steps | cache | corrected (0.75) | plain with the full steps' count | gain | gain "
        "corrected | the cache | corrected | now |",
        "|---:|---:|---:|---|---|---|---|---|---|---|---|",
    ]
    for row in data_.values():
        cells = [
            str(row["steps"]),
            str(row["interval"]),
            str(row["full"]),
            *(Estimate.from_json(row[name]["psnr"]).cell(".1f") for name in ("cache", "corrected", "fewer")),
            *(Estimate.from_json(row[gain]).cell("+.1f") for gain in ("gain", "corrected gain")),
            *("loses to fewer steps" if loses(row, gain) else "holds" for gain in ("gain", "corrected gain")),
            "stands aside"
            if too_short(dit.Mode("", "linear", "uniform", row["interval"]).settings(), row["steps"])
            else "caches",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, end])


def main(argv: list[str] | None = None) -> None:
    def measure(args) -> tuple[dict, dict]:
        start = time.perf_counter()
        subject = SUBJECTS[args.model]
        seeds, counts = (2, (4, 6)) if args.quick else (dit.SEEDS, STEP_COUNTS)
        model = subject.random() if args.quick else subject.load()
        results = run(seeds, counts, model, print, subject)
        meta = {"seeds": seeds, "seconds": round(time.perf_counter() - start, 1)}
        return results, subject.stamped(meta)

    parser = command(__doc__, quick="", threads=1)
    add_model_option(parser)
    run_command(parser, section_of(COMMAND, section), argv, measure)


if __name__ == "__main__":
    main()
