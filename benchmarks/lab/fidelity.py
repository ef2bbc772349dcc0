"""Every mode's fidelity against plain sampling, on the two trained models (``python -m benchmarks.quality.fidelity``).

For each model (SD1.5 and SDXL layout), at its trained side and at 2x per side, and for each sampler: every mode
samples the same seeds from the same noise (classifier-free guidance 7, the WebUI's sigmas, progress reported
before every step as the WebUI script does), each seed conditioned on class ``seed % 10``. Reported, with bootstrap
95 % intervals over seeds:

* PSNR and SSIM of the final sample against plain's, paired by seed (``skimage.metrics``, 8-bit RGB);
* the relative error of the guided ε against plain's at each step of *plain's* trajectory (the mode is fed plain's
  inputs, so errors do not compound; its plan reuse and caches run as in sampling), on the first seeds;
* class accuracy of the samples by the shipped classifier, and KID (×10³) between the samples' and the training
  data's features in that classifier's feature space.

Speed is not measured here (these models are small): the speed-up column and the plot take it from the real-width
runs in ``benchmarks/runs/`` (see :mod:`benchmarks.lab.prices`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from benchmarks.lab import anchors
from benchmarks.lab import modes as modes_
from benchmarks.lab import sampling as S
from benchmarks.lab.trained import architectures as A
from benchmarks.lab.trained import data
from benchmarks.lab.trained.loading import Model, load_classifier, load_model
from benchmarks.lab.trained.metrics import Estimate, bootstrap, kid_estimate, psnr_ssim

BEGIN, END = "<!-- fidelity:begin -->", "<!-- fidelity:end -->"
CFG = 7.0
STEPS = 20
LAYOUT_NAMES = {"sd15": "SD1.5 layout", "sdxl": "SDXL layout"}
DATA_FEATURES = 1000  # training-data draws the KID compares against


@dataclass(frozen=True)
class Case:
    layout: str
    side: int
    sampler: str

    @property
    def name(self) -> str:
        return f"{LAYOUT_NAMES[self.layout]}, {self.side} px, {S.LABELS[self.sampler]}"


@dataclass
class ModeResult:
    mode: str
    psnr: Estimate | None
    ssim: Estimate | None
    accuracy: Estimate
    kid: Estimate
    eps_error: list[float] = field(default_factory=list)  # per step, relative, over the first seeds
    steps: list[dict[str, int]] = field(default_factory=list)
    """What the steps cost, by kind (:data:`benchmarks.lab.anchors.KINDS`): one entry per seed for a mode sampled seed by
    seed, else one for the batch; empty for a mode without a cache (its speed is the real-width runs')."""

    def to_json(self) -> dict:
        est = {k: None if v is None else v.to_json() for k, v in vars(self).items() if isinstance(v, Estimate | None)}
        return {**est, "mode": self.mode, "eps_error": self.eps_error, "steps": self.steps}

    @classmethod
    def from_json(cls, d: dict) -> ModeResult:
        def est(key: str) -> Estimate | None:
            return None if d[key] is None else Estimate.from_json(d[key])

        return cls(d["mode"], est("psnr"), est("ssim"), est("accuracy"), est("kid"), d["eps_error"], d.get("steps", []))


class Trajectory:
    """What ``on_step`` saw of a sampling run: each step's input and guided ε."""

    def __init__(self, sigmas: list[float]) -> None:
        self.sigmas, self.x, self.eps = sigmas, [], []

    def __call__(self, i: int, x: torch.Tensor, denoised: torch.Tensor) -> None:
        self.x.append(x)
        self.eps.append((x - denoised) / self.sigmas[i])


def noise_for(seeds: range, side: int, channels: int, frames: int | None = None) -> torch.Tensor:
    """One unit-variance noise image per seed (``frames``: a clip of that many), each from its own generator (the
    same for every mode and size)."""
    shape = (channels, side, side) if frames is None else (channels, frames, side, side)
    return torch.stack([torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) for seed in seeds])


def labels_for(seeds: range, classes: int) -> torch.Tensor:
    return torch.tensor([seed % classes for seed in seeds])


def step_counts(applied) -> list[dict[str, int]]:
    """What a sampling run's steps cost, by kind: per seed from another cache's rule, or for the batch from our
    patch's step cache (full and cached steps); empty without a cache."""
    if isinstance(applied, anchors.StepRule):
        return applied.counts()
    if applied is None or applied.cache is None:
        return []
    passes = applied.cache.report().passes
    full, cached = sum(p.full for p in passes), sum(p.cached for p in passes)
    return [{"full": full, "partial": cached, "first": 0, "skip": 0}]


