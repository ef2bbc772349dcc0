"""Deferred correction of a cached pass, for :mod:`benchmarks.quality.dit_correction` only (issue 36: the study
behind the cache's ``cache_correction``, with its variants and diffusers' Wan, on which the setting does not act).

A cached step takes the skipped blocks' residual from the linear forecast of the last two full steps: an
extrapolation. At the next full step the residual is known on both sides of those cached steps, so each can be
re-estimated by interpolation (``order`` 1: the line through the two full steps around it; 2: the parabola through
those and the full step before, in the sampler's time). Under the flow-matching Euler sampler, ``x ← x + (σ' − σ) v``,
what the cached steps' outputs should have added to ``x`` is then known, and the full step's own output carries the
difference, ``gain`` of it, over its step:

    v_full += gain · Σ_m (σ'_m − σ_m) / (σ'_full − σ_full) · [head_m(h_m + R̃_m − R̂_m) − head_m(h_m)]

with ``h_m`` what entered the output layer at cached step ``m`` (the live probe's stream plus the forecast ``R̂_m``),
``R̃_m`` the interpolated residual and ``head_m`` the model's output layer at that step's time (FLUX: ``norm_out``
with its time embedding, then ``proj_out``; Wan: its modulated ``norm_out``, then ``proj_out``). The cache's own
forecast is untouched: with ``gain`` 0 the pass is the cache's, bit for bit.

It rests on the sampler: exact for first-order Euler only (a multistep sampler reuses the corrected output in later
steps), and it needs the next step's time (``σ'``), which a model does not see. Hence a study here, on the lab's
Euler sampler, with the step index and schedule handed in by the sampling loop. The cache's own ``cache_correction``
(:mod:`tome_core.caching.correction`) is this study's order 2 on the families whose output layer is one module (not
diffusers' Wan, whose modulation this study re-creates): the tests hold them equal on the FLUX layout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import benchmarks.lab.forecasters as forecasters
from tome_core.caching import correction as cache_correction
from tome_core.caching.forecast import Forecast
from tome_core.settings import DEFAULTS

DEFAULT = f"order 2, gain {DEFAULTS.cache_correction:g}"
"""The study's variant that is the setting ``cache_correction`` at its default (0.75), as the runs name it."""


def interpolate(fulls: list[tuple[float, torch.Tensor]], sigma: float, order: int) -> torch.Tensor:
    """The residual at ``sigma`` between the last two of ``fulls`` (``(σ, residual)`` of the last full steps, oldest
    first): on their line (``order`` 1), else as the cache's own correction interpolates
    (:func:`tome_core.caching.correction.interpolate`: the parabola through the last three)."""
    return cache_correction.interpolate(fulls[-2:] if order == 1 else fulls, sigma)


@dataclass
class _Cached:
    step: int
    entering: torch.Tensor  # what entered the output layer
    time_embedding: torch.Tensor
    forecast: torch.Tensor  # the residual the cache forecast


@dataclass
class DeferredCorrection:
    """The correction for one sampling run of a FLUX- or Wan-layout transformer (see the module)."""

    order: int = 2
    gain: float = 0.5
    schedule: list[float] = field(default_factory=list)
    step: int = 0
    _fulls: list[tuple[float, torch.Tensor]] = field(default_factory=list)
    _cached: list[_Cached] = field(default_factory=list)
    _seen: dict = field(default_factory=dict)  # this call's output-layer input, time embedding and forecast

    def forecast_factory(self):
        """The step cache's forecast, recording for the correction what it adds and predicts."""
        correction = self

        class Recorded(Forecast):
            def add(self, time, deep: torch.Tensor, probe: torch.Tensor | None = None) -> None:
                correction._fulls = [*correction._fulls, (correction.schedule[correction.step], deep)][-3:]
                super().add(time, deep, probe)

            def predict(self, time, probe: torch.Tensor | None = None) -> torch.Tensor | None:
                correction._seen["forecast"] = out = super().predict(time, probe)
                return out

        return Recorded

    @contextlib.contextmanager
    def attached(self, transformer: torch.nn.Module, schedule: list[float], cached_now) -> Iterator[None]:
        """While inside, sampling ``transformer`` on ``schedule`` is corrected (the loop sets :attr:`step` before each
        step; ``cached_now()`` says whether the call running is a cached one)."""
        self.schedule, self.step, self._fulls, self._cached = schedule, 0, [], []
        wan = hasattr(transformer, "scale_shift_table") and hasattr(transformer, "condition_embedder")

        def output_layer(h: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
            if not wan:
                return transformer.norm_out(h, temb)
            shift, scale = (transformer.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
            return (transformer.norm_out(h.float()) * (1 + scale) + shift).type_as(h)

        def entering(module, args) -> None:
            self._seen["entering"] = args[0]
            if not wan:
                self._seen["time_embedding"] = args[1]

        def corrected(module, args, out: torch.Tensor) -> torch.Tensor | None:
            if cached_now():
                seen = self._seen
                self._cached.append(
                    _Cached(self.step, seen["entering"], seen.pop("time_embedding"), seen.pop("forecast"))
                )
                return None
            cached, self._cached = self._cached, []
            if not cached or len(self._fulls) < 2 or self.gain == 0:
                return None
            total = torch.zeros_like(out)
            here = self.schedule[self.step + 1] - self.schedule[self.step]
            for c in cached:
                sigma = self.schedule[c.step]
                moved = interpolate(self._fulls, sigma, self.order) - c.forecast
                change = output_layer(c.entering + moved, c.time_embedding) - output_layer(c.entering, c.time_embedding)
                total += (self.schedule[c.step + 1] - sigma) / here * F.linear(change, transformer.proj_out.weight)
            return out + self.gain * total

        hooks = [transformer.norm_out.register_forward_pre_hook(entering)]
        if wan:
            hooks.append(
                transformer.condition_embedder.register_forward_hook(
                    lambda module, args, out: self._seen.__setitem__("time_embedding", out[0])
                )
            )
        hooks.append(transformer.proj_out.register_forward_hook(corrected))
        try:
            with forecasters.swapped(self.forecast_factory()):
                yield
        finally:
            for hook in hooks:
                hook.remove()
