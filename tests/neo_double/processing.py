"""Double of Neo's ``modules/processing.py`` (Neo at 5692d2d), installed as ``modules.processing`` while a Neo double
runs (``harness.py``). Forge's (``forge_double.processing``) but for:

- hires fix (``sample_hr_pass``, l.1512-1644): ``before_hr`` (l.1624), then ``forge_objects`` reset to
  ``after_applying_lora`` and ``apply_token_merging(for_hr=True)`` (l.1626-1627), then ``process_before_every_sampling``
  **once** (l.1629-1630; Forge calls it twice, the first time before the reset);
- the built-in token merging is Neo's (``neo_double.sd_models``: its stride, max downsample and no-random options);
  img2img's ratio is chosen as in the WebUI (l.2009-2010: ``p.token_merging_ratio``, else ``token_merging_ratio`` if
  the request overrides it, else ``token_merging_ratio_img2img``, else ``token_merging_ratio``);
- the sampler is Neo's (``neo_double.sd_samplers``: the refiner switch by sigma, or its weights loaded in place), and
  the Refiner script's ``postprocess`` (``processing_scripts/refiner.py:67-112``) runs at the end of
  ``process_images``, here also after an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

from forge_double import processing as forge

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
    apply_token_merging = staticmethod(sd_models.apply_token_merging)


@dataclass(repr=False)
class StableDiffusionProcessingTxt2Img(NeoSampling, forge.StableDiffusionProcessingTxt2Img):
    def prepare_hr_pass(self, samples, noise) -> None:
        """Neo's order (l.1624-1630): ``before_hr``, the reset and the hires token merging, then
        ``process_before_every_sampling`` once."""
        if self.scripts is not None:
            self.scripts.before_hr(self)
        self.reset_forge_objects_and_merge(for_hr=True)
        if self.scripts is not None:
            self.scripts.process_before_every_sampling(self, x=samples, noise=noise, c=self.hr_c, uc=self.hr_uc)


@dataclass(repr=False)
class StableDiffusionProcessingImg2Img(NeoSampling, forge.StableDiffusionProcessingImg2Img):
    pass
