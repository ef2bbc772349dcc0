"""The diffusion-transformer lab: FLUX-layout widths and the costs of their blocks (measured by
:mod:`benchmarks.speed.dit_costs`), guided sampling of the trained FLUX-layout model under our cache (its modes),
and the prices that turn a pass's counted steps into a speed-up at FLUX.1's real width.

Shared by the DiT commands (:mod:`benchmarks.speed.dit_costs`, :mod:`benchmarks.quality.dit_fidelity`,
:mod:`benchmarks.quality.dit_merge`, :mod:`benchmarks.quality.dit_steps`, :mod:`benchmarks.quality.dit_frontier`) and
:mod:`benchmarks.gpu`.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

import tome_core
from benchmarks.lab import forecasters
from benchmarks.lab.anchors import rel_l1
from benchmarks.lab.results import Section, command, load_run_data, run_command, run_meta
from benchmarks.lab.timing import Timer
from benchmarks.lab.trained import flux, wan
from benchmarks.lab.trained.loading import load_classifier
from benchmarks.lab.trained.metrics import Estimate, bootstrap
from tome_core.caching.forecast import Forecast
from tome_core.settings import ToMeSettings

STEPS = 20
CFG = 4.0
SEEDS = 64
Device = torch.device | str
Trained = flux.FluxLayout | wan.WanLayout


# --- the FLUX-layout widths and their blocks' costs ---------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """A FLUX-layout model's width and sequence: ``heads`` × ``head_dim`` hidden, image and text tokens, and its
    blocks (FLUX.1: 19 double-stream, 38 single-stream)."""

    name: str
    heads: int
    head_dim: int
    image_tokens: int
    text_tokens: int
    double: int = 19
    single: int = 38

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    def model(self, double: int = 0, single: int = 0) -> torch.nn.Module:
        """``FluxTransformer2DModel`` at this width with ``double`` and ``single`` blocks (random weights)."""
        from diffusers import FluxTransformer2DModel

        rope = (self.head_dim // 8, 7 * self.head_dim // 16, 7 * self.head_dim // 16)  # FLUX.1: 16, 56, 56
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return FluxTransformer2DModel(
                in_channels=64,
                num_layers=double,
                num_single_layers=single,
                attention_head_dim=self.head_dim,
                num_attention_heads=self.heads,
                joint_attention_dim=4096,
                pooled_projection_dim=768,
                guidance_embeds=True,
                axes_dims_rope=rope,
            ).eval()

    def inputs(self, device: Device = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """The model's inputs for one image: packed latents, text, pooled vector, time, guidance (in ``dtype``),
        positions (float32), on ``device``."""
        gen = torch.Generator().manual_seed(0)
        side = int(self.image_tokens**0.5)
        rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        inputs = {
            "hidden_states": torch.randn(1, self.image_tokens, 64, generator=gen),
            "encoder_hidden_states": torch.randn(1, self.text_tokens, 4096, generator=gen),
            "pooled_projections": torch.randn(1, 768, generator=gen),
            "timestep": torch.tensor([0.6]),
            "guidance": torch.tensor([3.5]),
        }
        return {k: v.to(device, dtype) for k, v in inputs.items()} | {
            "img_ids": torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3).float().to(device),
            "txt_ids": torch.zeros(self.text_tokens, 3, device=device),
        }


REAL = Config("FLUX.1 1024 px", 24, 128, 4096, 512)
CHECK = Config("FLUX.1 layout, hidden 384, 1024 px", 3, 128, 4096, 512)
QUICK = Config("tiny", 2, 32, 64, 8, 2, 3)


class Group(NamedTuple):
    """One kind of block at the real width: how many the model has, one's seconds, attention's share of them."""

    count: int
    seconds: float
    attention_share: float


@dataclass
class BlockCosts:
    """One configuration's seconds per kind (lists: one per round); ``whole``: the whole model's forward at this
    width, where it was timed (the check)."""

    config: dict
    seconds: dict[str, list[float]] = field(default_factory=dict)
    whole: list[float] = field(default_factory=list)

    def cost(self, kind: str) -> float:
        return statistics.median(self.seconds[kind])

    @property
    def blocks(self) -> Config:
        return Config(**self.config)

    def full_step(self) -> float:
        c = self.blocks
        return self.cost("outside") + c.double * self.cost("double") + c.single * self.cost("single")

    def probe(self) -> float:
        """The first block's seconds (FLUX.1: a double-stream block), which a cached step runs as its probe."""
        return self.cost("double")

    def cached_step(self) -> float:
        """A cached step: the model's outside, the first block (the probe), the calibrated forecast."""
        return self.cost("outside") + self.probe() + self.cost("calibrated")

    def attention_shares(self) -> tuple[float, float]:
        """Attention's share of a double- and a single-stream block at this width, from their multiply-adds per
        token (hidden d, N tokens): double: q, k, v, out (4d²) and attention (2Nd) of 4d² + 8d² (MLP) + 2Nd; single:
        q, k, v (3d²) and attention of the block's 12d² + 2Nd. The blocks' times are measured; their split is not."""
        c = self.blocks
        d, n = c.hidden, c.image_tokens + c.text_tokens
        block = 12 * d * d + 2 * n * d
        return (4 * d * d + 2 * n * d) / block, (3 * d * d + 2 * n * d) / block

    def groups(self) -> list[Group]:
        """The model's kinds of block in the order it runs them: FLUX.1's 19 double- then 38 single-stream."""
        c, (double, single) = self.blocks, self.attention_shares()
        return [Group(c.double, self.cost("double"), double), Group(c.single, self.cost("single"), single)]

    def priced(self, counts: dict[str, int]) -> float:
        """The speed-up of a pass whose steps were counted: ours (``full`` with the calibration's update, ``cached``)
        or another cache's (``full``; ``first``: the outside, the first block and the signal; ``skip``: the outside
        and the signal)."""
        full, outside, signal = self.full_step(), self.cost("outside"), self.cost("signal")
        steps = sum(counts.get(k, 0) for k in ("full", "cached", "first", "skip"))
        seconds = counts["full"] * (full + (self.cost("calibration") if "cached" in counts else 0.0))
        seconds += counts.get("cached", 0) * self.cached_step()
        seconds += counts.get("first", 0) * (outside + self.probe() + signal)
        seconds += counts.get("skip", 0) * (outside + signal)
        return steps * full / seconds

    def speedup(self, interval: int, steps: int = STEPS) -> float:
        """Ours at ``interval`` on the uniform schedule (first and last step full)."""
        full = len({*range(0, steps, interval), steps - 1})
        return self.priced({"full": full, "cached": steps - full})


