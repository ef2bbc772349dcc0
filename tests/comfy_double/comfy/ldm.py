"""ComfyUI's SD UNet and ControlNet model, small (3cd7b32f): ``comfy/ldm/modules/attention.py``,
``comfy/ldm/modules/diffusionmodules/openaimodel.py`` and ``comfy/cldm/cldm.py``.

What a hook-based patch and an attention patch can observe is reproduced; the layers whose math is ldm's and that
ComfyUI calls as ldm does (``ResBlock``, ``Upsample`` to ``output_shape``, ``Downsample``, ``CrossAttention`` with
``value=``, ``FeedForward``, the cosines-first timestep embedding) are the Forge double's (``forge_double.unet``: Forge's
backend is ComfyUI's, with the same layers). Weights load from the tests' ldm models (same ``state_dict()`` keys), and
the unpatched outputs equal ldm's (``tests/test_comfy_host.py``). Attention runs through SDPA
(``--use-pytorch-cross-attention``; ComfyUI's CPU default, sub-quadratic attention, computes the same function).

- ``forward_timestep_embed(ts, x, emb, context, transformer_options, output_shape)`` (openaimodel.py:33-60): iterates
  the block's layers and calls each itself; ``UNetModel._forward`` calls it for every block (l.874, 885, 899), never
  the block module: hooks and an instance ``forward`` on a block do not run in ComfyUI, those on its layers do. A
  ``SpatialTransformer`` layer counts ``transformer_index`` up.
- ``UNetModel.forward`` runs the ``DIFFUSION_MODEL`` wrappers (l.833-838); ``_forward`` (l.840-913) sets
  ``original_shape``, ``transformer_index`` and ``block`` in the ``transformer_options`` it is given, applies the
  ``input_block_patch`` / ``input_block_patch_after_skip`` / ``output_block_patch`` lists and ``apply_control`` (in
  place, l.365-373). No ``attention_resolutions`` attribute, no ``transformer_depth`` (the constructor consumes it).
- ``BasicTransformerBlock.forward(x, context=None, transformer_options={})`` (attention.py:848-961): ``extra_options``
  is ``transformer_options`` without ``patches``/``patches_replace`` plus ``n_heads``, ``dim_head``; ``attn1_patch``
  list with ``context = value = n`` (l.876-886); an attn1 replace looked up by ``(block[0], block[1], block_index)``
  then ``block`` calls ``to_q``/``to_k``/``to_v``/``to_out`` itself (l.888-906); else ``attn1(n, context=…, value=…,
  transformer_options=…)`` with ``n`` positional (l.907); ``attn1_output_patch``; ``x = n + x`` (not in place); the
  attn2 equivalents; ``ff(norm3(x))`` positional.
- ``SpatialTransformer.forward(x, context=None, transformer_options={})`` (l.1006-1027): ``block_index`` per block,
  ``block(x, context=context[i], transformer_options=…)``.
- cldm ``ControlNet.forward(x, hint, timesteps, context, y=None, **kwargs)`` (cldm.py:383-434): its blocks called as
  modules with ``(h, emb, context)`` (no ``transformer_options``), the hint added after the first, a zero conv per
  input block and ``middle_block_out``; returns ``{"middle": [...], "output": [...]}``.

Left out: video layers, ``ff_in``, 3-D convolutions, resblock up/down sampling, scale-shift norm, ``emb_patch``,
``forward_timestep_embed_patch``, ``middle_patch``, attention masks, the union ControlNet.
"""

from __future__ import annotations

from typing import Any

import torch
from forge_double.unet import CrossAttention, Downsample, FeedForward, ResBlock, TimestepBlock, Upsample
from forge_double.unet import timestep_embedding as _timestep_embedding
from torch import nn

from . import patcher_extension


def timestep_embedding(timesteps: torch.Tensor, dim: int) -> torch.Tensor:
    return _timestep_embedding(timesteps, dim)


