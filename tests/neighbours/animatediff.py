"""Double of continue-revolution/sd-webui-animatediff's motion modules (a88e889), written from reading
``motion_module.py`` and ``scripts/animatediff_mm.py``; line numbers are the real files'.

``AnimateDiffMM.inject`` (animatediff_mm.py l.62-115, SD1.5, not v2) appends a motion module to
``input_blocks[1, 2, 4, 5, 7, 8, 10, 11]`` and to every output block (before the ``Upsample`` of blocks 2, 5, 8);
``restore`` (l.118-) pops them again. A motion module (``VanillaTemporalModule`` → ``TemporalTransformer3DModel``,
motion_module.py l.114-215) takes the 4-D features, lays them out as ``(b f) (h w) c`` and runs
``TemporalTransformerBlock`` s whose ``VersatileAttention`` (l.322-354) rearranges ``(b f) d c -> (b d) f c`` with
``f`` the video length (the batch is frames: ``ad_params.batch_size``), adds a positional encoding over frames and
attends across frames at every one of the ``d = h * w`` tokens. Its blocks have ``attention_blocks``/``norms``/
``ff``/``ff_norm``, no ``attn1``/``attn2``. ``zero_initialize`` (l.134-135) starts ``proj_out`` at zero.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch import nn


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 24):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(1, max_len, d_model)
        pe[0, :, 0::2] = torch.sin(position * div_term)
        pe[0, :, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[:, : x.size(1)]


class VersatileAttention(nn.Module):
    def __init__(self, owner: MotionModules, dim: int, heads: int = 8):
        super().__init__()
        self.owner = [owner]  # a list: not a child module
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_k = nn.Linear(dim, dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(0.0))
        self.pos_encoder = PositionalEncoding(dim)

    def forward(self, x):
        video_length = self.owner[0].frames
        d = x.shape[1]
        x = rearrange(x, "(b f) d c -> (b d) f c", f=video_length)
        x = self.pos_encoder(x)
        q, k, v = (
            rearrange(t, "b s (h d) -> b h s d", h=self.heads) for t in (self.to_q(x), self.to_k(x), self.to_v(x))
        )
        x = rearrange(nn.functional.scaled_dot_product_attention(q, k, v), "b h s d -> b s (h d)")
        return rearrange(self.to_out(x), "(b d) f c -> (b f) d c", d=d)


class TemporalTransformerBlock(nn.Module):
    def __init__(self, owner: MotionModules, dim: int):
        super().__init__()
        self.attention_blocks = nn.ModuleList([VersatileAttention(owner, dim), VersatileAttention(owner, dim)])
        self.norms = nn.ModuleList([nn.LayerNorm(dim), nn.LayerNorm(dim)])
        self.ff = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))
        self.ff_norm = nn.LayerNorm(dim)

    def forward(self, hidden):
        for attention_block, norm in zip(self.attention_blocks, self.norms):
            hidden = attention_block(norm(hidden)) + hidden
        return self.ff(self.ff_norm(hidden)) + hidden


class TemporalTransformer3DModel(nn.Module):
    def __init__(self, owner: MotionModules, channels: int):
        super().__init__()
        self.owner = [owner]
        self.norm = nn.GroupNorm(32, channels, eps=1e-6)
        self.proj_in = nn.Linear(channels, channels)
        self.transformer_blocks = nn.ModuleList([TemporalTransformerBlock(owner, channels)])
        self.proj_out = nn.Linear(channels, channels)

    def forward(self, hidden):
        _, _, h, w = hidden.shape
        residual = hidden
        hidden = rearrange(self.norm(hidden), "b c h w -> b (h w) c")
        self.owner[0].calls.append((hidden.shape[1], h, w))
        hidden = self.proj_in(hidden)
        for block in self.transformer_blocks:
            hidden = block(hidden)
        hidden = rearrange(self.proj_out(hidden), "b (h w) c -> b c h w", h=h, w=w)
        return hidden + residual


class VanillaTemporalModule(nn.Module):
    def __init__(self, owner: MotionModules, channels: int):
        super().__init__()
        self.temporal_transformer = TemporalTransformer3DModel(owner, channels)

    def forward(self, x):
        return self.temporal_transformer(x)


class MotionModules(nn.Module):
    """The motion modules of one motion model (``MotionWrapper``: down_blocks / up_blocks of motion_modules)."""

    def __init__(self, channels: int, frames: int, seed: int = 0):
        super().__init__()
        self.frames = frames
        self.calls: list[tuple[int, int, int]] = []  # test-only: (tokens d, h, w) of every motion module call
        mults_down, mults_up = (1, 2, 4, 4), (4, 4, 2, 1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.down_blocks = nn.ModuleList(
                nn.ModuleList(VanillaTemporalModule(self, channels * m) for _ in range(2)) for m in mults_down
            )
            self.up_blocks = nn.ModuleList(
                nn.ModuleList(VanillaTemporalModule(self, channels * m) for _ in range(3)) for m in mults_up
            )
        self._proj_out = {id(m): m.temporal_transformer.proj_out.weight.clone() for m in self.all()}

    def all(self) -> list[VanillaTemporalModule]:
        return [m for blocks in (*self.down_blocks, *self.up_blocks) for m in blocks]

    def set_zero(self, zero: bool) -> None:
        """``zero_initialize`` (proj_out at zero: each module passes its input on) or the random weights."""
        with torch.no_grad():
            for m in self.all():
                proj = m.temporal_transformer.proj_out
                proj.weight.copy_(torch.zeros_like(proj.weight) if zero else self._proj_out[id(m)])
                proj.bias.zero_()


def inject(unet: nn.Module, frames: int, zero_out: bool = False, seed: int = 0) -> MotionModules:
    mm = MotionModules(unet.model_channels, frames, seed)
    mm.set_zero(zero_out)
    for mm_idx, unet_idx in enumerate([1, 2, 4, 5, 7, 8, 10, 11]):
        unet.input_blocks[unet_idx].append(mm.down_blocks[mm_idx // 2][mm_idx % 2])
    for unet_idx in range(12):
        module = mm.up_blocks[unet_idx // 3][unet_idx % 3]
        if unet_idx % 3 == 2 and unet_idx != 11:
            unet.output_blocks[unet_idx].insert(-1, module)
        else:
            unet.output_blocks[unet_idx].append(module)
    return mm


def restore(unet: nn.Module, mm: MotionModules) -> None:
    for unet_idx in [1, 2, 4, 5, 7, 8, 10, 11]:
        unet.input_blocks[unet_idx].pop(-1)
    for unet_idx in range(12):
        unet.output_blocks[unet_idx].pop(-2 if unet_idx % 3 == 2 and unet_idx != 11 else -1)
