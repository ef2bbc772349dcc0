"""Lumina 2 / Z-Image, Qwen-Image, SD3 / SD3.5 and Cosmos Predict2 as ComfyUI runs them: small doubles of what the step
cache's families :class:`tome_core.families.ComfyLumina`, :class:`~tome_core.families.ComfyQwenImage`,
:class:`~tome_core.families.ComfyMMDiT` and :class:`~tome_core.families.ComfyCosmos` meet there (Wan's is ``tests/wan_double.py``). Written from reading ComfyUI at
``3cd7b32f`` (v0.8.0); no code copied:

- ``NextDiT.forward(x, timesteps, context, num_tokens, attention_mask=None, **kwargs)`` (``comfy/ldm/lumina/model.py``
  l.599-660): ``t = 1 - timesteps`` (the sigma) embedded; the caption refined by ``context_refiner`` and the image
  tokens by ``noise_refiner``, joined (caption first); every layer called ``layer(img, mask, freqs_cis, adaln_input,
  transformer_options=)`` returning the joint stream; ``final_layer(img, adaln_input)``; the image tokens unpatchified
  and negated.
- ``QwenImageTransformer2DModel.forward(x, timestep, context, attention_mask=None, ...)``
  (``comfy/ldm/qwen_image/model.py`` l.410-530): a ``(B, C, 1, H, W)`` latent packed into 2x2 tokens, ``img_in``,
  ``txt_norm``/``txt_in``, ``time_text_embed(timestep, ...)``; every block called with ``hidden_states=``,
  ``encoder_hidden_states=``, ``encoder_hidden_states_mask=``, ``temb=``, ``image_rotary_emb=``,
  ``timestep_zero_index=``, ``transformer_options=`` and returning ``(encoder_hidden_states, hidden_states)``; a
  ControlNet's ``control["input"][i]`` added in place after block ``i``; ``norm_out(hidden_states, temb)``,
  ``proj_out``, unpacked.
- ``OpenAISignatureMMDITWrapper.forward(x, timesteps, context=None, y=None, control=None, transformer_options={})``
  (``comfy/ldm/modules/diffusionmodules/mmdit.py`` l.937-1037, SD3 and SD3.5): ``x_embedder`` (patches, plus the
  position embedding), ``t_embedder(timesteps)`` (the sigma times 1000) plus ``y_embedder(y)``, ``context_embedder``;
  every joint block called ``block(context, x, c=, use_checkpoint=, transformer_options=)`` returning ``(context, x)``
  (the last one, ``pre_only``, returns no context), a ControlNet's ``control["output"][i]`` added in place after
  block ``i``; ``final_layer(x, c)``, unpatchified.
- ``MiniTrainDIT._forward(x, timesteps, context, fps=None, padding_mask=None, **kwargs)``
  (``comfy/ldm/cosmos/predict2.py`` l.829-886, Cosmos Predict2; Forge Neo's Anima, ``backend/nn/anima.py`` l.459-503,
  is a port of it): a ``(B, C, T, H, W)`` latent patchified by ``x_embedder`` onto a ``(B, T, H, W, D)`` grid,
  ``t_embedder`` then ``t_embedding_norm``; every block called ``block(x, t_emb, context, rope_emb_L_1_1_D=,
  adaln_lora_B_T_3D=, extra_per_block_pos_emb=, transformer_options=)`` returning the grid; ``final_layer(x, t_emb,
  adaln_lora_B_T_3D=)``, unpatchified. Neo's Anima keeps the stream in float32 under a float16 model and hands
  ``final_layer`` a copy in the context's dtype.

Left out: RoPE, masks, reference latents, the blocks' exact modulation (an adaLN of the same shape stands in).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _embed(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class _Mixer(nn.Module):
    """Self-attention and a feed-forward over one stream, modulated by a vector (what both models' blocks do)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm1, self.norm2 = (
            nn.LayerNorm(dim, elementwise_affine=False),
            nn.LayerNorm(dim, elementwise_affine=False),
        )
        self.ff = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(approximate="tanh"), nn.Linear(2 * dim, dim))
        self.mod = nn.Linear(dim, 4 * dim)

    def forward(self, x: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
        scale1, gate1, scale2, gate2 = self.mod(F.silu(vec))[:, None].chunk(4, dim=-1)
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x) * (1 + scale1)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        x = x + gate1 * self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))
        return x + gate2 * self.ff(self.norm2(x) * (1 + scale2))


def _init(module: nn.Module, seed: int) -> None:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for p in module.parameters():
            nn.init.normal_(p, std=0.5 / math.sqrt(p.shape[-1]))


class JointTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.mixer = _Mixer(dim, heads)

    def forward(self, x, x_mask, freqs_cis, adaln_input=None, transformer_options={}):  # noqa: B006 (the host's)
        return self.mixer(x, adaln_input)


