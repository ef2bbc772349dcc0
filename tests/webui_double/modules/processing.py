"""Double of modules/processing.py (WebUI 1.10.1).

Same ORDER of hook calls and the same error behaviour as the real module (line numbers of the real file):

process_images(p) ~L819-860:
    p.scripts.before_process(p)                       # BEFORE override_settings and token merging
    stored_opts = ...; override_settings applied with opts.set(k, v, is_api=True, run_callbacks=False)
    try:
        sd_models.apply_token_merging(p.sd_model, p.get_token_merging_ratio())
        res = process_images_inner(p)
    finally:
        sd_models.apply_token_merging(p.sd_model, 0)  # also after an exception
        restore opts (if p.override_settings_restore_afterwards)
process_images_inner(p) ~L863-1150:
    seeds fixed, setup_prompts, all_seeds / all_subseeds, p.scripts.process(p), p.init(...)
    for n in range(n_iter):  skipped flag reset; interrupted -> break
        p.prompts/seeds slices, p.rng; before_process_batch(batch_number, prompts, seeds, subseeds)
        after_extra_networks_activate(... extra_network_data) (unless p.disable_extra_networks)
        process_batch(batch_number, prompts, seeds, subseeds); setup_conds()
        n == 0: infotext computed once for params.txt (callables in extra_generation_params run here too)
        p.sample(...)  -> process_before_every_sampling(p=, x=, noise=, c=, uc=) then the sampler
        post_sample; test_for_nans(samples, "unet") -> NansException propagates; decode (+ NaN check)
        postprocess_batch(p, *args, images=x, batch_number=n); postprocess_batch_list
        per image: postprocess_image, postprocess_maskoverlay, postprocess_image_after_composite, infotext
    grid (return_grid and >1 image), Processed(...)
    p.scripts.postprocess(p, res)                      # LAST; skipped by any exception above
StableDiffusionProcessingTxt2Img.sample_hr_pass ~L1364-1464 (hires fix, latent upscalers only):
    ... apply_token_merging(sd_model, p.get_token_merging_ratio(for_hr=True))
    p.scripts.before_hr(p); p.scripts.process_before_every_sampling(...)
    sampler.sample_img2img(...)
    apply_token_merging(sd_model, p.get_token_merging_ratio())   # not in a finally
Simplified: no VAE (TinySdModel fakes it), no saving, no face restoration/color correction/masks/inpainting,
no styles, no extra networks parsing, no prompt editing/attention syntax, pixel upscalers absent. The refiner switch
is the CFG denoiser's (sd_samplers_common.apply_refiner); ``p.refiner_checkpoint_info`` is resolved here (~L882-885).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from modules import (
    devices,
    errors,
    infotext_utils,
    scripts,
    sd_models,
    sd_samplers,
    shared,
)
from modules.shared import cmd_opts, opts, state

opt_C = 4
opt_f = 8

params_txt = None
"""test-only: what the real process_images_inner writes to params.txt for batch 0"""


class ImageRNG:
    """Like modules/rng.py ImageRNG: the first next() gives one N(0,1) tensor per seed (torch.manual_seed style
    generator), optionally slerped towards the subseed noise; later calls continue each seed's generator."""

    def __init__(self, shape, seeds, subseeds=None, subseed_strength=0.0, seed_resize_from_h=0, seed_resize_from_w=0):
        self.shape = tuple(int(x) for x in shape)
        self.seeds = seeds
        self.subseeds = subseeds
        self.subseed_strength = subseed_strength
        self.generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
        self.is_first = True

    def first(self):
        xs = []
        for i, g in enumerate(self.generators):
            noise = torch.randn(self.shape, generator=g)
            if self.subseeds is not None and self.subseed_strength != 0:
                sub = torch.randn(self.shape, generator=torch.Generator().manual_seed(int(self.subseeds[i])))
                noise = _slerp(self.subseed_strength, noise, sub)
            xs.append(noise)
        return torch.stack(xs)

    def next(self):
        if self.is_first:
            self.is_first = False
            return self.first()
        return torch.stack([torch.randn(self.shape, generator=g) for g in self.generators])


def _slerp(val, low, high):
    low_norm = low / torch.norm(low, dim=1, keepdim=True)
    high_norm = high / torch.norm(high, dim=1, keepdim=True)
    dot = (low_norm * high_norm).sum(1)
    if dot.mean() > 0.9995:
        return low * val + high * (1 - val)
    omega = torch.acos(dot)
    so = torch.sin(omega)
    return (torch.sin((1.0 - val) * omega) / so).unsqueeze(1) * low + (torch.sin(val * omega) / so).unsqueeze(1) * high


def txt2img_image_conditioning(sd_model, x, width, height):
    # ~L100-133, non-inpainting branch: a dummy zero conditioning
    return x.new_zeros(x.shape[0], 5, 1, 1, dtype=x.dtype, device=x.device)


