"""The caches other UIs ship, written from their published descriptions (no code copied), as anchors for the fidelity
benchmark: each decides per UNet call whether to run the UNet, and what to return when it does not.

Every rule here runs on the fidelity models' ldm ``UNetModel`` for one sampling run of classifier-free guidance (one
call a step, cond and uncond batched), told the step before each call as the WebUI tells our patch
(:meth:`StepRule.set_progress`). What each call cost is kept per step as a *kind* (:data:`KINDS`), which
:mod:`benchmarks.lab.prices` prices with real-width costs:

* **First Block Cache** (ParaAttention's FBCache, as Comfy-WaveSpeed applies it to SDXL UNets): the UNet's first block
  (``input_blocks[1]``) runs every step; when the relative L1 change of its residual against the last computed step's is
  below the threshold, the rest of the UNet is skipped and the last computed step's output residual (output minus
  input) is added to the input. First and last step computed; no cap on consecutive skips (WaveSpeed's default).
* **TeaCache without its polynomial** (DenOfEquity's sd-forge-blockcache for UNets): the relative L1 change of the raw
  input from step to step, accumulated; while the sum stays below the threshold the whole UNet is skipped and the
  output residual reused. First step computed ("uncached start steps" 1), last step computed.
* **EasyCache** (Zhou et al. 2025, arXiv 2507.02860; ComfyUI's node defaults: threshold 0.2, from 15 % to 95 % of the
  sampling): the rate at which the model's output changes with its input, ``k = |Δout| / |Δin|`` between the last two
  computed steps, predicts each step's relative output change ``k |Δx| / |out|``; while their sum stays below the
  threshold the step reuses the last computed output residual. Outside 15–95 %, and until ``k`` is known, computed.
* **Spectrum** (arXiv 2603.01623; Forge Neo's built-in, from ruwwww/comfyui-spectrum-sdxl): ``warmup_steps`` computed
  steps, then one computed step in every ``window`` (the window widening by ``flex_window`` after each), and computed
  steps again from ``stop_caching_step`` of the sampling; the other steps' output is forecast from the history of
  computed outputs (up to ``max(degree + 2, 8)`` of them): a ridge fit (``lam``) of Chebyshev polynomials up to
  ``degree`` in the step index, blended ``w : 1 - w`` with the linear extrapolation of the last two. Neo's defaults:
  w 0.25, degree 6, lam 0.5, window 2, flex 0, warmup 6, stop 0.9.

DeepCache's own schedules run on our step cache (``cache_forecast`` off): uniform, and the paper's non-uniform one
(:func:`quadratic_full_steps`, through :class:`FixedSteps`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from ldm.modules.diffusionmodules.util import timestep_embedding
from torch import nn

from tome_core.settings import ToMeSettings
from tome_core.steps import Call

KINDS = ("full", "partial", "first", "skip")
"""What a step cost: the whole UNet; our cached step (the shallow branch); FBCache's skipped step (the UNet's first
two blocks); a step that ran no block (the output estimated from earlier ones)."""


def rel_l1(a: torch.Tensor, b: torch.Tensor) -> float:
    """``mean |a - b| / mean |b|`` (as the block caches measure change)."""
    return float((a - b).abs().mean() / b.abs().mean().clamp_min(1e-12))


def seed_rows(t: torch.Tensor, seeds: int) -> torch.Tensor:
    """A batched call's rows ``(2 * seeds, ...)`` (cond rows, then uncond rows) as ``(seeds, 2, ...)``: each seed's own."""
    return t.reshape(2, seeds, *t.shape[1:]).transpose(0, 1)


def per_seed_rel_l1(a: torch.Tensor, b: torch.Tensor, seeds: int) -> torch.Tensor:
    """:func:`rel_l1` of each seed's rows (cond and uncond together): a vector of ``seeds``."""
    diff = seed_rows((a - b).abs(), seeds).reshape(seeds, -1).mean(1)
    return diff / seed_rows(b.abs(), seeds).reshape(seeds, -1).mean(1).clamp_min(1e-12)


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A per-seed mask as a mask over a batched call's rows, broadcastable to ``like``."""
    return mask.repeat(2).reshape(-1, *([1] * (like.dim() - 1)))


