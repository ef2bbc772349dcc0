"""Double of Neo's refiner switch, ``modules/sd_samplers_common.py:229-324`` ``apply_refiner`` (called by the CFG
denoiser with the step's sigma, ``sd_samplers_cfg_denoiser.py:117``), and the sampler's sigmas handed to the model
(``transformer_options["sampling_sigmas"]``, ``sd_samplers_kdiffusion.py:193, 248``); the rest of the sampler is
Forge's (``forge_double.sd_samplers``).

- When: by sigma unless ``opts.refiner_use_steps`` (l.233-238): the switch comes at the first step whose sigma is at
  most ``refiner_switch_at`` (the UI's "Switch at (in sigmas)", 0.875 by default for Wan 2.2); with
  ``refiner_use_steps``, at ``step / total_steps >= refiner_switch_at`` as in Forge. Never twice in one generation
  (``ORIGINAL_CHECKPOINT``, l.240-242), and never with hires fix (l.248-250: it prints an error and keeps the model).
- How: the infotext keys first (l.252-253); then either ``opts.refiner_fast_sd`` ("Reload state_dict only", l.255-304):
  the refiner's weights are loaded **into the same diffusion model** (``backend/state_dict.py:6-7``,
  ``model.load_state_dict``, in place) and ``ORIGINAL_CHECKPOINT`` remembers the first one, whose weights the Refiner
  script's ``postprocess`` loads back after the generation (``processing_scripts/refiner.py:67-112``; here: the end
  of ``process_images``); or Forge's way (l.306-324): ``sampling_cleanup``, the refiner checkpoint loaded as a new
  engine, ``setup_conds``, ``update_inner_model``, ``sampling_prepare``.
"""

from __future__ import annotations

from forge_double import sd_models as forge_models
from forge_double import sd_samplers as forge
from modules import shared
from modules.shared import opts

original_checkpoint: dict | None = None
"""``ORIGINAL_CHECKPOINT``: the first model's weights while the refiner's are loaded in their place."""


def restore_original() -> None:
    """The Refiner script's ``postprocess``: the first model's weights back in the diffusion model."""
    global original_checkpoint
    if original_checkpoint is not None:
        shared.sd_model.forge_objects.unet.model.diffusion_model.load_state_dict(original_checkpoint)
        original_checkpoint = None


def apply_refiner(cfg_denoiser, x, sigma) -> bool:
    global original_checkpoint
    p = cfg_denoiser.p
    switch_at = p.refiner_switch_at
    if not switch_at:
        return False
    if opts.refiner_use_steps:
        if switch_at > cfg_denoiser.step / cfg_denoiser.total_steps:
            return False
    elif float(sigma) > switch_at:
        return False
    if original_checkpoint is not None:
        return False
    info = p.refiner_checkpoint_info
    if info is None or shared.sd_model.sd_checkpoint_info == info:
        return False
    if getattr(p, "enable_hr", False):
        print("\n\n[Error]Refiner does not support Hires. fix\n\n")
        return False
    p.extra_generation_params["Refiner"] = info.short_title
    p.extra_generation_params["Refiner switch at"] = switch_at
    if opts.refiner_fast_sd:
        model = shared.sd_model.forge_objects.unet.model.diffusion_model
        original_checkpoint = {k: v.clone() for k, v in model.state_dict().items()}
        refiner = forge_models.checkpoints[info.name]().forge_objects.unet.model.diffusion_model
        model.load_state_dict(refiner.state_dict())
        return True
    forge.switch_model(cfg_denoiser, x, info)
    return True


class CFGDenoiser(forge.CFGDenoiser):
    def apply_refiner(self, x, sigma) -> bool:
        return apply_refiner(self, x, sigma[0])


class KDiffusionSampler(forge.KDiffusionSampler):
    denoiser = CFGDenoiser

    def hand_sigmas(self, p, sigmas) -> None:
        """``sd_samplers_kdiffusion.py:193, 248``: all of the sampler's sigmas (img2img too, which runs their tail)."""
        p.sd_model.forge_objects.unet.model_options["transformer_options"]["sampling_sigmas"] = sigmas


def create_sampler(name: str, model) -> KDiffusionSampler:
    return forge.create_sampler(name, model, KDiffusionSampler)
