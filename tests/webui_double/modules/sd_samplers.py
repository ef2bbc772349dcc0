"""Double of the k-diffusion sampler path (modules/sd_samplers.py, sd_samplers_kdiffusion.py, k_diffusion).

Every sampler name but "Heun" runs the same deterministic Euler loop (k_diffusion.sampling.sample_euler
without churn): ``denoised = CFGDenoiser(x, sigma)``; ``callback_state({'i': i})``; ``x += d * dt``.
"Heun" is second order (k_diffusion.sampling.sample_heun without churn): a second denoiser call at
sigma[i+1] AFTER step i's callback, except on the last step; its SamplerData says ``second_order`` so that
``CFGDenoiser.total_steps`` is twice the steps, as in the real sd_samplers_kdiffusion.py.
The inner model is a CompVisDenoiser (eps parameterisation): ``c_in = 1/sqrt(sigma^2+1)``,
``eps = sd_model.apply_model(x * c_in, t(sigma), cond)`` -> ``x - eps * sigma``; sigmas are the model's
discrete sigmas spaced uniformly in t (the "Automatic" schedule of Euler). Each sampler's ``func`` is named after the
k-diffusion function the real name runs (``KDiffusionSampler.func``, sd_samplers_kdiffusion.py: ``sample_euler`` for
"Euler", ``sample_dpmpp_2m`` for "DPM++ 2M", ...): Euler's runs (k-diffusion's, without churn), the others are
stand-ins whose name is what an extension reads and which raise if run.

TEST-ONLY FAILURE INJECTION: if the processing object has a callable ``_test_fail_at_step``, the loop calls
``p._test_fail_at_step(i, x)`` right before step i's denoiser call. It may raise (e.g. ``NansException``,
``torch.OutOfMemoryError``, ``RuntimeError("CUDA out of memory")`` -> propagates like a failure inside the
real sampler), call ``shared.state.interrupt()``/``skip()`` (-> handled as in the real CFGDenoiser), or return
a tensor that replaces x (e.g. ``x * float('nan')`` -> the real NaN check in processing raises NansException).
"""

import numpy as np
import torch

from modules import sd_samplers_cfg_denoiser, sd_samplers_common
from modules.shared import opts

samplers_names = ["DPM++ 2M", "Euler", "Euler a", "DDIM", "Heun"]
"""the first is the default, as samplers[0] in the real sd_samplers.py"""
FUNCS = {
    "DPM++ 2M": "sample_dpmpp_2m",
    "Euler": "sample_euler",
    "Euler a": "sample_euler_ancestral",
    "DDIM": "ddim",
    "Heun": "sample_heun",
}
"""The function each name runs in the real WebUI (k-diffusion's; DDIM's own)."""


def sample_euler(model, x, sigmas, extra_args=None, callback=None, disable=None):
    """k-diffusion's ``sample_euler`` without churn (what the double's loop runs), for an extension that runs the
    sampler's ``func`` itself (ToMe reads the sampler's linear map from it)."""
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **(extra_args or {}))
        x = x + (x - denoised) / sigmas[i] * (sigmas[i + 1] - sigmas[i])
    return x


def _named(name: str):
    if name == "sample_euler":
        return sample_euler

    def func(*args, **kwargs):
        raise NotImplementedError("the double samples with EulerSamplerDouble._euler")

    func.__name__ = func.__qualname__ = name
    return func


class CompVisDenoiserDouble(torch.nn.Module):
    def __init__(self, sd_model):
        super().__init__()
        self.inner_model = sd_model
        ac = sd_model.alphas_cumprod.double()
        self.sigmas = ((1 - ac) / ac) ** 0.5
        self.log_sigmas = self.sigmas.log()

    def sigma_to_t(self, sigma):
        t = np.interp(sigma.double().log().cpu().numpy(), self.log_sigmas.numpy(), np.arange(len(self.sigmas)))
        return torch.as_tensor(t, dtype=torch.float32, device=sigma.device)

    def t_to_sigma(self, t):
        log_sigma = np.interp(t.numpy(), np.arange(len(self.sigmas)), self.log_sigmas.numpy())
        return torch.as_tensor(np.exp(log_sigma), dtype=torch.float32)

    def get_sigmas(self, n):
        t = torch.linspace(len(self.sigmas) - 1, 0, n, dtype=torch.float64)
        return torch.cat([self.t_to_sigma(t), torch.zeros(1)])

    def forward(self, x, sigma, cond):
        c_in = 1 / (sigma**2 + 1) ** 0.5
        eps = self.inner_model.apply_model(x * c_in[:, None, None, None], self.sigma_to_t(sigma), cond)
        return x - eps * sigma[:, None, None, None]