def _run(patches: dict, name: str, n, context, value, extra):
    for patch in patches.get(name, ()):
        n, context, value = patch(n, context, value, extra)
    return n, context, value


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim: int, n_heads: int, d_head: int, context_dim: int | None, disable_self_attn=False):
        super().__init__()
        self.disable_self_attn = disable_self_attn
        self.attn1 = CrossAttention(dim, context_dim if disable_self_attn else None, n_heads, d_head)
        self.ff = FeedForward(dim)
        self.attn2 = CrossAttention(dim, context_dim, n_heads, d_head)
        self.norm2 = nn.LayerNorm(dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.n_heads, self.d_head = n_heads, d_head

    def _attention(self, attn, replaces, keys, n, context, value, extra, transformer_options):
        replace = next((replaces[k] for k in keys if k in replaces), None)
        if replace is None:
            return attn(n, context=context, value=value, transformer_options=transformer_options)
        context = n if context is None else context
        value = context if value is None else value
        return attn.to_out(replace(attn.to_q(n), attn.to_k(context), attn.to_v(value), extra))

    def forward(self, x, context=None, transformer_options={}):  # noqa: B006 (ComfyUI's)
        patches = transformer_options.get("patches", {})
        replaces = transformer_options.get("patches_replace", {})
        extra: dict[str, Any] = {
            k: v for k, v in transformer_options.items() if k not in ("patches", "patches_replace")
        }
        extra["n_heads"], extra["dim_head"] = self.n_heads, self.d_head
        block = transformer_options.get("block")
        keys = [] if block is None else [(block[0], block[1], transformer_options.get("block_index", 0)), block]

        n = self.norm1(x)
        context1 = context if self.disable_self_attn else None
        value1 = None
        if "attn1_patch" in patches:
            context1 = n if context1 is None else context1
            value1 = context1
            n, context1, value1 = _run(patches, "attn1_patch", n, context1, value1, extra)
        n = self._attention(
            self.attn1, replaces.get("attn1", {}), keys, n, context1, value1, extra, transformer_options
        )
        for patch in patches.get("attn1_output_patch", ()):
            n = patch(n, extra)
        x = n + x

        n = self.norm2(x)
        context2, value2 = context, None
        if "attn2_patch" in patches:
            value2 = context2
            n, context2, value2 = _run(patches, "attn2_patch", n, context2, value2, extra)
        n = self._attention(
            self.attn2, replaces.get("attn2", {}), keys, n, context2, value2, extra, transformer_options
        )
        for patch in patches.get("attn2_output_patch", ()):
            n = patch(n, extra)
        x = n + x
        return x + self.ff(self.norm3(x))


class SpatialTransformer(nn.Module):
    def __init__(self, channels: int, n_heads: int, d_head: int, depth: int, context_dim: int, use_linear: bool):
        super().__init__()
        inner = n_heads * d_head
        self.in_channels = channels
        self.norm = nn.GroupNorm(32, channels, eps=1e-6, affine=True)
        self.proj_in = nn.Linear(channels, inner) if use_linear else nn.Conv2d(channels, inner, 1)
        self.transformer_blocks = nn.ModuleList(
            BasicTransformerBlock(inner, n_heads, d_head, context_dim) for _ in range(depth)
        )
        self.proj_out = nn.Linear(inner, channels) if use_linear else nn.Conv2d(inner, channels, 1)
        self.use_linear = use_linear

    def forward(self, x, context=None, transformer_options={}):  # noqa: B006 (ComfyUI's)
        if not isinstance(context, list):
            context = [context] * len(self.transformer_blocks)
        _, _, h, w = x.shape
        transformer_options["activations_shape"] = list(x.shape)
        x_in = x
        x = self.norm(x)
        if not self.use_linear:
            x = self.proj_in(x)
        x = x.movedim(1, 3).flatten(1, 2).contiguous()
        if self.use_linear:
            x = self.proj_in(x)
        for i, block in enumerate(self.transformer_blocks):
            transformer_options["block_index"] = i
            x = block(x, context=context[i], transformer_options=transformer_options)
        if self.use_linear:
            x = self.proj_out(x)
        x = x.reshape(x.shape[0], h, w, x.shape[-1]).movedim(3, 1).contiguous()
        if not self.use_linear:
            x = self.proj_out(x)
        return x + x_in


def forward_timestep_embed(ts, x, emb, context=None, transformer_options={}, output_shape=None):  # noqa: B006
    for layer in ts:
        if isinstance(layer, TimestepBlock):
            x = layer(x, emb)
        elif isinstance(layer, SpatialTransformer):
            x = layer(x, context, transformer_options)
            if "transformer_index" in transformer_options:
                transformer_options["transformer_index"] += 1
        elif isinstance(layer, Upsample):
            x = layer(x, output_shape=output_shape)
        else:
            x = layer(x)
    return x


class TimestepEmbedSequential(nn.Sequential, TimestepBlock):
    def forward(self, *args, **kwargs):
        return forward_timestep_embed(self, *args, **kwargs)


def apply_control(h, control, name):
    if control is not None and name in control and len(control[name]) > 0:
        ctrl = control[name].pop()
        if ctrl is not None:
            h += ctrl
    return h


class UNetModel(nn.Module):
    """Built by :func:`unet_from_ldm` with the tests' ldm UNet's layout and weights."""

    def forward(self, x, timesteps=None, context=None, y=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        return patcher_extension.WrapperExecutor.new_class_executor(
            self._forward,
            self,
            patcher_extension.get_all_wrappers(patcher_extension.WrappersMP.DIFFUSION_MODEL, transformer_options),
        ).execute(x, timesteps, context, y, control, transformer_options, **kwargs)

    def _forward(self, x, timesteps=None, context=None, y=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        transformer_options["original_shape"] = list(x.shape)
        transformer_options["transformer_index"] = 0
        patches = transformer_options.get("patches", {})
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels).to(x.dtype))
        if getattr(self, "label_emb", None) is not None:
            emb = emb + self.label_emb(y)
        hs, h = [], x
        for i, module in enumerate(self.input_blocks):
            transformer_options["block"] = ("input", i)
            h = forward_timestep_embed(module, h, emb, context, transformer_options)
            h = apply_control(h, control, "input")
            for p in patches.get("input_block_patch", ()):
                h = p(h, transformer_options)
            hs.append(h)
            for p in patches.get("input_block_patch_after_skip", ()):
                h = p(h, transformer_options)
        transformer_options["block"] = ("middle", 0)
        h = forward_timestep_embed(self.middle_block, h, emb, context, transformer_options)
        h = apply_control(h, control, "middle")
        for i, module in enumerate(self.output_blocks):
            transformer_options["block"] = ("output", i)
            hsp = apply_control(hs.pop(), control, "output")
            for p in patches.get("output_block_patch", ()):
                h, hsp = p(h, hsp, transformer_options)
            h = torch.cat([h, hsp], dim=1)
            output_shape = hs[-1].shape if hs else None
            h = forward_timestep_embed(module, h, emb, context, transformer_options, output_shape)
        return self.out(h.type(x.dtype))


class ControlNet(nn.Module):
    """cldm.py: built by :func:`controlnet_from_ldm` from the tests' ldm ControlNet (``controlnet_double``)."""

    def forward(self, x, hint, timesteps, context, y=None, **kwargs):
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels).to(x.dtype))
        guided_hint = self.input_hint_block(hint, emb, context)
        out_output, h = [], x
        for module, zero_conv in zip(self.input_blocks, self.zero_convs):
            h = module(h, emb, context)
            if guided_hint is not None:
                h += guided_hint
                guided_hint = None
            out_output.append(zero_conv(h, emb, context))
        h = self.middle_block(h, emb, context)
        return {"middle": [self.middle_block_out(h, emb, context)], "output": out_output}


