"""The real libraries' caches as anchors on the trained FLUX- and Wan-layout transformers (issue 36): cache-dit's
DBCache (the first and last blocks it computes, ``Fn`` and ``Bn``; its residual threshold and warm-up; TaylorSeer
orders 1–2 and FoCa as its calibrators; step masks, ours among them) and diffusers' cache hooks (First Block Cache,
MagCache with its own calibration, TaylorSeer and its lite mode, Pyramid Attention Broadcast, FasterCache on Wan),
applied through the libraries' public APIs, one image at a time as a user runs them. FasterCache reads the batch as
[uncond, cond], as diffusers' pipelines batch it: its runs are sampled in that order (the lab's is [cond, uncond]; the
samples are the same to the bit).

Every run is priced by what it executed: forward hooks inside each block (on its first adaptive norm, which a skipped
block never reaches whichever way the library skips it, and on its attention, which diffusers' TaylorSeer and PAB
skip alone) record, call by call, what computed and at what batch; :func:`priced` turns that into the real model's
width (FLUX.1's: :class:`benchmarks.lab.dit.BlockCosts`, Wan 2.1's: :class:`benchmarks.lab.wan21.ChainCosts`), with
the model's outside and the library's own work: its signal (a residual's distance) where it decides by a threshold,
its forecast where it extrapolates (diffusers' TaylorSeer: one per skipped module).

Benchmark dependencies only (pinned in ``requirements-dev.txt``); nothing here enters ``tome_core``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from benchmarks.lab.dit import BlockCosts, Trained, guided_euler
from benchmarks.lab.trained.metrics import psnr_ssim

Params = tuple[tuple[str, object], ...]


LAYOUTS = {
    "FluxTransformer2DModel": (("transformer_blocks", "norm1", "attn"), ("single_transformer_blocks", "norm", "attn")),
    "WanTransformer3DModel": (("blocks", "norm1", "attn1"),),
}
"""Per transformer class, its kinds of block in the order it runs them: (the blocks, their first adaptive norm, their
self-attention)."""
TIMESTEP_SCALE = {"FluxTransformer2DModel": 1000.0, "WanTransformer3DModel": 1.0}
"""Per transformer class, from the timestep it is called with to diffusers' 0–1000 scale, as its pipelines pass the
time to Pyramid Attention Broadcast (FLUX's is σ, Wan's σ × 1000)."""


class Executed:
    """What a transformer of :data:`LAYOUTS` computed, call by call: ``ran`` (per call, the blocks that computed:
    their first adaptive norm ran) and ``attended`` (the blocks whose self-attention ran: its query projection); blocks
    numbered in the order the model runs them (FLUX: double-stream first)."""

    def __init__(self, transformer: torch.nn.Module) -> None:
        kinds = [(getattr(transformer, name), norm, attn) for name, norm, attn in LAYOUTS[type(transformer).__name__]]
        self.blocks = tuple(len(blocks) for blocks, _, _ in kinds)
        self.ran: list[set[int]] = []
        self.attended: list[set[int]] = []
        self.batch: list[int] = []  # per call, the batch its blocks ran at (FasterCache runs cond alone at times)
        self._handles = [transformer.register_forward_pre_hook(self._call)]
        i = 0
        for blocks, norm, attn in kinds:
            for block in blocks:
                self._handles.append(getattr(block, norm).register_forward_hook(lambda m, a, o, i=i: self._ran(i, a)))
                to_q = getattr(block, attn).to_q
                self._handles.append(to_q.register_forward_hook(lambda *_, i=i: self.attended[-1].add(i)))
                i += 1

    def _call(self, *_) -> None:
        self.ran.append(set())
        self.attended.append(set())
        self.batch.append(0)

    def _ran(self, i: int, args: tuple) -> None:
        self.ran[-1].add(i)
        self.batch[-1] = max(self.batch[-1], len(args[0]))

    def share(self, call: int) -> float:
        """The share of the pass's batch that call ``call`` ran its blocks at (1 where it ran none)."""
        full = max(self.batch, default=0)
        return self.batch[call] / full if self.batch[call] and full else 1.0

    def clear(self) -> None:
        self.ran.clear()
        self.attended.clear()
        self.batch.clear()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def spans(ran: set[int], blocks: int) -> tuple[int, int, int]:
    """A call's executed blocks as (head, tail, middle): the first ``head`` blocks, the last ``tail`` and any others."""
    head = next((i for i in range(blocks) if i not in ran), blocks)
    tail = 0 if head == blocks else next(j for j in range(blocks) if blocks - 1 - j not in ran)
    return head, tail, len(ran) - head - tail


