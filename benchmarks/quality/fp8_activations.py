"""What the step cache keeps on activation-quantized fp8 (issue 37): the trained FLUX-layout model with float weights
and as ComfyUI runs ``fp8_e4m3fn_fast`` (weights and activations in float8_e4m3fn: :mod:`benchmarks.lab.quantized`),
the transformers' linear forecast against DeepCache's reuse of the last full step (``cache_forecast: off``) at
``cache_interval`` 2, 3 and 4 (uniform schedule), each against the same weights' plain samples; ``--model wan``: the
same on the Wan-layout video model (run fp8-activations-wan).

    python -m benchmarks.quality.fp8_activations            # 64 seeds, 20 steps (a few minutes, one thread)
    python -m benchmarks.quality.fp8_activations --quick    # 2 seeds, 8 steps: prints only (CI)
    python -m benchmarks.quality.fp8_activations --render   # the section again from benchmarks/runs/fp8-activations.json

NVIDIA switched an extrapolating cache off on W8A8 (cosmos-framework PR #247: quantization noise as large as the
step-to-step change). Here both forecasts are measured on the same samples: PSNR (mean [bootstrap 95 %]) against the
plain sample of the same weights, and the paired difference linear − off per seed.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.lab import dit
from benchmarks.lab.quantized import fp8_fast
from benchmarks.lab.results import command, run_command, run_meta
from benchmarks.lab.subjects import SUBJECTS, Subject, add_model_option, of_run, section_of
from benchmarks.lab.trained.metrics import Estimate, bootstrap, psnr_ssim

COMMAND = "fp8-activations"
_, BEGIN, END = SUBJECTS["flux"].markers(COMMAND)
WEIGHTS = ("float32", "fp8_e4m3fn_fast (W8A8)")
FORECASTS = ("linear", "off")
INTERVALS = (2, 3, 4)


def measure(seeds: int, steps: int, log=print, subject: Subject = SUBJECTS["flux"]) -> list[dict]:
    """Both forecasts at each interval on ``subject``'s trained model, with float and with W8A8 weights."""
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    rows = []
    for weights in WEIGHTS:
        model = subject.load().eval().requires_grad_(False)
        if weights != WEIGHTS[0]:
            fp8_fast(model.transformer)
        plain, _ = dit.sample(model, noise, labels, steps)
        for interval in INTERVALS:
            psnr, counts = {}, {}
            for forecast in FORECASTS:
                samples, counts = dit.sample(
                    model, noise, labels, steps, dit.Mode(forecast, forecast, "uniform", interval)
                )
                psnr[forecast] = psnr_ssim(samples, plain)[0]
            row = {
                "weights": weights,
                "interval": interval,
                "counts": counts,
                **{f: bootstrap(psnr[f]).to_json() for f in FORECASTS},
                "difference": bootstrap(np.asarray(psnr["linear"]) - np.asarray(psnr["off"])).to_json(),
            }
            log(f"{weights} N={interval}: linear {row['linear'][0]:.2f} dB, off {row['off'][0]:.2f} dB")
            rows.append(row)
    return rows


def section(rows: list[dict], meta: dict) -> str:
    subject = of_run(meta)
    _, begin, end = subject.markers(COMMAND)
    lines = [
        begin,
        f"## The cache on activation-quantized fp8 (`python -m benchmarks.quality.fp8_activations{subject.option}`)",
        "",
        f"{subject.heading} (`{subject.card}`), {meta['seeds']} seeds, "
        f"{meta['steps']} flow-matching Euler steps, CFG {dit.CFG:g}; torch {meta['torch']}, run finished "
        f"{meta['finished']}. fp8_e4m3fn_fast as ComfyUI runs it: weights and each linear layer's input in "
        "float8_e4m3fn (`benchmarks/lab/quantized.py`). PSNR against the same weights' plain sample (mean [bootstrap "
        "95 %]); the difference is paired per seed.",
        "",
        "| weights | N | steps full / cached | linear forecast | DeepCache's reuse (`off`) | linear − off |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        cells = [Estimate.from_json(r[k]).cell(".1f") for k in (*FORECASTS, "difference")]
        counts = f"{r['counts']['full']} / {r['counts']['cached']}"
        lines.append(f"| {r['weights']} | {r['interval']} | {counts} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, end])


def main(argv: list[str] | None = None) -> None:
    parser = command(__doc__, quick="2 seeds, 8 steps, print only", threads=1)
    parser.add_argument("--seeds", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    add_model_option(parser)

    def run(args) -> tuple[list[dict], dict]:
        subject = SUBJECTS[args.model]
        seeds, steps = (2, 8) if args.quick else (args.seeds, args.steps)
        start = time.perf_counter()
        rows = measure(seeds, steps, print, subject)
        meta = {**run_meta(args, 1, time.perf_counter() - start), "seeds": seeds, "steps": steps}
        return rows, subject.stamped(meta)

    run_command(parser, section_of(COMMAND, section), argv, run)


if __name__ == "__main__":
    main()
