"""The lab's trained SD1.5- and SDXL-layout models (:mod:`benchmarks.lab.trained`) as diffusers pipelines: each ldm
``UNetModel`` converted by diffusers' own converter into a ``UNet2DConditionModel``, in a ``StableDiffusionPipeline``
(or ``StableDiffusionXLPipeline``) that samples its pixels (a one-level VAE keeps the size; ``output_type="latent"``
returns the pixels, the VAE never runs), its "prompt" the conditioner's context tokens passed in as embeddings.

SDXL's ``y`` (a learned 64-wide vector per class) is diffusers' pooled text embedding: the converted label embedding's
first layer takes SDXL's six time ids beside it, with zero weights, so they add nothing.

Schedulers: SD1.5's own configuration (scaled-linear betas 0.00085–0.012, ``steps_offset`` 1) under Euler, DDIM and
DPM-Solver++ 2M with Karras sigmas, as the diffusers docs run SD1.5.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.lab.trained import architectures as A
from benchmarks.lab.trained.loading import Model, load_model

SD15_SCHEDULER = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    steps_offset=1,
    timestep_spacing="leading",
)
TIME_IDS = 8
"""The width diffusers embeds each of SDXL's six time ids at (``addition_time_embed_dim``): zero-weighted here."""


def scheduler(name: str) -> Any:
    """``euler``, ``ddim`` or ``dpmpp_2m`` (Karras sigmas) on SD1.5's configuration."""
    import diffusers

    if name == "euler":
        return diffusers.EulerDiscreteScheduler(**SD15_SCHEDULER)
    if name == "ddim":
        return diffusers.DDIMScheduler(**SD15_SCHEDULER, clip_sample=False, set_alpha_to_one=False)
    if name == "dpmpp_2m":
        return diffusers.DPMSolverMultistepScheduler(
            **SD15_SCHEDULER, algorithm_type="dpmsolver++", solver_order=2, use_karras_sigmas=True
        )
    raise ValueError(f"scheduler {name!r}: one of euler, ddim, dpmpp_2m")


SCHEDULERS = ("euler", "ddim", "dpmpp_2m")


def _config(model: Model) -> dict[str, Any]:
    """The ``UNet2DConditionModel`` configuration of ``model``'s ldm UNet (diffusers' reading of an ldm config)."""
    from diffusers.loaders.single_file_utils import create_unet_diffusers_config_from_ldm

    arch = A.ARCHITECTURES[model.name]
    params = dict(arch.unet, in_channels=arch.channels, out_channels=arch.channels, context_dim=arch.context_dim)
    if arch.adm_dim:
        params.update(num_classes="sequential", adm_in_channels=arch.adm_dim + 6 * TIME_IDS)
    original = {
        "model": {
            "params": {
                "unet_config": {"params": params},
                "first_stage_config": {"params": {"ddconfig": {"ch_mult": [1]}}},
            }
        }
    }
    state = {f"model.diffusion_model.{k}": v for k, v in model.unet.state_dict().items()}
    config = create_unet_diffusers_config_from_ldm(original, state)
    heads = [c // arch.unet["num_head_channels"] for c in config["block_out_channels"]]
    config.update(sample_size=arch.size, attention_head_dim=heads)
    if arch.depths:  # built deep, cut per level (architectures.build): no transformer at the first level
        config["transformer_layers_per_block"] = (1, *arch.depths)
    if arch.adm_dim:  # SDXL's: the pooled embedding and the time ids
        config.update(
            class_embed_type=None,
            num_class_embeds=None,
            addition_embed_type="text_time",
            addition_time_embed_dim=TIME_IDS,
            projection_class_embeddings_input_dim=arch.adm_dim + 6 * TIME_IDS,
        )
    return config


def _state(model: Model) -> dict[str, torch.Tensor]:
    """``model``'s UNet weights as ldm's converter reads them: the SDXL layout's label embedding is ``Sequential``
    (Linear, SiLU, Linear) where sgm nests one more level."""
    state = model.unet.state_dict()
    if A.ARCHITECTURES[model.name].adm_dim:
        state = {k.replace("label_emb.", "label_emb.0.", 1): v for k, v in state.items()}
        first = state["label_emb.0.0.weight"]
        state["label_emb.0.0.weight"] = torch.cat([first, first.new_zeros(first.shape[0], 6 * TIME_IDS)], dim=1)
    return {f"model.diffusion_model.{k}": v for k, v in state.items()}


def diffusers_unet(model: Model) -> torch.nn.Module:
    """``model``'s UNet as diffusers' ``UNet2DConditionModel``, converted by diffusers (eval, float32)."""
    from diffusers import UNet2DConditionModel
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    config = _config(model)
    unet = UNet2DConditionModel(**config)
    unet.load_state_dict(convert_ldm_unet_checkpoint(_state(model), config), strict=True)
    return unet.eval().requires_grad_(False)


@dataclass
class Pipe:
    """A trained model's diffusers pipeline and how to sample it."""

    name: str
    pipe: Any
    model: Model

    def sample(self, labels: torch.Tensor, noise: torch.Tensor, steps: int, guidance: float = 7.0) -> torch.Tensor:
        """Images in [-1, 1] for ``labels`` from ``noise`` (the initial latents, unit variance), ``steps`` steps."""
        cond, uncond = self.model.condition(labels), self.model.condition(torch.full_like(labels, -1))
        more: dict[str, Any] = {}
        if "y" in cond:
            more = {"pooled_prompt_embeds": cond["y"], "negative_pooled_prompt_embeds": uncond["y"]}
        side = noise.shape[-1]
        with torch.no_grad():
            out = self.pipe(
                prompt_embeds=cond["context"],
                negative_prompt_embeds=uncond["context"],
                num_inference_steps=steps,
                guidance_scale=guidance,
                height=side,
                width=side,
                latents=noise * _init_sigma(self.pipe.scheduler, steps),
                output_type="latent",
                **more,
            ).images
        return out.clamp(-1, 1)


def _init_sigma(scheduler: Any, steps: int) -> float:
    """The scheduler's initial noise scale once its timesteps for ``steps`` are set (the pipeline's own ``latents``
    are scaled by it: given latents must be too)."""
    scheduler.set_timesteps(steps)
    return float(scheduler.init_noise_sigma)


@functools.cache
def _vae() -> Any:
    from diffusers import AutoencoderKL

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoencoderKL(
            block_out_channels=(32,),
            in_channels=3,
            out_channels=3,
            latent_channels=3,
            down_block_types=("DownEncoderBlock2D",),
            up_block_types=("UpDecoderBlock2D",),
        ).eval()


def pipeline(name: str, scheduler_name: str = "euler") -> Pipe:
    """The trained ``sd15`` or ``sdxl`` model as a diffusers pipeline under ``scheduler_name``."""
    from diffusers import StableDiffusionPipeline, StableDiffusionXLPipeline

    model = load_model(name)
    parts: dict[str, Any] = dict(
        vae=_vae(), unet=diffusers_unet(model), scheduler=scheduler(scheduler_name), tokenizer=None, text_encoder=None
    )
    if A.ARCHITECTURES[name].adm_dim:
        pipe = StableDiffusionXLPipeline(
            **parts, text_encoder_2=None, tokenizer_2=None, force_zeros_for_empty_prompt=False
        )
    else:
        pipe = StableDiffusionPipeline(
            **parts, safety_checker=None, feature_extractor=None, requires_safety_checker=False
        )
    pipe.set_progress_bar_config(disable=True)
    return Pipe(name, pipe, model)
