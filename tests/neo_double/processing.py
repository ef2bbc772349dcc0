"""Double of Neo's ``modules/processing.py`` (Neo at 5692d2d), installed as ``modules.processing`` while a Neo double
runs (``harness.py``). Forge's (``forge_double.processing``) but for:

- hires fix (``sample_hr_pass``, l.1512-1644): ``before_hr`` (l.1624), then ``forge_objects`` reset to
  ``after_applying_lora`` and ``apply_token_merging(for_hr=True)`` (l.1626-1627), then ``process_before_every_sampling``
  **once** (l.1629-1630; Forge calls it twice, the first time before the reset);
- the built-in token merging is Neo's (``neo_double.sd_models``: its stride, max downsample and no-random options);
  img2img's ratio is ``p.token_merging_ratio``, else ``token_merging_ratio`` if the request overrides it, else
  ``token_merging_ratio_img2img``, else ``token_merging_ratio`` (l.2009-2010);
- the sampler is Neo's (``neo_double.sd_samplers``: the refiner switch by sigma, or its weights loaded in place), and
  the Refiner script's ``postprocess`` (``processing_scripts/refiner.py:67-112``) runs at the end of
  ``process_images``, here also after an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from forge_double import processing as forge
from modules import shared
from modules.shared import opts

from neo_double import sd_models, sd_samplers

Processed = forge.Processed
create_infotext = forge.create_infotext
decode_latent_batch = forge.decode_latent_batch
fix_seed = forge.fix_seed
get_fixed_seed = forge.get_fixed_seed
ImageRNG = forge.ImageRNG
opt_f = forge.opt_f


def process_images(p) -> Processed:
    try:
        return forge.process_images(p)
    finally:
        sd_samplers.restore_original()


class NeoSampling(forge.ForgeSampling):
    create_sampler = staticmethod(sd_samplers.create_sampler)

    def reset_forge_objects_and_merge(self, for_hr: bool = False) -> None:
        self.sd_model.forge_objects = self.sd_model.forge_objects_after_applying_lora.shallow_copy()
        sd_models.apply_token_merging(self.sd_model, self.get_token_merging_ratio(for_hr=for_hr))


@dataclass(repr=False)
class StableDiffusionProcessingTxt2Img(NeoSampling, forge.StableDiffusionProcessingTxt2Img):
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
        if self.scripts is not None:
            self.scripts.before_hr(self)
        self.reset_forge_objects_and_merge(for_hr=True)
        if self.scripts is not None:
            self.scripts.process_before_every_sampling(self, x=samples, noise=noise, c=self.hr_c, uc=self.hr_uc)
        samples = self.sample_hr_latents(samples, noise, image_conditioning)
        self.sampler = None
        decoded_samples = decode_latent_batch(self.sd_model, samples, check_for_nans=True)
        self.is_hr_pass = False
        return decoded_samples


@dataclass(repr=False)
class StableDiffusionProcessingImg2Img(NeoSampling, forge.StableDiffusionProcessingImg2Img):
    def get_token_merging_ratio(self, for_hr=False):
        return (
            self.token_merging_ratio
            or ("token_merging_ratio" in self.override_settings and opts.token_merging_ratio)
            or opts.token_merging_ratio_img2img
            or opts.token_merging_ratio
        )
