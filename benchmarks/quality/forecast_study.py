"""Why the linear forecast gains little under DPM++ 2M Karras (``python -m benchmarks.quality.forecast_study``): issue 27's
candidates measured one at a time on the trained SD1.5-layout model, 20 steps, CFG 7, PSNR against plain's sample.

* **Where the error comes from**: the linear forecast with only one pair of steps cached (1–2, 4–5, …, 16–17: the
  cached steps of N=3), every other step full, under Euler and DPM++ 2M Karras, with each pair's sampler-time distance
  from its last full step.
* **The time variable**: the linear forecast at N=3 with its time taken as the UNet's timestep (the default), log-sigma,
  sigma or sqrt(sigma) of that timestep.
* **The schedule**: N=3 with the full steps at 0, 3, 6, … (uniform) against the time schedule.
* **Higher-order and global fits** (:mod:`benchmarks.lab.forecasters`): TaylorSeer order 2, HiCache's Hermite basis,
  Spectrum's Chebyshev ridge fit and FoCa's predictor-corrector against ours, at N=3, 4 and 5 on the time schedule.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace

import torch

import tome_core.steps as clock
from benchmarks.lab import fidelity as B
from benchmarks.lab import forecasters as F
from benchmarks.lab import modes as M
from benchmarks.lab import sampling as S
from benchmarks.lab.results import Section, command, save_run_data
from benchmarks.lab.trained.loading import load_model
from benchmarks.lab.trained.metrics import psnr_ssim

BEGIN, END = "<!-- forecast-study:begin -->", "<!-- forecast-study:end -->"
STEPS = 20
SAMPLERS = ("euler", "dpmpp_2m")
TIME_VARIABLES = {
    "timestep": None,
    "log sigma": math.log,
    "sigma": lambda s: s,
    "sqrt sigma": math.sqrt,
}

FITS = {
    "off (DeepCache's reuse)": ("off", None),
    "linear": ("linear", None),
    "calibrated (default)": ("calibrated", None),
    "TaylorSeer, order 2": ("linear", F.Taylor),
    "HiCache (Hermite, order 2)": ("linear", F.Hermite),
    "Spectrum (Chebyshev ridge, w 0.25)": ("linear", F.Chebyshev),
    "Spectrum's fit alone (w 1)": ("linear", lambda forecast, store=None: F.Chebyshev(forecast, store, w=1.0)),
    "calibrated, order 2": ("calibrated", F.CalibratedTaylor),
    "FoCa's predictor-corrector": ("linear", F.Trapezoid),
}
"""The forecasts compared on the time schedule: the setting each runs with, and the study's forecaster in place of the
step cache's own (None: the setting's)."""
FIT_INTERVALS = (3, 4, 5)


@contextlib.contextmanager
def _time_variable(variable):
    """While inside, the step clock hands the cache ``variable(sigma of the call's timestep)`` as the call's time (None:
    the timestep itself, as always)."""
    original = clock._first_timestep

    def first(timesteps):
        t = original(timesteps)
        return None if t is None else variable(float(S.t_to_sigma(torch.tensor([float(t)]))[0]))

    clock._first_timestep = original if variable is None else first
    try:
        yield
    finally:
        clock._first_timestep = original


def _psnr(model, mode, noise, labels, sigmas, sampler, plain) -> float:
    out, _ = B.run_sampling(model, mode, noise, labels, sigmas, sampler)
    return float(psnr_ssim(out, plain)[0].mean())


def run(seeds: int, log) -> dict:
    model = load_model("sd15")
    seed_range = range(seeds)
    noise, labels = B.noise_for(seed_range, model.size, model.channels), B.labels_for(seed_range, len(model.classes))
    out: dict = {"pairs": {}, "time": {}, "schedule": {}}
    for sampler in SAMPLERS:
        sigmas = S.schedule(sampler, STEPS)
        times = [S.sigma_to_t(s) for s in sigmas[:-1]]
        plain, _ = B.run_sampling(model, M.PLAIN, noise, labels, sigmas, sampler)
        linear = M.cached(M.PLAIN, 3, forecast="linear")
        pairs = []
        for first in range(1, 18, 3):
            full = [s for s in range(STEPS) if s not in (first, first + 1)]
            mode = replace(M.cached(M.PLAIN, 10, forecast="linear"), full_steps=lambda n, full=full: full)
            reach = times[first - 1] - times[first + 1]
            psnr = _psnr(model, mode, noise, labels, sigmas, sampler, plain)
            pairs.append({"steps": [first, first + 1], "reach": reach, "psnr": psnr})
            log(f"{sampler}: pair {first}-{first + 1}: {pairs[-1]['psnr']:.1f} dB")
        out["pairs"][sampler] = pairs
        out["time"][sampler] = {}
        for name, variable in TIME_VARIABLES.items():
            with _time_variable(variable):
                out["time"][sampler][name] = _psnr(model, linear, noise, labels, sigmas, sampler, plain)
            log(f"{sampler}: time {name}: {out['time'][sampler][name]:.1f} dB")
        out["schedule"][sampler] = {}
        for forecast in ("off", "linear", "calibrated"):
            for schedule in ("uniform", "time"):
                base = M.cached(M.PLAIN, 3, forecast=forecast)
                mode = replace(base, settings={**base.settings, "cache_schedule": schedule})
                samples, counts = B.run_sampling(model, mode, noise, labels, sigmas, sampler)
                psnr = float(psnr_ssim(samples, plain)[0].mean())
                out["schedule"][sampler][f"{forecast}, {schedule}"] = {"psnr": psnr, "full": counts[0]["full"]}
                log(f"{sampler}: {forecast}, {schedule}: {psnr:.1f} dB")
        out.setdefault("fits", {})[sampler] = {}
        for name, (forecast, factory) in FITS.items():
            for interval in FIT_INTERVALS:
                mode = M.cached(M.PLAIN, interval, forecast=forecast, schedule="time")
                with F.swapped(factory):
                    samples, counts = B.run_sampling(model, mode, noise, labels, sigmas, sampler)
                psnr = float(psnr_ssim(samples, plain)[0].mean())
                out["fits"][sampler][f"{name}, N={interval}"] = {"psnr": psnr, "full": counts[0]["full"]}
                log(f"{sampler}: {name}, N={interval}: {psnr:.1f} dB")
    return out


def section(data: dict, meta: dict) -> str:
    lines = [
        BEGIN,
        "## Why the forecast gained little under DPM++ 2M (`python -m benchmarks.quality.forecast_study`)",
        "",
        f"Trained SD1.5-layout model, {STEPS} steps, CFG 7, {meta['seeds']} seeds, {meta['seconds'] / 60:.0f} min "
        "(1 torch thread); mean PSNR (dB) of the final sample against plain's.",
        "",
        "**Where the error comes from**: one pair of steps cached (linear forecast), every other step full; *reach*: "
        "the sampler time (timestep) from the pair's last full step to its second step.",
        "",
        "| cached pair | " + " | ".join(f"{S.LABELS[s]}: reach, PSNR" for s in data["pairs"]) + " |",
        "|---|" + "---:|" * len(data["pairs"]),
    ]
    samplers = list(data["pairs"])
    for i, pair in enumerate(data["pairs"][samplers[0]]):
        cells = [f"{data['pairs'][s][i]['reach']:.0f}, {data['pairs'][s][i]['psnr']:.1f}" for s in samplers]
        lines.append(f"| {pair['steps'][0]}–{pair['steps'][1]} | " + " | ".join(cells) + " |")
    lines += ["", "**The time variable** of the linear forecast, N=3, uniform schedule:", ""]
    lines += ["| time | " + " | ".join(S.LABELS[s] for s in samplers) + " |", "|---|" + "---:|" * len(samplers)]
    for name in TIME_VARIABLES:
        lines.append(f"| {name} | " + " | ".join(f"{data['time'][s][name]:.1f}" for s in samplers) + " |")
    lines += ["", "**The schedule**, N=3 (PSNR, full steps of 20):", "", *_runs_table(data["schedule"], "schedule")]
    title = "**Higher-order and global fits** of the deep features, time schedule (PSNR, full steps of 20):"
    lines += ["", title, "", *_runs_table(data["fits"], "N")]
    return "\n".join([*lines, END])


def _runs_table(runs: dict, what: str) -> list[str]:
    """Per run (rows) and sampler (columns): its PSNR and full steps."""
    samplers = list(runs)
    lines = [f"| forecast, {what} | " + " | ".join(S.LABELS[s] for s in samplers) + " |"]
    lines += ["|---|" + "---:|" * len(samplers)]
    for key in runs[samplers[0]]:
        cells = [f"{runs[s][key]['psnr']:.1f}, {runs[s][key]['full']} full" for s in samplers]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = command(__doc__.splitlines()[0], render="only re-render the section from the saved run")
    parser.add_argument("--seeds", type=int, default=16)
    args = parser.parse_args(argv)
    if not args.render:
        torch.set_num_threads(1)
        start = time.perf_counter()
        data = run(args.seeds, print)
        save_run_data("forecast-study", data, {"seeds": args.seeds, "seconds": round(time.perf_counter() - start, 1)})
    Section("forecast-study", BEGIN, END, section).rewrite()


if __name__ == "__main__":
    main()
