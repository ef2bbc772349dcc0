"""Forge's UNet (``backend/nn/unet.py``) and built-in ControlNet model (``backend/nn/cnets/cldm.py``), small.

Written from reading Forge main at dfdcbab (2025-06-26); the line numbers below are that commit's. What is
reproduced is what a hook-based patch can observe: the module tree and ``state_dict()`` keys (ldm's, so the
tiny ldm UNets of ``benchmarks/lab/models.py`` load here unchanged), the call signatures (keywords and positions), the
in-place adds of ``BasicTransformerBlock._forward`` and its ``transformer_options["patches"]`` /
``["patches_replace"]`` protocol, ``transformer_depth`` per input block instead of ``attention_resolutions``,
and upsampling to the skip connection's size. Attention runs through ``scaled_dot_product_attention``, as Forge
does with ``--attention-pytorch``. Left out: gradient checkpointing (Forge raises if it is on), ``ff_in``
(video models), 3-D convolutions, resblock up/down sampling, scale-shift norm, block inner modifiers, the
group-norm wrapper.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def timestep_embedding(timesteps: torch.Tensor, dim: int, max_period: int = 10000) -> torch.Tensor:
    """Sinusoidal embedding, cosines first (unet.py:55-67; the same numbers as ldm's)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half).to(timesteps.device)
    args = timesteps[:, None].float() * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    return torch.cat([emb, torch.zeros_like(emb[:, :1])], dim=-1) if dim % 2 else emb


def attention_pytorch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, mask=None) -> torch.Tensor:
    """``backend/attention.py:324-339``: K/V may be shorter than Q (reshaped with -1)."""
    b, _, inner = q.shape
    q, k, v = (t.view(b, -1, heads, inner // heads).transpose(1, 2) for t in (q, k, v))
    out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).reshape(b, -1, inner)


class TimestepBlock(nn.Module):
    """Marker: layers that take the timestep embedding (unet.py:70)."""


class TimestepEmbedSequential(nn.Sequential, TimestepBlock):
    """unet.py:74-92: each layer gets what it takes; a SpatialTransformer counts ``transformer_index`` up."""

    def forward(self, x, emb, context=None, transformer_options={}, output_shape=None):  # noqa: B006 (Forge's)
        for layer in self:
            if isinstance(layer, TimestepBlock):
                x = layer(x, emb, transformer_options)
            elif isinstance(layer, SpatialTransformer):
                x = layer(x, context, transformer_options)
                if "transformer_index" in transformer_options:
                    transformer_options["transformer_index"] += 1
            elif isinstance(layer, Upsample):
                x = layer(x, output_shape=output_shape)
            else:
                x = layer(x)
        return x


class GEGLU(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out * 2)

    def forward(self, x):
        x, gate = self.proj(x).chunk(2, dim=-1)
        return x * nn.functional.gelu(gate)


class FeedForward(nn.Module):
    """unet.py:114-130: ``net = [GEGLU, Dropout, Linear]`` (keys ``net.0.proj``, ``net.2``)."""

    def __init__(self, dim: int, dim_out: int | None = None, mult: int = 4):
        super().__init__()
        inner = dim * mult
        self.net = nn.Sequential(GEGLU(dim, inner), nn.Dropout(0.0), nn.Linear(inner, dim_out or dim))

    def forward(self, x):
        return self.net(x)


class CrossAttention(nn.Module):
    """unet.py:133-155: keys from ``context`` (default ``x``), values from ``value`` if given, else ``context``."""

    def __init__(self, query_dim: int, context_dim: int | None = None, heads: int = 8, dim_head: int = 64):
        super().__init__()
        inner = heads * dim_head
        context_dim = query_dim if context_dim is None else context_dim
        self.heads, self.dim_head = heads, dim_head
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(context_dim, inner, bias=False)
        self.to_v = nn.Linear(context_dim, inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, query_dim), nn.Dropout(0.0))

    def forward(self, x, context=None, value=None, mask=None, transformer_options={}):  # noqa: B006 (Forge's)
        q = self.to_q(x)
        context = x if context is None else context
        k = self.to_k(context)
        v = self.to_v(context if value is None else value)
        return self.to_out(attention_pytorch(q, k, v, self.heads, mask))


def _run_patches(patches: dict, name: str, *values):
    """Apply each patch of ``patches[name]`` in list order, feeding each the previous one's result."""
    for patch in patches.get(name, ()):
        values = patch(*values)
    return values


