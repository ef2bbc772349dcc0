"""Double of Forge's ``modules/processing.py`` (Forge main ``dfdcbab``), installed as ``modules.processing`` while
a Forge double runs (see ``harness.py``). What is the same as in WebUI 1.10.1 is the WebUI double's code, reused:
``process_images_inner`` (batches, per-batch hooks, NaN check, infotext, ``postprocess`` last and skipped on any
exception), ``Processed``, ``create_infotext``, ``get_token_merging_ratio``. What Forge does differently:

process_images(p) l.816-850:
    p.scripts.before_process(p)              # BEFORE the model (re)load: shared.sd_model may be the previous engine
    override_settings applied; manage_model_and_prompt_cache -> forge_model_reload()
    res = process_images_inner(p)            # no apply_token_merging around it (it is per sampling pass)
per batch (l.930-957): forge_model_reload() (swaps back after a refiner), forge_objects = original.shallow_copy(),
    extra networks, forge_objects = after_applying_lora.shallow_copy()  [here: in parse_extra_network_prompts,
    i.e. after before_process_batch, which changes nothing for the hooks that read forge_objects later]
every sampling pass (txt2img l.1372-1381, hires l.1509-1526, img2img l.1851-1859):
    forge_objects = after_applying_lora.shallow_copy(); apply_token_merging(sd_model, ratio)
    p.scripts.process_before_every_sampling(...)
hires: before_hr + process_before_every_sampling FIRST (on the first pass's forge_objects, thrown away), then the
    reset, apply_token_merging(for_hr=True) and process_before_every_sampling again; hires CFG is ``p.hr_cfg``.
refiner: ``p.refiner_checkpoint_info`` from ``p.refiner_checkpoint`` (l.872, as in the WebUI), swapped in by the CFG
denoiser (``sd_samplers.apply_refiner``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from modules import processing as webui
from modules import shared
from modules.shared import opts

from forge_double import sd_models, sd_samplers

Processed = webui.Processed
create_infotext = webui.create_infotext
decode_latent_batch = webui.decode_latent_batch
fix_seed = webui.fix_seed
get_fixed_seed = webui.get_fixed_seed
ImageRNG = webui.ImageRNG
opt_f = webui.opt_f


def process_images(p) -> Processed:
    if p.scripts is not None:
        p.scripts.before_process(p)
    stored_opts = {
        k: opts.data[k] if k in opts.data else opts.get_default(k) for k in p.override_settings if k in opts.data
    }
    try:
        p.override_settings.pop("sd_model_checkpoint", None)
        for k, v in p.override_settings.items():
            opts.set(k, v, is_api=True, run_callbacks=False)
        sd_models.forge_model_reload()
        sd_samplers.fix_p_invalid_sampler_and_scheduler(p)
        res = webui.process_images_inner(p)
    finally:
        if p.override_settings_restore_afterwards:
            for k, v in stored_opts.items():
                setattr(opts, k, v)
    return res


class ForgeSampling:
    """What every Forge processing class does around a sampling pass."""

    create_sampler = staticmethod(sd_samplers.create_sampler)  # Forge's (a Forge variant may have its own)
    apply_token_merging = staticmethod(sd_models.apply_token_merging)  # the built-in token merging, likewise

    def parse_extra_network_prompts(self) -> None:
        sd_models.forge_model_reload()
        self.sd_model.forge_objects = self.sd_model.forge_objects_original.shallow_copy()
        super().parse_extra_network_prompts()
        self.sd_model.forge_objects = self.sd_model.forge_objects_after_applying_lora.shallow_copy()

    def reset_forge_objects_and_merge(self, for_hr: bool = False) -> None:
        self.sd_model.forge_objects = self.sd_model.forge_objects_after_applying_lora.shallow_copy()
        self.apply_token_merging(self.sd_model, self.get_token_merging_ratio(for_hr=for_hr))


@dataclass(repr=False)
class StableDiffusionProcessingTxt2Img(ForgeSampling, webui.StableDiffusionProcessingTxt2Img):
    hr_cfg: float = 1.0

    def sample(self, conditioning, unconditional_conditioning, seeds, subseeds, subseed_strength, prompts):
        self.sampler = self.create_sampler(self.sampler_name, self.sd_model)
        x = self.rng.next()
        self.reset_forge_objects_and_merge()
        if self.scripts is not None:
            self.scripts.process_before_every_sampling(
                self, x=x, noise=x, c=conditioning, uc=unconditional_conditioning
            )
        samples = self.sampler.sample(
            self, x, conditioning, unconditional_conditioning, image_conditioning=self.txt2img_image_conditioning(x)
        )
        del x
        if not self.enable_hr:
            return samples
        return self.sample_hr_pass(samples, None, seeds, subseeds, subseed_strength, prompts)

    def prepare_hr_pass(self, samples, noise) -> None:
        """Forge's order (l.1509-1526): ``before_hr`` and ``process_before_every_sampling`` on the first pass's
        ``forge_objects``, then the reset, the hires token merging and ``process_before_every_sampling`` again."""
        if self.scripts is not None:
            self.scripts.before_hr(self)
            self.scripts.process_before_every_sampling(p=self, x=samples, noise=noise, c=self.hr_c, uc=self.hr_uc)
        self.reset_forge_objects_and_merge(for_hr=True)
        if self.scripts is not None:
            self.scripts.process_before_every_sampling(self, x=samples, noise=noise, c=self.hr_c, uc=self.hr_uc)

    def sample_hr_pass(self, samples, decoded_samples, seeds, subseeds, subseed_strength, prompts):
        if shared.state.interrupted:
            return samples
        self.is_hr_pass = True
        self.sampler = self.create_sampler(self.hr_sampler_name or self.sampler_name, self.sd_model)
        samples = torch.nn.functional.interpolate(
            samples,
            size=(self.hr_upscale_to_y // opt_f, self.hr_upscale_to_x // opt_f),
            mode=self.latent_scale_mode["mode"],
            antialias=self.latent_scale_mode["antialias"],
        )
        image_conditioning = self.txt2img_image_conditioning(samples)
        shared.state.nextjob()
        self.rng = ImageRNG(
            samples.shape[1:], self.seeds, subseeds=self.subseeds, subseed_strength=self.subseed_strength
        )
        noise = self.rng.next()
        self.calculate_hr_conds()
        self.prepare_hr_pass(samples, noise)
        samples = self.sample_hr_latents(samples, noise, image_conditioning)
        self.sampler = None
        decoded_samples = decode_latent_batch(self.sd_model, samples, check_for_nans=True)
        self.is_hr_pass = False
        return decoded_samples


@dataclass(repr=False)
class StableDiffusionProcessingImg2Img(ForgeSampling, webui.StableDiffusionProcessingImg2Img):
    def init(self, all_prompts, all_seeds, all_subseeds):
        super().init(all_prompts, all_seeds, all_subseeds)
        self.sampler = self.create_sampler(self.sampler_name, self.sd_model)

    def sample(self, conditioning, unconditional_conditioning, seeds, subseeds, subseed_strength, prompts):
        x = self.rng.next()
        if self.initial_noise_multiplier != 1.0:
            self.extra_generation_params["Noise multiplier"] = self.initial_noise_multiplier
            x *= self.initial_noise_multiplier
        self.reset_forge_objects_and_merge()
        if self.scripts is not None:
            self.scripts.process_before_every_sampling(
                self, x=self.init_latent, noise=x, c=conditioning, uc=unconditional_conditioning
            )
        return self.sampler.sample_img2img(
            self,
            self.init_latent,
            x,
            conditioning,
            unconditional_conditioning,
            image_conditioning=self.image_conditioning,
        )