def blocks(
    config: Config,
    device: Device = "cpu",
    dtype: torch.dtype = torch.float32,
    outside: torch.nn.Module | None = None,
    inputs: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.nn.Module, torch.nn.Module, dict[str, torch.Tensor]]:
    """One double- and one single-stream block at ``config``'s width (random weights), and the keyword arguments the
    model hands its blocks for :meth:`Config.inputs`: the image and text streams, the time embedding, the RoPE; all
    on ``device`` in ``dtype``. ``outside`` and ``inputs``: the model without blocks and its inputs, where the caller
    has them already."""
    inputs = config.inputs(device, dtype) if inputs is None else inputs
    outside = config.model().to(device, dtype) if outside is None else outside
    with torch.no_grad():
        temb = outside.time_text_embed(
            inputs["timestep"] * 1000, inputs["guidance"] * 1000, inputs["pooled_projections"]
        )
        kwargs = {
            "hidden_states": outside.x_embedder(inputs["hidden_states"]),
            "encoder_hidden_states": outside.context_embedder(inputs["encoder_hidden_states"]),
            "temb": temb,
            "image_rotary_emb": outside.pos_embed(torch.cat([inputs["txt_ids"], inputs["img_ids"]])),
        }
    one = config.model(double=1, single=1).to(device, dtype)
    return one.transformer_blocks[0], one.single_transformer_blocks[0], kwargs


def cache_work(tokens: int, hidden: int, device: Device = "cpu", dtype: torch.dtype = torch.float32) -> dict:
    """The caches' own work on a hidden state of ``tokens`` × ``hidden``, as callables by kind: ``forecast`` /
    ``calibrated``: our linear / calibrated forecast (:class:`tome_core.caching.forecast.Forecast`), ``calibration``:
    the calibrated one's update at a full step, ``signal``: the relative L1 change of a probe's output (First Block
    Cache's decision, on every 4th token and channel as our adaptive schedule subsamples)."""
    gen = torch.Generator().manual_seed(1)
    states = [torch.randn(1, tokens, hidden, generator=gen).to(device, dtype) for _ in range(3)]
    linear, calibrated = Forecast("linear"), Forecast("calibrated")
    for i in range(2):
        linear.add(torch.tensor(0.9 - 0.1 * i), states[i])
        calibrated.add(torch.tensor(0.9 - 0.1 * i), states[i], states[i])

    def calibration() -> None:
        fresh = Forecast("calibrated")
        fresh.time, fresh.deep, fresh.probe = torch.tensor(0.8, device=device), states[0], calibrated.probe
        fresh.add(torch.tensor(0.7), states[2], states[2])

    def signal() -> None:
        rel_l1(states[2][..., ::4, ::4], states[1][..., ::4, ::4])

    return {
        "forecast": lambda: linear.predict(torch.tensor(0.7)),
        "calibrated": lambda: calibrated.predict(torch.tensor(0.7), states[2]),
        "calibration": calibration,
        "signal": signal,
    }


