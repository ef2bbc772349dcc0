"""``comfy/model_base.py`` and ``comfy/model_sampling.py`` (3cd7b32f): the model a patcher holds.

- ``BaseModel`` (an ``nn.Module``) holds the UNet at ``diffusion_model`` and the noise schedule at ``model_sampling``.
  ``apply_model`` (model_base.py:164-169) runs the ``APPLY_MODEL`` wrappers from the call's ``transformer_options``
  around ``_apply_model`` (l.171-211): ``calculate_input``, ``t = model_sampling.timestep(sigma)``, then
  ``diffusion_model(xc, t, context=c_crossattn, control=control, transformer_options=transformer_options, **extra)``:
  the timestep positional, everything else by keyword; ``calculate_denoised``.
- ``ModelSamplingDiscrete`` + ``EPS`` (model_sampling.py:30-50, 107-182): SD's scaled-linear schedule, ``sigmas``
  ascending (``sigma_min = sigmas[0]``), ``timestep`` = the nearest index in log sigma, ``sigma`` log-interpolated,
  ``percent_to_sigma``; ``noise_scaling`` with ``max_denoise``.
- ``extra_conds`` (l.213+): the cross-attention context, SDXL's ``y`` where the UNet takes one.
- ``Flux`` (model_base.py:837) with ``ModelSamplingFlux`` + ``CONST`` (model_sampling.py:62-76, 340-377): rectified
  flow, the sigma (0–1, shifted by ``flux_time_shift(1.15, 1, t)``) passed as the timestep, the input unscaled,
  ``denoised = x - out * sigma``; the pooled text embedding as ``y``.
- ``WAN21`` (model_base.py, ``supported_models.WAN21_T2V`` shift 8) with ``ModelSamplingDiscreteFlow`` + ``CONST``
  (model_sampling.py:244-284): ``sigma = time_snr_shift(8, t / 1000)``, the timestep is ``sigma * 1000``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn

from . import patcher_extension


class _Sampling(nn.Module):
    """What the schedules share: the ends of ``sigmas`` and the denoised image from the model's prediction."""

    @property
    def sigma_min(self):
        return self.sigmas[0]

    @property
    def sigma_max(self):
        return self.sigmas[-1]

    @staticmethod
    def _shape(sigma, ndim):
        return sigma.view(sigma.shape[:1] + (1,) * (ndim - 1))

    def calculate_denoised(self, sigma, model_output, model_input):
        return model_input - model_output * self._shape(sigma, model_output.ndim)


class ModelSamplingDiscrete(_Sampling):
    def __init__(self):
        super().__init__()
        betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
        alphas_cumprod = torch.cumprod(1.0 - betas, dim=0)
        sigmas = ((1 - alphas_cumprod) / alphas_cumprod) ** 0.5
        self.register_buffer("sigmas", sigmas.float(), persistent=False)
        self.register_buffer("log_sigmas", sigmas.log().float(), persistent=False)
        self.sigma_data = 1.0

    def timestep(self, sigma):
        dists = sigma.log() - self.log_sigmas[:, None]
        return dists.abs().argmin(dim=0).view(sigma.shape).to(sigma.device)

    def sigma(self, timestep):
        t = torch.clamp(timestep.float(), min=0, max=len(self.sigmas) - 1)
        low, high = t.floor().long(), t.ceil().long()
        w = t.frac()
        return ((1 - w) * self.log_sigmas[low] + w * self.log_sigmas[high]).exp()

    def percent_to_sigma(self, percent):
        if percent <= 0.0:
            return 999999999.9
        if percent >= 1.0:
            return 0.0
        return self.sigma(torch.tensor((1.0 - percent) * 999.0)).item()

    def calculate_input(self, sigma, noise):
        return noise / (self._shape(sigma, noise.ndim) ** 2 + self.sigma_data**2) ** 0.5

    def noise_scaling(self, sigma, noise, latent_image, max_denoise=False):
        sigma = self._shape(sigma.reshape(-1)[:1].expand(noise.shape[0]), noise.ndim)
        noise = noise * torch.sqrt(1.0 + sigma**2.0) if max_denoise else noise * sigma
        return noise + latent_image

    def inverse_noise_scaling(self, sigma, latent):
        return latent