@dataclass(repr=False)
class StableDiffusionProcessing:
    sd_model: object = None
    outpath_samples: str = None
    outpath_grids: str = None
    prompt: str = ""
    prompt_for_display: str = None
    negative_prompt: str = ""
    styles: list = None
    seed: int = -1
    subseed: int = -1
    subseed_strength: float = 0
    seed_resize_from_h: int = -1
    seed_resize_from_w: int = -1
    seed_enable_extras: bool = True
    sampler_name: str = None
    scheduler: str = None
    batch_size: int = 1
    n_iter: int = 1
    steps: int = 50
    cfg_scale: float = 7.0
    width: int = 512
    height: int = 512
    restore_faces: bool = None
    tiling: bool = None
    do_not_save_samples: bool = False
    do_not_save_grid: bool = False
    extra_generation_params: dict = None
    overlay_images: list = None
    eta: float = None
    do_not_reload_embeddings: bool = False
    denoising_strength: float = None
    ddim_discretize: str = None
    s_min_uncond: float = None
    s_churn: float = None
    s_tmax: float = None
    s_tmin: float = None
    s_noise: float = None
    override_settings: dict = None
    override_settings_restore_afterwards: bool = True
    sampler_index: int = None
    refiner_checkpoint: str = None
    refiner_switch_at: float = None
    token_merging_ratio = 0  # class attributes, NOT constructor fields (same as the real dataclass ~L179)
    token_merging_ratio_hr = 0
    disable_extra_networks: bool = False
    firstpass_image: Any = None

    scripts_value: Any = field(default=None, init=False)
    script_args_value: Any = field(default=None, init=False)
    scripts_setup_complete: bool = field(default=False, init=False)

    comments: dict = None
    sampler: Any = field(default=None, init=False)
    is_using_inpainting_conditioning: bool = field(default=False, init=False)
    paste_to: Any = field(default=None, init=False)
    is_hr_pass: bool = field(default=False, init=False)
    c: Any = field(default=None, init=False)
    uc: Any = field(default=None, init=False)
    rng: Any = field(default=None, init=False)
    step_multiplier: int = field(default=1, init=False)
    color_corrections: list = field(default=None, init=False)
    all_prompts: list = field(default=None, init=False)
    all_negative_prompts: list = field(default=None, init=False)
    all_seeds: list = field(default=None, init=False)
    all_subseeds: list = field(default=None, init=False)
    iteration: int = field(default=0, init=False)
    main_prompt: str = field(default=None, init=False)
    main_negative_prompt: str = field(default=None, init=False)
    prompts: list = field(default=None, init=False)
    negative_prompts: list = field(default=None, init=False)
    seeds: list = field(default=None, init=False)
    subseeds: list = field(default=None, init=False)
    extra_network_data: dict = field(default=None, init=False)
    user: str = field(default=None, init=False)
    sd_model_name: str = field(default=None, init=False)
    sd_model_hash: str = field(default=None, init=False)
    sd_vae_name: str = field(default=None, init=False)
    sd_vae_hash: str = field(default=None, init=False)
    is_api: bool = field(default=False, init=False)

    def __post_init__(self):
        # ~L228-252
        self.comments = {}
        if self.styles is None:
            self.styles = []
        self.sampler_noise_scheduler_override = None
        self.extra_generation_params = self.extra_generation_params or {}
        self.override_settings = self.override_settings or {}
        self.script_args = self.script_args or {}
        self.refiner_checkpoint_info = None
        if not self.seed_enable_extras:
            self.subseed = -1
            self.subseed_strength = 0
            self.seed_resize_from_h = 0
            self.seed_resize_from_w = 0

    def fill_fields_from_opts(self):
        self.s_min_uncond = self.s_min_uncond if self.s_min_uncond is not None else opts.s_min_uncond
        self.s_churn = self.s_churn if self.s_churn is not None else opts.s_churn
        self.s_tmin = self.s_tmin if self.s_tmin is not None else opts.s_tmin
        self.s_tmax = (self.s_tmax if self.s_tmax is not None else opts.s_tmax) or float("inf")
        self.s_noise = self.s_noise if self.s_noise is not None else opts.s_noise

    # ~L261-294: p.sd_model is a property (installed below the class, as the dataclass field of the same
    # name needs a plain default) that ALWAYS returns shared.sd_model; assigning it does nothing. Assigning
    # scripts and then script_args (both truthy) runs the scripts' setup() once, with is_ui = not p.is_api.
    @property
    def scripts(self):
        return self.scripts_value

    @scripts.setter
    def scripts(self, value):
        self.scripts_value = value
        if self.scripts_value and self.script_args_value and not self.scripts_setup_complete:
            self.setup_scripts()

    @property
    def script_args(self):
        return self.script_args_value

    @script_args.setter
    def script_args(self, value):
        self.script_args_value = value
        if self.scripts_value and self.script_args_value and not self.scripts_setup_complete:
            self.setup_scripts()

    def setup_scripts(self):
        self.scripts_setup_complete = True
        self.scripts.setup_scrips(self, is_ui=not self.is_api)

    def comment(self, text):
        self.comments[text] = 1

    def txt2img_image_conditioning(self, x, width=None, height=None):
        return txt2img_image_conditioning(self.sd_model, x, width or self.width, height or self.height)

    def init(self, all_prompts, all_seeds, all_subseeds):
        pass

    def sample(self, conditioning, unconditional_conditioning, seeds, subseeds, subseed_strength, prompts):
        raise NotImplementedError()

    def close(self):
        self.sampler = None
        self.c = None
        self.uc = None

    def get_token_merging_ratio(self, for_hr=False):
        # ~L412-416
        if for_hr:
            return (
                self.token_merging_ratio_hr
                or opts.token_merging_ratio_hr
                or self.token_merging_ratio
                or opts.token_merging_ratio
            )
        return self.token_merging_ratio or opts.token_merging_ratio

    def setup_prompts(self):
        # ~L418-438 (styles not applied)
        if isinstance(self.prompt, list):
            self.all_prompts = self.prompt
        elif isinstance(self.negative_prompt, list):
            self.all_prompts = [self.prompt] * len(self.negative_prompt)
        else:
            self.all_prompts = self.batch_size * self.n_iter * [self.prompt]
        if isinstance(self.negative_prompt, list):
            self.all_negative_prompts = self.negative_prompt
        else:
            self.all_negative_prompts = [self.negative_prompt] * len(self.all_prompts)
        if len(self.all_prompts) != len(self.all_negative_prompts):
            raise RuntimeError(
                f"Received a different number of prompts ({len(self.all_prompts)}) and negative prompts ({len(self.all_negative_prompts)})"
            )
        self.main_prompt = self.all_prompts[0]
        self.main_negative_prompt = self.all_negative_prompts[0]

    def setup_conds(self):
        # ~L493-503, with the double's deterministic text encoder (no cache)
        self.uc = self.sd_model.get_learned_conditioning(self.negative_prompts)
        self.c = self.sd_model.get_learned_conditioning(self.prompts)

    def get_conds(self):
        return self.c, self.uc

    def parse_extra_network_prompts(self):
        self.extra_network_data = {}

    def save_samples(self) -> bool:
        return False