@dataclass(frozen=True)
class Overhead:
    """What a library adds to a step at the real width: ``signal`` (a residual's distance, at each call that decided),
    ``forecast`` (at a skipped call: one forecast, or one per skipped block of the real model where ``per_block``; at
    a full call, its update)."""

    signal: bool = False
    forecast: bool = False
    per_block: bool = False


def priced(executed: Executed, costs: BlockCosts, overhead: Overhead) -> float:
    """The speed-up over plain of the pass ``executed`` recorded, at the real width ``costs`` measured: a call that
    ran every block and its attention is a full step; one that ran every block, some without attention, runs all of
    the real model's blocks with the same fractions of each kind without attention; otherwise its first ``h`` and last
    ``t`` blocks are the real model's first ``h`` (FLUX.1: double-stream) and last ``t`` (single-stream). A call that
    ran on part of the batch (FasterCache's cond alone) costs that part."""
    total, groups = sum(executed.blocks), costs.groups()
    full = costs.full_step()
    seconds = 0.0
    for call, (ran, attended) in enumerate(zip(executed.ran, executed.attended)):
        share = executed.share(call)
        if len(ran) == total and len(attended) == total:
            seconds += share * (full + (costs.cost("calibration") if overhead.forecast else 0.0))
            continue
        if len(ran) == total:
            computed, skipped, first = 0.0, 0.0, 0
            for lab, group in zip(executed.blocks, groups):
                no_attention = sum(i not in attended for i in range(first, first + lab)) / lab
                computed += group.count * group.seconds * (1 - no_attention * group.attention_share)
                skipped += no_attention * group.count
                first += lab
            skipped = round(skipped)
        else:
            head, tail, middle = spans(ran, total)
            computed = head * groups[0].seconds + (tail + middle) * groups[-1].seconds
            skipped = sum(group.count for group in groups) - head - tail - middle
        seconds += share * (costs.cost("outside") + computed)
        if overhead.signal:
            seconds += costs.cost("signal")
        if overhead.forecast:
            seconds += (skipped if overhead.per_block else 1) * costs.cost("calibrated")
    return len(executed.ran) * full / seconds


@dataclass(frozen=True)
class Setting:
    """One configuration of one library's cache: ``library`` ("cache-dit", "diffusers"), ``method`` and its
    ``params`` (the libraries' own argument names)."""

    library: str
    method: str
    params: Params

    @property
    def name(self) -> str:
        return f"{self.library} {self.method} " + " ".join(f"{k}={_short(v)}" for k, v in self.params)

    @property
    def overhead(self) -> Overhead:
        p = dict(self.params)
        if self.library == "diffusers" and self.method == "taylorseer":
            return Overhead(forecast=True, per_block=True)
        if self.method in ("pab", "fastercache"):  # kept attention outputs (and cond's), reused or blended
            return Overhead()
        return Overhead(signal=p.get("mask") is None, forecast=p.get("calibrator", "none") != "none")

    @property
    def uncond_first(self) -> bool:
        """Whether the library reads the guided batch as [uncond, cond] (FasterCache)."""
        return self.method == "fastercache"

    @contextlib.contextmanager
    def applied(self, transformer: torch.nn.Module, steps: int, ratios: list[float] | None = None) -> Iterator[None]:
        """The cache on ``transformer`` for a pass of ``steps`` (``ratios``: MagCache's calibration), removed after.
        diffusers' hooks keep their state in a cache context, which its pipelines open around the denoiser's calls:
        one here (cond and uncond run batched in one call)."""
        p = dict(self.params)
        if self.library == "cache-dit":
            remove, context = _cache_dit(transformer, steps, p), contextlib.nullcontext()
        else:
            remove, context = _diffusers(transformer, steps, self.method, p, ratios), transformer.cache_context("cfg")
        try:
            with context:
                yield
        finally:
            remove()


