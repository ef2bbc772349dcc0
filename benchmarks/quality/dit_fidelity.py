"""The step cache on a diffusion transformer, on the trained FLUX-layout model (``python -m benchmarks.quality.dit_fidelity``;
issue 26) and the Wan-layout video model (``--model wan``, issue 36): what each setting keeps of plain's image and what
it would save at the real model's width.

The model (:mod:`benchmarks.lab.trained.flux`, ``weights/flux.safetensors``) samples 64 seeds at its trained side with
the flow-matching Euler sampler on FLUX.1's schedule, classifier-free guidance 4 (cond and uncond batched: one
stream), 20 steps. Plain runs once; each mode of :data:`MODES` (our cache through the same engine as on the UNets:
the forecast off = DeepCache's reuse, linear, calibrated; the uniform and the time schedule) and each anchor of
:data:`ANCHORS` (First Block Cache, TeaCache, TaylorSeer, MagCache, EasyCache, LazyCache: :mod:`benchmarks.lab.dit_anchors`, image
by image; they hook FLUX's blocks, so on Wan the real libraries of :mod:`benchmarks.quality.dit_libraries` stand in)
samples the same noise.
Reported per mode: mean PSNR and SSIM against plain's sample with their bootstrap 95 % intervals, the judge's class
accuracy, the full steps of the pass and the speed-up of those steps priced at FLUX.1's real width
(:mod:`benchmarks.speed.dit_costs`' run; a cached step runs the model's outside and the first double block).

    python -m benchmarks.quality.dit_fidelity            # the run; writes its RESULTS.md section
    python -m benchmarks.quality.dit_fidelity --quick    # 4 seeds, 4 steps, untrained weights: prints only (CI runs it)
    python -m benchmarks.quality.dit_fidelity --render   # the section again from benchmarks/runs/dit-fidelity.json
    python -m benchmarks.quality.dit_fidelity --model wan   # the Wan-layout model: our modes (run dit-fidelity-wan)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from benchmarks.lab import dit_anchors as A
from benchmarks.lab.dit import CFG, SEEDS, STEPS, Mode, accuracy, guided_euler, sample
from benchmarks.lab.results import command, run_command
from benchmarks.lab.subjects import SUBJECTS, Subject, add_model_option, of_run, section_of
from benchmarks.lab.trained import flux
from benchmarks.lab.trained.metrics import Estimate, bootstrap, psnr_ssim

COMMAND = "dit-fidelity"
_, BEGIN, END = SUBJECTS["flux"].markers(COMMAND)
FIRST = 0.15
"""``cache_start`` that keeps the first three of 20 steps full."""


MODES = tuple(
    Mode(f"{forecast}-{schedule}-{n}", forecast, schedule, n)
    for forecast, schedule in (
        ("off", "uniform"),
        ("linear", "uniform"),
        ("calibrated", "uniform"),
        ("calibrated", "time"),
    )
    for n in (2, 3, 4, 5)
) + tuple(
    Mode(f"{name}-uniform-{n}-start", "linear", "uniform", n, FIRST, study)
    for name, study in (("linear", None), ("trapezoid", "Trapezoid"))
    for n in (2, 3, 4)
)
"""Our cache: DeepCache's reuse (off, uniform), the linear and calibrated forecasts, the UNets' default (calibrated,
time); and, with the first three steps full as TaylorSeer and FoCa run them (``cache_start`` :data:`FIRST`), the
linear forecast and FoCa's predictor-corrector (:class:`benchmarks.lab.forecasters.Trapezoid`) in its place."""


@dataclass(frozen=True)
class Calibration:
    """What anchors fit to the model on plain runs of seeds of their own: TeaCache's polynomial, MagCache's ratios."""

    polynomial: tuple[float, ...]
    ratios: list[float]


@dataclass(frozen=True)
class Anchor:
    """Another cache (:mod:`benchmarks.lab.dit_anchors`): ``make(calibration)`` builds its rule."""

    name: str
    label: str
    make: Callable[[Calibration], A.DiTRule]