def _get_sd_model(self):
    return shared.sd_model


def _set_sd_model(self, value):
    pass


StableDiffusionProcessing.sd_model = property(_get_sd_model, _set_sd_model)


class Processed:
    def __init__(
        self,
        p: StableDiffusionProcessing,
        images_list,
        seed=-1,
        info="",
        subseed=None,
        all_prompts=None,
        all_negative_prompts=None,
        all_seeds=None,
        all_subseeds=None,
        index_of_first_image=0,
        infotexts=None,
        comments="",
    ):
        # ~L516-569
        self.images = images_list
        self.prompt = p.prompt
        self.negative_prompt = p.negative_prompt
        self.seed = seed
        self.subseed = subseed
        self.subseed_strength = p.subseed_strength
        self.info = info
        self.comments = "".join(f"{comment}\n" for comment in p.comments)
        self.width = p.width
        self.height = p.height
        self.sampler_name = p.sampler_name
        self.cfg_scale = p.cfg_scale
        self.image_cfg_scale = getattr(p, "image_cfg_scale", None)
        self.steps = p.steps
        self.batch_size = p.batch_size
        self.restore_faces = p.restore_faces
        self.face_restoration_model = opts.face_restoration_model if p.restore_faces else None
        self.sd_model_name = p.sd_model_name
        self.sd_model_hash = p.sd_model_hash
        self.sd_vae_name = p.sd_vae_name
        self.sd_vae_hash = p.sd_vae_hash
        self.seed_resize_from_w = p.seed_resize_from_w
        self.seed_resize_from_h = p.seed_resize_from_h
        self.denoising_strength = getattr(p, "denoising_strength", None)
        self.extra_generation_params = p.extra_generation_params
        self.index_of_first_image = index_of_first_image
        self.styles = p.styles
        self.job_timestamp = state.job_timestamp
        self.clip_skip = opts.CLIP_stop_at_last_layers
        self.token_merging_ratio = p.token_merging_ratio
        self.token_merging_ratio_hr = p.token_merging_ratio_hr
        self.eta = p.eta
        self.sampler_noise_scheduler_override = p.sampler_noise_scheduler_override
        self.prompt = self.prompt if not isinstance(self.prompt, list) else self.prompt[0]
        self.negative_prompt = (
            self.negative_prompt if not isinstance(self.negative_prompt, list) else self.negative_prompt[0]
        )
        self.seed = int(self.seed if not isinstance(self.seed, list) else self.seed[0]) if self.seed is not None else -1
        self.subseed = (
            int(self.subseed if not isinstance(self.subseed, list) else self.subseed[0])
            if self.subseed is not None
            else -1
        )
        self.is_using_inpainting_conditioning = p.is_using_inpainting_conditioning
        self.all_prompts = all_prompts or p.all_prompts or [self.prompt]
        self.all_negative_prompts = all_negative_prompts or p.all_negative_prompts or [self.negative_prompt]
        self.all_seeds = all_seeds or p.all_seeds or [self.seed]
        self.all_subseeds = all_subseeds or p.all_subseeds or [self.subseed]
        self.infotexts = infotexts or [info] * len(images_list)
        self.version = program_version()

    def js(self):
        # ~L571-607: the API's "info" field; json.dumps with default=lambda o: None (callables become null)
        obj = {
            "prompt": self.all_prompts[0],
            "all_prompts": self.all_prompts,
            "negative_prompt": self.all_negative_prompts[0],
            "all_negative_prompts": self.all_negative_prompts,
            "seed": self.seed,
            "all_seeds": self.all_seeds,
            "subseed": self.subseed,
            "all_subseeds": self.all_subseeds,
            "subseed_strength": self.subseed_strength,
            "width": self.width,
            "height": self.height,
            "sampler_name": self.sampler_name,
            "cfg_scale": self.cfg_scale,
            "steps": self.steps,
            "batch_size": self.batch_size,
            "restore_faces": self.restore_faces,
            "face_restoration_model": self.face_restoration_model,
            "sd_model_name": self.sd_model_name,
            "sd_model_hash": self.sd_model_hash,
            "sd_vae_name": self.sd_vae_name,
            "sd_vae_hash": self.sd_vae_hash,
            "seed_resize_from_w": self.seed_resize_from_w,
            "seed_resize_from_h": self.seed_resize_from_h,
            "denoising_strength": self.denoising_strength,
            "extra_generation_params": self.extra_generation_params,
            "index_of_first_image": self.index_of_first_image,
            "infotexts": self.infotexts,
            "styles": self.styles,
            "job_timestamp": self.job_timestamp,
            "clip_skip": self.clip_skip,
            "is_using_inpainting_conditioning": self.is_using_inpainting_conditioning,
            "version": self.version,
        }
        return json.dumps(obj, default=lambda o: None)

    def infotext(self, p: StableDiffusionProcessing, index):
        return create_infotext(
            p,
            self.all_prompts,
            self.all_seeds,
            self.all_subseeds,
            comments=[],
            position_in_batch=index % self.batch_size,
            iteration=index // self.batch_size,
        )

    def get_token_merging_ratio(self, for_hr=False):
        return self.token_merging_ratio_hr if for_hr else self.token_merging_ratio