def timed(out: BlockCosts, work: dict, rounds: int, whole=None, device: Device = "cpu", log=print) -> BlockCosts:
    """``out`` with the seconds of each kind of ``work`` (process CPU time; CUDA: GPU time from events) over
    ``rounds`` interleaved rounds after a warm-up, and of the whole model's forward (``whole``) where given."""
    with torch.no_grad():
        for fn in work.values():
            fn()  # warm-up
        for r in range(rounds):
            for kind, fn in work.items():
                with Timer(device) as timer:
                    fn()
                out.seconds.setdefault(kind, []).append(timer.cpu)
            if whole is not None:
                with Timer(device) as timer:
                    whole()
                out.whole.append(timer.cpu)
            log(f"  {out.blocks.name}: round {r + 1}/{rounds} done")
    return out


def costs_table(results: list[BlockCosts], kinds: tuple[str, ...]) -> list[str]:
    """The costs commands' first table: per configuration the full step and each kind's seconds, also as a fraction
    of the full step."""
    lines = ["| configuration | full step | " + " | ".join(kinds) + " |", "|---|---:|" + "---:|" * len(kinds)]
    for r in results:
        full = r.full_step()
        cells = [f"{r.cost(k):.4f} s ({r.cost(k) / full:.4f})" for k in kinds]
        lines.append(f"| {r.blocks.name} | {full:.1f} s | " + " | ".join(cells) + " |")
    return lines


def costs_command(doc: str | None, section: Section, argv: list[str] | None, measure, quick, real, check) -> None:
    """The costs commands' ``main``: ``measure(config, rounds, log, whole)`` at the ``real`` configuration and at
    ``check`` (the whole model timed too), or at ``quick`` alone (2 rounds, printed only)."""

    def measure_all(args) -> tuple[list[dict], dict]:
        start, rounds = time.perf_counter(), 2 if args.quick else args.rounds
        plan = ((quick, True),) if args.quick else ((real, False), (check, True))
        results = [measure(config, rounds, print, whole) for config, whole in plan]
        return [vars(r) for r in results], run_meta(args, rounds, time.perf_counter() - start)

    run_command(command(doc, quick="", rounds=3, threads=1), section, argv, measure_all)


# --- the trained FLUX-layout model under our cache ---------------------------------------------------------


@dataclass(frozen=True)
class Mode:
    name: str
    forecast: str
    schedule: str
    interval: int
    start: float = 0.0
    study: str | None = None
    """A forecast of :mod:`benchmarks.lab.forecasters` (its class name) in place of the cache's own, or None."""
    correction: float = 0.0
    """The cache's ``cache_correction`` (the lab's sampler is Euler, which it needs)."""

    def settings(self) -> ToMeSettings:
        return ToMeSettings(
            ratio=0.0,
            cache=True,
            cache_interval=self.interval,
            cache_forecast=self.forecast,
            cache_schedule=self.schedule,
            cache_start=self.start,
            cache_correction=self.correction,
        )


def guided_euler(
    model: Trained, noise: torch.Tensor, labels: torch.Tensor, steps: int, progress=None, uncond_first: bool = False
):
    """Guided flow-matching Euler sampling (cond and uncond batched: [cond, uncond], or ``uncond_first``: [uncond,
    cond], as diffusers' pipelines batch them) on the model's own schedule."""
    schedule = model.schedule(steps, noise)
    empty = torch.full_like(labels, -1)
    both = torch.cat([empty, labels] if uncond_first else [labels, empty])

    def velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            first, second = model(torch.cat([x, x]), sigma.expand(2 * len(x)), both).chunk(2)
        cond, uncond = (second, first) if uncond_first else (first, second)
        return uncond + CFG * (cond - uncond)

    return flux.euler(velocity, noise.clone(), schedule, progress)


