"""Double of Forge's reference-only preprocessor (``extensions-builtin/forge_preprocessor_reference/scripts/
forge_reference.py``, dfdcbab), from reading it.

The real one runs as a ControlNet unit's preprocessor; here a script stands for that unit and calls the same
``process_before_every_sampling`` on ``forge_objects.unet`` (l.47-190): a conditioning modifier that, inside the
step's sigma range, runs the UNet once on the reference latent (noised with the step's sigma from a generator seeded
``seeds[0] + 1``) to record every self-attention's keys and values, and an attn1 replace on every block that
concatenates the recorded keys/values to the cond chunk's (and blends the uncond's by style fidelity). Reference
AdaIN (a block modifier) is left out. The reference latent: the control image averaged down to the latent size (the
double has no VAE). Arguments: enabled, weight (1.0), style_fidelity (0.5), start (0), end (1), image (3 x H x W).
"""

import torch
from forge_double import backend
from forge_double.extensions_builtin._builtin import controls
from forge_double.unet import attention_pytorch
from modules import scripts


def sdp(q, k, v, transformer_options):
    if q.shape[0] == 0:
        return q
    return attention_pytorch(q, k, v, heads=transformer_options["n_heads"])


def zero_cat(a, b, dim):
    if a.shape[0] == 0:
        return b
    if b.shape[0] == 0:
        return a
    return torch.cat([a, b], dim=dim)


class Reference:
    def __init__(self):
        self.is_recording_style = False
        self.recorded_attn1 = {}

    def process_before_every_sampling(self, process, image, weight, style_fidelity, start_percent, end_percent):
        h, w = process.height // 8, process.width // 8
        rgb = torch.nn.functional.adaptive_avg_pool2d(image[None] * 2 - 1, (h, w))
        latent_image = torch.cat([rgb, rgb.mean(1, keepdim=True)], dim=1)
        gen_cpu = torch.Generator().manual_seed(process.seeds[0] + 1)
        unet = process.sd_model.forge_objects.unet.clone()
        sigma_max = unet.model.predictor.percent_to_sigma(start_percent)
        sigma_min = unet.model.predictor.percent_to_sigma(end_percent)
        self.recorded_attn1 = {}

        def conditioning_modifier(model, x, timestep, uncond, cond, cond_scale, model_options, seed):
            sigma = timestep[0].item()
            if not (sigma_min <= sigma <= sigma_max):
                return model, x, timestep, uncond, cond, cond_scale, model_options, seed
            self.is_recording_style = True
            xt = latent_image.to(x) + torch.randn(x.size(), dtype=x.dtype, generator=gen_cpu).to(x) * sigma
            backend.sampling_function_inner(model, xt, timestep, uncond, cond, 1, model_options, seed)
            self.is_recording_style = False
            return model, x, timestep, uncond, cond, cond_scale, model_options, seed

        def attn1_proc(q, k, v, transformer_options):
            sigma = transformer_options["sigmas"][0].item()
            if not (sigma_min <= sigma <= sigma_max):
                return sdp(q, k, v, transformer_options)
            location = (*transformer_options["block"], transformer_options["block_index"])
            if int(q.shape[2]) < 1500 - 1280 * weight:
                return sdp(q, k, v, transformer_options)
            if self.is_recording_style:
                self.recorded_attn1[location] = (k, v)
                return sdp(q, k, v, transformer_options)
            cond_indices, uncond_indices = transformer_options["cond_indices"], transformer_options["uncond_indices"]
            q_c, q_uc = q[cond_indices], q[uncond_indices]
            k_c, k_uc = k[cond_indices], k[uncond_indices]
            v_c, v_uc = v[cond_indices], v[uncond_indices]
            k_r, v_r = self.recorded_attn1[location]
            o_c = sdp(q_c, zero_cat(k_c, k_r, dim=1), zero_cat(v_c, v_r, dim=1), transformer_options)
            o_uc_strong = sdp(q_uc, k_uc, v_uc, transformer_options)
            o_uc_weak = sdp(q_uc, zero_cat(k_uc, k_r, dim=1), zero_cat(v_uc, v_r, dim=1), transformer_options)
            o_uc = o_uc_weak + (o_uc_strong - o_uc_weak) * style_fidelity
            recon = [o_c if cx == 0 else o_uc for cx in transformer_options["cond_or_uncond"]]
            return torch.cat(recon, dim=0)

        unet.add_conditioning_modifier(conditioning_modifier)
        unet.set_model_replace_all(attn1_proc, "attn1")
        process.sd_model.forge_objects.unet = unet


class ReferenceOnlyUnit(scripts.Script):
    def title(self):
        return "reference_only (ControlNet unit)"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return [*controls(False, 1.0, 0.5, 0.0, 1.0), controls(False)[0]]

    def process_before_every_sampling(self, p, enabled, weight, style_fidelity, start, end, image, **kwargs):
        if enabled:
            Reference().process_before_every_sampling(p, image, weight, style_fidelity, start, end)
