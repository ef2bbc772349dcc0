"""Double of modules/sd_samplers_cfg_denoiser.py CFGDenoiser.forward (WebUI 1.10.1, ~L190-312).

Kept: interrupt/skip check first (raises InterruptedException); x_in = [x (cond), x (uncond)], sigma_in and
image_cond_in likewise; ``cfg_denoiser_callback(CFGDenoiserParams(x_in, image_cond_in, sigma_in,
state.sampling_step, state.sampling_steps, cond, uncond, self))`` and the values are read back from the params
object; skip_early_cond / NGMS uncond skipping; ``opts.batch_cond_uncond`` True -> ONE UNet call on the 2B
batch, False -> one call per chunk of B (cond first, then uncond); cfg_denoised and cfg_after_cfg callbacks;
``combine_denoised``; ``sampler.last_latent``.
``sd_samplers_common.apply_refiner`` right after the interrupt check (a switch re-reads cond/uncond; ``update_inner_model``
and ``inner_model`` rebuild the denoiser on ``shared.sd_model``, as CFGDenoiserKDiffusion does).
Left out: AND-prompts / prompt editing (one cond per image), edit models, masks, cond padding
(the double's conds always have 77 tokens), live previews.
"""

import torch

from modules import sd_samplers_common, shared
from modules.script_callbacks import (
    AfterCFGCallbackParams,
    CFGDenoisedParams,
    CFGDenoiserParams,
    cfg_after_cfg_callback,
    cfg_denoised_callback,
    cfg_denoiser_callback,
)
from modules.shared import opts, state


class CFGDenoiser(torch.nn.Module):
    def __init__(self, sampler, inner_model):
        super().__init__()
        self.sampler = sampler
        self.model_wrap = inner_model
        self.mask = None
        self.nmask = None
        self.init_latent = None
        self.steps = None
        self.total_steps = None
        self.step = 0
        self.image_cfg_scale = None
        self.p = None
        self.cond_scale_miltiplier = 1.0

    @property
    def inner_model(self):
        if self.model_wrap is None:  # after a refiner switch: a denoiser on the model now loaded
            from modules import sd_samplers

            self.model_wrap = sd_samplers.CompVisDenoiserDouble(shared.sd_model)
        return self.model_wrap

    def update_inner_model(self):
        self.model_wrap = None
        c, uc = self.p.get_conds()
        self.sampler.sampler_extra_args["cond"] = c
        self.sampler.sampler_extra_args["uncond"] = uc

    def combine_denoised(self, x_out, conds_list, uncond, cond_scale):
        denoised_uncond = x_out[-uncond.shape[0] :]
        denoised = torch.clone(denoised_uncond)
        for i, conds in enumerate(conds_list):
            for cond_index, weight in conds:
                denoised[i] += (x_out[cond_index] - denoised_uncond[i]) * (weight * cond_scale)
        return denoised

    def forward(self, x, sigma, uncond, cond, cond_scale, s_min_uncond, image_cond):
        if state.interrupted or state.skipped:
            raise sd_samplers_common.InterruptedException

        if sd_samplers_common.apply_refiner(self, sigma):
            cond = self.sampler.sampler_extra_args["cond"]
            uncond = self.sampler.sampler_extra_args["uncond"]

        conds_list = [[(i, 1.0)] for i in range(x.shape[0])]
        tensor = cond
        batch_size = len(conds_list)

        x_in = torch.cat([x, x])
        sigma_in = torch.cat([sigma, sigma])
        image_cond_in = torch.cat([image_cond, image_cond])

        def make_condition_dict(c_crossattn, c_concat):
            return {"c_crossattn": [c_crossattn], "c_concat": [c_concat]}

        params = CFGDenoiserParams(
            x_in, image_cond_in, sigma_in, state.sampling_step, state.sampling_steps, tensor, uncond, self
        )
        cfg_denoiser_callback(params)
        x_in = params.x
        image_cond_in = params.image_cond
        sigma_in = params.sigma
        tensor = params.text_cond
        uncond = params.text_uncond

        skip_uncond = False
        if opts.skip_early_cond != 0.0 and self.step / self.total_steps <= opts.skip_early_cond:
            skip_uncond = True
            self.p.extra_generation_params["Skip Early CFG"] = opts.skip_early_cond
        elif (self.step % 2 or opts.s_min_uncond_all) and s_min_uncond > 0 and sigma[0] < s_min_uncond:
            skip_uncond = True
            self.p.extra_generation_params["NGMS"] = s_min_uncond

        if skip_uncond:
            x_in = x_in[:-batch_size]
            sigma_in = sigma_in[:-batch_size]
            cond_in = tensor
        else:
            cond_in = torch.cat([tensor, uncond])

        if opts.batch_cond_uncond:
            x_out = self.inner_model(x_in, sigma_in, cond=make_condition_dict(cond_in, image_cond_in))
        else:
            x_out = torch.zeros_like(x_in)
            for a in range(0, x_out.shape[0], batch_size):
                b = a + batch_size
                x_out[a:b] = self.inner_model(
                    x_in[a:b], sigma_in[a:b], cond=make_condition_dict(cond_in[a:b], image_cond_in[a:b])
                )

        denoised_image_indexes = [c[0][0] for c in conds_list]
        if skip_uncond:
            x_out = torch.cat([x_out, torch.cat([x_out[i : i + 1] for i in denoised_image_indexes])])

        cfg_denoised_callback(CFGDenoisedParams(x_out, state.sampling_step, state.sampling_steps, self.inner_model))

        scale = 1.0 if skip_uncond else cond_scale * self.cond_scale_miltiplier
        denoised = self.combine_denoised(x_out, conds_list, uncond, scale)

        self.sampler.last_latent = torch.cat([x_out[i : i + 1] for i in denoised_image_indexes])

        after = AfterCFGCallbackParams(denoised, state.sampling_step, state.sampling_steps)
        cfg_after_cfg_callback(after)
        denoised = after.x

        self.step += 1
        return denoised