class BasicTransformerBlock(nn.Module):
    """unet.py:158-279. ``forward`` hands ``_forward`` its arguments positionally (``checkpoint`` is a plain
    call, l.9-12, 180-181); ``_forward`` adds the attention outputs into its input **in place** (l.240, 272)."""

    def __init__(self, dim: int, n_heads: int, d_head: int, context_dim: int | None = None, disable_self_attn=False):
        super().__init__()
        self.disable_self_attn = disable_self_attn
        self.attn1 = CrossAttention(dim, context_dim if disable_self_attn else None, n_heads, d_head)
        self.norm1 = nn.LayerNorm(dim)
        self.attn2 = CrossAttention(dim, context_dim, n_heads, d_head)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)
        self.norm3 = nn.LayerNorm(dim)
        self.n_heads, self.d_head = n_heads, d_head

    def forward(self, x, context=None, transformer_options={}):  # noqa: B006 (Forge's)
        return self._forward(x, context, transformer_options)

    def _replace(self, attn: CrossAttention, replace, n, context, value, extra: dict) -> torch.Tensor:
        """A ``patches_replace`` entry: the projections are called one by one, never ``attn.__call__``."""
        return attn.to_out(replace(attn.to_q(n), attn.to_k(context), attn.to_v(value), extra))

    def _forward(self, x, context=None, transformer_options={}):  # noqa: B006 (Forge's)
        patches = transformer_options.get("patches", {})
        replaces = transformer_options.get("patches_replace", {})
        extra: dict[str, Any] = {
            k: v for k, v in transformer_options.items() if k not in ("patches", "patches_replace")
        }
        extra["n_heads"], extra["dim_head"] = self.n_heads, self.d_head  # l.185-198
        block = transformer_options.get("block")
        keys = [] if block is None else [(block[0], block[1], transformer_options.get("block_index", 0)), block]

        n = self.norm1(x)
        context1 = context if self.disable_self_attn else None
        value1 = None
        if "attn1_patch" in patches:  # l.210-216: the patches see full-length context and value
            context1 = n if context1 is None else context1
            value1 = context1
            n, context1, value1 = _run_patches(patches, "attn1_patch", n, context1, value1, extra)
        replace1 = next((replaces["attn1"][k] for k in keys if k in replaces.get("attn1", {})), None)
        if replace1 is not None:  # l.221-233
            context1 = n if context1 is None else context1
            value1 = n if value1 is None else value1
            n = self._replace(self.attn1, replace1, n, context1, value1, extra)
        else:
            n = self.attn1(n, context=context1, value=value1, transformer_options=extra)  # l.235
        for patch in patches.get("attn1_output_patch", ()):
            n = patch(n, extra)
        x += n  # l.240
        for patch in patches.get("middle_patch", ()):
            x = patch(x, extra)

        n = self.norm2(x)
        context2, value2 = context, None
        if "attn2_patch" in patches:  # l.249-253
            value2 = context2
            n, context2, value2 = _run_patches(patches, "attn2_patch", n, context2, value2, extra)
        replace2 = next((replaces["attn2"][k] for k in keys if k in replaces.get("attn2", {})), None)
        if replace2 is not None:  # l.258-265
            n = self._replace(self.attn2, replace2, n, context2, context2 if value2 is None else value2, extra)
        else:
            n = self.attn2(n, context=context2, value=value2, transformer_options=extra)  # l.267
        for patch in patches.get("attn2_output_patch", ()):
            n = patch(n, extra)
        x += n  # l.272

        x_skip = x
        x = self.ff(self.norm3(x))  # l.276, positional
        x += x_skip
        return x


class SpatialTransformer(nn.Module):
    """unet.py:282-327: ``block(x, context=context[i], transformer_options=…)``, ``block_index`` set per block."""

    def __init__(self, channels: int, n_heads: int, d_head: int, depth: int, context_dim, use_linear: bool):
        super().__init__()
        inner = n_heads * d_head
        dims = context_dim if isinstance(context_dim, list) else [context_dim] * depth
        self.norm = nn.GroupNorm(32, channels, eps=1e-6, affine=True)
        self.proj_in = nn.Linear(channels, inner) if use_linear else nn.Conv2d(channels, inner, 1)
        self.transformer_blocks = nn.ModuleList(
            BasicTransformerBlock(inner, n_heads, d_head, context_dim=dims[d]) for d in range(depth)
        )
        self.proj_out = nn.Linear(channels, inner) if use_linear else nn.Conv2d(inner, channels, 1)  # l.305 as is
        self.use_linear = use_linear

    def forward(self, x, context=None, transformer_options={}):  # noqa: B006 (Forge's)
        if not isinstance(context, list):
            context = [context] * len(self.transformer_blocks)
        b, _, h, w = x.shape
        x_in = x
        x = self.norm(x)
        if not self.use_linear:
            x = self.proj_in(x)
        x = x.flatten(2).transpose(1, 2).contiguous()
        if self.use_linear:
            x = self.proj_in(x)
        for i, block in enumerate(self.transformer_blocks):
            transformer_options["block_index"] = i
            x = block(x, context=context[i], transformer_options=transformer_options)
        if self.use_linear:
            x = self.proj_out(x)
        x = x.transpose(1, 2).reshape(b, -1, h, w).contiguous()
        if not self.use_linear:
            x = self.proj_out(x)
        return x + x_in


