"""The small Wan-layout video model (issue 36): diffusers' ``WanTransformer3DModel`` — Wan 2.1's own blocks: one chain
of blocks over the video's tokens (self-attention with 3-axis RoPE over (frame, row, column), cross-attention to the
text, a feed-forward layer, each modulated by the time), then a modulated output norm and projection — at reduced
width, trained here by rectified flow on short clips of the fidelity data in motion
(:func:`benchmarks.lab.trained.data.draw_clips`).

* Layout: 6 blocks (Wan 2.1 1.3B: 30, 14B: 40), hidden 96 = 3 heads of 32 (1.3B: 12 of 128), feed-forward 256 (1.3B:
  8960), RoPE axes 12 + 10 + 10 over (frame, row, column) (Wan: 44 + 42 + 42), text by cross-attention only (no pooled
  vector), classifier-free guidance as two streams. Trained from the time's modulation and the output projection at
  zero (adaLN-Zero: :func:`zero_start`; :func:`build` alone is diffusers' initialisation, a random model for tests).
* Input: RGB pixels in [-1, 1] (no VAE), :data:`FRAMES` frames of 32 px cut into 1×4×4 patches → 48 channels a token:
  a clip is 8 × 8 × 8 = 512 tokens (Wan 2.1 at 480p, 81 frames: 21 latent frames × 30 × 52 = 32,760); text: the class
  label's :data:`~.architectures.CONTEXT_TOKENS` learned tokens (label −1: the empty prompt), from the UNet models'
  ``Conditioner``.
* Rectified flow as the FLUX-layout model: ``x_σ = (1 − σ) x₀ + σ ε``, the model predicts ``ε − x₀`` at time σ (the
  transformer's timestep is σ × 1000, as Wan's pipelines pass it), σ logit-normal.
* Sampling: the flow-matching Euler sampler (:func:`benchmarks.lab.trained.flux.euler`) on Wan's shifted schedule
  (:func:`sigmas`, shift 3: Wan 2.1 at 480p).
"""

from __future__ import annotations

import torch
from torch import nn

from .architectures import CONTEXT_TOKENS, Conditioner

NAME = "wan"
SIZE = 32  # trained side, pixels
FRAMES = 8
CHANNELS = 3
TEXT_DIM = 64
SHIFT = 3.0
LONG_NAME = "wan-long"
LONG_SIZE, LONG_FRAMES = 64, 16
"""The long-clip model (issue 52): the same architecture fine-tuned from the shipped weights to clips of
:data:`LONG_FRAMES` frames at :data:`LONG_SIZE` px, 16 × 16 × 16 = 4,096 tokens a clip (Wan 2.1 1.3B at 480p × 81
frames: 32,760), where token reduction is measured at a realistic count."""
LONG_ROPE_SCALE = 0.5
"""The long-clip model reads its RoPE positions at half steps on every axis (position interpolation,
:func:`build_long`): its clips are the base model's at twice the resolution in frames, rows and columns (the same
motion over twice the frames), so their positions span the base model's trained range. The earlier fine-tune, without
it and without the image steps first, left a quarter of the long clips' frames recognised; which of the two changes
did the most was not measured apart (read at half steps before any tuning, the base model gains nothing)."""
CONFIG = dict(
    patch_size=(1, 4, 4),
    num_attention_heads=3,
    attention_head_dim=32,
    in_channels=CHANNELS,
    out_channels=CHANNELS,
    text_dim=TEXT_DIM,
    freq_dim=256,
    ffn_dim=256,
    num_layers=6,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
)
"""``WanTransformer3DModel``'s arguments (Wan 2.1 T2V 1.3B: (1, 2, 2), 12, 128, 16, 16, 4096, 256, 8960, 30)."""


class WanLayout(nn.Module):
    """The transformer and its conditioner; ``forward(x, sigma, labels)``: the velocity for clips ``x`` (B, 3, F, H, W)
    at times ``sigma`` (B,) under class ``labels`` (B,; −1: the empty prompt)."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        from diffusers import WanTransformer3DModel

        self.transformer = WanTransformer3DModel(**CONFIG)
        self.conditioner = Conditioner(classes, TEXT_DIM, None)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.transformer(**self.inputs(x, sigma, labels), return_dict=False)[0]

    def schedule(self, steps: int, x: torch.Tensor) -> list[float]:
        """The sampling schedule: Wan's, shifted by :data:`SHIFT` whatever the clip's size (:func:`sigmas`)."""
        return sigmas(steps)

    def inputs(self, x: torch.Tensor, sigma: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """The transformer's keyword arguments for clips ``x`` at times ``sigma`` under ``labels``."""
        return {
            "hidden_states": x,
            "timestep": (sigma.to(x.dtype) * 1000).expand(len(x)),
            "encoder_hidden_states": self.conditioner(labels)["context"],
        }


def build(classes: int, seed: int = 0) -> WanLayout:
    """A freshly initialised model from ``seed``, diffusers' initialisation (the global RNG is left alone)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return WanLayout(classes)


def build_long(classes: int, seed: int = 0) -> WanLayout:
    """The long-clip model's architecture: :func:`build` with RoPE positions read at :data:`LONG_ROPE_SCALE` steps."""
    return interpolate_positions(build(classes, seed), LONG_ROPE_SCALE)


def interpolate_positions(model: WanLayout, scale: float) -> WanLayout:
    """``model`` with its RoPE tables (non-persistent buffers, not in the weights) rebuilt for positions ``scale`` ×
    0, 1, 2, … on the frame, row and column axes, as diffusers builds them for 0, 1, 2, …"""
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    rope = model.transformer.rope
    positions = torch.arange(rope.max_seq_len, dtype=torch.float64) * scale
    tables = [
        get_1d_rotary_pos_embed(
            dim, positions, 10000.0, use_real=True, repeat_interleave_real=True, freqs_dtype=torch.float64
        )
        for dim in (rope.t_dim, rope.h_dim, rope.w_dim)
    ]
    rope.freqs_cos = torch.cat([c for c, _ in tables], 1).to(rope.freqs_cos)
    rope.freqs_sin = torch.cat([s for _, s in tables], 1).to(rope.freqs_sin)
    return model


def zero_start(model: WanLayout) -> WanLayout:
    """Training's starting point (adaLN-Zero): the time's modulation and the output projection at zero."""
    t = model.transformer
    for layer in (t.condition_embedder.time_proj, t.proj_out):
        nn.init.zeros_(layer.weight)
        nn.init.zeros_(layer.bias)
    return model


def sigmas(steps: int, shift: float = SHIFT) -> list[float]:
    """Wan's schedule: ``steps`` + 1 times from 1 to 0, shifted (``σ = shift·t / (1 + (shift − 1)·t)``)."""
    out = []
    for i in range(steps + 1):
        t = 1 - i / steps
        out.append(shift * t / (1 + (shift - 1) * t))
    return out


__all__ = [
    "CONFIG",
    "CONTEXT_TOKENS",
    "FRAMES",
    "LONG_FRAMES",
    "LONG_NAME",
    "LONG_SIZE",
    "NAME",
    "SIZE",
    "WanLayout",
    "build",
    "sigmas",
    "zero_start",
]