def _short(value: object) -> str:
    if isinstance(value, tuple):  # a step mask's 0s and 1s run together; other pairs keep a comma
        return ("" if set(value) <= {0, 1} else ",").join(str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _quiet() -> None:
    for name in ("cache_dit", "diffusers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in logging.root.manager.loggerDict:
        if name.startswith(("cache_dit", "diffusers")):
            logging.getLogger(name).setLevel(logging.ERROR)


def cache_dit_configs(steps: int, p: dict, separate_cfg: bool) -> tuple[Any, Any]:
    """cache-dit's DBCache configuration and calibrator (or None) for the setting ``p``, over ``steps`` steps;
    ``separate_cfg``: whether cond and uncond come as separate calls (a pipeline's true CFG) or batched in one."""
    from cache_dit import DBCacheConfig, FoCaCalibratorConfig, TaylorSeerCalibratorConfig

    mask = p.get("mask")
    config = DBCacheConfig(
        Fn_compute_blocks=p["Fn"],
        Bn_compute_blocks=p["Bn"],
        residual_diff_threshold=p.get("threshold", 0.08),
        max_warmup_steps=p.get("warmup", 0 if mask else 8),
        num_inference_steps=steps,
        enable_separate_cfg=separate_cfg,
        steps_computation_mask=None if mask is None else list(mask),
        steps_computation_policy=p.get("policy", "dynamic"),
    )
    calibrator = {
        "none": lambda: None,
        "taylorseer": lambda: TaylorSeerCalibratorConfig(taylorseer_order=p.get("order", 1)),
        "foca": lambda: FoCaCalibratorConfig(),
    }[p.get("calibrator", "none")]()
    return config, calibrator


def _cache_dit(transformer: torch.nn.Module, steps: int, p: dict) -> Callable[[], None]:
    import cache_dit

    config, calibrator = cache_dit_configs(steps, p, separate_cfg=False)  # cond and uncond batched in one call
    with contextlib.redirect_stdout(io.StringIO()):
        cache_dit.enable_cache(transformer, cache_config=config, calibrator_config=calibrator)
    _quiet()

    def remove() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            cache_dit.disable_cache(transformer)

    return remove


def _diffusers(transformer, steps: int, method: str, p: dict, ratios: list[float] | None) -> Callable[[], None]:
    from diffusers import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        MagCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
    )

    clock = None
    now = [0.0]  # the transformer's timestep on diffusers' 0–1000 scale, as its pipelines pass it to PAB/FasterCache
    if method in ("pab", "fastercache"):
        scale = TIMESTEP_SCALE[type(transformer).__name__]

        def tick(_, args, kwargs) -> None:
            now[0] = float(kwargs["timestep"].flatten()[0]) * scale

        clock = transformer.register_forward_pre_hook(tick, with_kwargs=True)
    if method == "fbcache":
        config = FirstBlockCacheConfig(threshold=p["threshold"])
    elif method == "magcache":
        config = MagCacheConfig(
            threshold=p["threshold"],
            max_skip_steps=p["max_skip_steps"],
            retention_ratio=p["retention_ratio"],
            num_inference_steps=steps,
            mag_ratios=ratios,
        )
    elif method == "pab":
        config = PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=p["spatial_attention_block_skip_range"],
            spatial_attention_timestep_skip_range=p["spatial_attention_timestep_skip_range"],
            current_timestep_callback=lambda: now[0],
        )
    elif method == "fastercache":
        config = FasterCacheConfig(
            spatial_attention_block_skip_range=p["spatial_attention_block_skip_range"],
            spatial_attention_timestep_skip_range=p["spatial_attention_timestep_skip_range"],
            unconditional_batch_skip_range=p["unconditional_batch_skip_range"],
            unconditional_batch_timestep_skip_range=p["unconditional_batch_timestep_skip_range"],
            current_timestep_callback=lambda: now[0],
            tensor_format="BCFHW",
        )
    else:
        config = TaylorSeerCacheConfig(
            cache_interval=p["cache_interval"],
            disable_cache_before_step=p["disable_cache_before_step"],
            max_order=p["max_order"],
            taylor_factors_dtype=torch.float32,
            use_lite_mode=p["use_lite_mode"],
        )
    transformer.enable_cache(config)
    _quiet()

    def remove() -> None:
        transformer.disable_cache()
        if clock is not None:
            clock.remove()

    return remove


def magcache_ratios(transformer, sample: Callable[[int], None], images: int, steps: int) -> list[float]:
    """diffusers' MagCache calibration as its documentation asks: ``MagCacheConfig(calibrate=True)`` over a pass,
    the ratios it prints; here over ``images`` passes (``sample(i)``: image ``i``), averaged step by step."""
    from diffusers import MagCacheConfig

    runs = []
    for i in range(images):
        transformer.enable_cache(MagCacheConfig(calibrate=True, num_inference_steps=steps))
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed), transformer.cache_context("cfg"):
                sample(i)
        finally:
            transformer.disable_cache()
        found = re.findall(r"\[([0-9eE+.,\s-]+)\]", printed.getvalue())
        runs.append([float(x) for x in found[-1].split(",")])
    return [sum(r[s] for r in runs) / len(runs) for s in range(steps)]