class Upsample(nn.Module):
    """unet.py:330-355: nearest to ``output_shape`` (the skip connection's size) when given, else 2x; then conv."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, output_shape=None):
        size = list(output_shape[2:4]) if output_shape is not None else [x.shape[2] * 2, x.shape[3] * 2]
        return self.conv(nn.functional.interpolate(x, size=size, mode="nearest"))


class Downsample(nn.Module):
    """unet.py:358-374: stride-2 conv, padding 1 (sizes round up)."""

    def __init__(self, channels: int):
        super().__init__()
        self.op = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x):
        return self.op(x)


class ResBlock(TimestepBlock):
    """unet.py:377-478 without up/down sampling or scale-shift norm."""

    def __init__(self, channels: int, emb_channels: int, out_channels: int | None = None):
        super().__init__()
        out = out_channels or channels
        self.in_layers = nn.Sequential(nn.GroupNorm(32, channels), nn.SiLU(), nn.Conv2d(channels, out, 3, padding=1))
        self.h_upd = self.x_upd = nn.Identity()
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb_channels, out))
        self.out_layers = nn.Sequential(
            nn.GroupNorm(32, out), nn.SiLU(), nn.Dropout(0.0), nn.Conv2d(out, out, 3, padding=1)
        )
        self.skip_connection = nn.Identity() if out == channels else nn.Conv2d(channels, out, 1)

    def forward(self, x, emb, transformer_options={}):  # noqa: B006 (Forge's)
        h = self.in_layers(x)
        h = h + self.emb_layers(emb).type(h.dtype)[..., None, None]
        return self.skip_connection(x) + self.out_layers(h)


def apply_control(h: torch.Tensor, control: dict | None, name: str) -> torch.Tensor:
    """unet.py:44-52: pop the last residual of ``control[name]`` and add it in place."""
    if control is not None and control.get(name):
        ctrl = control[name].pop()
        if ctrl is not None:
            h += ctrl
    return h


class _Levels(nn.Module):
    """The encoder half shared by the UNet and the ControlNet: ``time_embed``, ``label_emb``, ``input_blocks``,
    ``middle_block``, with Forge's per-input-block ``transformer_depth`` (unet.py:485-634, cldm.py:86-237)."""

    def _build_encoder(self, cfg: dict) -> list[int]:
        mc, nrb = cfg["model_channels"], cfg["num_res_blocks"]
        self.model_channels = mc
        self.num_res_blocks = [nrb] * len(cfg["channel_mult"]) if isinstance(nrb, int) else list(nrb)
        self.channel_mult = list(cfg["channel_mult"])
        self.num_classes = cfg.get("num_classes")
        emb = mc * 4
        self.time_embed = nn.Sequential(nn.Linear(mc, emb), nn.SiLU(), nn.Linear(emb, emb))
        if self.num_classes == "sequential":  # SDXL's ADM vector (unet.py:529-537)
            adm = cfg["adm_in_channels"]
            self.label_emb = nn.Sequential(nn.Sequential(nn.Linear(adm, emb), nn.SiLU(), nn.Linear(emb, emb)))
        self.input_blocks = nn.ModuleList([TimestepEmbedSequential(nn.Conv2d(cfg["in_channels"], mc, 3, padding=1))])
        depths, chans, ch = list(cfg["transformer_depth"]), [mc], mc
        for level, mult in enumerate(self.channel_mult):
            for _ in range(self.num_res_blocks[level]):
                layers: list[nn.Module] = [ResBlock(ch, emb, mult * mc)]
                ch = mult * mc
                layers += self._transformer(ch, depths.pop(0), cfg)
                self.input_blocks.append(TimestepEmbedSequential(*layers))
                chans.append(ch)
            if level != len(self.channel_mult) - 1:
                self.input_blocks.append(TimestepEmbedSequential(Downsample(ch)))
                chans.append(ch)
        middle = [ResBlock(ch, emb), *self._transformer(ch, cfg["transformer_depth_middle"], cfg), ResBlock(ch, emb)]
        self.middle_block = TimestepEmbedSequential(*middle)
        return chans

    @staticmethod
    def _transformer(ch: int, depth: int, cfg: dict) -> list[nn.Module]:
        if depth <= 0:
            return []
        heads, d_head = cfg.get("num_heads", -1), cfg.get("num_head_channels", -1)
        heads, d_head = (ch // d_head, d_head) if d_head != -1 else (heads, ch // heads)  # unet.py:563-567
        return [SpatialTransformer(ch, heads, d_head, depth, cfg["context_dim"], cfg["use_linear_in_transformer"])]

    def _embed(self, x: torch.Tensor, timesteps: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels).to(x.dtype))
        if self.num_classes is not None:
            assert y is not None and y.shape[0] == x.shape[0]
            emb = emb + self.label_emb(y)
        return emb


