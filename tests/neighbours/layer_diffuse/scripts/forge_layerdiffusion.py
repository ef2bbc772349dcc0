"""Double of lllyasviel/sd-forge-layerdiffuse ``scripts/forge_layerdiffusion.py`` (e4d5060), the SD1.5
attention-sharing modes (l.221-275): in ``process_before_every_sampling`` a clone of the UNet patcher gets an
``AttentionSharingPatcher`` (object patches) and, for the modes conditioned on a foreground or background, its
control image. The real modes also load LoRAs and decode with a transparent VAE (left out). Arguments: enabled,
frames (2), use_control (True), image (3 x H x W).
"""

from forge_double.extensions_builtin._builtin import controls
from lib_layerdiffusion.attention_sharing import AttentionSharingPatcher
from modules import scripts


class LayerDiffusionForForge(scripts.Script):
    def title(self):
        return "LayerDiffuse"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return [*controls(False, 2, True), controls(False)[0]]

    def process_before_every_sampling(self, p, enabled, frames, use_control, image, **kwargs):
        if not enabled:
            return
        unet = p.sd_model.forge_objects.unet.clone()
        patcher = AttentionSharingPatcher(unet, frames=int(frames), use_control=use_control)
        if use_control:
            patcher.set_control(image[None])
        p.sd_model.forge_objects.unet = unet
        p.extra_generation_params["layerdiffusion_enabled"] = True
