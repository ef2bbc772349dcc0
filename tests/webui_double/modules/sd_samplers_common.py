"""Double of modules/sd_samplers_common.py (WebUI 1.10.1): InterruptedException, setup_img2img_steps, Sampler.

``Sampler.launch_sampling`` (~L265-281) sets ``state.sampling_steps``/``sampling_step`` and turns an
``InterruptedException`` (raised by the CFG denoiser on interrupt/skip) into returning ``last_latent``: so an
interrupted generation still decodes, runs postprocess hooks and returns normally. Any other exception
(NansException, OOM, a failing UNet) propagates. ``callback_state`` (~L256-263) runs AFTER each step's
denoiser call and sets ``state.sampling_step = i``: the first denoiser call of step i therefore sees the
previous value (0, 0, 1, 2, ... for Euler; 0, 0, 0, 1, 1, 2, ... for Heun, whose second call per step comes
after the callback), which is what ``CFGDenoiserParams.sampling_step`` carries in the real WebUI too.
``apply_refiner`` (~L158-202) is called by the CFG denoiser first thing in every call.
"""

from collections import namedtuple

import torch

from modules import shared
from modules.shared import opts, state

SamplerDataTuple = namedtuple("SamplerData", ["name", "constructor", "aliases", "options"])


class SamplerData(SamplerDataTuple):
    """mirrors ~L11-19: the expected number of denoiser calls is doubled for second-order samplers"""

    def total_steps(self, steps):
        if self.options.get("second_order", False):
            steps = steps * 2
        return steps


class InterruptedException(BaseException):
    pass


def apply_refiner(cfg_denoiser, sigma=None):
    """mirrors ~L158-202: switch ``shared.sd_model`` to the refiner once the pass is far enough along (by the
    model's timestep of ``sigma``, or by sampling steps), then new conds and a new inner model for the denoiser."""
    from modules import sd_models

    p = cfg_denoiser.p
    if opts.refiner_switch_by_sample_steps or sigma is None:
        completed_ratio = cfg_denoiser.step / cfg_denoiser.total_steps
        p.extra_generation_params["Refiner switch by sampling steps"] = True
    else:
        timestep = torch.argmin(torch.abs(cfg_denoiser.inner_model.sigmas.to(sigma.device) - torch.max(sigma)))
        completed_ratio = (999 - timestep) / 1000
    if p.refiner_switch_at is not None and completed_ratio < p.refiner_switch_at:
        return False
    if p.refiner_checkpoint_info is None or shared.sd_model.sd_checkpoint_info == p.refiner_checkpoint_info:
        return False
    if getattr(p, "enable_hr", False):
        if opts.hires_fix_refiner_pass == "first pass" and p.is_hr_pass:
            return False
        if opts.hires_fix_refiner_pass == "second pass" and not p.is_hr_pass:
            return False
        if opts.hires_fix_refiner_pass != "second pass":
            p.extra_generation_params["Hires refiner"] = opts.hires_fix_refiner_pass
    p.extra_generation_params["Refiner"] = p.refiner_checkpoint_info.short_title
    p.extra_generation_params["Refiner switch at"] = p.refiner_switch_at
    with sd_models.SkipWritingToConfig():
        sd_models.reload_model_weights(info=p.refiner_checkpoint_info)
    p.setup_conds()
    cfg_denoiser.update_inner_model()
    return True


def setup_img2img_steps(p, steps=None):
    # mirrors ~L22-31
    if opts.img2img_fix_steps or steps is not None:
        requested_steps = steps or p.steps
        steps = int(requested_steps / min(p.denoising_strength, 0.999)) if p.denoising_strength > 0 else 0
        t_enc = requested_steps - 1
    else:
        steps = p.steps
        t_enc = int(min(p.denoising_strength, 0.999) * steps)
    return steps, t_enc


class Sampler:
    def __init__(self, funcname):
        self.funcname = funcname
        self.func = funcname
        self.eta = None
        self.last_latent = None
        self.s_min_uncond = None
        self.stop_at = None
        self.p = None
        self.model_wrap_cfg = None
        self.sampler_extra_args = None
        self.options = {}
        self.config = None

    def callback_state(self, d):
        step = d["i"]
        if self.stop_at is not None and step > self.stop_at:
            raise InterruptedException
        state.sampling_step = step
        shared.total_tqdm.update()

    def launch_sampling(self, steps, func):
        self.model_wrap_cfg.steps = steps
        self.model_wrap_cfg.total_steps = self.config.total_steps(steps)
        state.sampling_steps = steps
        state.sampling_step = 0
        try:
            return func()
        except RecursionError:
            return self.last_latent
        except InterruptedException:
            return self.last_latent

    def initialize(self, p):
        # mirrors ~L285-296 (eta/churn parameters left out: the double's Euler has none)
        self.p = p
        self.model_wrap_cfg.p = p
        self.model_wrap_cfg.mask = p.mask if hasattr(p, "mask") else None
        self.model_wrap_cfg.nmask = p.nmask if hasattr(p, "nmask") else None
        self.model_wrap_cfg.step = 0
        self.model_wrap_cfg.image_cfg_scale = getattr(p, "image_cfg_scale", None)
        self.s_min_uncond = getattr(p, "s_min_uncond", 0.0)
        return {}