class IntegratedUNet2DConditionModel(_Levels):
    """unet.py:481-763. ``config`` is the dict the loader sets (``loader.py:164-167``: ``_internal_dict``); it has
    ``transformer_depth`` (one entry per input res-block), ``num_res_blocks``, ``channel_mult``, and no
    ``attention_resolutions``. ``forward`` writes ``original_shape``, ``transformer_index`` and ``block`` into the
    ``transformer_options`` it is given (l.697-734)."""

    def __init__(self, **cfg: Any):
        super().__init__()
        self._internal_dict = dict(cfg)
        chans = self._build_encoder(cfg)
        mc, emb, ch = self.model_channels, self.model_channels * 4, chans[-1]
        depths_out = list(cfg["transformer_depth_output"])
        self.output_blocks = nn.ModuleList()
        for level, mult in reversed(list(enumerate(self.channel_mult))):
            for i in range(self.num_res_blocks[level] + 1):
                layers: list[nn.Module] = [ResBlock(ch + chans.pop(), emb, mc * mult)]
                ch = mc * mult
                layers += self._transformer(ch, depths_out.pop(), cfg)
                if level and i == self.num_res_blocks[level]:
                    layers.append(Upsample(ch))
                self.output_blocks.append(TimestepEmbedSequential(*layers))
        self.out = nn.Sequential(nn.GroupNorm(32, ch), nn.SiLU(), nn.Conv2d(mc, cfg["out_channels"], 3, padding=1))

    @property
    def config(self) -> dict:
        return self._internal_dict

    def forward(self, x, timesteps=None, context=None, y=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        transformer_options["original_shape"] = list(x.shape)
        transformer_options["transformer_index"] = 0
        patches = transformer_options.get("patches", {})
        modifiers = transformer_options.get("block_modifiers", [])

        def modify(h, flag):
            for modifier in modifiers:
                h = modifier(h, flag, transformer_options)
            return h

        assert (y is not None) == (self.num_classes is not None)
        emb = self._embed(x, timesteps, y)
        hs, h = [], x
        for i, module in enumerate(self.input_blocks):
            transformer_options["block"] = ("input", i)
            h = modify(h, "before")
            h = apply_control(module(h, emb, context, transformer_options), control, "input")
            h = modify(h, "after")
            for patch in patches.get("input_block_patch", ()):  # l.717-720
                h = patch(h, transformer_options)
            hs.append(h)
            for patch in patches.get("input_block_patch_after_skip", ()):  # l.722-725
                h = patch(h, transformer_options)
        transformer_options["block"] = ("middle", 0)
        h = modify(h, "before")
        h = apply_control(self.middle_block(h, emb, context, transformer_options), control, "middle")
        h = modify(h, "after")
        for i, module in enumerate(self.output_blocks):
            transformer_options["block"] = ("output", i)
            hsp = apply_control(hs.pop(), control, "output")
            for patch in patches.get("output_block_patch", ()):  # l.737-740
                h, hsp = patch(h, hsp, transformer_options)
            h = modify(torch.cat([h, hsp], dim=1), "before")
            h = modify(module(h, emb, context, transformer_options, hs[-1].shape if hs else None), "after")
        transformer_options["block"] = ("last", 0)
        h = modify(h, "before")
        return modify(self.out(h), "after").type(x.dtype)


class ControlNet(_Levels):
    """cldm.py:7-270: the UNet's encoder half plus a hint encoder and one 1x1 zero conv per input block and the
    middle block. ``forward`` passes no ``transformer_options`` to its blocks (l.244-270), so Forge's attention
    patches never reach a control model. The real hint encoder is 16,16,32,32,96,96,256 wide (l.117-133);
    ``hint_widths`` lets the tests keep it small."""

    def __init__(self, hint_channels: int = 3, hint_widths=(16, 16, 32, 32, 96, 96, 256), **cfg: Any):
        super().__init__()
        chans = self._build_encoder(cfg)
        layers: list[nn.Module] = []
        cin = hint_channels
        for cout, stride in zip([*hint_widths, self.model_channels], (1, 1, 2, 1, 2, 1, 2, 1)):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, stride=stride), nn.SiLU()]
            cin = cout
        self.input_hint_block = TimestepEmbedSequential(*layers[:-1])
        self.zero_convs = nn.ModuleList(TimestepEmbedSequential(nn.Conv2d(c, c, 1)) for c in chans)
        self.middle_block_out = TimestepEmbedSequential(nn.Conv2d(chans[-1], chans[-1], 1))

    def forward(self, x, hint, timesteps, context, y=None, **kwargs):
        emb = self._embed(x, timesteps, y)
        guided_hint = self.input_hint_block(hint, emb, context)
        outs, h = [], x
        for module, zero_conv in zip(self.input_blocks, self.zero_convs):
            h = module(h, emb, context)
            if guided_hint is not None:
                h += guided_hint
                guided_hint = None
            outs.append(zero_conv(h, emb, context))
        h = self.middle_block(h, emb, context)
        outs.append(self.middle_block_out(h, emb, context))
        return outs


