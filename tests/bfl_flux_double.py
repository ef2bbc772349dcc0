"""FLUX in Black Forest Labs' layout, as ComfyUI and Forge Neo run it: a small double of what the step cache's family
:class:`tome_core.families.BflFlux` meets there.

Written from reading ComfyUI ``comfy/ldm/flux/model.py`` and ``layers.py`` at ``3cd7b32f`` (v0.8.0) and Forge Neo's
``webui/backend/nn/flux.py`` at ``5692d2d`` (the same loop: Neo ported ComfyUI's); no code copied:

- ``Flux.forward(x, timestep, context, y=None, guidance=None, control=None, transformer_options={}, **kwargs)``
  (model.py:299-351): the latent patchified into 2x2 tokens, image ids (0, row, column), text ids zero; in ComfyUI the
  ``DIFFUSION_MODEL`` wrappers from ``transformer_options`` (Neo's ``forward``, flux.py:579, has none).
- ``forward_orig`` (l.132-267): ``img_in``, ``time_in(timestep_embedding(t, 256))`` (+ ``guidance_in``, +
  ``vector_in(y)``), ``txt_in``; ``pe`` from the text ids then the image ids; the double-stream blocks with keywords
  ``img=, txt=, vec=, pe=, attn_mask=, transformer_options=`` (or through ``patches_replace["dit"][("double_block",
  i)]`` with ``{"original_block": ...}``), a ControlNet's ``control["input"][i]`` added in place to the image stream
  after block ``i``; ``torch.cat((txt, img), 1)``; the single-stream blocks called ``block(img, vec=, pe=, ...)`` (or
  the ``("single_block", i)`` replacement), ``control["output"][i]`` added in place to the image tokens;
  ``img[:, txt.shape[1]:]``; ``final_layer(img, vec)``.
- ``DoubleStreamBlock`` / ``SingleStreamBlock`` / ``LastLayer`` (layers.py): modulation from ``silu(vec)``, joint
  attention over text then image tokens with RoPE on q and k, QK RMS norm, and the residual **added in place**
  (``img += ...``, ``x += ...``): a block changes the tensor it was given.
- ``timestep_embedding(t, dim, time_factor=1000)``: FLUX takes the flow-matching sigma (0–1) as its timestep.

HunyuanVideo (``comfy/ldm/hunyuan_video/model.py`` ``HunyuanVideo.forward_orig``, l.290-455) runs the same loop with the
same block calls and names (``img_in``, ``double_blocks``, ``single_blocks``, ``final_layer``), but joins the streams
image first (``torch.cat((img, txt), 1)``), adds ``control["output"][i]`` to ``img[:, :img_len]`` and cuts
``img[:, :img_len]``, and its timestep is the sigma times 1000: :class:`HunyuanVideo` below.

Left out: Kontext reference latents, Chroma's approximator and skip lists, guidance-distilled models' ``guidance_in``
beyond one linear embedder, fp16 clamps, attention masks, ``post_input`` patches.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def timestep_embedding(t: torch.Tensor, dim: int, max_period: int = 10000, time_factor: float = 1000.0):
    t = time_factor * t
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def rope(pos: torch.Tensor, dim: int, theta: int) -> torch.Tensor:
    """(B, N, dim/2, 2): cos and sin of each position's angle per frequency."""
    omega = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = pos.double()[..., None] * omega
    return torch.stack([angles.cos(), angles.sin()], dim=-1).float()


