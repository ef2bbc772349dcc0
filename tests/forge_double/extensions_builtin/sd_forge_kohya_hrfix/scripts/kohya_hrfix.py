"""Double of Forge's ``extensions-builtin/sd_forge_kohya_hrfix/scripts/kohya_hrfix.py`` (dfdcbab), from reading it.

``PatchModelAddDownscale.patch`` (l.8-36) clones the patcher with an ``input_block_patch_after_skip`` (or
``input_block_patch``) that, after input block ``block_number`` and while the step's sigma is between the start and
end percents, resizes ``h`` by ``1 / downscale_factor`` (``adaptive_resize``: ``interpolate`` to the rounded size,
``backend/misc/image_resize.py:92-113``) and publishes ``shared.kohya_shrink_shape``; an ``output_block_patch``
resizes ``h`` back to the skip's size where they differ. Arguments as the real UI: enabled, block_number (3),
downscale_factor (2.0), start_percent (0), end_percent (0.35), downscale_after_skip (True), downscale_method,
upscale_method ("bicubic").
"""

import torch
from forge_double.extensions_builtin._builtin import controls
from modules import scripts, shared


def adaptive_resize(samples, width, height, method, crop):
    return torch.nn.functional.interpolate(samples, size=(height, width), mode=method)


def patch(model, block_number, downscale_factor, start_percent, end_percent, after_skip, down_method, up_method):
    sigma_start = model.model.predictor.percent_to_sigma(start_percent)
    sigma_end = model.model.predictor.percent_to_sigma(end_percent)

    def input_block_patch(h, transformer_options):
        if transformer_options["block"][1] == block_number:
            sigma = transformer_options["sigmas"][0].item()
            if sigma_end <= sigma <= sigma_start:
                h = adaptive_resize(
                    h,
                    round(h.shape[-1] * (1.0 / downscale_factor)),
                    round(h.shape[-2] * (1.0 / downscale_factor)),
                    down_method,
                    "disabled",
                )
        shared.kohya_shrink_shape = (h.shape[-1], h.shape[-2])
        shared.kohya_shrink_shape_out = None
        return h

    def output_block_patch(h, hsp, transformer_options):
        if h.shape[2] != hsp.shape[2]:
            h = adaptive_resize(h, hsp.shape[-1], hsp.shape[-2], up_method, "disabled")
        shared.kohya_shrink_shape_out = (h.shape[-1], h.shape[-2])
        return h, hsp

    m = model.clone()
    if after_skip:
        m.set_model_input_block_patch_after_skip(input_block_patch)
    else:
        m.set_model_input_block_patch(input_block_patch)
    m.set_model_output_block_patch(output_block_patch)
    return m


class KohyaHRFixForForge(scripts.Script):
    def title(self):
        return "Kohya HRFix Integrated"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return controls(False, 3, 2.0, 0.0, 0.35, True, "bicubic", "bicubic")

    def process_before_every_sampling(self, p, *script_args, **kwargs):
        enabled, block_number, factor, start, end, after_skip, down, up = script_args
        if not enabled:
            return
        unet = p.sd_model.forge_objects.unet
        p.sd_model.forge_objects.unet = patch(unet, int(block_number), factor, start, end, after_skip, down, up)
        p.extra_generation_params.update(kohya_hrfix_enabled=enabled, kohya_hrfix_block_number=int(block_number))