class StepRule:
    """One anchor's rule over one sampling run on ``unet`` (installed as an instance ``forward``, removed after).

    The call batches the cond and uncond rows of every seed; each seed decides for itself, as if it were sampled alone
    (the rules' state is per seed). The whole UNet runs for every row, and a seed whose rule skips the step takes the
    rule's estimate instead: what the step *cost* that seed is its kind (:data:`KINDS`), priced afterwards."""

    name = "rule"

    def __init__(self) -> None:
        self.kinds: list[list[str]] = []  # per step, per seed
        self.step, self.steps = 0, 1
        self.unet: nn.Module | None = None

    # --- the sampling run's side ---------------------------------------------------------------------------------
    def install(self, unet: nn.Module) -> StepRule:
        self.unet = unet
        unet.forward = self._call  # benchmark only: a forward of the instance, deleted by remove()
        return self

    def remove(self) -> None:
        if self.unet is not None:
            self.unet.__dict__.pop("forward", None)
            self.unet = None

    def set_progress(self, fraction: float, steps: int) -> None:
        self.step, self.steps = round(fraction * steps), steps

    @property
    def last(self) -> bool:
        return self.step >= self.steps - 1

    def counts(self) -> list[dict[str, int]]:
        """What each seed's steps cost, by kind."""
        per_seed = list(zip(*self.kinds)) if self.kinds else []
        return [{kind: list(steps).count(kind) for kind in KINDS} for steps in per_seed]

    # --- the UNet's side ---------------------------------------------------------------------------------------
    def _call(self, x: torch.Tensor, timesteps: torch.Tensor, context: torch.Tensor, y: Any = None) -> torch.Tensor:
        seeds = x.shape[0] // 2
        out, computed = self.call(x, timesteps, context, y, seeds)
        self.kinds.append([self.computed_kind if c else self.skipped_kind for c in computed.tolist()])
        return out

    computed_kind, skipped_kind = "full", "skip"

    def call(self, x, timesteps, context, y, seeds: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The call's output and, per seed, whether the seed computed the step (a bool vector)."""
        raise NotImplementedError

    def full(self, x, timesteps, context, y) -> torch.Tensor:
        return type(self.unet).forward(self.unet, x, timesteps, context, y)

    def guarded(self, seeds: int) -> torch.Tensor:
        """The seeds that must compute this step whatever the rule says: all of them at the first and the last."""
        return torch.full((seeds,), self.step == 0 or self.last)


def embedding(unet: nn.Module, timesteps: torch.Tensor, y: Any) -> torch.Tensor:
    """The ldm UNet's time (and class) embedding, as its forward computes it."""
    emb = unet.time_embed(timestep_embedding(timesteps, unet.model_channels, repeat_only=False))
    return emb + unet.label_emb(y) if getattr(unet, "num_classes", None) is not None else emb


def rest_of_unet(unet: nn.Module, hs: list[torch.Tensor], emb, context) -> torch.Tensor:
    """The ldm UNet's forward from after ``input_blocks[len(hs) - 1]`` on, given the outputs of the blocks so far."""
    h = hs[-1]
    for module in unet.input_blocks[len(hs) :]:
        h = module(h, emb, context)
        hs.append(h)
    h = unet.middle_block(h, emb, context)
    for module in unet.output_blocks:
        h = module(torch.cat([h, hs.pop()], dim=1), emb, context)
    return unet.out(h)


class FirstBlockCache(StepRule):
    name = "fbcache"
    skipped_kind = "first"

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold
        self.reference: torch.Tensor | None = None  # the first block's residual at each seed's last computed step
        self.residual: torch.Tensor | None = None  # output minus input there

    def call(self, x, timesteps, context, y, seeds):
        emb = embedding(self.unet, timesteps, y)
        h0 = self.unet.input_blocks[0](x, emb, context)
        h1 = self.unet.input_blocks[1](h0, emb, context)
        first = h1 - h0
        out = rest_of_unet(self.unet, [h0, h1], emb, context)
        if self.reference is None:
            computed = torch.ones(seeds, dtype=torch.bool)
        else:
            computed = self.guarded(seeds) | (per_seed_rel_l1(first, self.reference, seeds) >= self.threshold)
        keep = _rows(computed, x)
        if self.reference is not None:
            out = torch.where(keep, out, x + self.residual)
            first = torch.where(_rows(computed, first), first, self.reference)
        self.reference, self.residual = (
            first,
            torch.where(keep, out - x, self.residual if self.residual is not None else 0),
        )
        return out, computed


class TeaCacheInput(StepRule):
    name = "teacache"

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold
        self.previous: torch.Tensor | None = None  # the last step's input
        self.residual: torch.Tensor | None = None  # each seed's output minus input at its last computed step
        self.accumulated: torch.Tensor | None = None

    def call(self, x, timesteps, context, y, seeds):
        out = self.full(x, timesteps, context, y)
        if self.previous is None or self.residual is None:
            computed = torch.ones(seeds, dtype=torch.bool)
            self.accumulated = torch.zeros(seeds)
        else:
            self.accumulated = self.accumulated + per_seed_rel_l1(x, self.previous, seeds)
            computed = self.guarded(seeds) | (self.accumulated >= self.threshold)
            out = torch.where(_rows(computed, x), out, x + self.residual)
        self.accumulated = torch.where(computed, torch.zeros(seeds), self.accumulated)
        keep = _rows(computed, x)
        self.residual = torch.where(keep, out - x, self.residual if self.residual is not None else 0)
        self.previous = x
        return out, computed


class EasyCache(StepRule):
    name = "easycache"

    def __init__(self, threshold: float, start: float = 0.15, end: float = 0.95) -> None:
        super().__init__()
        self.threshold, self.start, self.end = threshold, start, end
        self.computed_io: list[tuple[torch.Tensor, torch.Tensor]] = []  # each seed's last two computed (in, out)
        self.previous: torch.Tensor | None = None  # the last step's input
        self.accumulated: torch.Tensor | None = None

    def call(self, x, timesteps, context, y, seeds):
        out = self.full(x, timesteps, context, y)
        progress = 1.0 - float(timesteps.flatten()[0]) / 1000.0  # EasyCache's percentages are of the timesteps
        computed = torch.ones(seeds, dtype=torch.bool)
        if self.accumulated is None:
            self.accumulated = torch.zeros(seeds)
        eligible = self.start <= progress < self.end and not self.last and len(self.computed_io) == 2
        if eligible and self.previous is not None:
            (x0, o0), (x1, o1) = self.computed_io

            def mean_abs(t: torch.Tensor) -> torch.Tensor:
                return seed_rows(t.abs(), seeds).reshape(seeds, -1).mean(1)

            rate = mean_abs(o1 - o0) / mean_abs(x1 - x0).clamp_min(1e-12)
            self.accumulated = self.accumulated + rate * mean_abs(x - self.previous) / mean_abs(o1).clamp_min(1e-12)
            computed = self.accumulated >= self.threshold
            out = torch.where(_rows(computed, x), out, x + (o1 - x1))
        self.accumulated = torch.where(computed, torch.zeros(seeds), self.accumulated)
        keep = _rows(computed, x)
        if len(self.computed_io) < 2:
            self.computed_io.append((x, out))
        else:
            (x0, o0), (x1, o1) = self.computed_io
            self.computed_io = [
                (torch.where(keep, x1, x0), torch.where(keep, o1, o0)),
                (torch.where(keep, x, x1), torch.where(keep, out, o1)),
            ]
        self.previous = x
        return out, computed


class Spectrum(StepRule):
    name = "spectrum"

    def __init__(
        self,
        w: float = 0.25,
        degree: int = 6,
        lam: float = 0.5,
        window: float = 2.0,
        flex_window: float = 0.0,
        warmup_steps: int = 6,
        stop_caching_step: float = 0.9,
    ) -> None:
        super().__init__()
        self.w, self.degree, self.lam = w, degree, lam
        self.window, self.flex, self.warmup, self.stop = float(window), flex_window, warmup_steps, stop_caching_step
        self.history: list[tuple[int, torch.Tensor]] = []  # (step, output) of computed steps
        self.since_computed = 0

    def call(self, x, timesteps, context, y, seeds):
        computes = self._computes() or not self.history  # a fixed schedule: every seed alike
        if computes:
            out = self.full(x, timesteps, context, y)
            self.history = [*self.history, (self.step, out)][-max(self.degree + 2, 8) :]
        else:
            out = self._forecast(self.step).to(x.dtype)
        return out, torch.full((seeds,), computes)

    def _computes(self) -> bool:
        """Spectrum's schedule: warmup, then one computed step per (widening) window, then computed to the end."""
        if self.step < self.warmup or self.step >= int(self.steps * self.stop):
            return True
        if (self.since_computed + 1) % math.floor(self.window) == 0:
            self.window += self.flex
            self.since_computed = 0
            return True
        self.since_computed += 1
        return False

    def _forecast(self, step: int) -> torch.Tensor:
        steps = torch.tensor([*(s for s, _ in self.history), step], dtype=torch.float32) / self.steps * 2 - 1
        *taus, at = steps.tolist()  # the step index mapped to [-1, 1]
        fit = chebyshev_ridge([(tau, h) for tau, (_, h) in zip(taus, self.history)], at, self.degree, self.lam)
        (s0, h0), (s1, h1) = self.history[-2:] if len(self.history) > 1 else (self.history[-1],) * 2
        taylor = h1 + (step - s1) / (s1 - s0) * (h1 - h0) if s1 != s0 else h1
        return (1 - self.w) * taylor + self.w * fit


def chebyshev_ridge(history: Sequence[tuple[float, torch.Tensor]], at: float, degree: int, lam: float) -> torch.Tensor:
    """Spectrum's fit: Chebyshev polynomials T_0 … T_degree of the time (mapped to [-1, 1]) fitted by ridge regression
    (``lam``) to the ``history`` of (time, tensor), evaluated at time ``at`` (shaped and typed as the last tensor)."""
    last = history[-1][1]
    values = torch.stack([h.reshape(-1).float() for _, h in history])
    design = _chebyshev(torch.tensor([tau for tau, _ in history], dtype=torch.float32), degree)
    gram = design.T @ design + lam * torch.eye(design.shape[1])
    coefficients = torch.linalg.solve(gram, design.T @ values)
    return (_chebyshev(torch.tensor([float(at)]), degree) @ coefficients).reshape(last.shape).to(last.dtype)


def _chebyshev(tau: torch.Tensor, degree: int) -> torch.Tensor:
    """Chebyshev polynomials T_0 … T_degree of ``tau`` (one row per value)."""
    tau = tau.reshape(-1, 1)
    columns = [torch.ones_like(tau), tau]
    while len(columns) <= degree:
        columns.append(2 * tau * columns[-1] - columns[-2])
    return torch.cat(columns[: degree + 1], dim=1)


# --- DeepCache's non-uniform schedule, on our step cache ----------------------------------------------------------------


def quadratic_full_steps(steps: int, count: int, center: float, power: float = 1.4) -> list[int]:
    """DeepCache's non-uniform 1:N schedule (Ma et al. 2024, §3.3): ``count`` full steps spaced by a power law around
    the step ``center`` (densest there, sparsest at the ends), step 0 among them; the power is lowered in steps of 0.02
    until the steps are distinct (the paper: ``center`` 15 of 50 steps, power 1.4)."""
    while power > 1.0:
        u = torch.linspace(-(center ** (1 / power)), (steps - center) ** (1 / power), count + 1, dtype=torch.float64)
        points = sorted({int(center + math.copysign(abs(float(v)) ** power, float(v))) for v in u})
        points = [p for p in points if 0 <= p < steps]
        if 0 not in points:
            points = [0, *points]
        if len(points) >= count:
            return points[:count]
        power -= 0.02
    return sorted({round(i * steps / count) for i in range(count)})


class FixedSteps:
    """A schedule for :class:`tome_core.caching.StepCache` (``cache.make_schedule``) whose full steps are a given list; the guard
    rails (first and last step full) as ours."""

    def __init__(self, full_steps: Sequence[int]) -> None:
        self.full_steps = frozenset(full_steps)

    def __call__(self, settings: ToMeSettings) -> FixedSteps:
        return self

    def may_cache(self, call: Call, since_full: int, x, timed: bool = True) -> bool:
        return call.step not in self.full_steps and not call.last and call.step > 0

    def full(self, call: Call, x) -> None:
        pass

    def tracks(self) -> tuple:
        return ()


def remove_rule(unet: nn.Module) -> None:
    """Take a rule's ``forward`` off ``unet`` (nothing when it has none)."""
    forward = unet.__dict__.get("forward")
    owner = getattr(forward, "__self__", None)
    if isinstance(owner, StepRule):
        owner.remove()
