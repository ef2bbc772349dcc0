"""The sampling loop the benchmarks share: SD's DDPM schedule, the WebUI's sigmas, classifier-free guidance, and the
WebUI's samplers: k-diffusion's Euler, Euler a, DPM++ 2M, DPM++ SDE and DPM++ 2M SDE, written from k-diffusion's
definitions (Karras et al. 2022; Lu et al. 2022), each on the scheduler A1111 1.10.1 gives it; DDIM as A1111's
``sd_samplers_timesteps_impl.ddim`` runs it (η 0: Euler on the sigmas of its integer timesteps 951, 901, …, 1, one call
fewer than the steps); UniPC through diffusers' ``UniPCMultistepScheduler`` set as A1111's (bh1, order 3, lower order
at the end, time-uniform, ending at the smallest noise level; integer timesteps where A1111 passes their fractional neighbours).

The noise that ancestral and SDE samplers add comes from one generator per image, seeded from that image's seed
(``noise_seeds``), so an image gets the same noise alone or in a batch; the SDE samplers draw it independently per
step where A1111 draws it from a Brownian tree (the same law for each step's increment).

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
SAMPLERS = ("euler", "dpmpp_2m", "euler_a", "dpmpp_sde", "dpmpp_2m_sde", "unipc", "ddim", "dpmpp_2m_comfy")
LABELS = {
    "euler": "Euler",
    "dpmpp_2m": "DPM++ 2M Karras",
    "dpmpp_2m_comfy": "DPM++ 2M Karras, ComfyUI's timesteps",
    "euler_a": "Euler a",
    "dpmpp_sde": "DPM++ SDE Karras",
    "dpmpp_2m_sde": "DPM++ 2M SDE",
    "unipc": "UniPC",
    "ddim": "DDIM",
}
STOCHASTIC = ("euler_a", "dpmpp_sde", "dpmpp_2m_sde")
"""The samplers that add fresh noise at every step."""
INTEGER = ("ddim", "unipc", "dpmpp_2m_comfy")
"""The samplers whose UNet calls get integer timesteps: A1111's DDIM and UniPC, and DPM++ 2M as ComfyUI runs it
(``ModelSamplingDiscrete.timestep``: the nearest of the schedule's timesteps in log-sigma, where the WebUI's
k-diffusion denoiser passes the fractional one)."""


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


def exponential_sigmas(steps: int) -> list[float]:
    """Sigmas evenly spaced in log-sigma between the schedule's largest and smallest (k-diffusion
    ``get_sigmas_exponential``), then 0: the WebUI's scheduler for DPM++ 2M SDE."""
    log_sigmas = _log_sigmas()
    return [
        *torch.linspace(float(log_sigmas[-1]), float(log_sigmas[0]), steps, dtype=torch.float64).exp().tolist(),
        0.0,
    ]