class ModelSamplingFlux(_Sampling):
    def __init__(self, shift: float = 1.15, timesteps: int = 10000, multiplier: float = 1.0):
        super().__init__()
        self.shift, self.multiplier = shift, multiplier
        ts = torch.arange(1, timesteps + 1) / timesteps * multiplier
        self.register_buffer("sigmas", self.sigma(ts), persistent=False)

    def timestep(self, sigma):
        return sigma

    def sigma(self, timestep):
        return math.exp(self.shift) / (math.exp(self.shift) + (1 / timestep - 1))

    def percent_to_sigma(self, percent):
        if percent <= 0.0:
            return 1.0
        if percent >= 1.0:
            return 0.0
        return float(self.sigma(torch.tensor(1.0 - percent)))

    def calculate_input(self, sigma, noise):
        return noise

    def noise_scaling(self, sigma, noise, latent_image, max_denoise=False):
        sigma = self._shape(sigma.reshape(-1)[:1].expand(noise.shape[0]), noise.ndim)
        return sigma * noise + (1.0 - sigma) * latent_image

    def inverse_noise_scaling(self, sigma, latent):
        return latent / (1.0 - self._shape(sigma.reshape(-1)[:1].expand(latent.shape[0]), latent.ndim))


class ModelSamplingDiscreteFlow(ModelSamplingFlux):
    """The Flux schedule's flow-matching parts with another time: ``time_snr_shift`` of ``timestep / multiplier``."""

    def __init__(self, shift: float = 8.0, multiplier: float = 1000.0):
        super().__init__(shift, 1000, multiplier)

    def timestep(self, sigma):
        return sigma * self.multiplier

    def sigma(self, timestep):
        t = timestep / self.multiplier
        return self.shift * t / (1 + (self.shift - 1) * t)

    def percent_to_sigma(self, percent):
        if percent <= 0.0:
            return 1.0
        if percent >= 1.0:
            return 0.0
        return self.shift * (1.0 - percent) / (1 + (self.shift - 1) * (1.0 - percent))


class BaseModel(nn.Module):
    def __init__(self, diffusion_model: nn.Module, adm_channels: int = 0):
        super().__init__()
        self.diffusion_model = diffusion_model
        self.model_sampling = ModelSamplingDiscrete()
        self.adm_channels = adm_channels
        self.model_config = SimpleNamespace(
            unet_config={"model_channels": getattr(diffusion_model, "model_channels", 0)}
        )

    def apply_model(self, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options={}, **kwargs):  # noqa: B006 (ComfyUI's)
        return patcher_extension.WrapperExecutor.new_class_executor(
            self._apply_model,
            self,
            patcher_extension.get_all_wrappers(patcher_extension.WrappersMP.APPLY_MODEL, transformer_options),
        ).execute(x, t, c_concat, c_crossattn, control, transformer_options, **kwargs)

    def _apply_model(self, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        sigma = t
        xc = self.model_sampling.calculate_input(sigma, x)
        t = self.model_sampling.timestep(t).float()
        out = self.diffusion_model(
            xc, t, context=c_crossattn, control=control, transformer_options=transformer_options, **kwargs
        )
        return self.model_sampling.calculate_denoised(sigma, out.float(), x)

    def extra_conds(self, batch: int) -> dict:
        """SDXL's ``y`` (``adm``) where the UNet has a label embedding; zeros (the tests' conditioning has none)."""
        return {"y": torch.zeros(batch, self.adm_channels)} if self.adm_channels else {}

    def process_latent_in(self, latent):
        return latent

    def process_latent_out(self, latent):
        return latent

    def memory_required(self, input_shape) -> float:
        return math.prod(input_shape) * 4.0


class Flux(BaseModel):
    """FLUX (``model_base.Flux``): the flow-matching schedule; ``y`` is the pooled text embedding (zeros here)."""

    def __init__(self, diffusion_model: nn.Module):
        super().__init__(diffusion_model, adm_channels=diffusion_model.vec_in_dim)
        self.model_sampling = ModelSamplingFlux()


class WAN21(BaseModel):
    """Wan 2.1 text-to-video (``model_base.WAN21``): the discrete-flow schedule, shift 8."""

    def __init__(self, diffusion_model: nn.Module):
        super().__init__(diffusion_model)
        self.model_sampling = ModelSamplingDiscreteFlow()