# --- built from the tests' ldm models, with their weights ---------------------------------------------------------


def _layer(ldm_layer: nn.Module) -> nn.Module:
    """The ComfyUI layer standing for one ldm layer (same keys)."""
    kind = type(ldm_layer).__name__
    if kind == "ResBlock":
        return ResBlock(ldm_layer.channels, ldm_layer.emb_channels, ldm_layer.out_channels)
    if kind == "SpatialTransformer" or hasattr(ldm_layer, "transformer_blocks"):
        first = ldm_layer.transformer_blocks[0]
        heads, inner = first.attn1.heads, first.attn1.to_q.out_features
        return SpatialTransformer(
            ldm_layer.in_channels,
            heads,
            inner // heads,
            len(ldm_layer.transformer_blocks),
            first.attn2.to_k.in_features,
            isinstance(ldm_layer.proj_in, nn.Linear),
        )
    if kind == "Downsample":
        return Downsample(ldm_layer.channels)
    if kind == "Upsample":
        return Upsample(ldm_layer.channels)
    if isinstance(ldm_layer, (nn.Conv2d, nn.SiLU)):
        return ldm_layer.__class__(**_conv_args(ldm_layer)) if isinstance(ldm_layer, nn.Conv2d) else nn.SiLU()
    raise TypeError(kind)


