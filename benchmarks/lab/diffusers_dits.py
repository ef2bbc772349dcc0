"""The lab's trained FLUX- and Wan-layout transformers (:mod:`benchmarks.lab.trained.flux`, :mod:`.wan`) as diffusers
pipelines: the trained ``FluxTransformer2DModel`` in a ``FluxPipeline``, the trained ``WanTransformer3DModel`` in a
``WanPipeline``, each under diffusers' ``FlowMatchEulerDiscreteScheduler`` configured as the lab samples them, its
"prompt" the conditioner's context tokens (and FLUX's pooled vector) passed in as embeddings; no text encoder, no VAE
(``output_type="latent"`` returns the latents, the VAE never runs). The mirror of
:mod:`benchmarks.lab.diffusers_unets` for the transformers.

* FLUX: the latents are the lab's packed pixels (4×4 patches, 48 channels a token, :func:`flux.pack`), given to the
  pipeline as its packed latents; the pipeline's ``height``/``width`` are set so that its image ids are the lab's
  (an 8 × 8 token grid for 32 px: the pipeline's latent grid is ``height / 16`` with no VAE). Its scheduler: FLUX.1's
  (dynamic shifting, ``mu`` from the token count, exponential time shift), which gives the lab's
  :func:`flux.sigmas` to the float. Guidance: true CFG (``true_cfg_scale`` with negative embeddings; the model has
  no guidance embedding), cond and uncond as two calls per step, each in its own cache context.
* Wan: the latents are the lab's clips (B, 3, F, H, W); its scheduler: flow-matching Euler with shift 3 (the lab's
  :func:`wan.sigmas`); ``guidance_scale`` runs cond and uncond as two calls per step. Diffusers' Wan example samples
  with UniPC (``flow_shift``), not run here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.lab.dit import CFG, Trained
from benchmarks.lab.trained import flux, wan

FLUX_SCHEDULER = dict(
    use_dynamic_shifting=True,
    base_shift=0.5,
    max_shift=1.15,
    base_image_seq_len=256,
    max_image_seq_len=4096,
    time_shift_type="exponential",
)
"""FLUX.1's scheduler configuration (its ``shift`` is unused under dynamic shifting)."""
WAN_SCHEDULER = dict(shift=wan.SHIFT)
WAN_SIDE, WAN_FRAMES = 256, 29
"""What the Wan pipeline is told of the clip's size (its checks want multiples of 16 and 4k + 1 frames); the latents
given are the clips themselves."""


def scheduler(name: str) -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**(FLUX_SCHEDULER if name == "flux" else WAN_SCHEDULER))


@dataclass
class Pipe:
    """A trained transformer's diffusers pipeline and how to sample it."""

    name: str
    pipe: Any
    model: Trained

    def sample(self, labels: torch.Tensor, noise: torch.Tensor, steps: int, guidance: float = CFG) -> torch.Tensor:
        """Samples (images (B, 3, H, W) or clips (B, 3, F, H, W), in [-1, 1]) for ``labels`` from ``noise``."""
        with torch.no_grad():
            cond = self.model.conditioner(labels.long())
            uncond = self.model.conditioner(torch.full_like(labels.long(), -1))
            if self.name == "flux":
                side = noise.shape[-1] // flux.PATCH * 16  # the pipeline's latent grid is height / 16 tokens
                out = self.pipe(
                    prompt_embeds=cond["context"],
                    pooled_prompt_embeds=cond["y"],
                    negative_prompt_embeds=uncond["context"],
                    negative_pooled_prompt_embeds=uncond["y"],
                    true_cfg_scale=guidance,
                    num_inference_steps=steps,
                    height=side,
                    width=side,
                    latents=flux.pack(noise),
                    output_type="latent",
                ).images
                out = flux.unpack(out, *noise.shape[2:])
            else:
                out = self.pipe(
                    prompt_embeds=cond["context"],
                    negative_prompt_embeds=uncond["context"],
                    guidance_scale=guidance,
                    num_inference_steps=steps,
                    height=WAN_SIDE,
                    width=WAN_SIDE,
                    num_frames=WAN_FRAMES,
                    latents=noise,
                    output_type="latent",
                ).frames
        return out.clamp(-1, 1)


def pipeline(name: str, model: Trained) -> Pipe:
    """``model`` (the trained ``flux`` or ``wan`` layout, or its random twin) as a diffusers pipeline."""
    from diffusers import FluxPipeline, WanPipeline

    parts = dict(transformer=model.transformer, scheduler=scheduler(name), vae=None, text_encoder=None, tokenizer=None)
    if name == "flux":
        pipe = FluxPipeline(**parts, text_encoder_2=None, tokenizer_2=None)
    else:
        pipe = WanPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    return Pipe(name, pipe, model)
