"""Double of Bing-su/adetailer's ``scripts/!adetailer.py`` (36189cb, 2025-03-10), written from reading it; line
numbers are the real file's. What it does to the generation around it:

* ``process`` (l.771-802) marks a generation it is off for with ``p._ad_disabled``.
* ``postprocess_image`` (l.896-929), per image: at the batch's first image (``need_call_postprocess``,
  ``aaaaaa/p_method.py``) it first runs the generation's own scripts' ``postprocess`` on ``copy(p)`` with an empty
  ``Processed`` (since 5af8158, 2023-07-04); then for each detection it runs a nested img2img, ``process_images(p2)``
  with ``p2.close()`` after it (l.861-879), on ``get_i2i_p`` (l.498-565): the crop size ``ad_inpaint_width/height``
  if ``ad_use_inpaint_width_height``, else ``p.width/p.height`` (l.351-362), ``extra_generation_params`` copied from
  ``p`` without its callables (``copy_extra_params``, ``aaaaaa/helper.py`` l.67-68), ``_ad_inner = _ad_disabled = True``, and ``script_filter`` (l.448-475): a shallow copy of ``p.scripts``
  whose always-on scripts are those whose file stem is in the option ``ad_script_names`` (default below) plus the
  built-ins ``soft_inpainting, hypertile_script`` (``adetailer/args.py`` l.275-286) — every script when
  ``ad_only_selected_scripts`` is off — with a copy of ``p.script_args``. At the batch's last image
  (``need_call_process``) it runs the scripts' ``before_process`` and ``process`` on ``copy(p)``.

Left out: detection (every image has one detection, the whole image: random weights find no face), masks and
inpainting (the double's img2img has none), prompts, ControlNet units, saving. ``CALL_OUTER_SCRIPTS = False`` models
ADetailer before 5af8158, or any extension that runs nested passes in ``postprocess_image`` without that call.
"""

import os
from copy import copy

import gradio as gr
import modules
from modules import script_callbacks, scripts, shared
from modules.shared import opts

SCRIPT_DEFAULT = "dynamic_prompting,dynamic_thresholding,lora_block_weight,negpip,wildcard_recursive,wildcards"
BUILTIN_SCRIPT = "hypertile_script,soft_inpainting"
CALL_OUTER_SCRIPTS = True
DEFAULT_ARGS = dict(
    ad_use_inpaint_width_height=False,
    ad_inpaint_width=512,
    ad_inpaint_height=512,
    ad_denoising_strength=0.4,
    ad_use_steps=False,
    ad_steps=28,
)


class AfterDetailerScript(scripts.Script):
    def title(self):
        return "ADetailer"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, is_img2img):
        return [gr.Checkbox(value=False, visible=False), gr.JSON(value={}, visible=False)]

    def process(self, p, enabled, ad, *args):
        if getattr(p, "_ad_disabled", False):
            return
        if not enabled:
            p._ad_disabled = True

    def script_filter(self, p):
        runner = copy(p.scripts)
        script_args = list(p.script_args)
        if not opts.data.get("ad_only_selected_scripts", True):
            return runner, script_args
        names = opts.data.get("ad_script_names", SCRIPT_DEFAULT).split(",") + BUILTIN_SCRIPT.split(",")
        wanted = {n for name in names for n in (name, name.strip())}
        runner.alwayson_scripts = [
            s for s in runner.alwayson_scripts if os.path.splitext(os.path.basename(s.filename))[0] in wanted
        ]
        return runner, script_args

    def get_i2i_p(self, p, ad, image):
        ad = {**DEFAULT_ARGS, **(ad or {})}
        if ad["ad_use_inpaint_width_height"]:
            width, height = ad["ad_inpaint_width"], ad["ad_inpaint_height"]
        else:
            width, height = p.width, p.height
        processing = modules.processing
        i2i = processing.StableDiffusionProcessingImg2Img(
            init_images=[image],
            resize_mode=0,
            denoising_strength=ad["ad_denoising_strength"],
            prompt=p.prompt,
            negative_prompt=p.negative_prompt,
            seed=p.all_seeds[p.iteration * p.batch_size + p.batch_index],
            subseed=p.subseed,
            sampler_name=p.sampler_name,
            batch_size=1,
            n_iter=1,
            steps=ad["ad_steps"] if ad["ad_use_steps"] else p.steps,
            cfg_scale=p.cfg_scale,
            width=width,
            height=height,
            extra_generation_params={k: v for k, v in p.extra_generation_params.items() if not callable(v)},
            do_not_save_samples=True,
            do_not_save_grid=True,
        )
        i2i.scripts, i2i.script_args = self.script_filter(p)
        i2i._ad_disabled = True
        i2i._ad_inner = True
        return i2i

    def postprocess_image(self, p, pp, enabled, ad, *args):
        if getattr(p, "_ad_disabled", False) or not enabled:
            return
        processing = modules.processing
        if CALL_OUTER_SCRIPTS and p.batch_index == 0:
            p.scripts.postprocess(copy(p), processing.Processed(p, [], p.seed, ""))
        i2i = self.get_i2i_p(p, ad, pp.image)
        p2 = copy(i2i)
        try:
            processed = processing.process_images(p2)
        finally:
            p2.close()
        pp.image = processed.images[0]
        if CALL_OUTER_SCRIPTS and p.batch_index == p.batch_size - 1:
            copy_p = copy(p)
            p.scripts.before_process(copy_p)
            p.scripts.process(copy_p)


def on_ui_settings():
    """Its two script-filter options (l.989-1010)."""
    shared.opts.add_option(
        "ad_only_selected_scripts", shared.OptionInfo(True, "Apply only selected scripts to ADetailer")
    )
    shared.opts.add_option("ad_script_names", shared.OptionInfo(SCRIPT_DEFAULT, "Script names to apply to ADetailer"))


script_callbacks.on_ui_settings(on_ui_settings)
