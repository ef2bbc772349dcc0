"""The step cache at few steps (``python -m benchmarks.quality.dit_steps``; issue 26: what the cache does at the 4–8 steps
of distilled models): on the trained FLUX-layout model, at each step count, our cache (the transformers' ``auto``)
against plain at that count, and against what a user could do instead: run plain with as many steps as the cached
pass runs in full (about its cost: a cached step costs 2 % of a full one at FLUX.1's real width).

Per step count S: plain with S steps is the reference; PSNR/SSIM of our cache at N = 2 and 3 against it, and of plain
with the cached pass's count of full steps against it. Where the cache is below those fewer plain steps, it only
loses: a user gets a closer image at no more cost by lowering the step count.

    python -m benchmarks.quality.dit_steps            # 64 seeds (a few minutes); writes its RESULTS.md section
    python -m benchmarks.quality.dit_steps --quick    # 2 seeds, untrained weights: prints only
    python -m benchmarks.quality.dit_steps --render   # the section again from benchmarks/runs/dit-steps.json
"""

from __future__ import annotations

import time

import torch

from benchmarks.lab import dit
from benchmarks.lab.fidelity import labels_for, noise_for
from benchmarks.lab.results import Section, command, run_command
from benchmarks.lab.trained import data, flux
from benchmarks.lab.trained.loading import load_flux
from benchmarks.lab.trained.metrics import Estimate, bootstrap, psnr_ssim
from tome_core.caching.schedule import too_short

BEGIN, END = "<!-- dit-steps:begin -->", "<!-- dit-steps:end -->"
STEP_COUNTS = (4, 5, 6, 8, 12, 20)
INTERVALS = (2, 3)


def run(seeds: int, counts: tuple[int, ...], model: flux.FluxLayout, log) -> dict:
    seed_range = range(seeds)
    noise, labels = noise_for(seed_range, flux.SIZE, flux.CHANNELS), labels_for(seed_range, len(data.CLASSES))
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
            for name, image in (("cache", samples), ("fewer", fewer(kinds["full"]))):
                psnr[name], ssim = psnr_ssim(image, reference)
                row[name] = {"psnr": bootstrap(psnr[name]).to_json(), "ssim": bootstrap(ssim).to_json()}
            row["gain"] = bootstrap(psnr["cache"] - psnr["fewer"]).to_json()  # paired by seed
            out[f"{steps}-{n}"] = row
            log(
                f"{steps} steps, N={n}: {kinds}, cache {row['cache']['psnr'][0]:.1f} dB, fewer {row['fewer']['psnr'][0]:.1f} dB"
            )
    return out


def loses(row: dict) -> bool:
    """Whether the cache is below plain with its count of full steps: the paired gain's whole interval below 0."""
    return Estimate.from_json(row["gain"]).high < 0


def section(data_: dict, meta: dict) -> str:
    lines = [
        BEGIN,
        "## The step cache at few steps (`python -m benchmarks.quality.dit_steps`)",
        "",
        f"The trained FLUX-layout model, {meta['seeds']} seeds, flow-matching Euler on FLUX.1's schedule, CFG "
        f"{dit.CFG:g}; {meta['seconds'] / 60:.0f} min (1 torch thread). At each step count, PSNR (dB, mean "
        "[bootstrap 95 %]) against plain with that many steps: our cache (`auto`: linear forecast, uniform schedule) "
        "at N, and plain run with only the cached pass's full steps (about the same cost); the cache's gain over "
        "those fewer steps, paired by seed; and what the cache does there now (`tome_core.caching.schedule.too_short`: it "
        "stands aside on a pass of at most N + 2 steps, whose cached steps could only reuse its first full step).",
        "",
        "| steps | N | full steps | cache | plain with the full steps' count | gain | the cache | now |",
        "|---:|---:|---:|---|---|---|---|---|",
    ]
    for row in data_.values():
        verdict = "loses to fewer steps" if loses(row) else "holds"
        cells = [
            str(row["steps"]),
            str(row["interval"]),
            str(row["full"]),
            Estimate.from_json(row["cache"]["psnr"]).cell(".1f"),
            Estimate.from_json(row["fewer"]["psnr"]).cell(".1f"),
            Estimate.from_json(row["gain"]).cell("+.1f"),
            verdict,
            "stands aside"
            if too_short(dit.Mode("", "linear", "uniform", row["interval"]).settings(), row["steps"])
            else "caches",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join([*lines, END])


def main(argv: list[str] | None = None) -> None:
    def measure(args) -> tuple[dict, dict]:
        start = time.perf_counter()
        seeds, counts = (2, (4, 6)) if args.quick else (dit.SEEDS, STEP_COUNTS)
        model = flux.build(len(data.CLASSES)).eval() if args.quick else load_flux()
        results = run(seeds, counts, model, print)
        return results, {"seeds": seeds, "seconds": round(time.perf_counter() - start, 1)}

    run_command(command(__doc__, quick="", threads=1), Section("dit-steps", BEGIN, END, section), argv, measure)


if __name__ == "__main__":
    main()