ANCHORS = (
    *(Anchor(f"fbcache-{t:g}", f"First Block Cache {t:g}", lambda _, t=t: A.FirstBlockCache(t)) for t in (0.07, 0.12)),
    *(
        Anchor(f"teacache-{t:g}", f"TeaCache {t:g} (FLUX.1's polynomial)", lambda _, t=t: A.TeaCache(t))
        for t in (0.25, 0.4, 0.6, 0.8)
    ),
    *(
        Anchor(f"teacache-fitted-{t:g}", f"TeaCache {t:g} (fitted here)", lambda c, t=t: A.TeaCache(t, c.polynomial))
        for t in (0.1, 0.2, 0.4)
    ),
    *(
        Anchor(
            f"taylorseer-o{o}-n{n}",
            f"TaylorSeer order {o}, interval {n}, 3 first steps",
            lambda _, o=o, n=n: A.TaylorSeer(n, o),
        )
        for o in (1, 2)
        for n in (4, 6)
    ),
    *(Anchor(f"foca-n{n}", f"FoCa, interval {n}, 3 first steps", lambda _, n=n: A.FoCa(n)) for n in (2, 3, 4, 6)),
    *(
        Anchor(f"magcache-{t:g}", f"MagCache {t:g} (K 5, 20 % retained)", lambda c, t=t: A.MagCache(t, c.ratios))
        for t in (0.12, 0.24)
    ),
    *(Anchor(f"easycache-{t:g}", f"EasyCache {t:g} (0.15–0.95)", lambda _, t=t: A.EasyCache(t)) for t in (0.1, 0.2)),
    *(
        Anchor(f"lazycache-{t:g}", f"LazyCache {t:g} (0.15–0.95)", lambda _, t=t: A.LazyCache(t, CFG, flux.SIZE))
        for t in (0.1, 0.2)
    ),
)
"""First Block Cache at the thresholds FLUX users quote; TeaCache at its published FLUX thresholds (1.5–2.25× on
FLUX.1-dev) with its published polynomial, and with one fitted to this model on seeds of their own; TaylorSeer at its
FLUX defaults (order 1, interval 6) and order 2; FoCa on TaylorSeer's schedule; MagCache with ratios calibrated here;
EasyCache and LazyCache at ComfyUI's default threshold (0.2) and half of it."""
CALIBRATION_SEEDS = range(1000, 1008)


def _per_image(model, noise, labels, steps: int, make: Callable[[], A.DiTRule]) -> tuple[torch.Tensor, list]:
    """Sampling image by image, each under a fresh rule from ``make`` (each decides for its image): the samples and
    the rules."""
    outs, rules = [], []
    for i in range(len(noise)):
        rule = make().apply(model.transformer)
        try:
            outs.append(guided_euler(model, noise[i : i + 1], labels[i : i + 1], steps, rule.at_step))
        finally:
            rule.remove()
        rules.append(rule)
    return torch.cat(outs), rules


def sample_anchor(model, noise, labels, steps: int, anchor: Anchor, calibration) -> tuple[torch.Tensor, list[dict]]:
    """The anchor's run, image by image: the samples and each image's steps."""
    samples, rules = _per_image(model, noise, labels, steps, lambda: anchor.make(calibration))
    return samples, [rule.counts() for rule in rules]


def calibrate(model: flux.FluxLayout, steps: int) -> Calibration:
    """TeaCache's polynomial and MagCache's ratios fitted to ``model`` on plain runs of :data:`CALIBRATION_SEEDS`."""
    subject = SUBJECTS["flux"]
    noise, labels = subject.noise(CALIBRATION_SEEDS), subject.labels(CALIBRATION_SEEDS)
    recorders = _per_image(model, noise, labels, steps, A.Recorder)[1]
    return Calibration(A.fit_teacache(recorders), A.magnitude_ratios(recorders))


def run(seeds: int, steps: int, model, log, subject: Subject = SUBJECTS["flux"]) -> dict:
    """Plain, each mode of :data:`MODES` and (on FLUX) each anchor of :data:`ANCHORS` on ``subject``'s ``model``."""
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    start = time.perf_counter()
    plain, _ = sample(model, noise, labels, steps)
    out = {"plain": {"accuracy": accuracy(plain, labels).to_json()}}
    log(f"plain: {time.perf_counter() - start:.0f} s, accuracy {out['plain']['accuracy'][0]:.0%}")
    for mode in MODES:
        samples, counts = sample(model, noise, labels, steps, mode)
        psnr, ssim = psnr_ssim(samples, plain)
        out[mode.name] = {
            "mode": asdict(mode),
            "psnr": bootstrap(psnr).to_json(),
            "ssim": bootstrap(ssim).to_json(),
            "accuracy": accuracy(samples, labels).to_json(),
            "counts": counts,
        }
        log(f"{mode.name}: {out[mode.name]['psnr'][0]:.1f} dB, {counts}")
    if subject.name != "flux":
        return out
    calibration = calibrate(model, steps)
    out["teacache-polynomial"] = list(calibration.polynomial)
    out["magcache-ratios"] = calibration.ratios
    for anchor in ANCHORS:
        samples, per_image = sample_anchor(model, noise, labels, steps, anchor, calibration)
        psnr, ssim = psnr_ssim(samples, plain)
        speeds = [subject.priced(c) for c in per_image]
        out[anchor.name] = {
            "label": anchor.label,
            "psnr": bootstrap(psnr).to_json(),
            "ssim": bootstrap(ssim).to_json(),
            "accuracy": accuracy(samples, labels).to_json(),
            "counts": {k: sum(c[k] for c in per_image) / len(per_image) for k in A.KINDS},
            "speeds": None if None in speeds else speeds,
        }
        log(f"{anchor.name}: {out[anchor.name]['psnr'][0]:.1f} dB, {out[anchor.name]['counts']}")
    return out


