"""Double of Forge's sampler path: ``modules/sd_samplers_kdiffusion.py``, ``sd_samplers_cfg_denoiser.py`` and the
refiner switch in ``sd_samplers_common.py`` (Forge main ``dfdcbab``).

- ``KDiffusionSampler.sample`` / ``sample_img2img`` (l.136-245): ``sampling_prepare(forge_objects.unet)`` (ControlNet
  ``pre_run``: ControlLora builds its model here), the k-diffusion loop, ``sampling_cleanup`` at the end (not in a
  ``finally``). The loop is the WebUI double's Euler/Heun loop (same failure injection, same ``callback_state``).
- ``CFGDenoiser.forward`` (``sd_samplers_cfg_denoiser.py:150-260``): interrupt check, ``apply_refiner`` (which may
  swap ``shared.sd_model`` mid-sampling), then ``on_cfg_denoiser`` with the UN-batched ``x``, the hires CFG
  (``p.hr_cfg``), skip-early-cond / NGMS as ``cond_scale = 1``, then ``sampling_function``; ``step += 1``.
  ``inner_model`` is a schedule linker whose ``inner_model`` is ``shared.sd_model`` (re-read after a refiner swap).
- ``apply_refiner`` (``sd_samplers_common.py:166-211``): at ``step / total_steps >= refiner_switch_at``:
  ``sampling_cleanup`` of the old UNet, reload the refiner checkpoint (the first-pass one is selected again for the
  next reload), ``setup_conds``, ``update_inner_model``, ``sampling_prepare`` of the new UNet. The new engine
  has fresh ``forge_objects``: no built-in token merging, no ``process_before_every_sampling``.
"""

from __future__ import annotations

import torch
from modules import sd_samplers as webui_samplers
from modules import sd_samplers_cfg_denoiser as webui_cfg
from modules import sd_samplers_common, shared
from modules.script_callbacks import (
    AfterCFGCallbackParams,
    CFGDenoiserParams,
    cfg_after_cfg_callback,
    cfg_denoiser_callback,
)
from modules.shared import opts, state

from forge_double import backend
from forge_double import sd_models as forge_models

samplers_names = webui_samplers.samplers_names
fix_p_invalid_sampler_and_scheduler = webui_samplers.fix_p_invalid_sampler_and_scheduler


class ForgeScheduleLinker:
    """``k_diffusion.external.ForgeScheduleLinker``: sigmas from the predictor; ``inner_model`` is the engine."""

    def __init__(self, predictor: backend.EpsPredictor) -> None:
        self.predictor = predictor
        self.inner_model = None

    def get_sigmas(self, n: int) -> torch.Tensor:
        t = torch.linspace(len(self.predictor.sigmas) - 1, 0, n, dtype=torch.float64)
        return torch.cat([self.predictor.sigma(t), torch.zeros(1)]).float()


def apply_refiner(cfg_denoiser, x: torch.Tensor) -> bool:
    p = cfg_denoiser.p
    if p.refiner_switch_at is not None and cfg_denoiser.step / cfg_denoiser.total_steps < p.refiner_switch_at:
        return False
    info = p.refiner_checkpoint_info
    if info is None or shared.sd_model.sd_checkpoint_info == info:
        return False
    p.extra_generation_params["Refiner"] = info.short_title
    p.extra_generation_params["Refiner switch at"] = p.refiner_switch_at
    switch_model(cfg_denoiser, x, info)
    return True


def switch_model(cfg_denoiser, x: torch.Tensor, info) -> None:
    """The model switch of ``apply_refiner``: the old UNet cleaned up, the refiner loaded, the conds redone."""
    p = cfg_denoiser.p
    backend.sampling_cleanup(forge_models.model_data.get_sd_model().forge_objects.unet)
    first_pass = forge_models.model_data.forge_loading_parameters["checkpoint_info"]
    forge_models.select_checkpoint(info.name)
    try:
        forge_models.forge_model_reload()
    finally:
        forge_models.select_checkpoint(first_pass)
    p.setup_conds()
    cfg_denoiser.update_inner_model()
    backend.sampling_prepare(forge_models.model_data.get_sd_model().forge_objects.unet, x=x)