def _conv_args(conv: nn.Conv2d) -> dict:
    return dict(
        in_channels=conv.in_channels,
        out_channels=conv.out_channels,
        kernel_size=conv.kernel_size,
        stride=conv.stride,
        padding=conv.padding,
    )


def _blocks(ldm_blocks) -> nn.ModuleList:
    return nn.ModuleList(TimestepEmbedSequential(*(_layer(layer) for layer in block)) for block in ldm_blocks)


def _encoder(module: nn.Module, ldm: nn.Module) -> None:
    module.model_channels = ldm.model_channels
    module.num_res_blocks = list(ldm.num_res_blocks)
    module.channel_mult = list(ldm.channel_mult)
    module.time_embed = nn.Sequential(*(_layer(m) if isinstance(m, nn.SiLU) else _linear(m) for m in ldm.time_embed))
    module.input_blocks = _blocks(ldm.input_blocks)
    module.middle_block = TimestepEmbedSequential(*(_layer(layer) for layer in ldm.middle_block))


def _linear(linear: nn.Linear) -> nn.Linear:
    return nn.Linear(linear.in_features, linear.out_features)


def unet_from_ldm(ldm: nn.Module) -> UNetModel:
    """A ComfyUI-layout UNet holding the ldm UNet's weights (strict load), eval mode."""
    unet = UNetModel()
    _encoder(unet, ldm)
    if getattr(ldm, "label_emb", None) is not None:
        unet.label_emb = nn.Sequential(*(_linear(m) if isinstance(m, nn.Linear) else nn.SiLU() for m in ldm.label_emb))
    unet.output_blocks = _blocks(ldm.output_blocks)
    out = ldm.out
    unet.out = nn.Sequential(nn.GroupNorm(out[0].num_groups, out[0].num_channels), nn.SiLU(), _layer(out[2]))
    unet.load_state_dict(ldm.state_dict(), strict=True)
    return unet.eval().requires_grad_(False)


def controlnet_from_ldm(ldm: nn.Module) -> ControlNet:
    """A ComfyUI cldm ControlNet holding the weights of the tests' ldm-built one (``controlnet_double.ControlNet``)."""
    net = ControlNet()
    _encoder(net, ldm)
    net.input_hint_block = TimestepEmbedSequential(*(_layer(m) for m in ldm.input_hint_block))
    net.zero_convs = _blocks(ldm.zero_convs)
    net.middle_block_out = TimestepEmbedSequential(*(_layer(m) for m in ldm.middle_block_out))
    net.load_state_dict(ldm.state_dict(), strict=True)
    return net.eval().requires_grad_(False)
