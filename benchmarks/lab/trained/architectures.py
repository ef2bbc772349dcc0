"""The two small Stable-Diffusion-layout models: their architectures, their conditioning and their files.

Both are the real ``ldm`` ``UNetModel`` (the one the WebUI runs for SD1/SD2), predicting ε on SD's 1000-step
scaled-linear DDPM schedule, so the WebUI's samplers, the timestep logic and tomesd apply unchanged. They
diffuse RGB pixels in [-1, 1] (no VAE), conditioned through cross-attention on a learned embedding of the class
label (the "prompt": a few context tokens per class, plus one learned "empty prompt" for label −1):

* ``sd15``: SD1.5's layout — ResBlock + SpatialTransformer (self- and cross-attention) at downsample 1, 2 and 4,
  none at 8 (reduced: model_channels 32, channel_mult 1, 2, 2, 2, one res-block per level; 2.2 M parameters).
* ``sdxl``: SDXL's layout — no transformer at downsample 1, depth 2 at 2 and 3 at 4 (SDXL: 2 and 10), linear
  projections in the transformers, and SDXL's ``adm`` vector ``y`` (a learned per-class vector here); reduced:
  model_channels 32, channel_mult 1, 2, 3, one res-block per level; 4.4 M parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.lab.models import one_context_per_block
from benchmarks.lab.sampling import TIMESTEPS, alphas_cumprod

__all__ = ["TIMESTEPS", "alphas_cumprod"]

WEIGHTS = Path(__file__).resolve().parent / "weights"
CONTEXT_TOKENS = 4  # "prompt" length: context tokens per class label


@dataclass(frozen=True)
class Architecture:
    """What ``build`` needs to make one of the models, and what it was trained on."""

    name: str
    unet: dict[str, Any]
    size: int  # trained side, in UNet input pixels
    channels: int = 3
    context_dim: int = 64
    adm_dim: int | None = None  # width of SDXL's ``y``; None: the layout takes none
    depths: tuple[int, ...] = field(default=())  # transformer depth per attention level (sdxl: built deep, cut)


ARCHITECTURES: dict[str, Architecture] = {
    "sd15": Architecture(
        "sd15",
        dict(
            model_channels=32,
            num_res_blocks=1,
            channel_mult=[1, 2, 2, 2],
            attention_resolutions=[4, 2, 1],
            transformer_depth=1,
            num_head_channels=16,
        ),
        size=32,
    ),
    "sdxl": Architecture(
        "sdxl",
        dict(
            model_channels=32,
            num_res_blocks=1,
            channel_mult=[1, 2, 3],
            attention_resolutions=[4, 2],
            transformer_depth=3,
            num_head_channels=16,
            use_linear_in_transformer=True,
        ),
        size=32,
        adm_dim=64,
        depths=(2, 3),
    ),
}


class Conditioner(nn.Module):
    """The learned "text encoder": class label → context tokens (and SDXL's ``y``); label −1 → the empty prompt."""

    def __init__(self, classes: int, context_dim: int, adm_dim: int | None):
        super().__init__()
        self.classes = classes
        self.tokens = nn.Embedding(classes + 1, CONTEXT_TOKENS * context_dim)
        self.pooled = nn.Embedding(classes + 1, adm_dim) if adm_dim else None
        nn.init.normal_(self.tokens.weight, std=1.0)
        if self.pooled is not None:
            nn.init.normal_(self.pooled.weight, std=1.0)

    def forward(self, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        index = torch.where(labels < 0, torch.full_like(labels, self.classes), labels)
        out = {"context": self.tokens(index).view(len(labels), CONTEXT_TOKENS, -1)}
        if self.pooled is not None:
            out["y"] = self.pooled(index)
        return out


def build(arch: Architecture, classes: int, seed: int = 0) -> tuple[nn.Module, Conditioner]:
    """The UNet and the conditioner of ``arch``, freshly initialised from ``seed`` (the global RNG is left alone).

    The UNet's zero-initialised output layers stay zero (ldm's ``zero_module``), as in training from scratch."""
    from ldm.modules.attention import SpatialTransformer
    from ldm.modules.diffusionmodules.openaimodel import UNetModel

    cfg = dict(arch.unet)
    deep = cfg["transformer_depth"]
    context_dim = [arch.context_dim] * deep if arch.depths else arch.context_dim
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        unet = UNetModel(
            image_size=arch.size,
            in_channels=arch.channels,
            out_channels=arch.channels,
            use_spatial_transformer=True,
            context_dim=context_dim,
            use_checkpoint=False,
            legacy=False,
            num_classes="continuous" if arch.adm_dim else None,
            **cfg,
        )
        if arch.adm_dim:  # SDXL's label embedding: Linear(adm, emb), SiLU, Linear
            emb = 4 * cfg["model_channels"]
            unet.label_emb = nn.Sequential(nn.Linear(arch.adm_dim, emb), nn.SiLU(), nn.Linear(emb, emb))
        conditioner = Conditioner(classes, arch.context_dim, arch.adm_dim)
    if arch.depths:  # built at the deepest depth; the shallower attention levels keep their first blocks
        levels = {cfg["model_channels"] * m: d for m, d in zip(cfg["channel_mult"][1:], arch.depths)}
        for module in unet.modules():
            if isinstance(module, SpatialTransformer) and module.in_channels in levels:
                module.transformer_blocks = module.transformer_blocks[: levels[module.in_channels]]
        one_context_per_block(unet)
    return unet, conditioner


def install_attention() -> None:
    """ldm's attention through ``scaled_dot_product_attention``, as the WebUI's default *sdp* runs it (and the
    models were trained with it)."""
    from benchmarks.lab.models import install_sdp_attention, install_unet_cat_hijack

    install_sdp_attention()
    install_unet_cat_hijack()


def weights_path(name: str) -> Path:
    return WEIGHTS / f"{name}.safetensors"