class FinalLayer(nn.Module):
    def __init__(self, dim: int, out: int):
        super().__init__()
        self.norm_final = nn.LayerNorm(dim, elementwise_affine=False)
        self.linear = nn.Linear(dim, out)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, x, c):
        return self.linear(self.norm_final(x) * (1 + self.adaLN_modulation(c)[:, None]))


class NextDiT(nn.Module):
    """``comfy.ldm.lumina.model.NextDiT`` (Lumina 2, Z-Image) at small width."""

    def __init__(self, in_channels=4, dim=32, heads=2, layers=4, cap_dim=32, seed=0):
        super().__init__()
        self.patch_size, self.in_channels = 2, in_channels
        self.x_embedder = nn.Linear(in_channels * 4, dim)
        self.cap_embedder = nn.Sequential(nn.LayerNorm(cap_dim), nn.Linear(cap_dim, dim))
        self.t_embedder = nn.Sequential(nn.Linear(64, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.noise_refiner = nn.ModuleList([JointTransformerBlock(dim, heads)])
        self.context_refiner = nn.ModuleList([JointTransformerBlock(dim, heads)])
        self.layers = nn.ModuleList(JointTransformerBlock(dim, heads) for _ in range(layers))
        self.final_layer = FinalLayer(dim, in_channels * 4)
        _init(self, seed)

    def forward(self, x, timesteps, context, num_tokens=None, attention_mask=None, transformer_options={}, **kwargs):  # noqa: B006
        b, c, h, w = x.shape
        t = self.t_embedder(_embed((1.0 - timesteps) * 1000, 64))
        cap = self.cap_embedder(context)
        for layer in self.context_refiner:
            cap = layer(cap, None, None, t)
        img = self.x_embedder(x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4))
        for layer in self.noise_refiner:
            img = layer(img, None, None, t)
        img = torch.cat((cap, img), dim=1)
        for layer in self.layers:
            img = layer(img, None, None, t, transformer_options=transformer_options)
        img = self.final_layer(img, t)[:, cap.shape[1] :]
        img = img.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
        return -img


class QwenImageTransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.img, self.txt = _Mixer(dim, heads), _Mixer(dim, heads)

    def forward(
        self,
        hidden_states,
        encoder_hidden_states,
        encoder_hidden_states_mask,
        temb,
        image_rotary_emb=None,
        timestep_zero_index=None,
        transformer_options={},  # noqa: B006
    ):
        joint = torch.cat((encoder_hidden_states, hidden_states), dim=1)
        txt = self.txt(encoder_hidden_states + joint[:, : encoder_hidden_states.shape[1]].mean(1, keepdim=True), temb)
        img = self.img(hidden_states + encoder_hidden_states.mean(1, keepdim=True), temb)
        return txt, img


class LastLayer(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x, conditioning_embedding):
        scale, shift = self.linear(F.silu(conditioning_embedding)).chunk(2, dim=1)
        return self.norm(x) * (1 + scale[:, None]) + shift[:, None]


class QwenImageTransformer2DModel(nn.Module):
    """``comfy.ldm.qwen_image.model.QwenImageTransformer2DModel`` at small width."""

    def __init__(self, in_channels=4, dim=32, heads=2, layers=4, context_dim=32, seed=0):
        super().__init__()
        self.img_in = nn.Linear(in_channels * 4, dim)
        self.txt_norm = nn.RMSNorm(context_dim, eps=1e-6)
        self.txt_in = nn.Linear(context_dim, dim)
        self.time_text_embed = nn.Sequential(nn.Linear(64, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.transformer_blocks = nn.ModuleList(QwenImageTransformerBlock(dim, heads) for _ in range(layers))
        self.norm_out = LastLayer(dim)
        self.proj_out = nn.Linear(dim, in_channels * 4)
        _init(self, seed)

    def forward(self, x, timestep, context, attention_mask=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        b, c, _, h, w = x.shape
        hidden = self.img_in(
            x[:, :, 0].reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4)
        )
        encoder = self.txt_in(self.txt_norm(context))
        temb = self.time_text_embed(_embed(timestep * 1000, 64))
        for i, block in enumerate(self.transformer_blocks):
            encoder, hidden = block(
                hidden_states=hidden,
                encoder_hidden_states=encoder,
                encoder_hidden_states_mask=None,
                temb=temb,
                image_rotary_emb=None,
                timestep_zero_index=None,
                transformer_options=transformer_options,
            )
            if control is not None and i < len(control.get("input", ())) and control["input"][i] is not None:
                add = control["input"][i]
                hidden[:, : add.shape[1]] += add
        out = self.proj_out(self.norm_out(hidden, temb))
        return out.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, 1, h, w)


class JointBlock(nn.Module):
    def __init__(self, dim: int, heads: int, pre_only: bool):
        super().__init__()
        self.context_block, self.x_block = _Mixer(dim, heads), _Mixer(dim, heads)
        self.pre_only = pre_only

    def forward(self, context, x, c=None, use_checkpoint=False, transformer_options={}):  # noqa: B006 (the host's)
        img = self.x_block(x + context.mean(1, keepdim=True), c)  # the joint attention's mixing, in short
        return (None if self.pre_only else self.context_block(context + x.mean(1, keepdim=True), c)), img


class OpenAISignatureMMDITWrapper(nn.Module):
    """``comfy.ldm.modules.diffusionmodules.mmdit.OpenAISignatureMMDITWrapper`` (SD3, SD3.5) at small width."""

    def __init__(self, in_channels=4, dim=32, heads=2, blocks=4, context_dim=32, seed=0):
        super().__init__()
        self.x_embedder = nn.Linear(in_channels * 4, dim)
        self.t_embedder = nn.Sequential(nn.Linear(64, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.context_embedder = nn.Linear(context_dim, dim)
        self.joint_blocks = nn.ModuleList(JointBlock(dim, heads, pre_only=i == blocks - 1) for i in range(blocks))
        self.final_layer = FinalLayer(dim, in_channels * 4)
        _init(self, seed)

    def forward(self, x, timesteps, context=None, y=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        b, ch, h, w = x.shape
        tokens = self.x_embedder(
            x.reshape(b, ch, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, ch * 4)
        )
        c = self.t_embedder(_embed(timesteps, 64))
        context = self.context_embedder(context)
        for i, block in enumerate(self.joint_blocks):
            context, tokens = block(context, tokens, c=c, use_checkpoint=False, transformer_options=transformer_options)
            if control is not None and i < len(control.get("output", ())) and control["output"][i] is not None:
                tokens += control["output"][i]
        out = self.final_layer(tokens, c)
        return out.reshape(b, h // 2, w // 2, ch, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, ch, h, w)


class CosmosBlock(nn.Module):
    def __init__(self, dim: int, heads: int, context_dim: int):
        super().__init__()
        self.mixer, self.cross = _Mixer(dim, heads), nn.Linear(context_dim, dim)

    def forward(
        self,
        x_B_T_H_W_D,
        emb_B_T_D,
        crossattn_emb,
        rope_emb_L_1_1_D=None,
        adaln_lora_B_T_3D=None,
        extra_per_block_pos_emb=None,
        transformer_options={},  # noqa: B006 (the host's)
    ):
        b, t, h, w, d = x_B_T_H_W_D.shape
        tokens = x_B_T_H_W_D.reshape(b, t * h * w, d) + self.cross(crossattn_emb).mean(1, keepdim=True)
        return self.mixer(tokens, emb_B_T_D[:, 0]).reshape(b, t, h, w, d)


class CosmosFinalLayer(nn.Module):
    def __init__(self, dim: int, out: int):
        super().__init__()
        self.layer_norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.linear = nn.Linear(dim, out)
        self.adaln_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, x_B_T_H_W_D, emb_B_T_D, adaln_lora_B_T_3D=None):
        scale = self.adaln_modulation(emb_B_T_D)[:, :, None, None]
        return self.linear(self.layer_norm(x_B_T_H_W_D) * (1 + scale))


class MiniTrainDIT(nn.Module):
    """``comfy.ldm.cosmos.predict2.MiniTrainDIT`` (Cosmos Predict2) at small width."""

    def __init__(self, in_channels=4, dim=32, heads=2, blocks=4, context_dim=32, seed=0):
        super().__init__()
        self.x_embedder = nn.Linear(in_channels * 4, dim)
        self.t_embedder = nn.Sequential(nn.Linear(64, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.t_embedding_norm = nn.RMSNorm(dim, eps=1e-6)
        self.blocks = nn.ModuleList(CosmosBlock(dim, heads, context_dim) for _ in range(blocks))
        self.final_layer = CosmosFinalLayer(dim, in_channels * 4)
        _init(self, seed)

    def forward(self, x, timesteps, context, fps=None, padding_mask=None, **kwargs):
        b, c, t, h, w = x.shape
        grid = (
            x.reshape(b, c, t, h // 2, 2, w // 2, 2).permute(0, 2, 3, 5, 1, 4, 6).reshape(b, t, h // 2, w // 2, c * 4)
        )
        grid = self.x_embedder(grid)
        emb = self.t_embedding_norm(self.t_embedder(_embed(timesteps, 64)))[:, None]
        options = kwargs.get("transformer_options", {})
        for block in self.blocks:
            grid = block(
                grid,
                emb,
                context,
                rope_emb_L_1_1_D=None,
                adaln_lora_B_T_3D=None,
                extra_per_block_pos_emb=None,
                transformer_options=options,
            )
        out = self.final_layer(self.to_output(grid, context), emb, adaln_lora_B_T_3D=None)
        return out.reshape(b, t, h // 2, w // 2, c, 2, 2).permute(0, 4, 1, 2, 5, 3, 6).reshape(b, c, t, h, w)

    def to_output(self, grid: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """What ``final_layer`` is handed: the stream itself (ComfyUI's)."""
        return grid