def run_sampling(
    model: Model,
    mode: modes_.Mode,
    noise: torch.Tensor,
    labels: torch.Tensor,
    sigmas: list[float],
    sampler: str,
    on_step=None,
    seeds: list[int] | None = None,
) -> tuple[torch.Tensor, list[dict[str, int]]]:
    """One sampling run of ``mode`` (applied afresh, removed after), seed by seed for a mode whose decisions depend on
    the sample (``per_seed``); the samples and what their steps cost (:func:`step_counts`: one entry per run).
    ``seeds``: the images' seeds, for the noise of stochastic samplers (default 0, 1, …)."""
    seeds = list(range(len(noise))) if seeds is None else seeds
    if mode.per_seed and len(noise) > 1 and on_step is None:
        runs = [
            run_sampling(model, mode, noise[i : i + 1], labels[i : i + 1], sigmas, sampler, seeds=seeds[i : i + 1])
            for i in range(len(noise))
        ]
        return torch.cat([out for out, _ in runs]), [c for _, counts in runs for c in counts]
    applied = mode.apply(model.unet, len(sigmas) - 1)
    conditioning = S.batched(model.condition(labels), model.condition(torch.full_like(labels, -1)))
    progress = None if applied is None else (lambda i, steps: applied.set_progress(i / steps, steps))  # as the WebUI
    try:
        denoiser = S.CFGDenoiser(model.unet, conditioning, CFG, integer=sampler in S.INTEGER)
        out = S.sample(denoiser, noise, sigmas, sampler, progress, on_step, seeds)
        return out, step_counts(applied)
    finally:
        modes_.PLAIN.apply(model.unet)


def eps_errors(model: Model, mode: modes_.Mode, labels: torch.Tensor, plain: Trajectory) -> list[float]:
    """The mode's guided ε at each input of plain's trajectory, relative to plain's (mode applied afresh; a mode sampled
    seed by seed decides here for the first seeds together)."""
    patch = mode.apply(model.unet, len(plain.x))
    conditioning = S.batched(model.condition(labels), model.condition(torch.full_like(labels, -1)))
    denoiser = S.CFGDenoiser(model.unet, conditioning, CFG)
    steps = len(plain.x)
    out = []
    try:
        for i, (x, eps) in enumerate(zip(plain.x, plain.eps)):
            if patch is not None:
                patch.set_progress(i / steps, steps)
            ours = denoiser.eps(x, plain.sigmas[i])
            out.append(((ours - eps).norm() / eps.norm()).item())
    finally:
        modes_.PLAIN.apply(model.unet)
    return out