class EulerSamplerDouble(sd_samplers_common.Sampler):
    def __init__(self, name, sd_model):
        super().__init__(name)
        self.func = _named(FUNCS.get(name, "sample_euler"))
        self.model_wrap = CompVisDenoiserDouble(sd_model)
        self.model_wrap_cfg = sd_samplers_cfg_denoiser.CFGDenoiser(self, self.model_wrap)

    def get_sigmas(self, p, steps):
        if p.sampler_noise_scheduler_override:
            return p.sampler_noise_scheduler_override(steps)
        return self.model_wrap.get_sigmas(steps)

    def _euler(self, p, x, sigmas, extra_args):
        s_in = x.new_ones([x.shape[0]])
        for i in range(len(sigmas) - 1):
            fail = getattr(p, "_test_fail_at_step", None)
            if callable(fail):
                replaced = fail(i, x)
                if isinstance(replaced, torch.Tensor):
                    x = replaced
            denoised = self.model_wrap_cfg(x, sigmas[i] * s_in, **extra_args)
            d = (x - denoised) / sigmas[i]
            self.callback_state({"x": x, "i": i, "sigma": sigmas[i], "sigma_hat": sigmas[i], "denoised": denoised})
            dt = sigmas[i + 1] - sigmas[i]
            if self.config.options.get("second_order") and sigmas[i + 1] != 0:
                x_2 = x + d * dt
                d_2 = (x_2 - self.model_wrap_cfg(x_2, sigmas[i + 1] * s_in, **extra_args)) / sigmas[i + 1]
                x = x + (d + d_2) / 2 * dt
            else:
                x = x + d * dt
        return x

    def _extra_args(self, p, conditioning, unconditional_conditioning, image_conditioning):
        return {
            "cond": conditioning,
            "image_cond": image_conditioning,
            "uncond": unconditional_conditioning,
            "cond_scale": p.cfg_scale,
            "s_min_uncond": self.s_min_uncond,
        }

    def sample(self, p, x, conditioning, unconditional_conditioning, steps=None, image_conditioning=None):
        # mirrors KDiffusionSampler.sample ~L190-236
        steps = steps or p.steps
        sigmas = self.get_sigmas(p, steps)
        x = x * sigmas[0]
        self.initialize(p)
        self.last_latent = x
        self.sampler_extra_args = self._extra_args(p, conditioning, unconditional_conditioning, image_conditioning)
        return self.launch_sampling(steps, lambda: self._euler(p, x, sigmas, self.sampler_extra_args))

    def sample_img2img(
        self, p, x, noise, conditioning, unconditional_conditioning, steps=None, image_conditioning=None
    ):
        # mirrors KDiffusionSampler.sample_img2img ~L124-188
        steps, t_enc = sd_samplers_common.setup_img2img_steps(p, steps)
        sigmas = self.get_sigmas(p, steps)
        sigma_sched = sigmas[steps - t_enc - 1 :]
        xi = x + noise * sigma_sched[0]
        if opts.img2img_extra_noise > 0:
            p.extra_generation_params["Extra noise"] = opts.img2img_extra_noise
            xi += noise * opts.img2img_extra_noise
        self.initialize(p)
        self.model_wrap_cfg.init_latent = x
        self.last_latent = x
        self.sampler_extra_args = self._extra_args(p, conditioning, unconditional_conditioning, image_conditioning)
        return self.launch_sampling(t_enc + 1, lambda: self._euler(p, xi, sigma_sched, self.sampler_extra_args))


def create_sampler(name, model):
    name = name or samplers_names[0]
    sampler = EulerSamplerDouble(name, model)
    options = {"second_order": True} if name == "Heun" else {}
    sampler.config = sd_samplers_common.SamplerData(name, EulerSamplerDouble, [], options)
    return sampler


def fix_p_invalid_sampler_and_scheduler(p):
    # like sd_samplers.py ~L101-129: unknown/None sampler -> the default sampler, scheduler -> "Automatic"
    if p.sampler_name not in samplers_names:
        p.sampler_name = samplers_names[0]
    if not p.scheduler:
        p.scheduler = "Automatic"