# --- built from the tests' ldm models, with their weights ---------------------------------------------------------


def _depth(seq: nn.Module) -> int:
    """Transformer blocks in one ldm ``TimestepEmbedSequential``."""
    return sum(len(m.transformer_blocks) for m in seq if hasattr(m, "transformer_blocks"))


def config_from_ldm(ldm: nn.Module) -> dict:
    """Forge's config for an ldm ``UNetModel`` (or the tests' ldm-built ControlNet): the huggingface_guess layout,
    ``transformer_depth`` per input res-block and per output block, read off the ldm module tree."""
    spatial = [m for m in ldm.modules() if hasattr(m, "transformer_blocks")]
    first, attn2 = spatial[0], spatial[0].transformer_blocks[0].attn2
    heads = {m.transformer_blocks[0].attn2.heads for m in spatial}
    res_blocks = [b for b in list(ldm.input_blocks)[1:] if hasattr(b[0], "in_layers")]
    cfg = dict(
        in_channels=ldm.input_blocks[0][0].in_channels,
        model_channels=ldm.model_channels,
        num_res_blocks=list(ldm.num_res_blocks),
        channel_mult=list(ldm.channel_mult),
        transformer_depth=[_depth(b) for b in res_blocks],
        transformer_depth_middle=_depth(ldm.middle_block),
        num_heads=attn2.heads if len(heads) == 1 else -1,
        num_head_channels=-1 if len(heads) == 1 else attn2.to_q.out_features // attn2.heads,
        context_dim=attn2.to_k.in_features,
        use_linear_in_transformer=isinstance(first.proj_in, nn.Linear),
    )
    if hasattr(ldm, "output_blocks"):
        cfg["transformer_depth_output"] = [_depth(b) for b in reversed(ldm.output_blocks)]
        cfg["out_channels"] = ldm.out[-1].out_channels
    return cfg


def unet_from_ldm(ldm: nn.Module) -> IntegratedUNet2DConditionModel:
    """A Forge-layout UNet holding the ldm UNet's weights (strict load: same keys, same shapes), eval mode."""
    unet = IntegratedUNet2DConditionModel(**config_from_ldm(ldm))
    unet.load_state_dict(ldm.state_dict(), strict=True)
    return unet.eval().requires_grad_(False)


def controlnet_from_ldm(ldm: nn.Module) -> ControlNet:
    """A Forge cldm ControlNet holding the weights of the tests' ldm-built one (``controlnet_double.ControlNet``)."""
    convs = [m for m in ldm.input_hint_block if isinstance(m, nn.Conv2d)]
    widths = [c.out_channels for c in convs[:-1]]
    net = ControlNet(hint_channels=convs[0].in_channels, hint_widths=widths, **config_from_ldm(ldm))
    net.load_state_dict(ldm.state_dict(), strict=True)
    return net.eval().requires_grad_(False)
