"""The cache's deferred correction under the first-order Euler sampler (``cache_correction``; issue 36): a
diffusion transformer's cached steps re-estimated once the next full step is known, and what they should have added
to the latent carried by that full step's output.

A cached step takes the skipped blocks' residual from the forecast of the last full steps: an extrapolation. At the
next full step the residual is known on both sides of those cached steps, so each is re-estimated by interpolation
(the parabola through the last three full steps in the sampler's time; the line through two while only two are
known). Under Euler, ``x ← x + (σ' − σ) v``, what each cached step's output should have added to ``x`` is then
known, and the full step's output carries the difference, ``gain`` of it:

    out_full += gain · Σ_m (σ'_m − σ_m) / (σ'_full − σ_full) · [head(h_m + R̃_m − R̂_m) − head(h_m)]

with ``h_m`` the image stream that entered the output layer (the family's entry) at cached step ``m`` (the live
probe's stream plus the forecast ``R̂_m``), ``R̃_m`` the interpolated residual and ``head`` the output layer on that
step's own arguments (its time modulation included): ``head(h_m)`` is what it gave then, ``head`` runs once more on
the probe's stream plus ``R̃_m``. It adds to the entry's output, which the model
only maps linearly from there (a projection, unpatchifying), and the host's Euler step (``d = (x − denoised) / σ``
is the model's output for flow-matching and epsilon models) and classifier-free guidance combine the calls' outputs
linearly, so guided samples get the same correction. That is Euler's case. Under a linear multistep sampler (DPM++
2M, DEIS, res_multistep, UniPC) the cached steps' outputs also live on in the sampler's history, and a full step's
changed output in turn: :mod:`.samplers` reads the sampler as a linear map and gives the weights, ``W[k, m]``, with
which the full step's output and the next few outputs carry each cached step's difference so that every later input
lands where it should (under Euler: the weight above at the full step, none later); after more than
:data:`HISTORY_UP_TO` cached steps, :data:`LONG_SHARE` of it. The weights need the sampler
and its sigmas, which only the host knows (:meth:`tome_core.session.Session.set_sampler`).

Measured on the lab's trained FLUX- and Wan-layout models (``benchmarks.quality.dit_correction``, 64 seeds): gains
0.5 and 0.75 (the default) keep more than the uncorrected pass at every cache interval on both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import samplers
from .forecast import kept_on, moved_to
from .samplers import LinearSampler

HISTORY_UP_TO = 2
"""Under a multistep sampler (whose outputs live on in its history), a full step after more than this many cached
steps carries :data:`LONG_SHARE` of the gain: past two cached steps the interpolated errors are rough, and the
history spreads them. On the trained FLUX layout (16 seeds, N = 4 … 8) the full gain fell 0.1 dB below the
uncorrected cache under ComfyUI's ``uni_pc``, two thirds of it stayed above it under ``uni_pc``, ``dpmpp_2m`` and
diffusers' UniPC (+0.0 to +0.3 dB); carrying through the full step's output alone fell 0.4 dB below under
``uni_pc``. At 64 seeds (``dit-samplers``) two thirds keep +0.3 to +0.5 dB at N = 4 and 5 under the multistep samplers
but ComfyUI's UniPC (+0.3 and 0.0 there), and stay within 0.1 dB of the uncorrected cache at N = 7 and 8. Euler (no
history) keeps the whole gain."""
LONG_SHARE = 2 / 3


Head = Callable[[tuple, dict, torch.Tensor], torch.Tensor]
"""The family's output layer on a call's arguments with another image stream (:meth:`ResidualLayout.head`)."""


def interpolate(fulls: Sequence[tuple[float, torch.Tensor]], sigma: float) -> torch.Tensor:
    """The residual at ``sigma`` between the last two of ``fulls`` (``(σ, residual)`` of the last full steps, oldest
    first): on the parabola through the last three, or on the line through the last two while only two are known."""
    (s2, r2), (s3, r3) = fulls[-2:]
    if len(fulls) < 3:
        return r2 + (sigma - s2) / (s3 - s2) * (r3 - r2)
    s1, r1 = fulls[-3]
    w1 = (sigma - s2) * (sigma - s3) / ((s1 - s2) * (s1 - s3))
    w2 = (sigma - s1) * (sigma - s3) / ((s2 - s1) * (s2 - s3))
    w3 = (sigma - s1) * (sigma - s2) / ((s3 - s1) * (s3 - s2))
    return w1 * r1 + w2 * r2 + w3 * r3


@dataclass
class _Cached:
    """A cached step as the output layer saw it: its step, its arguments but the image stream (which was ``left``, what
    left the probe, plus the forecast residual, in ``dtype``) and what the output layer gave."""

    step: int
    args: tuple
    kwargs: dict
    left: torch.Tensor
    dtype: torch.dtype
    factor: torch.Tensor | None = None  # the model's scale of the entry's output at this step (a modulation)
    out: torch.Tensor | None = None


class Correction:
    """The correction of one stream's pass through the blocks (see the module), fed by the cache's entry hooks. It
    keeps the last three full steps' residuals and, per cached step, what left the probe (each one image-stream-sized
    tensor, on ``store`` where ``cache_device`` says so) and the output layer's output until the next full step; under
    a multistep sampler, the errors found at a full step until the later outputs that carry them have run."""

    def __init__(self, gain: float, store: torch.device | None = None):
        self.gain, self.store = gain, store
        self._fulls: list[tuple[float, torch.Tensor]] = []  # (σ, residual) of the last three full steps
        self._cached: list[_Cached] = []  # the cached steps since the last full one
        self._carried: list[tuple[dict[int, list[float]], list[torch.Tensor]]] = []  # (weights per step, errors)

    def full(self, sigma: float, residual: torch.Tensor) -> None:
        """A full step at ``sigma`` read the skipped blocks' ``residual`` (the tensor the forecast keeps)."""
        self._fulls = [*self._fulls, (sigma, kept_on(residual, self.store))][-3:]

    def cached(
        self,
        step: int,
        args: tuple,
        kwargs: dict,
        left: torch.Tensor,
        dtype: torch.dtype,
        factor: torch.Tensor | None = None,
    ) -> None:
        """Cached step ``step`` calls the output layer with ``args``/``kwargs`` (the image stream left out: ``left``,
        what left the probe, plus the forecast, in ``dtype``); ``factor``: how the model scales the layer's output at
        this step (:meth:`~tome_core.families.base.Layout.modulation`), or None."""
        self._cached.append(_Cached(step, args, kwargs, kept_on(left, self.store), dtype, factor))

    def output(self, out: torch.Tensor, factor: torch.Tensor | None = None) -> torch.Tensor | None:
        """What the output layer gave at the cached step just recorded; what it gives instead (what earlier full
        steps left it to carry), or None."""
        if self._cached and self._cached[-1].out is None:
            self._cached[-1].out = out
            return self.carry(out, self._cached[-1].step, factor)
        return None

    def correct(
        self, out: torch.Tensor, step: int, sampler: LinearSampler, head: Head, factor: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """The output of full step ``step`` (the output layer's ``out``) carrying the cached steps since the last full
        one under ``sampler`` (:meth:`LinearSampler.carry`: the later outputs' shares are kept for them); None where
        there is nothing to carry (the output stays). Where the model scales the layer's output by a modulation of
        its own (``factor`` here, each cached step's kept with it), the errors are taken at their steps' scale and
        carried at this one's: the model's output moves as the errors say."""
        cached, self._cached = self._cached, []
        if cached and len(self._fulls) >= 2:
            fulls = [(s, moved_to(r, out.device)) for s, r in self._fulls]
            sigmas = sampler.sigmas
            steps, errors = [], []
            for c in cached:
                if c.out is None:  # another hook replaced the output layer's call: nothing known to correct
                    continue
                left = moved_to(c.left, out.device)
                image = (left + interpolate(fulls, sigmas[c.step]).to(left.dtype)).to(c.dtype)
                steps.append(c.step)
                error = head(c.args, c.kwargs, image) - c.out
                errors.append(error if c.factor is None else error * c.factor)
            if errors:
                rows = sampler.carry(step, steps)
                if len(steps) > HISTORY_UP_TO and len(rows) > 1:
                    rows = {k: [LONG_SHARE * w for w in row] for k, row in rows.items()}
                self._carried.append((rows, errors))
        return self.carry(out, step, factor)

    def carry(self, out: torch.Tensor, step: int, factor: torch.Tensor | None = None) -> torch.Tensor | None:
        """``out`` of step ``step`` plus ``gain`` of what it carries (over ``factor``, the model's scale of it at this
        step, where it has one); None where it carries nothing."""
        self._carried = [(rows, errors) for rows, errors in self._carried if max(rows, default=-1) >= step]
        total = None
        for rows, errors in self._carried:
            row = rows.get(step)
            if row is None:
                continue
            if total is None:
                total = torch.zeros_like(out)
            for weight, error in zip(row, errors):
                total += weight * error
        if total is None:
            return None
        return out + self.gain * (total if factor is None else total / factor)


def output_is_direction(prediction: Any) -> bool:
    """Whether a host's prediction type (ComfyUI's ``model_sampling``, Forge's ``predictor``) makes the denoised image
    ``x − σ·out`` (flow matching and epsilon prediction), so that Euler's direction ``(x − denoised) / σ`` is the
    model's output itself, which the correction needs: asked of its own ``calculate_denoised``."""
    try:
        sigma = torch.tensor([0.5])
        ones, zeros = torch.ones(1, 1, 1, 1), torch.zeros(1, 1, 1, 1)
        scale = prediction.calculate_denoised(sigma, ones, zeros)  # −σ where the output is the direction
        skip = prediction.calculate_denoised(sigma, zeros, ones)  # x itself
        return bool(torch.allclose(scale, -sigma.view(1, 1, 1, 1)) and torch.allclose(skip, ones))
    except Exception:  # another interface: not known to be one
        return False


def why_not_corrected(shown: str, name: str, churn: float, prediction: Any) -> str | None:
    """Why the correction cannot act on a host's sampling, or None where it can: the host's sampler (``shown``: its
    name as the host shows it; ``name``: :func:`.samplers.name_of` its function) is a linear one without ``churn``
    (:func:`.samplers.why_not`), and its ``prediction`` makes the model's output the direction
    (:func:`output_is_direction`)."""
    why = samplers.why_not(shown, name, churn)
    if why is None and not output_is_direction(prediction):
        why = "this model's output is not the sampler's direction (v-prediction or EDM)"
    return why