def decode_latent_batch(model, batch, target_device=None, check_for_nans=False):
    # ~L625-672 (no VAE precision fallback)
    samples = DecodedSamples()
    if check_for_nans:
        devices.test_for_nans(batch, "unet")
    for i in range(batch.shape[0]):
        sample = model.decode_first_stage(batch[i : i + 1])[0]
        if check_for_nans:
            devices.test_for_nans(sample, "vae")
        samples.append(sample)
    return samples


class DecodedSamples(list):
    already_decoded = True


def get_fixed_seed(seed):
    # ~L675-687
    if seed == "" or seed is None:
        seed = -1
    elif isinstance(seed, str):
        try:
            seed = int(seed)
        except Exception:
            seed = -1
    if seed == -1:
        return int(random.randrange(4294967294))
    return seed


def fix_seed(p):
    p.seed = get_fixed_seed(p.seed)
    p.subseed = get_fixed_seed(p.subseed)


def program_version():
    return "v1.10.1"


def create_infotext(
    p,
    all_prompts,
    all_seeds,
    all_subseeds,
    comments=None,
    iteration=0,
    position_in_batch=0,
    use_main_prompt=False,
    index=None,
    all_negative_prompts=None,
):
    # ~L705-816: same keys and order; list values are indexed, callables are called with locals() (errors -> None)
    if use_main_prompt:
        index = 0
    elif index is None:
        index = position_in_batch + iteration * p.batch_size

    if all_negative_prompts is None:
        all_negative_prompts = p.all_negative_prompts

    clip_skip = getattr(p, "clip_skip", opts.CLIP_stop_at_last_layers)
    enable_hr = getattr(p, "enable_hr", False)
    token_merging_ratio = p.get_token_merging_ratio()
    token_merging_ratio_hr = p.get_token_merging_ratio(for_hr=True)

    prompt_text = p.main_prompt if use_main_prompt else all_prompts[index]
    negative_prompt = p.main_negative_prompt if use_main_prompt else all_negative_prompts[index]

    generation_params = {
        "Steps": p.steps,
        "Sampler": p.sampler_name,
        "Schedule type": p.scheduler,
        "CFG scale": p.cfg_scale,
        "Image CFG scale": getattr(p, "image_cfg_scale", None),
        "Seed": p.all_seeds[0] if use_main_prompt else all_seeds[index],
        "Face restoration": opts.face_restoration_model if p.restore_faces else None,
        "Size": f"{p.width}x{p.height}",
        "Model hash": p.sd_model_hash if opts.add_model_hash_to_info else None,
        "Model": p.sd_model_name if opts.add_model_name_to_info else None,
        "VAE hash": p.sd_vae_hash if opts.add_vae_hash_to_info else None,
        "VAE": p.sd_vae_name if opts.add_vae_name_to_info else None,
        "Variation seed": (
            None if p.subseed_strength == 0 else (p.all_subseeds[0] if use_main_prompt else all_subseeds[index])
        ),
        "Variation seed strength": (None if p.subseed_strength == 0 else p.subseed_strength),
        "Seed resize from": (
            None
            if p.seed_resize_from_w <= 0 or p.seed_resize_from_h <= 0
            else f"{p.seed_resize_from_w}x{p.seed_resize_from_h}"
        ),
        "Denoising strength": p.extra_generation_params.get("Denoising strength"),
        "Conditional mask weight": None,
        "Clip skip": None if clip_skip <= 1 else clip_skip,
        "ENSD": None,
        "Token merging ratio": None if token_merging_ratio == 0 else token_merging_ratio,
        "Token merging ratio hr": None if not enable_hr or token_merging_ratio_hr == 0 else token_merging_ratio_hr,
        "Init image hash": getattr(p, "init_img_hash", None),
        "RNG": opts.randn_source if opts.randn_source != "GPU" else None,
        "Tiling": "True" if p.tiling else None,
        **p.extra_generation_params,
        "Version": program_version() if opts.add_version_to_infotext else None,
        "User": p.user if opts.add_user_name_to_info else None,
    }

    for key, value in generation_params.items():
        try:
            if isinstance(value, list):
                generation_params[key] = value[index]
            elif callable(value):
                generation_params[key] = value(**locals())
        except Exception:
            errors.report(f'Error creating infotext for key "{key}"', exc_info=True)
            generation_params[key] = None

    generation_params_text = ", ".join(
        [k if k == v else f"{k}: {infotext_utils.quote(v)}" for k, v in generation_params.items() if v is not None]
    )
    negative_prompt_text = f"\nNegative prompt: {negative_prompt}" if negative_prompt else ""
    return f"{prompt_text}{negative_prompt_text}\n{generation_params_text}".strip()


def process_images(p: StableDiffusionProcessing) -> Processed:
    if p.scripts is not None:
        p.scripts.before_process(p)

    stored_opts = {
        k: opts.data[k] if k in opts.data else opts.get_default(k) for k in p.override_settings if k in opts.data
    }

    try:
        if sd_models.checkpoint_aliases.get(p.override_settings.get("sd_model_checkpoint")) is None:
            p.override_settings.pop("sd_model_checkpoint", None)
            sd_models.reload_model_weights()

        for k, v in p.override_settings.items():
            opts.set(k, v, is_api=True, run_callbacks=False)
            if k == "sd_model_checkpoint":
                sd_models.reload_model_weights()

        sd_models.apply_token_merging(p.sd_model, p.get_token_merging_ratio())

        sd_samplers.fix_p_invalid_sampler_and_scheduler(p)

        res = process_images_inner(p)

    finally:
        sd_models.apply_token_merging(p.sd_model, 0)

        if p.override_settings_restore_afterwards:
            for k, v in stored_opts.items():
                setattr(opts, k, v)

    return res


