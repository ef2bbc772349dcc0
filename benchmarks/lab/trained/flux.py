"""The small FLUX-layout model (issue 26): diffusers' ``FluxTransformer2DModel`` — FLUX.1's own blocks: double-stream
blocks (text and image tokens in streams of their own, joint attention), then single-stream blocks over the
concatenated tokens, 3-axis RoPE over (text, row, column) positions, adaptive norms from the time and a pooled
vector — at reduced width, trained here by rectified flow on the fidelity data (:mod:`benchmarks.lab.trained.data`).

* Layout: 3 double-stream then 6 single-stream blocks (FLUX.1: 19 and 38), hidden 96 = 3 heads of 32 (FLUX.1: 24 of
  128), RoPE axes 8 + 12 + 12 (FLUX.1: 16 + 56 + 56), no guidance embedding (as FLUX.1 schnell and Chroma: classifier-
  free guidance runs as two streams). 1.9 M parameters, trained from DiT's adaLN-Zero (every modulation and the
  output projection at zero, each block the identity: :func:`zero_start`; :func:`build` alone is diffusers'
  initialisation, a random model for tests).
* Input: RGB pixels in [-1, 1] (no VAE), packed as FLUX packs latents: 4×4 patches → 48 channels a token (FLUX.1: 2×2
  patches of a 16-channel latent at 1/8, 64 channels, each token 16 px square), a 32 px image is 64 image tokens
  (FLUX.1 at 1024 px: 4096); text: the class label's :data:`~.architectures.CONTEXT_TOKENS` learned tokens (label −1:
  the empty prompt) and a learned pooled vector, from the UNet models' ``Conditioner``. (With 2×2 patches and the
  default initialisation, 5000 steps learned the photographs but not the digits: samples were recognised 28 % of the
  time and the label moved the loss by under 1 %; 4×4 patches and adaLN-Zero learn them in a fraction of the time.)
* Rectified flow: ``x_σ = (1 − σ) x₀ + σ ε``, the model predicts the velocity ``ε − x₀`` at time σ (the transformer's
  timestep, as FLUX.1's), σ drawn logit-normal (SD3's recipe).
* Sampling: the flow-matching Euler sampler ``x ← x + (σ' − σ) v`` on FLUX.1's time-shifted schedule for the image's
  token count (:func:`sigmas`).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

from .architectures import CONTEXT_TOKENS, Conditioner

NAME = "flux"
SIZE = 32  # trained side, pixels
PATCH = 4
CHANNELS = 3
TEXT_DIM = 64
CONFIG = dict(
    patch_size=1,
    in_channels=CHANNELS * PATCH * PATCH,
    num_layers=3,
    num_single_layers=6,
    attention_head_dim=32,
    num_attention_heads=3,
    joint_attention_dim=TEXT_DIM,
    pooled_projection_dim=TEXT_DIM,
    guidance_embeds=False,
    axes_dims_rope=(8, 12, 12),
)
"""``FluxTransformer2DModel``'s arguments (FLUX.1-dev's: 19, 38, 128, 24, 4096, 768, guidance on, (16, 56, 56))."""


class FluxLayout(nn.Module):
    """The transformer and its conditioner; ``forward(x, sigma, labels)``: the velocity for images ``x`` (B, 3, H, W)
    at times ``sigma`` (B,) under class ``labels`` (B,; −1: the empty prompt)."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        from diffusers import FluxTransformer2DModel

        self.transformer = FluxTransformer2DModel(**CONFIG)
        self.conditioner = Conditioner(classes, TEXT_DIM, TEXT_DIM)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        out = self.transformer(**self.inputs(x, sigma, labels), return_dict=False)[0]
        return unpack(out, *x.shape[2:])

    def schedule(self, steps: int, x: torch.Tensor) -> list[float]:
        """The sampling schedule for images like ``x``: FLUX.1's, shifted for their token count (:func:`sigmas`)."""
        return sigmas(steps, (x.shape[-1] // PATCH) ** 2)

    def inputs(self, x: torch.Tensor, sigma: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """The transformer's keyword arguments for images ``x`` at times ``sigma`` under ``labels``."""
        text = self.conditioner(labels)
        b, _, h, w = x.shape
        return {
            "hidden_states": pack(x),
            "encoder_hidden_states": text["context"],
            "pooled_projections": text["y"],
            "timestep": sigma.to(x.dtype).expand(b),
            "img_ids": image_ids(h, w, x.device),
            "txt_ids": torch.zeros(CONTEXT_TOKENS, 3, device=x.device),
        }


def build(classes: int, seed: int = 0) -> FluxLayout:
    """A freshly initialised model from ``seed``, diffusers' initialisation (the global RNG is left alone)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return FluxLayout(classes)


def zero_start(model: FluxLayout) -> FluxLayout:
    """Training's starting point (DiT's adaLN-Zero): every modulation and the output projection at zero."""
    t = model.transformer
    zeroed = [m.linear for m in t.modules() if type(m).__name__.startswith("AdaLayerNorm")] + [t.proj_out]
    for layer in zeroed:
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)
    return model


def pack(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) → (B, H/P · W/P, C · P²): P × P patches as tokens (:data:`PATCH`), row by row (FLUX's packing of
    latents)."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // PATCH, PATCH, w // PATCH, PATCH)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(b, (h // PATCH) * (w // PATCH), c * PATCH * PATCH)


def unpack(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """The inverse of :func:`pack` for an image of side ``h`` × ``w``."""
    b, _, d = tokens.shape
    c = d // (PATCH * PATCH)
    x = tokens.reshape(b, h // PATCH, w // PATCH, c, PATCH, PATCH)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def image_ids(h: int, w: int, device=None) -> torch.Tensor:
    """The image tokens' RoPE positions: (0, row, column) per token, row by row (FLUX's ``img_ids``)."""
    rows, cols = torch.meshgrid(torch.arange(h // PATCH), torch.arange(w // PATCH), indexing="ij")
    ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3)
    return ids.float().to(device)


def sigmas(steps: int, tokens: int) -> list[float]:
    """FLUX.1's schedule: ``steps`` + 1 times from 1 to 0, shifted by ``mu`` linear in the image token count (0.5 at
    256 tokens, 1.15 at 4096: ``σ = e^mu / (e^mu + 1/t − 1)``)."""
    mu = 0.5 + (1.15 - 0.5) * (tokens - 256) / (4096 - 256)
    out = []
    for i in range(steps + 1):
        t = 1 - i / steps
        out.append(0.0 if t == 0 else math.exp(mu) / (math.exp(mu) + 1 / t - 1))
    return out


def euler(velocity, x: torch.Tensor, schedule: list[float], progress=None) -> torch.Tensor:
    """The flow-matching Euler sampler: ``x ← x + (σ' − σ) v(x, σ)`` over ``schedule`` (from pure noise ``x``);
    ``progress(i, steps)`` before each step, as the WebUI reports it."""
    steps = len(schedule) - 1
    for i, (sigma, after) in enumerate(itertools.pairwise(schedule)):
        if progress is not None:
            progress(i, steps)
        x = x + (after - sigma) * velocity(x, torch.tensor(sigma))
    return x