def _grid(library: str, method: str, **axes: tuple) -> Iterator[Setting]:
    keys = list(axes)
    combos: list[list[tuple[str, object]]] = [[]]
    for key in keys:
        combos = [[*c, (key, v)] for c in combos for v in axes[key]]
    for combo in combos:
        yield Setting(library, method, tuple(combo))


def uniform_mask(interval: int, steps: int) -> tuple[int, ...]:
    """Our uniform schedule as a step mask: full at 0, N, 2N, … and the last step."""
    full = {*range(0, steps, interval), steps - 1}
    return tuple(int(i in full) for i in range(steps))


def preset_mask(policy: str, steps: int) -> tuple[int, ...]:
    """cache-dit's own step-mask preset (``slow``, ``medium``, ``fast``, ``ultra``) for ``steps``."""
    import cache_dit

    return tuple(cache_dit.steps_mask(mask_policy=policy, total_steps=steps))


def settings(steps: int, transformer: str = "FluxTransformer2DModel") -> list[Setting]:
    """Every configuration the sweep measures: each library's menu (defaults, presets, documented ranges) and beyond
    it, so that its frontier is found, on ``transformer`` (a class of :data:`LAYOUTS`). cache-dit's ``Fn`` and ``Bn``
    are counts of blocks, priced as the real model's: up to 2 and 1 here, where the FLUX-layout model's first two
    blocks are already 22 % of its depth (FLUX.1's: 4 %; the Wan-layout model's 33 %, Wan 2.1 1.3B's 7 %); its default
    warm-up (8 steps, for 28–50-step runs) would leave 12 of 20 steps, so 1 and 3. On Wan, diffusers' TaylorSeer
    runs in lite mode only: its standard mode hooks the modules named ``…attn``, and Wan's are ``attn1`` and ``attn2``
    (a pass without a single forecast). FasterCache runs on Wan only: it reuses the attention modules named ``attn1``
    (FLUX's are ``attn``) and approximates the unconditional output in the frequencies of a (B, C, F, H, W) latent
    (FLUX's output is packed tokens)."""
    calibrators = (
        {"calibrator": ("none",)},
        {"calibrator": ("taylorseer",), "order": (1, 2)},
        {"calibrator": ("foca",)},
    )
    out: list[Setting] = []
    for calibrator in calibrators:
        out += _grid(
            "cache-dit",
            "dbcache",
            Fn=(1, 2),
            Bn=(0, 1),
            warmup=(1, 3),
            threshold=(0.04, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48),
            **calibrator,
        )
        masks = [uniform_mask(n, steps) for n in (2, 3, 4, 5, 6, 7, 8)]
        masks += [preset_mask(p, steps) for p in ("slow", "medium", "fast", "ultra")]
        out += _grid(
            "cache-dit",
            "dbcache",
            Fn=(1,),
            Bn=(0, 1),
            mask=tuple(masks),
            policy=("static",),
            **calibrator,
        )
    out += _grid("diffusers", "fbcache", threshold=(0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.16, 0.2, 0.3, 0.4))
    out += _grid(
        "diffusers",
        "magcache",
        threshold=(0.02, 0.04, 0.06, 0.1, 0.15, 0.24, 0.4),
        max_skip_steps=(2, 3, 5),
        retention_ratio=(0.1, 0.2),
    )
    out += _grid(
        "diffusers",
        "taylorseer",
        cache_interval=(2, 3, 4, 5, 6),
        disable_cache_before_step=(1, 3),
        max_order=(1, 2),
        use_lite_mode=(False, True) if transformer != "WanTransformer3DModel" else (True,),
    )
    out += _grid(
        "diffusers",
        "pab",
        spatial_attention_block_skip_range=(2, 3, 4, 5, 6),
        spatial_attention_timestep_skip_range=((100, 800), (50, 950), (-1, 1001)),
    )
    if transformer == "WanTransformer3DModel":
        out += _grid(
            "diffusers",
            "fastercache",
            spatial_attention_block_skip_range=(2, 3, 4),
            spatial_attention_timestep_skip_range=((-1, 681), (-1, 901)),
            unconditional_batch_skip_range=(2, 5),
            unconditional_batch_timestep_skip_range=((-1, 641), (-1, 901)),
        )
    return list({s.name: s for s in out}.values())  # (few steps make some masks alike)


LIBRARIES = ("cache-dit", "diffusers")
"""The real libraries a ``dit_libraries`` run sweeps."""


Sampler = Callable[[Trained, torch.Tensor, torch.Tensor, bool], torch.Tensor]
"""A guided pass of the lab: ``(model, noise, labels, uncond_first)`` to the samples."""