def section(data_: dict, meta: dict) -> str:
    subject = of_run(meta)
    _, begin, end = subject.markers(COMMAND)
    plain = Estimate.from_json(data_["plain"]["accuracy"])
    frames = "" if subject.frames is None else " (every frame of each clip)"
    lines = [
        begin,
        f"## The step cache on a diffusion transformer (`python -m benchmarks.quality.dit_fidelity{subject.option}`)",
        "",
        f"{subject.heading} (`{subject.card}`), {meta['seeds']} seeds, {meta['steps']} "
        f"flow-matching Euler steps on {subject.schedule}, CFG {CFG:g}; {meta['seconds'] / 60:.0f} min (1 torch thread). "
        f"PSNR and SSIM against plain's sample (mean [bootstrap 95 %]); class accuracy{frames} (plain: "
        f"{plain.cell('.0%', 1)}); speed-up: the pass's full and cached steps priced at {subject.width} "
        f"(`{subject.costs_command}`).",
        "",
        "| mode | PSNR (dB) | SSIM | accuracy | full steps | speed-up |",
        "|---|---|---|---|---:|---:|",
    ]
    for row in data_.values():
        if not isinstance(row, dict) or "psnr" not in row:
            continue
        if "mode" in row:
            mode = row["mode"]
            forecast = "FoCa's predictor-corrector" if mode.get("study") == "Trapezoid" else mode["forecast"]
            label = f"ours: {forecast}, {mode['schedule']}, N={mode['interval']}"
            if mode.get("start"):
                label += ", 3 first steps full"
            speed, full = subject.priced(row["counts"]), str(row["counts"]["full"])
        else:
            label, full = row["label"], f"{row['counts']['full']:.1f}"
            speed = sum(row["speeds"]) / len(row["speeds"]) if row.get("speeds") else None
        cells = [
            label,
            Estimate.from_json(row["psnr"]).cell(".1f"),
            Estimate.from_json(row["ssim"]).cell(".3f"),
            f"{row['accuracy'][0]:.0%}",
            full,
            "—" if speed is None else f"{speed:.2f}×",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if "teacache-polynomial" in data_:
        fitted = ", ".join(f"{c:.4g}" for c in data_["teacache-polynomial"])
        lines += ["", f"TeaCache's polynomial fitted to this model (highest power first): {fitted}."]
    if "magcache-ratios" in data_:
        ratios = ", ".join(f"{r:.3f}" for r in data_["magcache-ratios"])
        lines += ["", f"MagCache's magnitude ratios calibrated on this model, per step: {ratios}."]
    if subject.name != "flux":
        lines += ["", "The other caches hook FLUX's blocks; on this model the real libraries' run stands in for them."]
    return "\n".join([*lines, end])


def main(argv: list[str] | None = None) -> None:
    def measure(args) -> tuple[dict, dict]:
        start = time.perf_counter()
        subject = SUBJECTS[args.model]
        seeds, steps = (4, 4) if args.quick else (SEEDS, STEPS)
        model = subject.random() if args.quick else subject.load()
        results = run(seeds, steps, model, print, subject)
        meta = {"seeds": seeds, "steps": steps, "seconds": round(time.perf_counter() - start, 1)}
        return results, subject.stamped(meta)

    parser = command(__doc__, quick="", threads=1)
    add_model_option(parser)
    run_command(parser, section_of(COMMAND, section), argv, measure)


if __name__ == "__main__":
    main()
