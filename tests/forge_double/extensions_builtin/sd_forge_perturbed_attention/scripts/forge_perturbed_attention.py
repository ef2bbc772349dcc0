"""Double of Forge's ``extensions-builtin/sd_forge_perturbed_attention/scripts/forge_perturbed_attention.py``
(dfdcbab), from reading it.

A post-CFG function (l.62-83) runs the UNet once more on the cond with the middle block's self-attention replaced by
the identity (``attn_proc`` returns ``v``, through ``set_model_options_patch_replace(options, attn_proc, "attn1",
"middle", 0)``) and adds ``(cond_denoised - degraded) * scale``; an ``on_cfg_denoiser`` callback limits it to the
start/end step fractions. Arguments as the real UI: enabled, scale (3.0), attenuation (0), start (0), end (1).
"""

from forge_double import backend
from forge_double.extensions_builtin._builtin import controls
from modules import scripts
from modules.script_callbacks import on_cfg_denoiser, remove_current_script_callbacks


class PerturbedAttentionGuidanceForForge(scripts.Script):
    doPAG = True

    def title(self):
        return "PerturbedAttentionGuidance Integrated"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return controls(False, 3.0, 0.0, 0.0, 1.0)

    def denoiser_callback(self, params):
        step = params.sampling_step / (params.total_sampling_steps - 1)
        cls = PerturbedAttentionGuidanceForForge
        cls.doPAG = cls.PAG_start <= step <= cls.PAG_end

    def process_before_every_sampling(self, p, *script_args, **kwargs):
        enabled, scale, attenuation, start_step, end_step = script_args
        if not enabled:
            return
        cls = PerturbedAttentionGuidanceForForge
        cls.scale, cls.PAG_start, cls.PAG_end = scale, start_step, end_step
        on_cfg_denoiser(self.denoiser_callback)
        unet = p.sd_model.forge_objects.unet.clone()

        def attn_proc(q, k, v, to):
            return v

        def post_cfg_function(args):
            denoised = args["denoised"]
            if cls.scale <= 0.0 or not cls.doPAG:
                return denoised
            options = backend.set_model_options_patch_replace(
                args["model_options"].copy(), attn_proc, "attn1", "middle", 0
            )
            degraded, _ = backend.calc_cond_uncond_batch_of(
                args["model"], args["cond"], None, args["input"], args["sigma"], options
            )
            result = denoised + (args["cond_denoised"] - degraded) * cls.scale
            cls.scale -= scale * attenuation / 100.0
            return result

        unet.set_model_sampler_post_cfg_function(post_cfg_function)
        p.sd_model.forge_objects.unet = unet
        p.extra_generation_params.update(pagi_enabled=enabled, pagi_scale=scale)

    def postprocess(self, params, processed, *args):
        remove_current_script_callbacks()
