"""Wan 2.1 / 2.2 as ComfyUI and Forge Neo run it: a small double of what the step cache's family
:class:`tome_core.families.ComfyWan` meets there.

Written from reading ComfyUI ``comfy/ldm/wan/model.py`` at ``3cd7b32f`` (v0.8.0) and Forge Neo's
``webui/backend/nn/wan.py`` at ``5692d2d`` (the same loop); no code copied:

- ``WanModel.forward(x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options={}, **kwargs)``
  (model.py:629-646): a video latent ``(B, C, T, H, W)``; in ComfyUI the ``DIFFUSION_MODEL`` wrappers.
- ``forward_orig`` (l.510-593): ``patch_embedding`` (a Conv3d, patch (1, 2, 2)) flattened to one token sequence,
  ``time_embedding(sinusoidal(t))`` and ``time_projection`` to six modulation vectors ``e0``, ``text_embedding``;
  every block called ``block(x, e=e0, freqs=, context=, context_img_len=, transformer_options=)`` (or through
  ``patches_replace["dit"][("double_block", i)]`` with ``{"original_block": ...}``), returning a new tensor;
  ``head(x, e)``; unpatchify.
- ``WanAttentionBlock`` (l.171-247): ``modulation`` (a parameter) plus ``e`` chunked in six; self-attention on the
  modulated ``norm1(x)``, gated; ``x + cross_attn(norm3(x), context)``; a gated feed-forward on ``norm2``.
- The timestep is the flow-matching sigma times 1000 (``ModelSamplingDiscreteFlow``, ``multiplier`` 1000).

Left out: RoPE (``freqs`` is None), image-to-video's CLIP features, VACE and camera models, reference latents.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def sinusoidal(dim: int, t: torch.Tensor) -> torch.Tensor:
    half = dim // 2
    freqs = torch.pow(10000, -torch.arange(half, dtype=torch.float64).div(half))
    args = t.double()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=1).float()


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.norm_q, self.norm_k = nn.RMSNorm(dim, eps=1e-6), nn.RMSNorm(dim, eps=1e-6)

    def forward(self, x, context=None):
        context = x if context is None else context
        b, n, d = x.shape
        q = self.norm_q(self.q(x)).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.norm_k(self.k(context)).view(b, context.shape[1], self.heads, -1).transpose(1, 2)
        v = self.v(context).view(b, context.shape[1], self.heads, -1).transpose(1, 2)
        return self.o(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))


class WanAttentionBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.self_attn = Attention(dim, heads)
        self.norm3 = nn.LayerNorm(dim, eps=1e-6)
        self.cross_attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(self, x, e, freqs, context, context_img_len=257, transformer_options={}):  # noqa: B006 (the host's)
        e = (self.modulation + e).chunk(6, dim=1)
        y = self.self_attn(torch.addcmul(e[0], self.norm1(x), 1 + e[1]))
        x = torch.addcmul(x, y, e[2])
        x = x + self.cross_attn(self.norm3(x), context)
        return torch.addcmul(x, self.ffn(torch.addcmul(e[3], self.norm2(x), 1 + e[4])), e[5])


class Head(nn.Module):
    def __init__(self, dim: int, out: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-6, elementwise_affine=False)
        self.head = nn.Linear(dim, out)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    def forward(self, x, e):
        e = (self.modulation + e.unsqueeze(1)).chunk(2, dim=1)
        return self.head(torch.addcmul(e[0], self.norm(x), 1 + e[1]))


class WanModel(nn.Module):
    """``comfy.ldm.wan.model.WanModel`` / Neo's ``WanModel`` at small width (see the module)."""

    WRAPPERS = True
    """Whether ``forward`` runs ComfyUI's ``DIFFUSION_MODEL`` wrappers (Neo's has none)."""

    def __init__(self, in_dim=4, dim=32, heads=2, layers=4, text_dim=32, freq_dim=32, seed=0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.patch_size, self.out_dim, self.freq_dim, self.dim = (1, 2, 2), in_dim, freq_dim, dim
            self.patch_embedding = nn.Conv3d(in_dim, dim, kernel_size=self.patch_size, stride=self.patch_size)
            self.text_embedding = nn.Sequential(
                nn.Linear(text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
            )
            self.time_embedding = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
            self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim * 6))
            self.blocks = nn.ModuleList(WanAttentionBlock(dim, heads) for _ in range(layers))
            self.head = Head(dim, in_dim * math.prod(self.patch_size))
            for name, p in self.named_parameters():
                if "norm" not in name:  # random weights that move the video; the norms' scales stay 1
                    nn.init.normal_(p, std=0.5 / math.sqrt(p.shape[-1]))

    def forward_orig(self, x, t, context, clip_fea=None, freqs=None, transformer_options=None, **kwargs):
        transformer_options = {} if transformer_options is None else transformer_options
        replace = transformer_options.get("patches_replace", {}).get("dit", {})
        x = self.patch_embedding(x.float()).to(x.dtype)
        grid = x.shape[2:]
        x = x.flatten(2).transpose(1, 2)
        e = self.time_embedding(sinusoidal(self.freq_dim, t.flatten()).to(x.dtype))
        e0 = self.time_projection(e).unflatten(1, (6, self.dim))
        context = self.text_embedding(context)
        for i, block in enumerate(self.blocks):
            if ("double_block", i) in replace:

                def wrap(args, block=block):
                    return {"img": block(args["img"], context=args["txt"], e=args["vec"], freqs=args["pe"])}

                out = replace[("double_block", i)](
                    {"img": x, "txt": context, "vec": e0, "pe": freqs, "transformer_options": transformer_options},
                    {"original_block": wrap},
                )
                x = out["img"]
            else:
                x = block(
                    x, e=e0, freqs=freqs, context=context, context_img_len=None, transformer_options=transformer_options
                )
        x = self.head(x, e)
        b, c = x.shape[0], self.out_dim
        x = x.view(b, *grid, *self.patch_size, c)
        return torch.einsum("bfhwpqrc->bcfphqwr", x).reshape(b, c, *(g * p for g, p in zip(grid, self.patch_size)))

    def forward(self, x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options={}, **kwargs):  # noqa: B006
        if not self.WRAPPERS:
            return self._forward(x, timestep, context, clip_fea, time_dim_concat, transformer_options, **kwargs)
        from comfy import patcher_extension as pe

        wrappers = pe.get_all_wrappers(pe.WrappersMP.DIFFUSION_MODEL, transformer_options)
        executor = pe.WrapperExecutor.new_class_executor(self._forward, self, wrappers)
        return executor.execute(x, timestep, context, clip_fea, time_dim_concat, transformer_options, **kwargs)

    def _forward(self, x, timestep, context, clip_fea=None, time_dim_concat=None, transformer_options={}, **kwargs):  # noqa: B006
        return self.forward_orig(x, timestep, context, clip_fea=clip_fea, transformer_options=transformer_options)