def apply_rope(x: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
    """x: (B, H, N, D); pe: (B, 1, N, D/2, 2)."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    cos, sin = pe[..., 0], pe[..., 1]
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).type_as(x)


class EmbedND(nn.Module):
    def __init__(self, theta: int, axes_dim: list[int]):
        super().__init__()
        self.theta, self.axes_dim = theta, axes_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        emb = torch.cat([rope(ids[..., i], d, self.theta) for i, d in enumerate(self.axes_dim)], dim=-2)
        return emb.unsqueeze(1)


def attention(q, k, v, pe):
    q, k = apply_rope(q, pe), apply_rope(k, pe)
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).flatten(2)


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim: int, hidden: int):
        super().__init__()
        self.in_layer, self.silu, self.out_layer = nn.Linear(in_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden)

    def forward(self, x):
        return self.out_layer(self.silu(self.in_layer(x)))


class QKNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.query_norm, self.key_norm = nn.RMSNorm(dim, eps=1e-6), nn.RMSNorm(dim, eps=1e-6)

    def forward(self, q, k, v):
        return self.query_norm(q).to(v), self.key_norm(k).to(v)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.qkv, self.norm, self.proj = nn.Linear(dim, dim * 3), QKNorm(dim // heads), nn.Linear(dim, dim)


class Modulation(nn.Module):
    def __init__(self, dim: int, double: bool):
        super().__init__()
        self.multiplier = 6 if double else 3
        self.lin = nn.Linear(dim, self.multiplier * dim)

    def forward(self, vec):
        out = self.lin(F.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1)
        return [out[i : i + 3] for i in range(0, self.multiplier, 3)]  # (shift, scale, gate) per half


def _mlp(dim: int, ratio: float) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(dim, int(dim * ratio)), nn.GELU(approximate="tanh"), nn.Linear(int(dim * ratio), dim)
    )


class DoubleStreamBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads = heads
        for side in ("img", "txt"):
            setattr(self, f"{side}_mod", Modulation(dim, double=True))
            setattr(self, f"{side}_norm1", nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6))
            setattr(self, f"{side}_attn", SelfAttention(dim, heads))
            setattr(self, f"{side}_norm2", nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6))
            setattr(self, f"{side}_mlp", _mlp(dim, mlp_ratio))

    def _qkv(self, side: str, x, mod):
        shift, scale, _ = mod
        attn = getattr(self, f"{side}_attn")
        qkv = attn.qkv((1 + scale) * getattr(self, f"{side}_norm1")(x) + shift)
        q, k, v = qkv.view(x.shape[0], x.shape[1], 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k = attn.norm(q, k, v)
        return q, k, v

    def forward(self, img, txt, vec, pe, attn_mask=None, transformer_options={}):  # noqa: B006 (the host's)
        (img_mod1, img_mod2), (txt_mod1, txt_mod2) = self.img_mod(vec), self.txt_mod(vec)
        iq, ik, iv = self._qkv("img", img, img_mod1)
        tq, tk, tv = self._qkv("txt", txt, txt_mod1)
        attn = attention(torch.cat((tq, iq), 2), torch.cat((tk, ik), 2), torch.cat((tv, iv), 2), pe)
        txt_attn, img_attn = attn[:, : txt.shape[1]], attn[:, txt.shape[1] :]
        for x, a, (_, _, gate1), (shift2, scale2, gate2), side in (
            (img, img_attn, img_mod1, img_mod2, "img"),
            (txt, txt_attn, txt_mod1, txt_mod2, "txt"),
        ):
            x += gate1 * getattr(self, f"{side}_attn").proj(a)  # in place, as the host's
            x += gate2 * getattr(self, f"{side}_mlp")((1 + scale2) * getattr(self, f"{side}_norm2")(x) + shift2)
        return img, txt


class SingleStreamBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        self.heads, self.dim, self.mlp_hidden = heads, dim, int(dim * mlp_ratio)
        self.linear1 = nn.Linear(dim, dim * 3 + self.mlp_hidden)
        self.linear2 = nn.Linear(dim + self.mlp_hidden, dim)
        self.norm = QKNorm(dim // heads)
        self.pre_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp_act = nn.GELU(approximate="tanh")
        self.modulation = Modulation(dim, double=False)

    def forward(self, x, vec, pe, attn_mask=None, transformer_options={}):  # noqa: B006
        ((shift, scale, gate),) = self.modulation(vec)
        qkv, mlp = torch.split(
            self.linear1((1 + scale) * self.pre_norm(x) + shift), [3 * self.dim, self.mlp_hidden], -1
        )
        q, k, v = qkv.view(qkv.shape[0], qkv.shape[1], 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.norm(q, k, v)
        x += gate * self.linear2(torch.cat((attention(q, k, v, pe), self.mlp_act(mlp)), 2))  # in place
        return x


class LastLayer(nn.Module):
    def __init__(self, dim: int, out: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(dim, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))

    def forward(self, x, vec):
        shift, scale = self.adaLN_modulation(vec).chunk(2, dim=1)
        return self.linear((1 + scale[:, None, :]) * self.norm_final(x) + shift[:, None, :])


class Flux(nn.Module):
    """``comfy.ldm.flux.model.Flux`` / Neo's ``IntegratedFluxTransformer2DModel`` at small width (see the module)."""

    WRAPPERS = True
    """Whether ``forward`` runs ComfyUI's ``DIFFUSION_MODEL`` wrappers (Neo's has none)."""
    IMAGE_FIRST = False
    """Whether the single-stream blocks' joint stream is the image tokens, then the text's (HunyuanVideo's order)."""

    def __init__(
        self, in_channels=4, hidden=32, heads=2, depth=2, depth_single=3, context_dim=32, vec_in_dim=8, seed=0
    ):
        super().__init__()
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.patch_size, self.in_channels, self.vec_in_dim = 2, in_channels, vec_in_dim
        head = hidden // heads
        self.pe_embedder = EmbedND(10000, [head - 4 * (head // 6), 2 * (head // 6), 2 * (head // 6)])
        self.img_in = nn.Linear(in_channels * 4, hidden)
        self.time_in = MLPEmbedder(256, hidden)
        self.vector_in = MLPEmbedder(vec_in_dim, hidden)
        self.txt_in = nn.Linear(context_dim, hidden)
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(hidden, heads, 4.0) for _ in range(depth))
        self.single_blocks = nn.ModuleList(SingleStreamBlock(hidden, heads, 4.0) for _ in range(depth_single))
        self.final_layer = LastLayer(hidden, in_channels * 4)
        for p in self.parameters():  # random weights that move the image, zero-initialised layers included
            nn.init.normal_(p, std=0.3 / math.sqrt(p.shape[-1]))
        torch.random.set_rng_state(gen_state)

    def forward_orig(
        self, img, img_ids, txt, txt_ids, timesteps, y, guidance=None, control=None, transformer_options=None
    ):
        transformer_options = {} if transformer_options is None else transformer_options
        replace = transformer_options.get("patches_replace", {}).get("dit", {})
        img = self.img_in(img)
        vec = self.time_in(timestep_embedding(timesteps, 256).to(img.dtype))
        vec = vec + self.vector_in(
            y[:, : self.vec_in_dim] if y is not None else img.new_zeros(img.shape[0], self.vec_in_dim)
        )
        txt = self.txt_in(txt)
        pe = self.pe_embedder(torch.cat((txt_ids, img_ids), dim=1))
        for i, block in enumerate(self.double_blocks):
            if ("double_block", i) in replace:

                def wrap(args, block=block):
                    img, txt = block(img=args["img"], txt=args["txt"], vec=args["vec"], pe=args["pe"])
                    return {"img": img, "txt": txt}

                out = replace[("double_block", i)](
                    {"img": img, "txt": txt, "vec": vec, "pe": pe, "transformer_options": transformer_options},
                    {"original_block": wrap},
                )
                img, txt = out["img"], out["txt"]
            else:
                img, txt = block(
                    img=img, txt=txt, vec=vec, pe=pe, attn_mask=None, transformer_options=transformer_options
                )
            if control is not None and i < len(control.get("input", ())) and control["input"][i] is not None:
                add = control["input"][i]
                img[:, : add.shape[1]] += add
        start, length = (0 if self.IMAGE_FIRST else txt.shape[1]), img.shape[1]
        img = torch.cat((img, txt), 1) if self.IMAGE_FIRST else torch.cat((txt, img), 1)
        for i, block in enumerate(self.single_blocks):
            if ("single_block", i) in replace:
                out = replace[("single_block", i)](
                    {"img": img, "vec": vec, "pe": pe, "transformer_options": transformer_options},
                    {
                        "original_block": lambda args, block=block: {
                            "img": block(args["img"], vec=args["vec"], pe=args["pe"])
                        }
                    },
                )
                img = out["img"]
            else:
                img = block(img, vec=vec, pe=pe, attn_mask=None, transformer_options=transformer_options)
            if control is not None and i < len(control.get("output", ())) and control["output"][i] is not None:
                add = control["output"][i]
                img[:, start : start + add.shape[1], ...] += add
        img = img[:, start : start + length, ...]
        return self.final_layer(img, vec)

    def forward(self, x, timestep, context, y=None, guidance=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        if not self.WRAPPERS:
            return self._forward(x, timestep, context, y, guidance, control, transformer_options)
        from comfy import patcher_extension as pe

        wrappers = pe.get_all_wrappers(pe.WrappersMP.DIFFUSION_MODEL, transformer_options)
        executor = pe.WrapperExecutor.new_class_executor(self._forward, self, wrappers)
        return executor.execute(x, timestep, context, y, guidance, control, transformer_options)

    def _forward(self, x, timestep, context, y=None, guidance=None, control=None, transformer_options={}):  # noqa: B006
        b, c, h, w = x.shape
        p = self.patch_size
        img = x.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // p) * (w // p), c * p * p)
        rows = torch.arange(h // p, dtype=torch.float32)[:, None].expand(h // p, w // p)
        cols = torch.arange(w // p, dtype=torch.float32)[None, :].expand(h // p, w // p)
        img_ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(1, -1, 3).expand(b, -1, -1)
        txt_ids = torch.zeros(b, context.shape[1], 3)
        out = self.forward_orig(img, img_ids, context, txt_ids, timestep, y, guidance, control, transformer_options)
        out = out.reshape(b, h // p, w // p, c, p, p).permute(0, 3, 1, 4, 2, 5)
        return out.reshape(b, c, h, w)


class HunyuanVideo(Flux):
    """``comfy.ldm.hunyuan_video.model.HunyuanVideo``'s loop (see the module) on the same small blocks."""

    IMAGE_FIRST = True