class CFGDenoiser(webui_cfg.CFGDenoiser):
    def __init__(self, sampler) -> None:
        super().__init__(sampler, None)

    @property
    def inner_model(self) -> ForgeScheduleLinker:
        if self.model_wrap is None:
            self.model_wrap = ForgeScheduleLinker(shared.sd_model.forge_objects.unet.model.predictor)
            self.model_wrap.inner_model = shared.sd_model
        return self.model_wrap

    def apply_refiner(self, x, sigma) -> bool:
        return apply_refiner(self, x)

    def forward(self, x, sigma, uncond, cond, cond_scale, s_min_uncond, image_cond):
        if state.interrupted or state.skipped:
            raise sd_samplers_common.InterruptedException
        if self.apply_refiner(x, sigma):
            cond = self.sampler.sampler_extra_args["cond"]
            uncond = self.sampler.sampler_extra_args["uncond"]
        params = CFGDenoiserParams(x, image_cond, sigma, state.sampling_step, state.sampling_steps, cond, uncond, self)
        cfg_denoiser_callback(params)
        if self.p.is_hr_pass:
            cond_scale = self.p.hr_cfg
        if (opts.skip_early_cond > 0 and self.step / self.total_steps <= opts.skip_early_cond) or (
            (self.step % 2 or opts.s_min_uncond_all) and s_min_uncond > 0 and sigma[0] < s_min_uncond
        ):
            cond_scale = 1.0
        denoised, _, _ = backend.sampling_function(self, params, cond_scale)
        self.sampler.last_latent = denoised
        after = AfterCFGCallbackParams(denoised, state.sampling_step, state.sampling_steps)
        cfg_after_cfg_callback(after)
        self.step += 1
        return after.x


class KDiffusionSampler(webui_samplers.EulerSamplerDouble):
    denoiser = CFGDenoiser

    def __init__(self, name: str, sd_model) -> None:
        sd_samplers_common.Sampler.__init__(self, name)
        self.func = webui_samplers._named(webui_samplers.FUNCS.get(name, "sample_euler"))
        self.model_wrap_cfg = self.denoiser(self)
        self.model_wrap = self.model_wrap_cfg.inner_model

    def hand_sigmas(self, p, sigmas: torch.Tensor) -> None:
        """What the host tells the model of the sampler's sigmas before the loop: nothing in Forge main (Neo: all of
        them, ``neo_double.sd_samplers``)."""

    def sample(self, p, x, conditioning, unconditional_conditioning, steps=None, image_conditioning=None):
        unet_patcher = self.model_wrap.inner_model.forge_objects.unet
        backend.sampling_prepare(unet_patcher, x=x)
        steps = steps or p.steps
        sigmas = self.get_sigmas(p, steps)
        x = self.model_wrap.predictor.noise_scaling(sigmas[0], x, torch.zeros_like(x))
        self.initialize(p)
        self.last_latent = x
        self.sampler_extra_args = self._extra_args(p, conditioning, unconditional_conditioning, image_conditioning)
        self.hand_sigmas(p, sigmas)
        samples = self.launch_sampling(steps, lambda: self._euler(p, x, sigmas, self.sampler_extra_args))
        backend.sampling_cleanup(unet_patcher)
        return samples

    def sample_img2img(
        self, p, x, noise, conditioning, unconditional_conditioning, steps=None, image_conditioning=None
    ):
        unet_patcher = self.model_wrap.inner_model.forge_objects.unet
        backend.sampling_prepare(unet_patcher, x=x)
        steps, t_enc = sd_samplers_common.setup_img2img_steps(p, steps)
        sigmas = self.get_sigmas(p, steps)
        sigma_sched = sigmas[steps - t_enc - 1 :]
        xi = self.model_wrap.predictor.noise_scaling(sigma_sched[0], noise, x)
        self.initialize(p)
        self.model_wrap_cfg.init_latent = x
        self.last_latent = x
        self.sampler_extra_args = self._extra_args(p, conditioning, unconditional_conditioning, image_conditioning)
        self.hand_sigmas(p, sigmas)
        samples = self.launch_sampling(t_enc + 1, lambda: self._euler(p, xi, sigma_sched, self.sampler_extra_args))
        backend.sampling_cleanup(unet_patcher)
        return samples


def create_sampler(name: str, model, sampler_class: type[KDiffusionSampler] = KDiffusionSampler) -> KDiffusionSampler:
    name = name or samplers_names[0]
    sampler = sampler_class(name, model)
    options = {"second_order": True} if name == "Heun" else {}
    sampler.config = sd_samplers_common.SamplerData(name, sampler_class, [], options)
    return sampler
