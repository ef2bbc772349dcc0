"""The step cache emulated by hooks, for :mod:`benchmarks.quality.correction_ceiling` only: every block runs at every
step, and at a cached step what enters the output layer is replaced by what left the probe (the first block) plus a
residual the study chooses. So a study can try what the cache itself cannot (knowing the future, running a step
twice) and measure how far each idea is from plain's sample; its speed is priced from what the idea would run, not
from what the emulation runs.

The residual is the cache's: what entered the output layer minus what left the probe (the image stream; FLUX's
double-stream block gives ``(text, image)``), at the full steps. The uncorrected cache (the linear forecast in the
sampler's time from the last two full steps) and its deferred correction (:mod:`tome_core.caching.correction`, order
2) are emulated too, and held to the cache's own samples by ``tests/test_correction_ceiling.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from benchmarks.lab.dit import CFG, Trained
from tome_core.caching.correction import interpolate

Residual = torch.Tensor | None
"""What a call feeds the output layer past its probe: a residual, or None (the blocks' own: a full step)."""


@dataclass
class Hooks:
    """The probe's output and the blocks' own residual at the last call, and the residual the next call uses."""

    use: Residual = None
    probe: torch.Tensor | None = None
    live: torch.Tensor | None = None  # the blocks' own residual at the last call

    @contextlib.contextmanager
    def on(self, transformer: torch.nn.Module) -> Iterator[None]:
        blocks = getattr(transformer, "transformer_blocks", None) or transformer.blocks

        def probed(module, args, out) -> None:
            self.probe = out[1] if isinstance(out, tuple) else out

        def entering(module, args):
            h = args[0]
            self.live = h - self.probe.to(h.dtype)
            if self.use is None:
                return None
            return (self.probe.to(h.dtype) + self.use, *args[1:])

        hooks = [blocks[0].register_forward_hook(probed), transformer.norm_out.register_forward_pre_hook(entering)]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()


@dataclass
class Guided:
    """Guided calls of a trained DiT under :class:`Hooks` (cond and uncond batched, CFG as the lab's sampling)."""

    model: Trained
    labels: torch.Tensor
    hooks: Hooks = field(default_factory=Hooks)

    def __call__(self, x: torch.Tensor, sigma: float, use: Residual = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The guided velocity at ``x``, ``sigma`` with ``use`` past the probe; and the blocks' own residual there."""
        self.hooks.use = use
        empty = torch.full_like(self.labels, -1)
        with torch.no_grad():
            cond, uncond = self.model(
                torch.cat([x, x]), torch.full((2 * len(x),), sigma), torch.cat([self.labels, empty])
            ).chunk(2)
        return uncond + CFG * (cond - uncond), self.hooks.live


def full_steps(steps: int, interval: int) -> set[int]:
    """The uniform schedule's full steps: every ``interval``-th, and the last."""
    return {*range(0, steps, interval), steps - 1}


def extrapolate(fulls: list[tuple[float, torch.Tensor]], sigma: float, scale: float = 1.0) -> torch.Tensor:
    """The linear forecast at ``sigma`` from the last two of ``fulls`` (``(time, residual)``), its slope times
    ``scale``; the last one's residual while only one is known."""
    if len(fulls) < 2:
        return fulls[-1][1]
    (s0, r0), (s1, r1) = fulls[-2:]
    return r1 + scale * (sigma - s1) / (s1 - s0) * (r1 - r0)


@dataclass(frozen=True)
class Variant:
    """One way to sample with the emulated cache at a cache interval (see :func:`sample`).

    ``forecast``: the cached steps' residual from the past, ``linear`` (the cache's) or ``parabola`` (through the last
    three full steps), with its slope times ``slope``, in the sampler's time or the step index (``time``).
    ``correction``: what happens at a full step after cached ones: None; ``linear`` (the cache's ``cache_correction``:
    each cached step re-estimated on the parabola through the full steps around it, ``gain`` of what its output then
    adds carried by the full step's output); ``replay`` (the cached steps run again from where they began with the
    re-estimated residual and their probe live, and the full step's output taken at where they end, its blocks'
    residual kept); ``replay-full`` (the same, the full step's blocks run again there). ``known``: the cached steps'
    residual interpolated from plain's own full steps on both sides (the future known: no method, a ceiling)."""

    name: str
    forecast: str = "linear"
    slope: float = 1.0
    time: str = "sigma"
    correction: str | None = None
    gain: float = 1.0
    known: bool = False


def sample(
    guided: Guided, noise: torch.Tensor, schedule: list[float], interval: int, variant: Variant, plain_residuals=None
) -> tuple[torch.Tensor, dict[str, int]]:
    """Flow-matching Euler over ``schedule`` with the cache emulated at ``interval`` as ``variant`` says; the samples
    and what a pass like it would run: ``full`` and ``cached`` steps, and the ``again`` full and ``probes`` cached steps
    its correction runs once more. ``plain_residuals`` (step → the blocks' residual of plain's pass) for ``known``."""
    steps = len(schedule) - 1
    full = full_steps(steps, interval)
    counts = {"full": len(full), "cached": steps - len(full), "again": 0, "probes": 0}
    x, fulls, cached = noise.clone(), [], []

    def when(i: int) -> float:
        return float(i) if variant.time == "step" else schedule[i]

    for i in range(steps):
        sigma, here = schedule[i], schedule[i + 1] - schedule[i]
        if i not in full:
            if variant.known:
                residual = _known(plain_residuals, sorted(full), i, schedule)
            elif variant.forecast == "parabola" and len(fulls) >= 3:
                residual = interpolate([(when(k), r) for k, r in fulls], when(i))
            else:
                residual = extrapolate([(when(k), r) for k, r in fulls], when(i), variant.slope)
            v, _ = guided(x, sigma, residual)
            cached.append((i, x, v))
            x = x + here * v
            continue
        v, live = guided(x, sigma)
        fulls = [*fulls, (i, live)][-3:]
        if cached and variant.correction is not None and len(fulls) >= 2:
            known = [(schedule[k], r) for k, r in fulls]
            redone = {m: interpolate(known, schedule[m]) for m, _, _ in cached}
            if variant.correction == "linear":
                moved = sum(
                    (schedule[m + 1] - schedule[m]) * (guided(xm, schedule[m], redone[m])[0] - vm)
                    for m, xm, vm in cached
                )
                v = v + variant.gain * moved / here
            else:
                replayed = cached[0][1]
                for m, _, _ in cached:
                    replayed = replayed + (schedule[m + 1] - schedule[m]) * guided(replayed, schedule[m], redone[m])[0]
                counts["probes"] += len(cached)
                if variant.correction == "replay-full":
                    v, live = guided(replayed, sigma)
                    fulls[-1] = (i, live)
                    counts["again"] += 1
                else:
                    v, _ = guided(replayed, sigma, live)
                x = replayed
        cached = []
        x = x + here * v
    return x, counts


def _known(residuals: dict[int, torch.Tensor], full: list[int], i: int, schedule: list[float]) -> torch.Tensor:
    """Step ``i``'s residual interpolated in the sampler's time through the two full steps before it and the two
    after (fewer at the ends), from ``residuals`` (plain's pass)."""
    around = [k for k in full if k < i][-2:] + [k for k in full if k > i][:2]
    out = torch.zeros_like(residuals[around[0]])
    for a in around:
        w = 1.0
        for b in around:
            if b != a:
                w *= (schedule[i] - schedule[b]) / (schedule[a] - schedule[b])
        out += w * residuals[a]
    return out


def plain(guided: Guided, noise: torch.Tensor, schedule: list[float]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """Plain's pass (every step full) and each step's blocks' residual."""
    x, residuals = noise.clone(), {}
    for i in range(len(schedule) - 1):
        v, residuals[i] = guided(x, schedule[i])
        x = x + (schedule[i + 1] - schedule[i]) * v
    return x, residuals