def run_setting(
    models: dict,
    setting: Setting,
    noise,
    labels,
    plain,
    steps: int,
    ratios,
    costs: BlockCosts,
    sampler: Sampler | None = None,
) -> dict:
    """``setting`` image by image on its library's copy of the model, told a pass of ``steps`` model calls: per
    image PSNR against ``plain`` (list) and speed-up; the pass is ``sampler``'s (default: guided Euler)."""
    sampler = sampler or (lambda m, x, y, first: guided_euler(m, x, y, steps, uncond_first=first))
    model = models[setting.library]
    executed = Executed(model.transformer)
    outs, speeds = [], []
    try:
        for i in range(len(noise)):
            executed.clear()
            with setting.applied(model.transformer, steps, ratios):
                outs.append(sampler(model, noise[i : i + 1], labels[i : i + 1], setting.uncond_first))
            speeds.append(priced(executed, costs, setting.overhead))
    finally:
        executed.remove()
    psnr, _ = psnr_ssim(torch.cat(outs), plain)
    return {
        "name": setting.name,
        "psnr_per_seed": psnr.tolist(),
        "psnr": float(psnr.mean()),
        "speed": float(np.mean(speeds)),
    }


def sweep_and_frontiers(
    models: dict,
    settings: list[Setting],
    noise,
    labels,
    plain,
    steps: int,
    ratios,
    costs: BlockCosts,
    progress,
    log,
    sweep_seeds: int,
    sampler: Sampler | None = None,
    prefix: str = "",
    final_from: float = 0.0,
) -> tuple[list[dict], dict[str, dict]]:
    """The sweep (``settings`` on the first ``sweep_seeds`` seeds, per-seed PSNR dropped) and each library's frontier
    of it, from ``final_from``× on, on all seeds (:func:`run_setting`, ``sampler``'s passes of ``steps`` calls). Each
    run is taken from ``progress`` (a :class:`benchmarks.lab.results.Progress`) where it is there (``prefix`` +
    ``sweep/`` or ``final/`` + its name), else run and put there."""
    start = time.perf_counter()
    sweep = []
    for k, setting in enumerate(settings):
        key = f"{prefix}sweep/{setting.name}"
        row = progress.get(key)
        if row is None:
            seeds = slice(0, sweep_seeds)
            row = run_setting(models, setting, noise[seeds], labels[seeds], plain[seeds], steps, ratios, costs, sampler)
            row.pop("psnr_per_seed")
            row = progress.put(key, {"library": setting.library, **row})
        sweep.append(row)
        if k % 25 == 24:
            log(f"{prefix}sweep {k + 1}/{len(settings)}: {time.perf_counter() - start:.0f} s")
    by_name = {s.name: s for s in settings}
    final = {}
    for library in LIBRARIES:
        for point in frontier([p for p in sweep if p["library"] == library]):
            if point["speed"] < final_from:
                continue
            setting, key = by_name[point["name"]], f"{prefix}final/{point['name']}"
            final[setting.name] = progress.get(key) or progress.put(
                key,
                {
                    "library": library,
                    **run_setting(models, setting, noise, labels, plain, steps, ratios, costs, sampler),
                },
            )
            log(f"{prefix}{setting.name}: {final[setting.name]['psnr']:.1f} dB at {final[setting.name]['speed']:.2f}x")
    return sweep, final


def frontier(points: list[dict]) -> list[dict]:
    """The points no other point beats (at least as fast and as close, one of them strictly), fastest last; of equal
    points the first."""
    keep: list[dict] = []
    for p in points:
        beaten = any(
            o["speed"] >= p["speed"] and o["psnr"] >= p["psnr"] and (o["speed"], o["psnr"]) != (p["speed"], p["psnr"])
            for o in points
        )
        if not beaten and not any((k["speed"], k["psnr"]) == (p["speed"], p["psnr"]) for k in keep):
            keep.append(p)
    return sorted(keep, key=lambda p: p["speed"])


def best_at(final: dict, library: str, target: float) -> dict | None:
    """Of a run's ``final`` entries (each with ``library``, ``psnr`` and ``speed``), ``library``'s best PSNR at
    ``target``× or faster; None if it has none there."""
    runs = [r for r in final.values() if r["library"] == library and r["speed"] >= target]
    return max(runs, key=lambda r: r["psnr"], default=None)


def best_library_at(final: dict, target: float) -> dict | None:
    """The best of :data:`LIBRARIES`' :func:`best_at` ``target``; None if none has a run there."""
    runs = [r for r in (best_at(final, library, target) for library in LIBRARIES) if r is not None]
    return max(runs, key=lambda r: r["psnr"], default=None)