def ddim_sigmas(steps: int) -> list[float]:
    """The sigmas of A1111's DDIM timesteps (``range(0, 1000, 1000 // steps) + 1``, run from the highest): its
    ``steps - 1`` calls step down to the smallest, which it returns without a last call."""
    t = torch.arange(0, TIMESTEPS, TIMESTEPS // steps, dtype=torch.float64).add(1).clamp(0, TIMESTEPS - 1).flip(0)
    return t_to_sigma(t).tolist()


def schedule(sampler: str, steps: int) -> list[float]:
    """The sigmas ``sampler`` runs on in the WebUI: Karras for DPM++ 2M and DPM++ SDE, exponential for DPM++ 2M SDE,
    DDIM's own, else the discrete default (UniPC: the same, it runs on the timesteps)."""
    if sampler in ("dpmpp_2m", "dpmpp_sde", "dpmpp_2m_comfy"):
        return karras_sigmas(steps)
    if sampler == "dpmpp_2m_sde":
        return exponential_sigmas(steps)
    return ddim_sigmas(steps) if sampler == "ddim" else discrete_sigmas(steps)


Model = Callable[[torch.Tensor, torch.Tensor, dict], torch.Tensor]
"""``unet(x, timesteps, **conditioning)`` → ε."""


def batched(cond: dict[str, torch.Tensor], uncond: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The UNet's keyword arguments for one call on the cond rows then the uncond rows."""
    return {k: torch.cat([cond[k], uncond[k]]) for k in cond}


class CFGDenoiser:
    """``denoised(x, sigma)`` of an ε-prediction UNet with classifier-free guidance: one UNet call on the cond and
    uncond halves batched together (the WebUI's default; ``conditioning`` holds the cond rows then the uncond
    rows, see :func:`batched`), ``eps = uncond + scale * (cond - uncond)``. Nothing is read back from the device."""

    def __init__(self, unet: Model, conditioning: dict[str, torch.Tensor], scale: float, integer: bool = False):
        self.unet, self.conditioning, self.scale = unet, conditioning, scale
        self.integer = integer  # timesteps rounded to integers (the WebUI's DDIM, PLMS and UniPC pass integers)

    def eps(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        """The guided ε at ``x`` (noise level ``sigma``)."""
        t = sigma_to_t(sigma)
        t = torch.full((2 * x.shape[0],), round(t) if self.integer else t, dtype=torch.float32, device=x.device)
        scaled = torch.cat([x, x]) * (1 / (sigma**2 + 1) ** 0.5)
        with torch.no_grad():
            eps_cond, eps_uncond = self.unet(scaled, t, **self.conditioning).chunk(2)
        return eps_uncond + self.scale * (eps_cond - eps_uncond)

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        return x - sigma * self.eps(x, sigma)


Progress = Callable[[int, int], None]
"""Called before every step with ``(step, steps)``: the WebUI script reports ``step / steps`` to our patch."""


class Noise:
    """Fresh unit-variance noise for an ancestral or SDE step: one generator per image, seeded from its seed."""

    def __init__(self, seeds: Sequence[int]) -> None:
        self.generators = [torch.Generator().manual_seed(1_000_003 + int(seed)) for seed in seeds]

    def __call__(self, like: torch.Tensor) -> torch.Tensor:
        rows = [torch.randn(like.shape[1:], generator=g, dtype=torch.float32) for g in self.generators]
        return torch.stack(rows).to(like)


def ancestral_step(sigma: float, nxt: float, eta: float = 1.0) -> tuple[float, float]:
    """k-diffusion's ``get_ancestral_step``: ``(sigma_down, sigma_up)`` from ``sigma`` to ``nxt``."""
    if not eta or not nxt:
        return nxt, 0.0
    up = min(nxt, eta * (nxt**2 * (sigma**2 - nxt**2) / sigma**2) ** 0.5)
    return (nxt**2 - up**2) ** 0.5, up


def sample(
    denoiser: Callable[[torch.Tensor, float], torch.Tensor],
    noise: torch.Tensor,
    sigmas: Sequence[float],
    sampler: str = "euler",
    progress: Progress | None = None,
    on_step: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
    noise_seeds: Sequence[int] | None = None,
) -> torch.Tensor:
    """Sample from ``noise`` (unit variance) down ``sigmas`` with ``sampler`` (see the module); ``on_step(i, x,
    denoised)`` sees each step's input and prediction (its first call's, for DPM++ SDE); ``noise_seeds``: the images'
    seeds, for the noise the stochastic samplers add (default 0, 1, …)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler {sampler!r}: one of {SAMPLERS}")
    if sampler == "unipc":
        return _unipc(denoiser, noise, len(sigmas) - 1, progress, on_step)
    steps = len(sigmas) - 1
    fresh = Noise(range(len(noise)) if noise_seeds is None else noise_seeds) if sampler in STOCHASTIC else None
    x = noise * sigmas[0]
    old: torch.Tensor | None = None
    h_last: float | None = None
    for i in range(steps):
        if progress is not None:
            progress(i, steps)
        sigma, nxt = sigmas[i], sigmas[i + 1]
        denoised = denoiser(x, sigma)
        if on_step is not None:
            on_step(i, x, denoised)
        if sampler in ("euler", "ddim"):  # dx/dsigma = (x - denoised) / sigma = eps
            x = x + (x - denoised) / sigma * (nxt - sigma)
        elif sampler == "euler_a":
            down, up = ancestral_step(sigma, nxt)
            x = x + (x - denoised) / sigma * (down - sigma)
            if nxt > 0:
                x = x + fresh(x) * up
        elif nxt == 0:
            x = denoised
        elif sampler == "dpmpp_sde":
            x = _dpmpp_sde_step(denoiser, x, denoised, sigma, nxt, fresh)
        elif sampler == "dpmpp_2m_sde":  # midpoint solver, eta 1
            h = math.log(sigma) - math.log(nxt)
            x = (nxt / sigma) * math.exp(-h) * x - math.expm1(-2 * h) * denoised
            if old is not None:
                x = x - 0.5 * math.expm1(-2 * h) * (h / h_last) * (denoised - old)
            x = x + fresh(x) * nxt * (-math.expm1(-2 * h)) ** 0.5
            h_last = h
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


def _dpmpp_sde_step(denoiser, x: torch.Tensor, denoised: torch.Tensor, sigma: float, nxt: float, fresh: Noise):
    """One step of k-diffusion's ``sample_dpmpp_sde`` (η 1, r ½): a noisy half step in log-sigma, a second call
    there, then the whole step from both predictions."""
    t, t_next = -math.log(sigma), -math.log(nxt)
    s = t + (t_next - t) / 2
    down, up = ancestral_step(sigma, math.exp(-s))
    x2 = (down / sigma) * x - math.expm1(t + math.log(down)) * denoised
    x2 = x2 + fresh(x) * up
    denoised2 = denoiser(x2, math.exp(-s))
    down, up = ancestral_step(sigma, nxt)
    x = (down / sigma) * x - math.expm1(t + math.log(down)) * denoised2  # r = ½: the second prediction alone
    return x + fresh(x) * up


def _unipc(denoiser, noise: torch.Tensor, steps: int, progress, on_step) -> torch.Tensor:
    """UniPC (Zhao et al. 2023) as A1111 sets it, through diffusers' scheduler on SD's DDPM schedule."""
    from diffusers import UniPCMultistepScheduler

    scheduler = UniPCMultistepScheduler(
        beta_start=BETA_START,
        beta_end=BETA_END,
        beta_schedule="scaled_linear",
        solver_order=3,
        solver_type="bh1",
        lower_order_final=True,
        predict_x0=True,
        timestep_spacing="linspace",
        final_sigmas_type="sigma_min",  # A1111's ends at the schedule's smallest noise level, not at 0
    )
    scheduler.set_timesteps(steps)
    ab = alphas_cumprod()
    x = noise.clone()  # variance-preserving: x_t = sqrt(ab) x0 + sqrt(1 - ab) eps
    for i, t in enumerate(scheduler.timesteps.tolist()):
        if progress is not None:
            progress(i, steps)
        scale = float(ab[t]) ** 0.5
        sigma = ((1 - float(ab[t])) / float(ab[t])) ** 0.5
        eps = denoiser.eps(x / scale, sigma)
        if on_step is not None:
            on_step(i, x / scale, x / scale - sigma * eps)
        x = scheduler.step(eps, t, x).prev_sample
    return x
