"""Double of ``extensions-builtin/hypertile/scripts/hypertile_script.py`` (WebUI 1.10.1, 82a973c0), U-Net part.

``process`` seeds Hypertile's RNG with the first seed and configures the U-Net for ``p.width x p.height`` with
``hypertile_enable_unet``; ``before_hr`` configures it for the hires size with ``hypertile_enable_unet_secondpass
or hypertile_enable_unet`` (l.14-36). Its options (l.68-84) are added in ``on_ui_settings``; their infotext
entries (l.38-57) are written as the real script does for the U-Net.
"""

import hypertile
from modules import script_callbacks, scripts, shared


class ScriptHypertile(scripts.Script):
    name = "Hypertile"

    def title(self):
        return self.name

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def process(self, p, *args):
        hypertile.set_hypertile_seed(p.all_seeds[0])
        configure_hypertile(p.width, p.height, enable_unet=shared.opts.hypertile_enable_unet)
        self.add_infotext(p)

    def before_hr(self, p, *args):
        enable = shared.opts.hypertile_enable_unet_secondpass or shared.opts.hypertile_enable_unet
        if enable:
            hypertile.set_hypertile_seed(p.all_seeds[0])
        configure_hypertile(p.hr_upscale_to_x, p.hr_upscale_to_y, enable_unet=enable)
        if enable and not shared.opts.hypertile_enable_unet:
            p.extra_generation_params["Hypertile U-Net second pass"] = True
            self.add_infotext(p, add_unet_params=True)

    def add_infotext(self, p, add_unet_params=False):
        def option(name):
            value = getattr(shared.opts, name)
            return None if value == shared.opts.get_default(name) else value

        if shared.opts.hypertile_enable_unet:
            p.extra_generation_params["Hypertile U-Net"] = True
        if shared.opts.hypertile_enable_unet or add_unet_params:
            p.extra_generation_params["Hypertile U-Net max depth"] = option("hypertile_max_depth_unet")
            p.extra_generation_params["Hypertile U-Net max tile size"] = option("hypertile_max_tile_unet")
            p.extra_generation_params["Hypertile U-Net swap size"] = option("hypertile_swap_size_unet")


def configure_hypertile(width, height, enable_unet=True):
    hypertile.hypertile_hook_model(
        shared.sd_model.model,
        width,
        height,
        swap_size=shared.opts.hypertile_swap_size_unet,
        max_depth=shared.opts.hypertile_max_depth_unet,
        tile_size_max=shared.opts.hypertile_max_tile_unet,
        enable=enable_unet,
        is_sdxl=shared.sd_model.is_sdxl,
    )


def on_ui_settings():
    options = {
        "hypertile_enable_unet": shared.OptionInfo(False, "Enable Hypertile U-Net", infotext="Hypertile U-Net"),
        "hypertile_enable_unet_secondpass": shared.OptionInfo(
            False, "Enable Hypertile U-Net for hires fix second pass", infotext="Hypertile U-Net second pass"
        ),
        "hypertile_max_depth_unet": shared.OptionInfo(3, "Hypertile U-Net max depth"),
        "hypertile_max_tile_unet": shared.OptionInfo(256, "Hypertile U-Net max tile size"),
        "hypertile_swap_size_unet": shared.OptionInfo(3, "Hypertile U-Net swap size"),
    }
    for name, opt in options.items():
        shared.opts.add_option(name, opt)


script_callbacks.on_ui_settings(on_ui_settings)
