"""Double of Forge's ``extensions-builtin/sd_forge_freeu/scripts/forge_freeu.py`` (dfdcbab), from reading it.

``process_before_every_sampling`` clones the UNet patcher with an ``output_block_patch`` (``patch_freeu_v2``,
l.28-62): at the output blocks whose backbone ``h`` has 4x or 2x ``model_channels`` channels it scales the first half
of ``h``'s channels by ``(b - 1) * normalised mean + 1`` and Fourier-filters the skip ``hsp`` (4-D features, between
blocks). An ``on_cfg_denoiser`` callback turns it on between the start and end step fractions. Arguments as the
real UI: enabled, b1, b2, s1, s2, start, end (Forge's defaults 1.01, 1.02, 0.99, 0.95, 0, 1).
"""

import torch
from forge_double.extensions_builtin._builtin import controls
from modules import scripts
from modules.script_callbacks import on_cfg_denoiser, remove_current_script_callbacks


def fourier_filter(x, threshold, scale):
    x_freq = torch.fft.fftshift(torch.fft.fftn(x.float(), dim=(-2, -1)), dim=(-2, -1))
    b, c, h, w = x_freq.shape
    mask = torch.ones((b, c, h, w), device=x.device)
    crow, ccol = h // 2, w // 2
    mask[..., crow - threshold : crow + threshold, ccol - threshold : ccol + threshold] = scale
    x_freq = torch.fft.ifftshift(x_freq * mask, dim=(-2, -1))
    return torch.fft.ifftn(x_freq, dim=(-2, -1)).real.to(x.dtype)


def patch_freeu_v2(unet_patcher, b1, b2, s1, s2):
    model_channels = unet_patcher.model.diffusion_model.config.get("model_channels")
    scale_dict = {model_channels * 4: (b1, s1), model_channels * 2: (b2, s2)}

    def output_block_patch(h, hsp, transformer_options):
        scale = scale_dict.get(h.shape[1]) if FreeUForForge.doFreeU else None
        if scale is not None:
            hidden_mean = h.mean(1).unsqueeze(1)
            b = hidden_mean.shape[0]
            hidden_max, _ = torch.max(hidden_mean.view(b, -1), dim=-1, keepdim=True)
            hidden_min, _ = torch.min(hidden_mean.view(b, -1), dim=-1, keepdim=True)
            hidden_mean = (hidden_mean - hidden_min.unsqueeze(2).unsqueeze(3)) / (hidden_max - hidden_min).unsqueeze(
                2
            ).unsqueeze(3)
            h[:, : h.shape[1] // 2] = h[:, : h.shape[1] // 2] * ((scale[0] - 1) * hidden_mean + 1)
            hsp = fourier_filter(hsp, threshold=1, scale=scale[1])
        return h, hsp

    m = unet_patcher.clone()
    m.set_model_output_block_patch(output_block_patch)
    return m


class FreeUForForge(scripts.Script):
    doFreeU = True

    def title(self):
        return "FreeU Integrated (SD 1.x, SD 2.x, SDXL)"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return controls(False, 1.01, 1.02, 0.99, 0.95, 0.0, 1.0)

    def denoiser_callback(self, params):
        step = params.sampling_step / (params.total_sampling_steps - 1)
        FreeUForForge.doFreeU = FreeUForForge.freeu_start <= step <= FreeUForForge.freeu_end

    def process_before_every_sampling(self, p, *script_args, **kwargs):
        enabled, b1, b2, s1, s2, start, end = script_args
        if not enabled:
            return
        unet = p.sd_model.forge_objects.unet
        FreeUForForge.freeu_start, FreeUForForge.freeu_end = start, end
        on_cfg_denoiser(self.denoiser_callback)
        p.sd_model.forge_objects.unet = patch_freeu_v2(unet, b1, b2, s1, s2)
        p.extra_generation_params.update(freeu_enabled=enabled, freeu_b1=b1)

    def postprocess(self, params, processed, *args):
        remove_current_script_callbacks()