def features(images: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return load_classifier().features(images).double().numpy()


def accuracy_values(images: torch.Tensor, labels: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return (load_classifier()(images).argmax(1) == labels).double().numpy()


def run_case(
    model: Model,
    case: Case,
    mode_list: list[modes_.Mode],
    seeds: int,
    eps_seeds: int,
    steps: int,
    log,
    data_features: int = DATA_FEATURES,
    done: dict[str, ModeResult] | None = None,
    on_result=None,
) -> tuple[dict[str, ModeResult], torch.Tensor]:
    """Every mode of ``mode_list`` on one case; also returns plain's samples (for the grid). Modes in ``done`` (an
    earlier, interrupted run's) are taken as they are, plain is always run; ``on_result(results)`` after each mode."""
    sigmas = S.schedule(case.sampler, steps)
    seed_range = range(seeds)
    noise = noise_for(seed_range, case.side, model.channels)
    labels = labels_for(seed_range, len(model.classes))
    reference = data.draw(data_features, case.side, seed=10_000 + case.side)[0]
    data_features = features(reference)
    plain_path = Trajectory(sigmas)
    k = min(eps_seeds, seeds)
    results: dict[str, ModeResult] = {}
    plain = None
    for mode in mode_list:
        start = time.perf_counter()
        if done and mode.name in done and mode.name != "plain":
            results[mode.name] = done[mode.name]
            continue
        steps: list[dict[str, int]] = []
        if mode.name == "plain":
            out, _ = run_sampling(model, mode, noise, labels, sigmas, case.sampler, plain_path)
            plain_path.x = [x[:k] for x in plain_path.x]
            plain_path.eps = [e[:k] for e in plain_path.eps]
            plain = out
            psnr = ssim = None
            errors = [0.0] * len(plain_path.x)
        else:
            assert plain is not None, "plain runs first"
            out, steps = run_sampling(model, mode, noise, labels, sigmas, case.sampler)
            p, s = psnr_ssim(out, plain)
            psnr, ssim = bootstrap(p), bootstrap(s)
            errors = eps_errors(model, mode, labels[:k], plain_path)
        results[mode.name] = ModeResult(
            mode.name,
            psnr,
            ssim,
            bootstrap(accuracy_values(out, labels)),
            kid_estimate(features(out), data_features),
            errors,
            steps,
        )
        log(f"  {case.name}: {mode.label}: {time.perf_counter() - start:.0f} s")
        if on_result is not None:
            on_result(results)
    assert plain is not None
    return results, plain


def untrained_accuracy(layout: str, seeds: int, steps: int) -> Estimate:
    """Class accuracy of plain CFG samples from the same architecture, untrained (the gap that shows learning)."""
    arch = A.ARCHITECTURES[layout]
    unet, conditioner = A.build(arch, len(data.CLASSES), seed=0)
    model = Model(layout, unet.eval().requires_grad_(False), conditioner.eval(), data.CLASSES, arch.size, arch.channels)
    seed_range = range(seeds)
    labels = labels_for(seed_range, len(data.CLASSES))
    out, _ = run_sampling(
        model,
        modes_.PLAIN,
        noise_for(seed_range, arch.size, arch.channels),
        labels,
        S.schedule("euler", steps),
        "euler",
    )
    return bootstrap(accuracy_values(out, labels))


# --- the run -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one run covers: per sampler, the modes (names) and the sides (multiples of the trained side)."""

    seeds: int
    eps_seeds: int
    steps: int
    samplers: dict[str, tuple[tuple[str, ...] | None, tuple[int, ...]]]
    data_features: int = DATA_FEATURES
    overrides: dict[str, dict[str, tuple[tuple[str, ...] | None, tuple[int, ...]]]] = field(default_factory=dict)
    """Per layout, samplers whose modes or sides differ from ``samplers``."""


DPMPP_DEFAULTS = (
    "cache-2-calibrated-time",
    "cache-3-calibrated-time",
    "cache-4-calibrated-time",
    "cache-5-calibrated-time",
    "cache-3-calibrated-time+todo-2",
    "cache-4-calibrated-time+todo-2",
    "cache-5-calibrated-time+todo-2",
    "cache-adaptive-0.08-10-calibrated",
)
"""Issue 27's defaults under DPM++ 2M, near 2x, 3x and 4x."""
DPMPP_FRONTIER = (
    "cache-4",
    "deepcache-nonuniform-3",
    "cache-2-linear",
    "cache-3-linear",
    "cache-4-linear",
    "cache-5-linear",
    "cache-3-linear+todo-2",
    "cache-4-linear+todo-2",
    "cache-adaptive-0.08-10-linear",
    "fbcache-0.05",
    "teacache-0.1",
    "easycache-0.05",
    "spectrum",
    *DPMPP_DEFAULTS,
)
"""Under DPM++ 2M, issue 23's caches near 2x, 3x and 4x: DeepCache's and ours, one setting of each other cache (the
sweeps run under Euler), and ours at the defaults since issue 27."""
DPMPP_MODES = ("plain", "cache-3", "cache-3-from-0.2", "cache-3+exact-0.5", *DPMPP_FRONTIER)
"""DPM++ 2M, where early cached steps are reported to hurt (DeepCache #9): the cache with and without a late start,
and the caches side by side."""
SDXL_DPMPP_LEFT_OUT = (
    "cache-3+exact-0.5",
    "cache-4",
    "cache-2-linear",
    "cache-4-linear",
    "cache-4-linear+todo-2",
    "cache-2-calibrated-time",
    "cache-4-calibrated-time+todo-2",
)
"""Under DPM++ on SDXL (a sampling run costs 2.5x SD1.5's here): the caches near 3x and 4x, not the ones between."""
TOME_MODES = ("plain", "tomesd", *(m.name for m in modes_.TOME))
"""Every token-merging mode (issue 16's list), at both sides on both layouts."""
TWICE_FRONTIER = (
    "cache-3",
    "cache-3-linear",
    "cache-3-linear+todo-2",
    "fbcache-0.05",
    "spectrum",
)
"""At SD1.5's 2x side, where a sampling run costs 7x more here: DeepCache N=3 and ours, alone and with ToDo, and two of
the other caches."""
TWICE_MODES = (*TOME_MODES, "cache-3+exact-0.5")
"""At 2x the side, where a sampling run costs 7x more here: every token-merging mode and the cache with ToMe's
default (SDXL: the cache alone too); the cache's other intervals are measured at the trained side."""
EULER_MODES = tuple(m for m in modes_.MODES if "-from-" not in m)
"""Euler at the trained side: every mode but the late-start cache (that one is for DPM++)."""
FULL = Plan(
    64,
    8,
    STEPS,
    {
        "euler": (EULER_MODES, (1,)),
        "dpmpp_2m": (DPMPP_MODES, (1,)),
        "euler@2x": ((*TWICE_MODES, *TWICE_FRONTIER), (2,)),
    },
    overrides={
        "sdxl": {
            "dpmpp_2m": (tuple(m for m in DPMPP_MODES if m not in SDXL_DPMPP_LEFT_OUT), (1,)),
            "euler@2x": ((*TWICE_MODES, "cache-3"), (2,)),
        }
    },
)
QUICK_MODES = (
    "plain",
    "tomesd",
    "exact-0.5",
    "todo-2",
    "cache-3",
    "cache-3+exact-0.5",
    "cache-3-linear",
    "cache-adaptive-0.08-10-linear",
    "fbcache-0.05",
    "spectrum",
)
QUICK = Plan(4, 2, 3, {"euler": (QUICK_MODES, (1, 2)), "dpmpp_2m": (("plain", "cache-3"), (1,))}, data_features=64)


def cases(plan: Plan) -> list[tuple[Case, tuple[str, ...] | None]]:
    out = []
    for layout, arch in A.ARCHITECTURES.items():
        for key, (names, scales) in (plan.samplers | plan.overrides.get(layout, {})).items():
            sampler = key.split("@")[0]  # "euler@2x": Euler again, with another list of modes
            out += [(Case(layout, arch.size * scale, sampler), names) for scale in scales]
    return out


def run(
    plan: Plan,
    log,
    layouts: tuple[str, ...] = tuple(A.ARCHITECTURES),
    save=None,
    previous: dict | None = None,
    earlier_grids: dict | None = None,
    scale: int | None = None,
) -> dict:
    """Every case of ``plan`` on ``layouts``: per case, each mode's results; per layout, the untrained model's
    accuracy; plain's samples per model and side (``grids``, for the sample grid). ``save(out, grids)`` is called
    after every mode (a long run keeps what it measured); ``previous``: an interrupted run's data (same plan and
    code), whose finished modes are kept, and its ``grids``; ``scale``: only the cases at that multiple of the
    trained side."""
    earlier_grids = earlier_grids or {}
    out: dict = {"cases": [], "untrained": {}}
    earlier = {Case(**c["case"]): c["results"] for c in (previous or {}).get("cases", [])}
    grids: dict[str, torch.Tensor] = {}
    for layout in layouts:
        untrained = (previous or {}).get("untrained", {}).get(layout)
        if scale in (None, 1):  # the gap that shows learning, at the trained side
            out["untrained"][layout] = untrained or untrained_accuracy(layout, plan.seeds, plan.steps).to_json()
            log(f"{layout}: untrained accuracy {out['untrained'][layout]}")
        model = load_model(layout)
        side = None if scale is None else scale * A.ARCHITECTURES[layout].size
        for case, names in (c for c in cases(plan) if c[0].layout == layout and side in (None, c[0].side)):
            mode_list = modes_.for_layout(layout, names)
            entry = {"case": vars(case), "results": []}
            out["cases"].append(entry)

            def on_result(results: dict[str, ModeResult], entry: dict = entry) -> None:
                entry["results"] = [r.to_json() for r in results.values()]
                if save is not None:
                    save(out, grids)

            done = {r["mode"]: ModeResult.from_json(r) for r in earlier.get(case, [])}
            grid = f"{LAYOUT_NAMES[layout]}, {case.side} px"
            if all(m.name in done for m in mode_list) and (case.sampler != "euler" or grid in earlier_grids):
                entry["results"] = [done[m.name].to_json() for m in mode_list]  # finished before: kept as it is
                if case.sampler == "euler":
                    grids[grid] = earlier_grids[grid]
                continue
            results, plain = run_case(
                model, case, mode_list, plan.seeds, plan.eps_seeds, plan.steps, log, plan.data_features, done, on_result
            )
            entry["results"] = [r.to_json() for r in results.values()]
            if case.sampler == "euler":
                grids[grid] = plain[:40].half()  # 4 per class
            if save is not None:
                save(out, grids)
    out["grids"] = grids
    return out