def process_images_inner(p: StableDiffusionProcessing) -> Processed:
    global params_txt

    if isinstance(p.prompt, list):
        assert len(p.prompt) > 0
    else:
        assert p.prompt is not None

    seed = get_fixed_seed(p.seed)
    subseed = get_fixed_seed(p.subseed)

    if p.restore_faces is None:
        p.restore_faces = opts.face_restoration
    if p.tiling is None:
        p.tiling = opts.tiling

    if p.refiner_checkpoint not in (None, "", "None", "none"):
        p.refiner_checkpoint_info = sd_models.get_closet_checkpoint_match(p.refiner_checkpoint)
        if p.refiner_checkpoint_info is None:
            raise Exception(f"Could not find checkpoint with name {p.refiner_checkpoint}")

    p.sd_model_name = shared.sd_model.sd_checkpoint_info.name_for_extra
    p.sd_model_hash = shared.sd_model.sd_model_hash
    p.sd_vae_name = None
    p.sd_vae_hash = None

    p.fill_fields_from_opts()
    p.setup_prompts()

    if isinstance(seed, list):
        p.all_seeds = seed
    else:
        p.all_seeds = [int(seed) + (x if p.subseed_strength == 0 else 0) for x in range(len(p.all_prompts))]

    if isinstance(subseed, list):
        p.all_subseeds = subseed
    else:
        p.all_subseeds = [int(subseed) + x for x in range(len(p.all_prompts))]

    if p.scripts is not None:
        p.scripts.process(p)

    infotexts = []
    output_images = []
    with torch.no_grad(), p.sd_model.ema_scope():
        p.init(p.all_prompts, p.all_seeds, p.all_subseeds)

        if state.job_count == -1:
            state.job_count = p.n_iter

        for n in range(p.n_iter):
            p.iteration = n

            if state.skipped:
                state.skipped = False

            if state.interrupted or state.stopping_generation:
                break

            sd_models.reload_model_weights()

            p.prompts = p.all_prompts[n * p.batch_size : (n + 1) * p.batch_size]
            p.negative_prompts = p.all_negative_prompts[n * p.batch_size : (n + 1) * p.batch_size]
            p.seeds = p.all_seeds[n * p.batch_size : (n + 1) * p.batch_size]
            p.subseeds = p.all_subseeds[n * p.batch_size : (n + 1) * p.batch_size]

            latent_channels = getattr(shared.sd_model, "latent_channels", opt_C)
            p.rng = ImageRNG(
                (latent_channels, p.height // opt_f, p.width // opt_f),
                p.seeds,
                subseeds=p.subseeds,
                subseed_strength=p.subseed_strength,
                seed_resize_from_h=p.seed_resize_from_h,
                seed_resize_from_w=p.seed_resize_from_w,
            )

            if p.scripts is not None:
                p.scripts.before_process_batch(p, batch_number=n, prompts=p.prompts, seeds=p.seeds, subseeds=p.subseeds)

            if len(p.prompts) == 0:
                break

            p.parse_extra_network_prompts()

            if not p.disable_extra_networks and p.scripts is not None:
                # extra_networks.activate ends with this hook (modules/extra_networks.py ~L149-150)
                p.scripts.after_extra_networks_activate(
                    p,
                    batch_number=p.iteration,
                    prompts=p.prompts,
                    seeds=p.seeds,
                    subseeds=p.subseeds,
                    extra_network_data=p.extra_network_data,
                )

            if p.scripts is not None:
                p.scripts.process_batch(p, batch_number=n, prompts=p.prompts, seeds=p.seeds, subseeds=p.subseeds)

            p.setup_conds()

            if n == 0 and not cmd_opts.no_prompt_history:
                params_txt = Processed(p, []).infotext(p, 0)

            if p.n_iter > 1:
                shared.state.job = f"Batch {n + 1} out of {p.n_iter}"

            sd_models.apply_alpha_schedule_override(p.sd_model, p)

            samples_ddim = p.sample(
                conditioning=p.c,
                unconditional_conditioning=p.uc,
                seeds=p.seeds,
                subseeds=p.subseeds,
                subseed_strength=p.subseed_strength,
                prompts=p.prompts,
            )

            if p.scripts is not None:
                ps = scripts.PostSampleArgs(samples_ddim)
                p.scripts.post_sample(p, ps)
                samples_ddim = ps.samples

            if getattr(samples_ddim, "already_decoded", False):
                x_samples_ddim = samples_ddim
            else:
                devices.test_for_nans(samples_ddim, "unet")
                x_samples_ddim = decode_latent_batch(
                    p.sd_model, samples_ddim, target_device=devices.cpu, check_for_nans=True
                )

            x_samples_ddim = torch.stack(x_samples_ddim).float()
            x_samples_ddim = torch.clamp((x_samples_ddim + 1.0) / 2.0, min=0.0, max=1.0)

            del samples_ddim

            state.nextjob()

            if p.scripts is not None:
                p.scripts.postprocess_batch(p, x_samples_ddim, batch_number=n)

                p.prompts = p.all_prompts[n * p.batch_size : (n + 1) * p.batch_size]
                p.negative_prompts = p.all_negative_prompts[n * p.batch_size : (n + 1) * p.batch_size]

                batch_params = scripts.PostprocessBatchListArgs(list(x_samples_ddim))
                p.scripts.postprocess_batch_list(p, batch_params, batch_number=n)
                x_samples_ddim = batch_params.images

            def infotext(index=0, use_main_prompt=False):
                return create_infotext(
                    p,
                    p.prompts,
                    p.seeds,
                    p.subseeds,
                    use_main_prompt=use_main_prompt,
                    index=index,
                    all_negative_prompts=p.negative_prompts,
                )

            for i, x_sample in enumerate(x_samples_ddim):
                p.batch_index = i

                x_sample = 255.0 * np.moveaxis(x_sample.cpu().numpy(), 0, 2)
                x_sample = x_sample.astype(np.uint8)
                image = Image.fromarray(x_sample)

                if p.scripts is not None:
                    pp = scripts.PostprocessImageArgs(image)
                    p.scripts.postprocess_image(p, pp)
                    image = pp.image

                mask_for_overlay = getattr(p, "mask_for_overlay", None)
                overlay_image = None

                if p.scripts is not None:
                    ppmo = scripts.PostProcessMaskOverlayArgs(i, mask_for_overlay, overlay_image)
                    p.scripts.postprocess_maskoverlay(p, ppmo)

                if p.scripts is not None:
                    pp = scripts.PostprocessImageArgs(image)
                    p.scripts.postprocess_image_after_composite(p, pp)
                    image = pp.image

                text = infotext(i)
                infotexts.append(text)
                if opts.enable_pnginfo:
                    image.info["parameters"] = text
                output_images.append(image)

            del x_samples_ddim

        if not infotexts:
            infotexts.append(Processed(p, []).infotext(p, 0))

        p.color_corrections = None

        index_of_first_image = 0
        unwanted_grid_because_of_img_count = len(output_images) < 2 and opts.grid_only_if_multiple
        if (opts.return_grid or opts.grid_save) and not p.do_not_save_grid and not unwanted_grid_because_of_img_count:
            grid = image_grid(output_images, p.batch_size)
            if opts.return_grid:
                text = infotext(use_main_prompt=True)
                infotexts.insert(0, text)
                if opts.enable_pnginfo:
                    grid.info["parameters"] = text
                output_images.insert(0, grid)
                index_of_first_image = 1

    res = Processed(
        p,
        images_list=output_images,
        seed=p.all_seeds[0],
        info=infotexts[0],
        subseed=p.all_subseeds[0],
        index_of_first_image=index_of_first_image,
        infotexts=infotexts,
    )

    if p.scripts is not None:
        p.scripts.postprocess(p, res)

    return res


def image_grid(imgs, batch_size):
    """Plain grid (modules/images.py image_grid, without its options)."""
    rows = max(1, int(np.sqrt(len(imgs))))
    cols = (len(imgs) + rows - 1) // rows
    w, h = imgs[0].size
    grid = Image.new("RGB", size=(cols * w, rows * h), color="black")
    for i, img in enumerate(imgs):
        grid.paste(img, box=(i % cols * w, i // cols * h))
    return grid


@dataclass(repr=False)
class StableDiffusionProcessingTxt2Img(StableDiffusionProcessing):
    enable_hr: bool = False
    denoising_strength: float = 0.75
    firstphase_width: int = 0
    firstphase_height: int = 0
    hr_scale: float = 2.0
    hr_upscaler: str = None
    hr_second_pass_steps: int = 0
    hr_resize_x: int = 0
    hr_resize_y: int = 0
    hr_checkpoint_name: str = None
    hr_sampler_name: str = None
    hr_scheduler: str = None
    hr_prompt: str = ""
    hr_negative_prompt: str = ""
    force_task_id: str = None

    hr_checkpoint_info: dict = field(default=None, init=False)
    hr_upscale_to_x: int = field(default=0, init=False)
    hr_upscale_to_y: int = field(default=0, init=False)
    truncate_x: int = field(default=0, init=False)
    truncate_y: int = field(default=0, init=False)
    applied_old_hires_behavior_to: tuple = field(default=None, init=False)
    latent_scale_mode: dict = field(default=None, init=False)
    hr_c: Any = field(default=None, init=False)
    hr_uc: Any = field(default=None, init=False)
    all_hr_prompts: list = field(default=None, init=False)
    all_hr_negative_prompts: list = field(default=None, init=False)
    hr_prompts: list = field(default=None, init=False)
    hr_negative_prompts: list = field(default=None, init=False)
    hr_extra_network_data: list = field(default=None, init=False)

    def __post_init__(self):
        super().__post_init__()
        if self.firstphase_width != 0 or self.firstphase_height != 0:
            self.hr_upscale_to_x = self.width
            self.hr_upscale_to_y = self.height
            self.width = self.firstphase_width
            self.height = self.firstphase_height

    def calculate_target_resolution(self):
        # ~L1213-1250 (old hires behaviour left out)
        if self.hr_resize_x == 0 and self.hr_resize_y == 0:
            self.extra_generation_params["Hires upscale"] = self.hr_scale
            self.hr_upscale_to_x = int(self.width * self.hr_scale)
            self.hr_upscale_to_y = int(self.height * self.hr_scale)
        else:
            self.extra_generation_params["Hires resize"] = f"{self.hr_resize_x}x{self.hr_resize_y}"
            if self.hr_resize_y == 0:
                self.hr_upscale_to_x = self.hr_resize_x
                self.hr_upscale_to_y = self.hr_resize_x * self.height // self.width
            elif self.hr_resize_x == 0:
                self.hr_upscale_to_x = self.hr_resize_y * self.width // self.height
                self.hr_upscale_to_y = self.hr_resize_y
            else:
                target_w = self.hr_resize_x
                target_h = self.hr_resize_y
                src_ratio = self.width / self.height
                dst_ratio = self.hr_resize_x / self.hr_resize_y
                if src_ratio < dst_ratio:
                    self.hr_upscale_to_x = self.hr_resize_x
                    self.hr_upscale_to_y = self.hr_resize_x * self.height // self.width
                else:
                    self.hr_upscale_to_x = self.hr_resize_y * self.width // self.height
                    self.hr_upscale_to_y = self.hr_resize_y
                self.truncate_x = (self.hr_upscale_to_x - target_w) // opt_f
                self.truncate_y = (self.hr_upscale_to_y - target_h) // opt_f

    def init(self, all_prompts, all_seeds, all_subseeds):
        # ~L1252-1305
        if not self.enable_hr:
            return
        self.extra_generation_params["Denoising strength"] = self.denoising_strength

        if self.hr_sampler_name is not None and self.hr_sampler_name != self.sampler_name:
            self.extra_generation_params["Hires sampler"] = self.hr_sampler_name

        def get_hr_prompt(p, index, prompt_text, **kwargs):
            hr_prompt = p.all_hr_prompts[index]
            return hr_prompt if hr_prompt != prompt_text else None

        def get_hr_negative_prompt(p, index, negative_prompt, **kwargs):
            hr_negative_prompt = p.all_hr_negative_prompts[index]
            return hr_negative_prompt if hr_negative_prompt != negative_prompt else None

        self.extra_generation_params["Hires prompt"] = get_hr_prompt
        self.extra_generation_params["Hires negative prompt"] = get_hr_negative_prompt
        self.extra_generation_params["Hires schedule type"] = None

        if self.hr_scheduler is None:
            self.hr_scheduler = self.scheduler

        if self.hr_upscaler is not None:
            self.latent_scale_mode = shared.latent_upscale_modes.get(self.hr_upscaler, None)
        else:
            self.latent_scale_mode = shared.latent_upscale_modes.get(shared.latent_upscale_default_mode, "nearest")
        if self.latent_scale_mode is None and not any(x.name == self.hr_upscaler for x in shared.sd_upscalers):
            raise Exception(f"could not find upscaler named {self.hr_upscaler}")

        self.calculate_target_resolution()

        if not state.processing_has_refined_job_count:
            if state.job_count == -1:
                state.job_count = self.n_iter
            state.job_count = state.job_count * 2
            state.processing_has_refined_job_count = True

        if self.hr_second_pass_steps:
            self.extra_generation_params["Hires steps"] = self.hr_second_pass_steps
        if self.hr_upscaler is not None:
            self.extra_generation_params["Hires upscaler"] = self.hr_upscaler

    def sample(self, conditioning, unconditional_conditioning, seeds, subseeds, subseed_strength, prompts):
        # ~L1307-1362 (firstpass_image path left out)
        self.sampler = sd_samplers.create_sampler(self.sampler_name, self.sd_model)

        x = self.rng.next()
        if self.scripts is not None:
            self.scripts.process_before_every_sampling(
                p=self, x=x, noise=x, c=conditioning, uc=unconditional_conditioning
            )

        samples = self.sampler.sample(
            self, x, conditioning, unconditional_conditioning, image_conditioning=self.txt2img_image_conditioning(x)
        )
        del x

        if not self.enable_hr:
            return samples

        decoded_samples = None  # latent upscalers only in the double

        with sd_models.SkipWritingToConfig():
            sd_models.reload_model_weights(info=self.hr_checkpoint_info)

        return self.sample_hr_pass(samples, decoded_samples, seeds, subseeds, subseed_strength, prompts)

    def sample_hr_pass(self, samples, decoded_samples, seeds, subseeds, subseed_strength, prompts):
        # ~L1364-1464, latent-upscale branch
        if shared.state.interrupted:
            return samples

        self.is_hr_pass = True
        target_width = self.hr_upscale_to_x
        target_height = self.hr_upscale_to_y

        img2img_sampler_name = self.hr_sampler_name or self.sampler_name
        self.sampler = sd_samplers.create_sampler(img2img_sampler_name, self.sd_model)

        samples = torch.nn.functional.interpolate(
            samples,
            size=(target_height // opt_f, target_width // opt_f),
            mode=self.latent_scale_mode["mode"],
            antialias=self.latent_scale_mode["antialias"],
        )
        image_conditioning = self.txt2img_image_conditioning(samples)

        shared.state.nextjob()

        samples = samples[
            :,
            :,
            self.truncate_y // 2 : samples.shape[2] - (self.truncate_y + 1) // 2,
            self.truncate_x // 2 : samples.shape[3] - (self.truncate_x + 1) // 2,
        ]

        self.rng = ImageRNG(
            samples.shape[1:],
            self.seeds,
            subseeds=self.subseeds,
            subseed_strength=self.subseed_strength,
            seed_resize_from_h=self.seed_resize_from_h,
            seed_resize_from_w=self.seed_resize_from_w,
        )
        noise = self.rng.next()

        if not self.disable_extra_networks and self.scripts is not None:
            self.scripts.after_extra_networks_activate(
                self,
                batch_number=self.iteration,
                prompts=self.prompts,
                seeds=self.seeds,
                subseeds=self.subseeds,
                extra_network_data=self.hr_extra_network_data,
            )

        self.calculate_hr_conds()

        sd_models.apply_token_merging(self.sd_model, self.get_token_merging_ratio(for_hr=True))

        if self.scripts is not None:
            self.scripts.before_hr(self)
            self.scripts.process_before_every_sampling(p=self, x=samples, noise=noise, c=self.hr_c, uc=self.hr_uc)

        samples = self.sample_hr_latents(samples, noise, image_conditioning)

        sd_models.apply_token_merging(self.sd_model, self.get_token_merging_ratio())

        self.sampler = None

        decoded_samples = decode_latent_batch(self.sd_model, samples, target_device=devices.cpu, check_for_nans=True)

        self.is_hr_pass = False
        return decoded_samples

    def sample_hr_latents(self, samples, noise, image_conditioning):
        """The hires pass's sampler call (the double's own helper, shared with the Forge double)."""
        return self.sampler.sample_img2img(
            self,
            samples,
            noise,
            self.hr_c,
            self.hr_uc,
            steps=self.hr_second_pass_steps or self.steps,
            image_conditioning=image_conditioning,
        )

    def close(self):
        super().close()
        self.hr_c = None
        self.hr_uc = None

    def setup_prompts(self):
        # ~L1474-1497
        super().setup_prompts()
        if not self.enable_hr:
            return
        if self.hr_prompt == "":
            self.hr_prompt = self.prompt
        if self.hr_negative_prompt == "":
            self.hr_negative_prompt = self.negative_prompt
        if isinstance(self.hr_prompt, list):
            self.all_hr_prompts = self.hr_prompt
        else:
            self.all_hr_prompts = self.batch_size * self.n_iter * [self.hr_prompt]
        if isinstance(self.hr_negative_prompt, list):
            self.all_hr_negative_prompts = self.hr_negative_prompt
        else:
            self.all_hr_negative_prompts = self.batch_size * self.n_iter * [self.hr_negative_prompt]

    def calculate_hr_conds(self):
        if self.hr_c is not None:
            return
        self.hr_uc = self.sd_model.get_learned_conditioning(self.hr_negative_prompts)
        self.hr_c = self.sd_model.get_learned_conditioning(self.hr_prompts)

    def setup_conds(self):
        if self.is_hr_pass:
            self.hr_c = None
            self.calculate_hr_conds()
            return
        super().setup_conds()
        self.hr_uc = None
        self.hr_c = None

    def get_conds(self):
        if self.is_hr_pass:
            return self.hr_c, self.hr_uc
        return super().get_conds()

    def parse_extra_network_prompts(self):
        super().parse_extra_network_prompts()
        if self.enable_hr:
            self.hr_prompts = self.all_hr_prompts[
                self.iteration * self.batch_size : (self.iteration + 1) * self.batch_size
            ]
            self.hr_negative_prompts = self.all_hr_negative_prompts[
                self.iteration * self.batch_size : (self.iteration + 1) * self.batch_size
            ]
            self.hr_extra_network_data = {}


@dataclass(repr=False)
class StableDiffusionProcessingImg2Img(StableDiffusionProcessing):
    init_images: list = None
    resize_mode: int = 0
    denoising_strength: float = 0.75
    image_cfg_scale: float = None
    mask: Any = None
    mask_blur_x: int = 4
    mask_blur_y: int = 4
    mask_blur: int = None
    mask_round: bool = True
    inpainting_fill: int = 0
    inpaint_full_res: bool = True
    inpaint_full_res_padding: int = 0
    inpainting_mask_invert: int = 0
    initial_noise_multiplier: float = None
    latent_mask: Any = None
    force_task_id: str = None

    image_mask: Any = field(default=None, init=False)
    nmask: Any = field(default=None, init=False)
    image_conditioning: Any = field(default=None, init=False)
    init_img_hash: str = field(default=None, init=False)
    mask_for_overlay: Any = field(default=None, init=False)
    init_latent: Any = field(default=None, init=False)

    def __post_init__(self):
        super().__post_init__()
        self.image_mask = self.mask
        self.mask = None
        self.initial_noise_multiplier = (
            opts.initial_noise_multiplier if self.initial_noise_multiplier is None else self.initial_noise_multiplier
        )

    def init(self, all_prompts, all_seeds, all_subseeds):
        # ~L1602-1757, reduced to: resize init images, "encode" them, repeat to the batch size (no masks)
        self.extra_generation_params["Denoising strength"] = self.denoising_strength
        self.image_cfg_scale = self.image_cfg_scale if shared.sd_model.cond_stage_key == "edit" else None
        self.sampler = sd_samplers.create_sampler(self.sampler_name, self.sd_model)
        imgs = []
        for img in self.init_images:
            img = img.convert("RGB").resize((self.width, self.height))
            arr = np.moveaxis(np.array(img).astype(np.float32) / 255.0, 2, 0)
            imgs.append(arr)
        if len(imgs) == 1:
            batch = np.expand_dims(imgs[0], axis=0).repeat(self.batch_size, axis=0)
        elif len(imgs) <= self.batch_size:
            self.batch_size = len(imgs)
            batch = np.array(imgs)
        else:
            raise RuntimeError(f"bad number of images passed: {len(imgs)}; expecting {self.batch_size} or less")
        image = torch.from_numpy(batch) * 2.0 - 1.0
        self.init_latent = self.sd_model.get_first_stage_encoding(self.sd_model.encode_first_stage(image))
        self.image_conditioning = self.txt2img_image_conditioning(self.init_latent)

    def sample(self, conditioning, unconditional_conditioning, seeds, subseeds, subseed_strength, prompts):
        # ~L1759-1789 (mask blending left out)
        x = self.rng.next()
        if self.initial_noise_multiplier != 1.0:
            self.extra_generation_params["Noise multiplier"] = self.initial_noise_multiplier
            x *= self.initial_noise_multiplier
        if self.scripts is not None:
            self.scripts.process_before_every_sampling(
                p=self, x=self.init_latent, noise=x, c=conditioning, uc=unconditional_conditioning
            )
        samples = self.sampler.sample_img2img(
            self,
            self.init_latent,
            x,
            conditioning,
            unconditional_conditioning,
            image_conditioning=self.image_conditioning,
        )
        del x
        return samples

    def get_token_merging_ratio(self, for_hr=False):
        # ~L1791-1792: for_hr is ignored; p ratio, then an override of the txt2img option, then the img2img option,
        # then the txt2img option
        return (
            self.token_merging_ratio
            or ("token_merging_ratio" in self.override_settings and opts.token_merging_ratio)
            or opts.token_merging_ratio_img2img
            or opts.token_merging_ratio
        )
