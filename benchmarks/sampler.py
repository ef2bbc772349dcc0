"""The sampling loop the benchmarks share: SD's DDPM schedule, the WebUI's sigmas, classifier-free guidance, and
k-diffusion's Euler and DPM++ 2M steps, written from k-diffusion's definitions (Karras et al. 2022; Lu et al. 2022).

An ε-prediction UNet is sampled as k-diffusion's ``DiscreteEpsDDPMDenoiser`` wraps it for the WebUI: the input is
scaled by ``1 / sqrt(sigma² + 1)``, the timestep is the schedule's (fractional) index of ``sigma``, and
``denoised = x - sigma * eps``. Progress is reported to a callback before every step (``step / steps``), as the
WebUI script reports it to our patch.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Sequence

import torch

TIMESTEPS = 1000
BETA_START, BETA_END = 0.00085, 0.012  # SD's scaled-linear schedule (v1-inference.yaml)
SAMPLERS = ("euler", "dpmpp_2m")
LABELS = {"euler": "Euler", "dpmpp_2m": "DPM++ 2M Karras"}


@functools.cache
def alphas_cumprod() -> torch.Tensor:
    """ᾱ_t of SD's 1000-step scaled-linear DDPM schedule (float64)."""
    betas = torch.linspace(BETA_START**0.5, BETA_END**0.5, TIMESTEPS, dtype=torch.float64) ** 2
    return torch.cumprod(1 - betas, 0)


@functools.cache
def _log_sigmas() -> torch.Tensor:
    ab = alphas_cumprod()
    return (((1 - ab) / ab) ** 0.5).log()


def t_to_sigma(t: torch.Tensor) -> torch.Tensor:
    """k-diffusion's ``DiscreteSchedule.t_to_sigma``: log-linear interpolation between the discrete sigmas."""
    log_sigmas = _log_sigmas()
    t = t.to(torch.float64)
    low, frac = t.floor().long(), t - t.floor()
    high = (low + 1).clamp(max=TIMESTEPS - 1)
    return ((1 - frac) * log_sigmas[low] + frac * log_sigmas[high]).exp()


@functools.cache
def _log_sigma_list() -> tuple[float, ...]:
    return tuple(_log_sigmas().tolist())


def sigma_to_t(sigma: float) -> float:
    """k-diffusion's ``DiscreteSchedule.sigma_to_t``: the fractional timestep of ``sigma`` (in Python numbers: the
    loop reads nothing back from any tensor)."""
    log_sigmas = _log_sigma_list()
    log_sigma = math.log(sigma)
    low = min(max(bisect.bisect_right(log_sigmas, log_sigma) - 1, 0), TIMESTEPS - 2)
    lo, hi = log_sigmas[low], log_sigmas[low + 1]
    w = min(max((lo - log_sigma) / (lo - hi), 0.0), 1.0)
    return (1 - w) * low + w * (low + 1)


def discrete_sigmas(steps: int) -> list[float]:
    """The WebUI's default sigmas for a discrete model (k-diffusion ``get_sigmas``): timesteps evenly spaced from
    999 to 0, their sigmas, then 0."""
    t = torch.linspace(TIMESTEPS - 1, 0, steps, dtype=torch.float64)
    return [*t_to_sigma(t).tolist(), 0.0]


def karras_sigmas(steps: int, rho: float = 7.0) -> list[float]:
    """Karras et al.'s sigmas between the schedule's smallest and largest (k-diffusion ``get_sigmas_karras``), then 0:
    what the WebUI uses for DPM++ 2M (its default scheduler for that sampler)."""
    log_sigmas = _log_sigmas()
    lo, hi = float(log_sigmas[0].exp()) ** (1 / rho), float(log_sigmas[-1].exp()) ** (1 / rho)
    ramp = torch.linspace(0, 1, steps, dtype=torch.float64)
    return [*((hi + ramp * (lo - hi)) ** rho).tolist(), 0.0]


def schedule(sampler: str, steps: int) -> list[float]:
    """The sigmas ``sampler`` runs on in the WebUI (discrete for Euler, Karras for DPM++ 2M)."""
    return discrete_sigmas(steps) if sampler == "euler" else karras_sigmas(steps)


Model = Callable[[torch.Tensor, torch.Tensor, dict], torch.Tensor]
"""``unet(x, timesteps, **conditioning)`` → ε."""


def batched(cond: dict[str, torch.Tensor], uncond: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The UNet's keyword arguments for one call on the cond rows then the uncond rows."""
    return {k: torch.cat([cond[k], uncond[k]]) for k in cond}


class CFGDenoiser:
    """``denoised(x, sigma)`` of an ε-prediction UNet with classifier-free guidance: one UNet call on the cond and
    uncond halves batched together (the WebUI's default; ``conditioning`` holds the cond rows then the uncond
    rows, see :func:`batched`), ``eps = uncond + scale * (cond - uncond)``. Nothing is read back from the device."""

    def __init__(self, unet: Model, conditioning: dict[str, torch.Tensor], scale: float):
        self.unet, self.conditioning, self.scale = unet, conditioning, scale

    def eps(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        """The guided ε at ``x`` (noise level ``sigma``)."""
        t = torch.full((2 * x.shape[0],), sigma_to_t(sigma), dtype=torch.float32, device=x.device)
        scaled = torch.cat([x, x]) * (1 / (sigma**2 + 1) ** 0.5)
        with torch.no_grad():
            eps_cond, eps_uncond = self.unet(scaled, t, **self.conditioning).chunk(2)
        return eps_uncond + self.scale * (eps_cond - eps_uncond)

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        return x - sigma * self.eps(x, sigma)


Progress = Callable[[int, int], None]
"""Called before every step with ``(step, steps)``: the WebUI script reports ``step / steps`` to our patch."""


def sample(
    denoiser: Callable[[torch.Tensor, float], torch.Tensor],
    noise: torch.Tensor,
    sigmas: Sequence[float],
    sampler: str = "euler",
    progress: Progress | None = None,
    on_step: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Sample from ``noise`` (unit variance) down ``sigmas`` with k-diffusion's ``sample_euler`` or
    ``sample_dpmpp_2m``; ``on_step(i, x, denoised)`` sees each step's input and prediction."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler {sampler!r}: one of {SAMPLERS}")
    steps = len(sigmas) - 1
    x = noise * sigmas[0]
    old: torch.Tensor | None = None
    for i in range(steps):
        if progress is not None:
            progress(i, steps)
        sigma, nxt = sigmas[i], sigmas[i + 1]
        denoised = denoiser(x, sigma)
        if on_step is not None:
            on_step(i, x, denoised)
        if sampler == "euler":  # dx/dsigma = (x - denoised) / sigma = eps
            x = x + (x - denoised) / sigma * (nxt - sigma)
        elif nxt == 0:
            x = denoised
        else:  # DPM++ 2M in log-sigma time t = -log(sigma)
            h = math.log(sigma) - math.log(nxt)
            if old is None:
                d = denoised
            else:
                r = (math.log(sigmas[i - 1]) - math.log(sigma)) / h
                d = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * old
            x = (nxt / sigma) * x - math.expm1(-h) * d
        old = denoised
    return x
