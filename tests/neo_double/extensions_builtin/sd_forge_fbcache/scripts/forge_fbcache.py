"""Double of upstream Neo's ``extensions-builtin/sd_forge_fbcache/scripts/forge_fbcache.py`` (Haoming02/
sd-webui-forge-classic, branch ``neo``, at 9fee4e7), from reading it.

First Block Cache supports only diffusion models of a class in ``SUPPORTED_MODELS`` (``("Anima",)``) that have
``fbc_reset``; on any other it logs that it does not support the model and skips. Enabled on a supported one: a
clone of the patcher with ``model_options["transformer_options"]["fbcache"] = {"threshold", "max_consecutive",
"start_percent"}``, ``fbc_reset()`` of the model, and ``fbcache: threshold/max/start`` in the infotext. The caching
itself happens inside the diffusion model (which reads those options): not modelled, ToMe only needs to see that it
is on. ``postprocess`` resets the model's cache. Arguments as the real UI: enable, threshold 0.1, max_consecutive 3,
start_percent 20.
"""

from forge_double.extensions_builtin._builtin import controls
from modules import scripts

SUPPORTED_MODELS = ("Anima",)


class FirstBlockCacheForForge(scripts.Script):
    sorting_priority = 18138

    def title(self):
        return "First Block Cache Integrated"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return controls(False, 0.1, 3, 20)

    def process_before_every_sampling(self, p, enable, threshold, max_consecutive, start_percent, **kwargs):
        unet = p.sd_model.forge_objects.unet
        model = unet.model.diffusion_model
        supported = type(model).__name__ in SUPPORTED_MODELS and hasattr(model, "fbc_reset")
        if not enable:
            if supported:
                model.fbc_reset()
            return
        if not supported:
            print(f'First Block Cache does not support "{type(model).__name__}" ; skipping...')
            return
        unet = unet.clone()
        unet.model_options["transformer_options"]["fbcache"] = {
            "threshold": float(threshold),
            "max_consecutive": int(max_consecutive),
            "start_percent": float(start_percent) / 100.0,
        }
        model.fbc_reset()
        p.sd_model.forge_objects.unet = unet
        p.extra_generation_params["fbcache"] = f"{threshold}/{int(max_consecutive)}/{int(start_percent)}"
