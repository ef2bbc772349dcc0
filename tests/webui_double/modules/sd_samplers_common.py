"""Double of modules/sd_samplers_common.py (WebUI 1.10.1): InterruptedException, setup_img2img_steps, Sampler.

``Sampler.launch_sampling`` (~L265-281) sets ``state.sampling_steps``/``sampling_step`` and turns an
``InterruptedException`` (raised by the CFG denoiser on interrupt/skip) into returning ``last_latent``: so an
interrupted generation still decodes, runs postprocess hooks and returns normally. Any other exception
(NansException, OOM, a failing UNet) propagates. ``callback_state`` (~L256-263) runs AFTER each step's
denoiser call and sets ``state.sampling_step = i``: the first denoiser call of step i therefore sees the
previous value (0, 0, 1, 2, ... for Euler; 0, 0, 0, 1, 1, 2, ... for Heun, whose second call per step comes
after the callback), which is what ``CFGDenoiserParams.sampling_step`` carries in the real WebUI too.
"""

from collections import namedtuple

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