def sample(
    model: Trained,
    noise: torch.Tensor,
    labels: torch.Tensor,
    steps: int,
    mode: Mode | None = None,
    short_passes: bool = False,
    correction=None,
):
    """One sampling run (``mode`` applied to the transformer for it, removed after): the samples and the pass's steps
    (full, cached). ``short_passes``: the cache caches a pass too short for a forecast as well, instead of standing
    aside (:func:`tome_core.caching.schedule.too_short`; to measure what it would do). ``correction``: a
    :class:`benchmarks.lab.correction.DeferredCorrection` of the cached pass (with a mode, in place of its study)."""
    patch = None if mode is None else tome_core.apply_settings(model.transformer, mode.settings())
    schedule = model.schedule(steps, noise)
    if patch is not None and patch.cache is not None:
        patch.cache.short_passes = short_passes
        patch.set_euler(schedule)
    study = None if mode is None or mode.study is None else getattr(forecasters, mode.study)
    try:
        progress = None if patch is None else (lambda i, n: patch.set_progress(i / n, n))
        studied = forecasters.swapped(study)
        if correction is not None and patch is not None and patch.cache is not None:
            cache = patch.cache
            studied = correction.attached(model.transformer, schedule, lambda: cache.cached_now)

            def progress(i: int, n: int) -> None:
                patch.set_progress(i / n, n)
                correction.step = i

        with studied:
            out = guided_euler(model, noise, labels, steps, progress)
        passes = patch.report().cache.passes if patch is not None else ()
    finally:
        tome_core.remove_patch(model.transformer)
    counts = passes[0].to_dict() if passes else {"full": steps, "cached": 0}
    return out, counts


def accuracy(samples: torch.Tensor, labels: torch.Tensor) -> Estimate:
    """The judge's class accuracy over images (n, 3, h, w), or over every frame of clips (n, 3, f, h, w)."""
    if samples.dim() == 5:
        labels = labels.repeat_interleave(samples.shape[2])
        samples = samples.transpose(1, 2).flatten(0, 1)
    with torch.no_grad():
        right = (load_classifier()(samples.clamp(-1, 1)).argmax(1) == labels).float().numpy()
    return bootstrap(right)


def priced(counts: dict[str, int]) -> float | None:
    """A pass's speed-up at FLUX.1's real width (:meth:`BlockCosts.priced` on :mod:`benchmarks.speed.dit_costs`'
    run), or None without one."""
    try:
        results, _ = load_run_data("dit-costs-cpu")
    except FileNotFoundError:
        return None
    return BlockCosts(**results[0]).priced(counts)


# --- token merging's prices -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Merge:
    """Merging at ``ratio`` of the image tokens, ``where`` (see the module), partitions drawn from ``seed``."""

    where: str
    ratio: float
    seed: int = 0

    @property
    def name(self) -> str:
        return f"{self.where}-{self.ratio:g}"


@dataclass(frozen=True)
class Prices:
    """A step's parts in seconds: the blocks' medians (``kind/merge``), the model's outside and our forecast (from
    :mod:`benchmarks.speed.dit_costs`' run), and the model's block counts."""

    blocks: dict[str, float]
    outside: float
    forecast: float
    double: int = 19
    single: int = 38

    def full(self, merge: str = "plain") -> float:
        return (
            self.outside + self.double * self.blocks[f"double/{merge}"] + self.single * self.blocks[f"single/{merge}"]
        )

    def speedup(self, counts: dict[str, int], merge: str = "plain") -> float:
        """Plain's pass over a pass of ``counts`` full and cached steps with ``merge`` in its blocks."""
        cached = self.outside + self.blocks[f"double/{merge}"] + self.forecast
        steps = counts["full"] + counts.get("cached", 0)
        return steps * self.full() / (counts["full"] * self.full(merge) + counts.get("cached", 0) * cached)


def prices(seconds: dict[str, list[float]], config: Config, costs: BlockCosts | None = None) -> Prices:
    """The medians of ``seconds``, with the model's outside and forecast from ``costs`` (by default
    :mod:`benchmarks.speed.dit_costs`' CPU run) where those were measured at ``config``."""
    blocks = {k: statistics.median(v) for k, v in seconds.items()}
    if costs is None:
        with contextlib.suppress(FileNotFoundError):
            costs = BlockCosts(**load_run_data("dit-costs-cpu")[0][0])
    if costs is None or costs.blocks != config:  # (a quick run's tiny sizes: the blocks alone)
        return Prices(blocks, 0.0, 0.0, config.double, config.single)
    outside, forecast = costs.cost("outside"), costs.cost("forecast")  # the linear forecast: the combined runs'
    return Prices(blocks, outside, forecast, config.double, config.single)
