"""Test double of Mikubill's sd-webui-controlnet, limited to what a token-merging extension touches.

Written from a reading of sd-webui-controlnet at commit 56cec5b2 (2024-07-25, the last 1.1.4xx line that
supports A1111 1.10.1).  No code was copied; line numbers below are approximate and refer to that commit.

Facts verified in the real extension
====================================

Control models and how they are called
--------------------------------------
* A unit's model is loaded as a ``ControlModel`` NamedTuple ``(model, type)``
  (``scripts/controlnet_model_guess.py`` ~116); ``controlnet.py`` unpacks it (~925) and stores ``model`` in
  ``ControlParams.control_model`` (~1034).  So ``param.control_model`` is a WRAPPER nn.Module:
  ``PlugableControlModel`` for ControlNets (``scripts/cldm.py`` ~18), ``PlugableAdapter`` for T2I adapters
  (``scripts/adapter.py`` ~47), ``None`` for reference-only (preprocessor-only units, ``controlnet.py`` ~915).
  The wrapper's ``.control_model`` holds the real network (``cldm.ControlNet`` / ``adapter.Adapter``).
  ``PlugableControlModel.forward(*a, **kw)`` just calls ``self.control_model(*a, **kw)`` (cldm.py ~31), i.e. the
  ControlNet's own ``forward`` via ``nn.Module.__call__`` (module hooks on it fire).
* A cached model is handed out as ``copy(cached.model)`` (shallow copy, controlnet.py ~426): the wrapper object
  differs per generation but ``.control_model`` (the ControlNet module) is the very same object.
* The hook calls the WRAPPER with keyword arguments only:
  ``param.control_model(x=x_in, hint=hint, timesteps=timesteps, context=controlnet_context, y=y,
  control_type=...)`` (``scripts/hook.py`` ~613-628; T2I style adapters ~570 without ``y``/``control_type``).
  ``cldm.ControlNet.forward(self, x, hint, timesteps, context, y=None, control_type=None, **kwargs)``
  (cldm.py ~352) returns a list of 13 residuals for SD1.5 (12 input blocks through ``zero_convs`` + middle block
  through ``middle_block_out``).
* ``cldm.ControlNet`` is built from ``TimestepEmbedSequential``, ``ResBlock``, ``Downsample``,
  ``SpatialTransformer`` imported from **sgm** if importable, else ldm (cldm.py ~8-15).  In A1111 1.10.1 sgm is
  importable, so the control model's transformer blocks are sgm ``BasicTransformerBlock`` s
  (``_forward(x, context=None, additional_tokens=None, n_times_crossframe_attn_in_self=0)``) even for SD1.5
  ControlNets.  This double uses ldm (sgm is not installed here).  It keeps ``attention_resolutions`` (cldm.py
  ~117); the SD1.5 config is ``attention_resolutions=[1, 2, 4]``, ``transformer_depth=[1, 1, 1, 0]``,
  ``channel_mult=[1, 2, 4, 4]`` (controlnet_model_guess.py ~19).  NB the ControlNet uses ds values (1, 2, 4) while
  the ldm UNet config uses (4, 2, 1): same levels.
* Residual application (hook.py ~630-688, ~822-831): scales are ``[weight] * 13`` (soft injection:
  ``weight * 0.825 ** (12 - i)``), summed over units into ``total_controlnet_embedding``; the last one is added to
  ``h`` after the middle block, the others to the SKIP tensors ``hs.pop()`` as they are concatenated in the
  decoder (``aligned_adding`` resizes by nearest if spatial sizes differ).  T2I adapters are instead added to
  ``h`` right after input blocks ``[2, 5, 8, 11]`` (hook.py ~811-816), before ``hs.append``.

Instance-level UNet hooking
---------------------------
* ``UnetHook.hook(model, sd_ldm, control_params, process, batch_option_uint_separate=False,
  batch_option_style_align=False)`` (hook.py ~449): ``model._original_forward = model.forward``,
  ``outer.original_forward = model.forward``, ``model.forward = forward_webui.__get__(model, UNetModel)``
  (~990-992): an INSTANCE attribute on the ldm UNet.  Whatever ``model.forward`` was (a class method or another
  extension's instance wrapper) is saved.
* The hooked forward does NOT call the saved forward for the main pass: it re-implements the UNet loop over
  ``self.input_blocks`` / ``self.middle_block`` / ``self.output_blocks`` / ``self.out`` (~796-835, encoder under
  ``no_grad``), calling each block as ``module(h, emb, context)``.  So a wrapper installed on ``unet.forward``
  BEFORE ControlNet hooks is bypassed for the main pass; only reference-only's extra pass calls the saved
  forward (``outer.original_forward(x=..., timesteps=..., context=...)``, ~787-791).  A wrapper installed AFTER
  (e.g. in ``process_before_every_sampling``) wraps ControlNet's forward.
* ``UnetHook.restore()`` (~1067-1074): ``control_params = None``; ``model.forward = model._original_forward``;
  ``del model._original_forward``.  ``forward`` therefore stays an INSTANCE attribute (the bound original) after
  restore.  restore does NOT undo the transformer-block / group-norm hijacks (see below).
* It also swaps ``process.sample`` (~986-988) to mark cond/uncond contexts with an extra first token
  (±1024, ~36-112) which the hooked forward strips again; and registers an ``on_cfg_denoiser`` callback that sets
  ``param.guidance_stopped`` from the step (~439-447, ~1065).  The double models marking for plain tensors only
  and exposes ``guidance_schedule_handler`` without a callback registry.

Where another script finds the control models, and when
--------------------------------------------------------
* The ControlNet ``Script`` (``scripts/controlnet.py`` ~295; ``title()`` returns ``"ControlNet"`` ~319,
  ``show`` returns ``AlwaysVisible``) is one of ``p.scripts.alwayson_scripts``; ControlNet's own
  ``internal_controlnet/external_code.py`` ``find_cn_script`` (~398-416) matches ``script.title().lower() ==
  "controlnet"``.  Path: ``script.latest_network`` (a ``UnetHook`` or ``None``, set ``None`` in ``__init__``
  ~302) ``.control_params[i].control_model`` (wrapper) ``.control_model`` (the nn.Module).
  ``control_params[i].control_model_type`` is a ``ControlModelType`` enum (``scripts/enums.py`` ~157).
* Populated in ``Script.process`` (``controlnet.py`` ~1226 -> ``controlnet_hack`` -> ``controlnet_main_entry``
  ~853-1202: restores the previous hook, ``clear_all_secondary_control_models(unet)``, builds ``ControlParams``,
  ``self.latest_network = UnetHook(...)`` and ``.hook(...)`` ~1199-1201).  With an SDXL refiner it happens in
  ``before_process_batch`` instead (~1231).  No enabled unit -> ``latest_network = None`` (~873-875).
* A1111 1.10.1 calls all scripts' ``process`` (``modules/processing.py`` ~915) before the batch loop, then
  ``before_process_batch`` (~952), ``process_batch`` (~964), and ``process_before_every_sampling`` just before
  each sampling (~1338 txt2img, ~1446 hires, ~1767 img2img).  So in ``process_before_every_sampling`` (and
  ``before_hr``) the control models are reachable; in another script's ``process`` only if it runs after
  ControlNet's.  The built-in ``apply_token_merging`` (~841) runs before all of these.
* Cleared in ``Script.postprocess`` (~1248-1299): ``clear_all_secondary_control_models(unet)``, then
  ``latest_network.restore()`` and ``latest_network = None``.  If postprocess is skipped (NaN/OOM), the hook
  stays installed until the next generation's ``process``.

Reference-only / reference-adain (attention and group-norm injection)
-------------------------------------------------------------------
* Units whose preprocessor name contains ``reference`` get ``ControlModelType.AttentionInjection`` and
  ``control_model=None`` (controlnet.py ~912-917).  In ``hook`` (hook.py ~998-1063) if any param is
  AttentionInjection: every ldm/sgm ``BasicTransformerBlock`` in the UNet (``torch_dfs`` = recursive children),
  sorted by descending ``norm1.normalized_shape[0]``, gets
  ``module._original_inner_forward_cn_hijack = module._forward`` (ONLY if not already set: the first capture is
  kept forever, the attribute is never deleted), then
  ``module._forward = hacked_basic_transformer_inner_forward.__get__(module, BasicTransformerBlock)`` (an
  INSTANCE attribute, shadowing any class-level ``_forward`` such as tomesd's ``ToMeBlock._forward``),
  ``module.bank = []``, ``module.style_cfgs = []``, ``module.attn_weight = i / n``.  Group-norm (AdaIN) hijack of
  ``middle_block``, ``input_blocks[4, 5, 7, 8, 10, 11]``, ``output_blocks[0..7]`` (SD1.5): instance
  ``forward`` saved in ``original_forward_cn_hijack`` and replaced, with ``mean_bank/var_bank/style_cfgs`` and
  ``gn_weight``.  Both hijacks are installed for reference_only AND reference_adain; the mode only selects which
  bank is written.
* Hacked inner forward (~910-954): ``x_norm1 = self.norm1(x)``; if ``disable_self_attn``:
  ``attn1(x_norm1, context=context)``; else in Write mode append ``x_norm1.detach().clone()`` to ``self.bank`` if
  ``outer.attention_auto_machine_weight > self.attn_weight``; in Read mode with a non-empty bank
  ``attn1(x_norm1, context=torch.cat([x_norm1] + self.bank, dim=1))`` blended with plain self-attention for
  the uncond rows by ``style_cfg``, then the banks are emptied; otherwise ``attn1(x_norm1, context=x_norm1)``
  (context passed explicitly).  Then ``x = attn1_out + x; x = attn2(norm2(x), context) + x;
  x = ff(norm3(x)) + x``.  The block's class ``forward`` still calls ``checkpoint(self._forward, ...)``, which
  finds the instance attribute.
* Per UNet call (~725-794): banks cleared; for each AttentionInjection param: ``ref_xt = q_sample(latent of the
  reference image, round(t), noise=randn_like)`` (global RNG!), style fidelity = ``threshold_a`` clipped to
  [0, 1] (1 with cfg_injection, 0 with soft injection / hires); machines set to Write; the SAVED original UNet
  forward is run on ``ref_xt``; machines back to Read; then the main pass reads the banks.
* Undo: NOT in ``UnetHook.restore``.  It happens in the next ``hook`` without attention injection (~1054-1063),
  and in ``controlnet.py`` ``clear_all_secondary_control_models(unet)`` (~61-72), called at the start of every
  ``controlnet_main_entry`` and in ``postprocess``: for every module with a saved
  ``_original_inner_forward_cn_hijack`` / ``original_forward_cn_hijack``, ``module._forward = saved`` /
  ``module.forward = saved``.  The saved attributes are not deleted, and ``_forward`` / ``forward`` remain
  instance attributes (bound methods captured at the first hijack).  Consequence (reproduced by this double,
  see tests/test_controlnet_double.py): if tomesd was applied when reference-only first ran, the captured
  ``_forward`` is ``ToMeBlock._forward`` bound to the block, and it keeps merging tokens after
  ``tomesd.remove_patch`` resets the class, for every later generation of that UNet.

ControlLLLite
-------------
* A Controlllite unit (``ControlModelType.Controlllite``, loaded afresh, not copied: controlnet.py ~416-420) holds
  the LLLite model itself as ``control_model`` (``PlugableControlLLLite``, no ControlNet: no transformer blocks);
  ``controlnet_main_entry`` calls its ``hook(model=unet, cond=hint, weight, start, end)`` (~1180), which wraps the
  UNet's projections; ``clear_all_secondary_control_models`` ends with ``clear_all_lllite()`` (~72).  The model is
  ``tests/neighbours/controlnet_lllite.py``'s double (used here when that module is loaded).

Not modelled: SDXL paths (revision, label_emb, 10 residuals), inpaint 9-channel hijack, colorfix / inpaint_only
post-processing, lowvram/medvram moves, control LoRA, IP-Adapter, union/InstantID, batch options
beyond what ``hook`` needs, VAE encoding (replaced by a deterministic stand-in, see ``UnetHook.encode_hint``).

API summary
===========
``make_control_net(...)`` (``PlugableControlModel`` around a tiny ``ControlNet``, for the SD1.5-layout UNet of
``benchmarks.lab.models.make_unet``), ``make_adapter(...)`` (``PlugableAdapter`` around a tiny
``Adapter``), ``FakeSDModel(unet)`` (``p.sd_model``-like), ``ControlParams``, ``UnetHook``,
``clear_all_secondary_control_models``, ``reference_params`` / ``enable_reference_only`` /
``disable_reference_only``, ``ControlNetUnit``, ``ControlNetScript``, ``find_cn_script``, ``mark_context``.
"""

from __future__ import annotations

import copy
import enum
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from ldm.modules.attention import BasicTransformerBlock, SpatialTransformer
from ldm.modules.diffusionmodules.openaimodel import (
    Downsample,
    ResBlock,
    TimestepEmbedSequential,
    UNetModel,
)
from ldm.modules.diffusionmodules.util import (
    conv_nd,
    linear,
    timestep_embedding,
    zero_module,
)
from torch import nn

__all__ = [
    "AutoMachine",
    "ControlModelType",
    "ControlNet",
    "ControlNetScript",
    "ControlNetUnit",
    "ControlParams",
    "FakeSDModel",
    "HiResFixOption",
    "PlugableAdapter",
    "PlugableControlModel",
    "T2IAdapter",
    "UnetHook",
    "clear_all_secondary_control_models",
    "disable_reference_only",
    "enable_reference_only",
    "find_cn_script",
    "make_adapter",
    "make_control_net",
    "mark_context",
    "reference_params",
    "reinit_zero_layers",
    "torch_dfs",
]


# --------------------------------------------------------------------------------------------------------------
# Enums (scripts/enums.py ~157-230)
# --------------------------------------------------------------------------------------------------------------


class ControlModelType(enum.Enum):
    """Subset of the real enum (enums.py ~157); values are the real strings."""

    ControlNet = "ControlNet, Lvmin Zhang"
    T2I_Adapter = "T2I_Adapter, Chong Mou"
    AttentionInjection = "AttentionInjection, Lvmin Zhang"
    ControlLoRA = "ControlLoRA, Wu Hecong"
    Controlllite = "Controlllite, Kohya"

    @property
    def is_controlnet(self) -> bool:
        # enums.py ~180: ControlNet, ControlLoRA, InstantID, ControlNetUnion
        return self in (ControlModelType.ControlNet, ControlModelType.ControlLoRA)

    @property
    def allow_context_sharing(self) -> bool:
        # enums.py ~190: everything except IPAdapter / Controlllite (not modelled)
        return True


class AutoMachine(enum.Enum):
    """Attention / AdaIN bank state machine (enums.py ~215)."""

    Read = "Read"
    Write = "Write"
    StyleAlign = "StyleAlign"


class HiResFixOption(enum.Enum):
    BOTH = "Both"
    LOW_RES_ONLY = "Low res only"
    HIGH_RES_ONLY = "High res only"


# --------------------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------------------


def torch_dfs(model: nn.Module) -> list[nn.Module]:
    """Pre-order list of a module and all its descendants via ``children()`` (hook.py ~268)."""
    out = [model]
    for child in model.children():
        out.extend(torch_dfs(child))
    return out


@torch.no_grad()
def reinit_zero_layers(module: nn.Module, *, seed: int = 0, scale: float = 1.0) -> int:
    """Give every all-zero Conv/Linear (``zero_module`` outputs, zero convs) small random weights.

    Uses the layer's default ``reset_parameters`` scaled by ``scale``, under a forked, seeded RNG so it is
    deterministic and leaves the global RNG alone.  Returns the number of layers changed.
    """
    changed = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for m in module.modules():
            if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)) and not m.weight.any():
                m.reset_parameters()
                m.weight.mul_(scale)
                if m.bias is not None:
                    m.bias.mul_(scale)
                changed += 1
    return changed


def _resizing_cat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``th.cat([a, b], dim=1)`` of the hook's TorchHijackForUnet (hook.py ~133-159): resize ``a`` to ``b``."""
    if a.shape[-2:] != b.shape[-2:]:
        a = F.interpolate(a, size=b.shape[-2:], mode="nearest")
    return torch.cat([a, b], dim=1)


def _aligned_add(base: torch.Tensor, x: Any, channel_align: bool = False) -> torch.Tensor:
    """Behaviour of ``aligned_adding`` (hook.py ~245-265)."""
    if isinstance(x, float):
        return base if x == 0.0 else base + x
    if channel_align:
        padded = torch.zeros_like(base)
        padded[:, : x.shape[1]] = x
        x = padded
    if (x.shape[-2] > 1 or x.shape[-1] > 1) and x.shape[-2:] != base.shape[-2:]:
        x = F.interpolate(x, size=base.shape[-2:], mode="nearest")
    return base + x


# Cond/uncond marking (hook.py ~36-112).  The real code marks WebUI conditioning objects in ``process.sample``;
# here a batched context tensor (B, T, D) gets an extra first token filled with +-1024.
_MARK = 1024.0
_MARK_EPS = 1e-3


def mark_context(context: torch.Tensor, positive: bool) -> torch.Tensor:
    """Prepend the marker token the real ``mark_prompt_context`` adds (``+1024`` cond, ``-1024`` uncond)."""
    mark = torch.full_like(context[:, :1, :], _MARK if positive else -_MARK)
    return torch.cat([mark, context], dim=1)


def _context_is_marked(context: torch.Tensor) -> bool:
    first = context[..., 0, :]
    return float((first.abs() - _MARK).abs().mean()) < _MARK_EPS


def _unmark_context(context: torch.Tensor):
    """Return ``(cond_mark (B,1,1,1), uc_indices, c_indices, context_without_marker)`` (hook.py ~81-112)."""
    if not _context_is_marked(context):
        ones = torch.ones(context.shape[0], 1, 1, 1, dtype=context.dtype, device=context.device)
        return ones, [], [], context
    is_cond = ((context[:, 0, :] + _MARK).abs().mean(dim=1) > _MARK_EPS).to(context.dtype)
    flags = is_cond.tolist()
    uc = [i for i, f in enumerate(flags) if f < 0.5]
    c = [i for i, f in enumerate(flags) if f >= 0.5]
    return is_cond[:, None, None, None], uc, c, context[:, 1:, :]


class FakeSDModel(nn.Module):
    """Stand-in for ``p.sd_model`` (an ldm ``LatentDiffusion`` nn.Module): ``.model.diffusion_model`` is the UNet
    (so ``tomesd.apply_patch(sd_model)`` works on it), with the SD1.5 schedule buffers the hook's
    ``predict_q_sample`` reads (hook.py ~338)."""

    def __init__(self, unet: UNetModel, *, sd_model_hash: str = "tiny", timesteps: int = 1000):
        super().__init__()
        self.model = nn.Module()
        self.model.diffusion_model = unet
        self.sd_model_hash = sd_model_hash
        self.is_sdxl = False
        alphas_cumprod = _sd15_alphas_cumprod(timesteps)
        self.register_buffer("alphas_cumprod", alphas_cumprod.float(), persistent=False)
        self.register_buffer("sqrt_alphas_cumprod", alphas_cumprod.sqrt().float(), persistent=False)
        self.register_buffer("sqrt_one_minus_alphas_cumprod", (1.0 - alphas_cumprod).sqrt().float(), persistent=False)


def _sd15_alphas_cumprod(timesteps: int = 1000) -> torch.Tensor:
    # SD1.5 "scaled linear" schedule: linear_start 0.00085, linear_end 0.012 (hook.py ~315-335)
    betas = torch.linspace(0.00085**0.5, 0.0120**0.5, timesteps, dtype=torch.float64) ** 2
    return torch.cumprod(1.0 - betas, dim=0)


def _q_sample(sd_ldm: Any, x0: torch.Tensor, t: torch.Tensor, noise: torch.Tensor | None = None):
    """``predict_q_sample`` (hook.py ~338): noise defaults to ``randn_like`` (global RNG)."""
    if noise is None:
        noise = torch.randn_like(x0)
    if hasattr(sd_ldm, "sqrt_alphas_cumprod"):
        a, b = sd_ldm.sqrt_alphas_cumprod, sd_ldm.sqrt_one_minus_alphas_cumprod
    else:
        ac = getattr(sd_ldm, "alphas_cumprod", None)
        ac = _sd15_alphas_cumprod() if ac is None else ac
        a, b = ac.sqrt(), (1.0 - ac).sqrt()
    shape = (-1,) + (1,) * (x0.dim() - 1)
    return a.to(x0)[t].reshape(shape) * x0 + b.to(x0)[t].reshape(shape) * noise


# --------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------


class ControlNet(nn.Module):
    """Shape of ``cldm.ControlNet`` (cldm.py ~63-400), SD1.5 branch only, built from real ldm blocks.

    Attributes mirror the real one: ``time_embed``, ``input_hint_block``, ``input_blocks``, ``zero_convs``,
    ``middle_block``, ``middle_block_out``, ``attention_resolutions``, ``model_channels``, ``num_res_blocks``,
    ``global_average_pooling``, ``dtype``.  ``hint_widths`` shrinks the hint encoder (real: 16,16,32,32,96,96,256).
    """

    def __init__(
        self,
        in_channels: int = 4,
        model_channels: int = 32,
        hint_channels: int = 3,
        num_res_blocks: int = 2,
        attention_resolutions: Sequence[int] = (1, 2, 4),
        channel_mult: Sequence[int] = (1, 2, 4, 4),
        num_heads: int = 8,
        transformer_depth: Sequence[int] = (1, 1, 1, 0),
        context_dim: int = 32,
        use_checkpoint: bool = False,
        hint_widths: Sequence[int] = (8, 8, 16, 16, 32, 32, 64),
        global_average_pooling: bool = False,
        dims: int = 2,
    ):
        super().__init__()
        self.dims = dims
        self.in_channels = in_channels
        self.model_channels = model_channels
        self.num_res_blocks = [num_res_blocks] * len(channel_mult)
        self.attention_resolutions = list(attention_resolutions)
        self.channel_mult = list(channel_mult)
        self.global_average_pooling = global_average_pooling
        self.num_classes = None
        self.dtype = torch.float32  # real: fp16 when the UNet is fp16 (cldm.py ~123)

        emb_dim = model_channels * 4
        self.time_embed = nn.Sequential(linear(model_channels, emb_dim), nn.SiLU(), linear(emb_dim, emb_dim))

        # Hint encoder: 8 convs with SiLU, three stride-2 (8x down), last one zero-initialised (cldm.py ~163-179)
        w = list(hint_widths)
        strides = (1, 1, 2, 1, 2, 1, 2)
        layers: list[nn.Module] = []
        cin = hint_channels
        for cout, s in zip(w, strides):
            layers += [conv_nd(dims, cin, cout, 3, padding=1, stride=s), nn.SiLU()]
            cin = cout
        layers.append(zero_module(conv_nd(dims, cin, model_channels, 3, padding=1)))
        self.input_hint_block = TimestepEmbedSequential(*layers)

        self.input_blocks = nn.ModuleList(
            [TimestepEmbedSequential(conv_nd(dims, in_channels, model_channels, 3, padding=1))]
        )
        self.zero_convs = nn.ModuleList([self._zero_conv(model_channels)])
        ch, ds = model_channels, 1
        for level, mult in enumerate(channel_mult):
            for _ in range(self.num_res_blocks[level]):
                blk: list[nn.Module] = [
                    ResBlock(
                        ch, emb_dim, 0.0, out_channels=mult * model_channels, dims=dims, use_checkpoint=use_checkpoint
                    )
                ]
                ch = mult * model_channels
                if ds in self.attention_resolutions and transformer_depth[level] > 0:
                    blk.append(
                        SpatialTransformer(
                            ch,
                            num_heads,
                            ch // num_heads,
                            depth=transformer_depth[level],
                            context_dim=context_dim,
                            use_checkpoint=use_checkpoint,
                        )
                    )
                self.input_blocks.append(TimestepEmbedSequential(*blk))
                self.zero_convs.append(self._zero_conv(ch))
            if level != len(channel_mult) - 1:
                self.input_blocks.append(TimestepEmbedSequential(Downsample(ch, True, dims=dims, out_channels=ch)))
                self.zero_convs.append(self._zero_conv(ch))
                ds *= 2

        # Middle block: ResBlock, SpatialTransformer, ResBlock (cldm.py ~259-281)
        self.middle_block = TimestepEmbedSequential(
            ResBlock(ch, emb_dim, 0.0, dims=dims, use_checkpoint=use_checkpoint),
            SpatialTransformer(
                ch, num_heads, ch // num_heads, depth=1, context_dim=context_dim, use_checkpoint=use_checkpoint
            ),
            ResBlock(ch, emb_dim, 0.0, dims=dims, use_checkpoint=use_checkpoint),
        )
        self.middle_block_out = self._zero_conv(ch)

    def _zero_conv(self, channels: int) -> TimestepEmbedSequential:
        # cldm.py ~349: 1x1 zero conv wrapped in TimestepEmbedSequential
        return TimestepEmbedSequential(zero_module(conv_nd(self.dims, channels, channels, 1, padding=0)))

    def forward(self, x, hint, timesteps, context, y=None, control_type=None, **kwargs) -> list[torch.Tensor]:
        """Returns 13 residuals: one per input block (through its zero conv) + the middle block (cldm.py ~352)."""
        out_dtype = x.dtype
        x, hint = x.to(self.dtype), hint.to(self.dtype)
        timesteps, context = timesteps.to(self.dtype), context.to(self.dtype)
        emb = self.time_embed(timestep_embedding(timesteps, self.model_channels, repeat_only=False).to(self.dtype))
        guided_hint = self.input_hint_block(hint, emb, context)
        residuals = []
        h = x
        for i, (block, zero_conv) in enumerate(zip(self.input_blocks, self.zero_convs)):
            h = block(h, emb, context)
            if i == 0:  # hint features join after the first conv only
                h = h + guided_hint
            residuals.append(zero_conv(h, emb, context))
        h = self.middle_block(h, emb, context)
        residuals.append(self.middle_block_out(h, emb, context))
        return [r.to(out_dtype) for r in residuals]


class PlugableControlModel(nn.Module):
    """Wrapper held in ``ControlParams.control_model`` (cldm.py ~18-60); ``.control_model`` is the ControlNet."""

    def __init__(self, control_model: ControlNet):
        super().__init__()
        self.control_model = control_model
        self.is_control_lora = False

    def reset(self):
        pass

    def forward(self, *args, **kwargs):
        return self.control_model(*args, **kwargs)

    def fullvram(self):
        return None


class _AdapterResBlock(nn.Module):
    """``adapter.ResnetBlock`` (adapter.py ~135) with sk=True, optional 2x downsample first."""

    def __init__(self, cin: int, cout: int, down: bool):
        super().__init__()
        self.down = down
        if down:
            self.down_opt = nn.Conv2d(cin, cin, 3, stride=2, padding=1)
        self.in_conv = nn.Conv2d(cin, cout, 3, padding=1) if cin != cout else None
        self.block1 = nn.Conv2d(cout, cout, 3, padding=1)
        self.act = nn.ReLU()
        self.block2 = nn.Conv2d(cout, cout, 3, padding=1)

    def forward(self, x):
        if self.down:
            x = self.down_opt(x)
        if self.in_conv is not None:
            x = self.in_conv(x)
        return self.block2(self.act(self.block1(x))) + x


class T2IAdapter(nn.Module):
    """T2I-Adapter (adapter.py ~171-240), SD1.5 variant: pixel-unshuffle by 8, four levels, downsampling at levels
    1-3; no transformer blocks, no timestep/context inputs.  Returns 4 feature maps at latent /1, /2, /4, /8."""

    def __init__(self, hint_channels: int = 3, channels: Sequence[int] = (32, 64, 128, 128), nums_rb: int = 2):
        super().__init__()
        self.channels = list(channels)
        self.nums_rb = nums_rb
        self.unshuffle = nn.PixelUnshuffle(8)
        self.conv_in = nn.Conv2d(hint_channels * 64, channels[0], 3, padding=1)
        body = []
        for i, c in enumerate(channels):
            for r in range(nums_rb):
                first = r == 0 and i > 0
                body.append(_AdapterResBlock(channels[i - 1] if first else c, c, down=first))
        self.body = nn.ModuleList(body)

    def forward(self, x):
        x = self.conv_in(self.unshuffle(x))
        feats = []
        for i in range(len(self.channels)):
            for r in range(self.nums_rb):
                x = self.body[i * self.nums_rb + r](x)
            feats.append(x)
        return feats


class PlugableAdapter(nn.Module):
    """Wrapper of a T2I adapter (adapter.py ~47-78): ``forward(hint=None, x=None, *args, **kwargs)`` computes the
    features once (cached in ``self.control`` until ``reset()``) and returns a deep copy each call."""

    def __init__(self, control_model: T2IAdapter):
        super().__init__()
        self.control_model = control_model
        self.control = None
        self.hint_cond = None

    def reset(self):
        self.control = None
        self.hint_cond = None

    def forward(self, hint=None, x=None, *args, **kwargs):
        if self.control is None:
            self.hint_cond = hint
            self.control = self.control_model(hint)
        return copy.deepcopy(self.control)

    def fullvram(self):
        return None


def make_control_net(
    *, context_dim: int = 32, model_channels: int = 32, seed: int = 100, zero_scale: float = 0.5, **kwargs
) -> PlugableControlModel:
    """A ``PlugableControlModel`` around a tiny ``ControlNet`` matching ``models.make_unet("sd15", context_dim=32)``
    (same ``context_dim`` and ``model_channels``).  Zero convs / zero_module layers re-initialised with ``zero_scale``.  Hint: 3 x (8H) x (8W)
    for a latent of H x W."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = ControlNet(context_dim=context_dim, model_channels=model_channels, **kwargs)
    reinit_zero_layers(net, seed=seed + 1, scale=zero_scale)
    return PlugableControlModel(net.eval()).eval()


def make_adapter(*, model_channels: int = 32, hint_channels: int = 3, seed: int = 200) -> PlugableAdapter:
    """A ``PlugableAdapter`` around a tiny ``T2IAdapter`` whose levels match the input blocks of
    ``models.make_unet("sd15")``: 2, 5, 8, 11 (channels m, 2m, 4m, 4m)."""
    m = model_channels
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = T2IAdapter(hint_channels=hint_channels, channels=(m, 2 * m, 4 * m, 4 * m))
    return PlugableAdapter(net.eval()).eval()


# --------------------------------------------------------------------------------------------------------------
# ControlParams and UnetHook (scripts/hook.py)
# --------------------------------------------------------------------------------------------------------------


class ControlParams:
    """Per-unit state read by the hook; attribute names as in hook.py ~162-243.

    ``preprocessor`` is a dict with ``name``, ``threshold_a``, ``threshold_b`` (controlnet.py ~1017).
    """

    def __init__(
        self,
        control_model: nn.Module | None,
        preprocessor: dict | None = None,
        hint_cond: torch.Tensor | None = None,
        weight: float = 1.0,
        guidance_stopped: bool = False,
        start_guidance_percent: float = 0.0,
        stop_guidance_percent: float = 1.0,
        advanced_weighting: list[float] | None = None,
        control_model_type: ControlModelType = ControlModelType.ControlNet,
        hr_hint_cond: torch.Tensor | None = None,
        global_average_pooling: bool = False,
        soft_injection: bool = False,
        cfg_injection: bool = False,
        hr_option: HiResFixOption = HiResFixOption.BOTH,
        control_context_override: Any = None,
        effective_region_mask: torch.Tensor | None = None,
        union_control_types: list | None = None,
        **kwargs,
    ):
        self.control_model = control_model
        self.preprocessor = preprocessor or {"name": "none", "threshold_a": 0.5, "threshold_b": 0.5}
        self._hint_cond = hint_cond
        self.weight = weight
        self.guidance_stopped = guidance_stopped
        self.start_guidance_percent = start_guidance_percent
        self.stop_guidance_percent = stop_guidance_percent
        self.advanced_weighting = advanced_weighting
        self.control_model_type = control_model_type
        self.global_average_pooling = global_average_pooling
        self.hr_hint_cond = hr_hint_cond
        self.hr_option = hr_option
        self.control_context_override = control_context_override
        self.effective_region_mask = effective_region_mask
        self.union_control_types = union_control_types or []
        self.used_hint_cond = None
        self.used_hint_cond_latent = None
        self.used_hint_inpaint_hijack = None
        self.soft_injection = soft_injection
        self.cfg_injection = cfg_injection
        self.vision_hint_count = None

    @property
    def hint_cond(self):
        return self._hint_cond

    @hint_cond.setter
    def hint_cond(self, value):
        # hook.py ~214: changing the hint invalidates the derived tensors
        self._hint_cond = value
        self.used_hint_cond = None
        self.used_hint_cond_latent = None
        self.used_hint_inpaint_hijack = None

    def disabled_by_hr_option(self, is_in_high_res_fix: bool) -> bool:
        if self.hr_option == HiResFixOption.LOW_RES_ONLY:
            return is_in_high_res_fix
        if self.hr_option == HiResFixOption.HIGH_RES_ONLY:
            return not is_in_high_res_fix
        return False

    def apply_effective_region_mask(self, out: torch.Tensor) -> torch.Tensor:
        if self.effective_region_mask is None:
            return out
        mask = F.interpolate(self.effective_region_mask.to(out.device), size=out.shape[-2:], mode="bilinear")
        return out * mask


# input_blocks / output_blocks whose forward gets the AdaIN hijack, SD1.5 (hook.py ~1030-1031)
_GN_INPUT_BLOCKS = (4, 5, 7, 8, 10, 11)
_GN_OUTPUT_BLOCKS = (0, 1, 2, 3, 4, 5, 6, 7)
# input blocks after which T2I adapter features are added, SD1.5 (hook.py ~811)
_T2I_INJECTION = (2, 5, 8, 11)


class UnetHook(nn.Module):
    """``scripts/hook.py`` ``UnetHook`` (~377-1074), SD1.5 paths."""

    def __init__(self, lowvram: bool = False) -> None:
        super().__init__()
        self.lowvram = lowvram
        self.model = None
        self.sd_ldm = None
        self.control_params = None
        self.attention_auto_machine = AutoMachine.Read
        self.attention_auto_machine_weight = 1.0
        self.gn_auto_machine = AutoMachine.Read
        self.gn_auto_machine_weight = 1.0
        self.current_style_fidelity = 0.0
        self.current_uc_indices: list[int] = []
        self.current_c_indices: list[int] = []
        self.is_in_high_res_fix = False
        self.attn_module_list: list[nn.Module] = []
        self.gn_module_list: list[nn.Module] = []
        self.original_forward = None
        # Double only: counts calls of the hooked UNet forward
        self.forward_calls = 0

    @staticmethod
    def encode_hint(process: Any, x: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        """Stand-in for ``call_vae_using_process`` (hook.py ~394): uses ``process.sd_model.encode_first_stage`` /
        ``get_first_stage_encoding`` when present, else a deterministic 8x average-pool of ``x*2-1`` padded to 4
        channels."""
        x = x[:, :3] * 2.0 - 1.0
        sd = getattr(process, "sd_model", None)
        if sd is not None and hasattr(sd, "encode_first_stage") and hasattr(sd, "get_first_stage_encoding"):
            latent = sd.get_first_stage_encoding(sd.encode_first_stage(x))
        else:
            pooled = F.avg_pool2d(x, 8)
            latent = torch.cat([pooled, pooled.mean(dim=1, keepdim=True)], dim=1)
        if batch_size is not None and latent.shape[0] != batch_size:
            latent = latent.repeat(batch_size // latent.shape[0], 1, 1, 1)
        return latent

    def guidance_schedule_handler(self, x: Any) -> None:
        """``on_cfg_denoiser`` callback (hook.py ~439): ``x.sampling_step`` / ``x.total_sampling_steps``."""
        if not self.control_params:
            return
        pct = x.sampling_step / x.total_sampling_steps
        for param in self.control_params:
            param.guidance_stopped = pct < param.start_guidance_percent or pct > param.stop_guidance_percent
        if self.model is not None:
            self.model.current_sampling_percent = pct

    # ----------------------------------------------------------------------------------------------------------
    def hook(
        self,
        model: UNetModel,
        sd_ldm: Any = None,
        control_params: list[ControlParams] | None = None,
        process: Any = None,
        batch_option_uint_separate: bool = False,
        batch_option_style_align: bool = False,
    ) -> None:
        self.model = model
        self.sd_ldm = sd_ldm
        self.control_params = list(control_params or [])
        outer = self

        # ---- the replacement UNet forward (hook.py ~472-890) ----
        def forward(self, x, timesteps=None, context=None, y=None, **kwargs):
            outer.forward_calls += 1
            total_cn: list[Any] = [0.0] * 13
            total_t2i: list[Any] = [0.0] * 4
            batch_size = int(x.shape[0])

            cond_mark, outer.current_uc_indices, outer.current_c_indices, context = _unmark_context(context)
            outer.model.cond_mark = cond_mark

            # which hint (low-res / hires) to use (hook.py ~509-537)
            in_hr = False
            for param in outer.control_params:
                if param.used_hint_cond is None:
                    param.used_hint_cond = param.hint_cond
                    param.used_hint_cond_latent = None
                hr = param.hr_hint_cond
                if isinstance(hr, torch.Tensor) and x.ndim == 4 and hr.ndim == 4 and param.hint_cond.ndim == 4:
                    pixel_h = x.shape[2] * 8
                    in_hr = abs(pixel_h - param.hint_cond.shape[2]) >= abs(pixel_h - hr.shape[2])
                    wanted = hr if in_hr else param.hint_cond
                    if param.used_hint_cond is not wanted:
                        param.used_hint_cond = wanted
                        param.used_hint_cond_latent = None
            self.is_in_high_res_fix = in_hr
            outer.is_in_high_res_fix = in_hr

            # reference images need a latent (hook.py ~539-547)
            for param in outer.control_params:
                if (
                    param.used_hint_cond_latent is None
                    and param.control_model_type == ControlModelType.AttentionInjection
                ):
                    param.used_hint_cond_latent = outer.encode_hint(process, param.used_hint_cond, batch_size)

            # ControlNet / T2I adapter residuals (hook.py ~576-688)
            for index, param in enumerate(outer.control_params):
                if param.guidance_stopped or param.disabled_by_hr_option(outer.is_in_high_res_fix):
                    continue
                kind = param.control_model_type
                if not (kind.is_controlnet or kind == ControlModelType.T2I_Adapter):
                    continue
                hint = param.used_hint_cond
                assert hint is not None, "Controlnet is enabled but no input image is given"
                if hint.shape[1] == 4:  # inpaint protocol (hook.py ~607)
                    masked = (hint[:, 3:4] > 0.5).to(hint.dtype)
                    hint = hint[:, :3] * (1 - masked) - masked
                control = param.control_model(
                    x=x, hint=hint, timesteps=timesteps, context=context, y=y, control_type=None
                )
                n = 13 if kind.is_controlnet else 4
                scales = [param.weight] * n
                if param.cfg_injection or param.global_average_pooling:
                    if kind == ControlModelType.T2I_Adapter:
                        control = [torch.cat([c] * batch_size, dim=0) for c in control]
                    control = [c * cond_mark for c in control]
                soft = param.soft_injection
                if in_hr and any(k in param.preprocessor["name"] for k in ("canny", "mlsd")):
                    soft = True
                if soft:
                    if kind == ControlModelType.T2I_Adapter:
                        scales = [param.weight * s for s in (0.25, 0.62, 0.825, 1.0)]
                    else:
                        scales = [param.weight * 0.825 ** float(12 - i) for i in range(13)]
                if param.advanced_weighting is not None:
                    scales = param.advanced_weighting
                control = [param.apply_effective_region_mask(c * s) for c, s in zip(control, scales)]
                if param.global_average_pooling:
                    control = [c.mean(dim=(2, 3), keepdim=True) for c in control]
                target = total_cn if kind.is_controlnet else total_t2i
                for i, item in enumerate(control):
                    if batch_option_uint_separate:
                        for rows in (outer.current_c_indices, outer.current_uc_indices):
                            for k, row in enumerate(rows):
                                if k % len(outer.control_params) != index:
                                    item[row] = 0
                    target[i] = item + target[i]

            # empty the banks (hook.py ~725-732)
            for m in outer.attn_module_list:
                m.bank, m.style_cfgs = [], []
            for m in outer.gn_module_list:
                m.mean_bank, m.var_bank, m.style_cfgs = [], [], []

            # reference pass: write banks with the ORIGINAL forward (hook.py ~734-794)
            for param in outer.control_params:
                if param.guidance_stopped or param.disabled_by_hr_option(outer.is_in_high_res_fix):
                    continue
                if (
                    param.used_hint_cond_latent is None
                    or param.control_model_type != ControlModelType.AttentionInjection
                ):
                    continue
                ref_xt = _q_sample(outer.sd_ldm, param.used_hint_cond_latent, torch.round(timesteps.float()).long())
                fidelity = min(1.0, max(0.0, float(param.preprocessor["threshold_a"])))
                if param.cfg_injection:
                    fidelity = 1.0
                elif param.soft_injection or in_hr:
                    fidelity = 0.0
                outer.current_style_fidelity = fidelity
                name = param.preprocessor["name"]
                if name in ("reference_only", "reference_adain+attn"):
                    outer.attention_auto_machine = AutoMachine.Write
                    outer.attention_auto_machine_weight = param.weight
                if name in ("reference_adain", "reference_adain+attn"):
                    outer.gn_auto_machine = AutoMachine.Write
                    outer.gn_auto_machine_weight = param.weight
                outer.original_forward(x=ref_xt.to(x.dtype), timesteps=timesteps, context=context)
                outer.attention_auto_machine = AutoMachine.Read
                outer.gn_auto_machine = AutoMachine.Read

            # the UNet itself, re-implemented (hook.py ~796-835)
            hs = []
            with torch.no_grad():
                emb = self.time_embed(timestep_embedding(timesteps, self.model_channels, repeat_only=False))
                h = x
                for i, block in enumerate(self.input_blocks):
                    self.current_h_shape = tuple(h.shape)
                    h = block(h, emb, context)
                    if i in _T2I_INJECTION:
                        h = _aligned_add(h, total_t2i.pop(0))
                    hs.append(h)
                self.current_h_shape = tuple(h.shape)
                h = self.middle_block(h, emb, context)
            h = _aligned_add(h, total_cn.pop())
            for block in self.output_blocks:
                self.current_h_shape = tuple(h.shape)
                h = _resizing_cat(h, _aligned_add(hs.pop(), total_cn.pop()))
                h = block(h, emb, context)
            return self.out(h.type(x.dtype))

        def forward_webui(*args, **kwargs):
            # hook.py ~897: lowvram bookkeeping around ``forward`` (not modelled)
            return forward(*args, **kwargs)

        # ---- reference-only: hacked BasicTransformerBlock._forward (hook.py ~910-954) ----
        def hacked_basic_transformer_inner_forward(self, x, context=None):
            x_norm1 = self.norm1(x)
            attn_out = None
            if self.disable_self_attn:
                attn_out = self.attn1(x_norm1, context=context)
            else:
                self_ctx = x_norm1
                if (
                    outer.attention_auto_machine == AutoMachine.Write
                    and outer.attention_auto_machine_weight > self.attn_weight
                ):
                    self.bank.append(self_ctx.detach().clone())
                    self.style_cfgs.append(outer.current_style_fidelity)
                if outer.attention_auto_machine == AutoMachine.Read:
                    if self.bank:
                        style_cfg = sum(self.style_cfgs) / float(len(self.style_cfgs))
                        with_bank = self.attn1(x_norm1, context=torch.cat([self_ctx, *self.bank], dim=1))
                        plain_uc = with_bank.clone()
                        uc = outer.current_uc_indices
                        if uc and style_cfg > 1e-5:
                            plain_uc[uc] = self.attn1(x_norm1[uc], context=self_ctx[uc])
                        attn_out = style_cfg * plain_uc + (1.0 - style_cfg) * with_bank
                    self.bank, self.style_cfgs = [], []
                if outer.attention_auto_machine == AutoMachine.StyleAlign and not outer.is_in_high_res_fix:

                    def shared(rows):
                        b, n, c = rows.shape
                        return self.attn1(rows.reshape(1, b * n, c)).reshape(b, n, c)

                    uc_out = shared(x_norm1[outer.current_uc_indices])
                    c_out = shared(x_norm1[outer.current_c_indices])
                    attn_out = torch.zeros_like(x_norm1).to(uc_out)
                    attn_out[outer.current_uc_indices] = uc_out
                    attn_out[outer.current_c_indices] = c_out
                if attn_out is None:
                    attn_out = self.attn1(x_norm1, context=self_ctx)
            x = attn_out.to(x.dtype) + x
            x = self.attn2(self.norm2(x), context=context) + x
            x = self.ff(self.norm3(x)) + x
            return x

        # ---- reference-adain: hacked TimestepEmbedSequential.forward (hook.py ~956-984) ----
        def hacked_group_norm_forward(self, *args, **kwargs):
            eps = 1e-6
            x = self.original_forward_cn_hijack(*args, **kwargs)
            y = None
            if outer.gn_auto_machine == AutoMachine.Write and outer.gn_auto_machine_weight > self.gn_weight:
                var, mean = torch.var_mean(x, dim=(2, 3), keepdim=True, correction=0)
                self.mean_bank.append(mean)
                self.var_bank.append(var)
                self.style_cfgs.append(outer.current_style_fidelity)
            if outer.gn_auto_machine == AutoMachine.Read:
                if self.mean_bank and self.var_bank:
                    style_cfg = sum(self.style_cfgs) / float(len(self.style_cfgs))
                    var, mean = torch.var_mean(x, dim=(2, 3), keepdim=True, correction=0)
                    std = torch.clamp(var, min=eps) ** 0.5
                    mean_acc = sum(self.mean_bank) / float(len(self.mean_bank))
                    std_acc = torch.clamp(sum(self.var_bank) / float(len(self.var_bank)), min=eps) ** 0.5
                    y_uc = (x - mean) / std * std_acc + mean_acc
                    y_c = y_uc.clone()
                    if outer.current_uc_indices and style_cfg > 1e-5:
                        y_c[outer.current_uc_indices] = x.to(y_c.dtype)[outer.current_uc_indices]
                    y = style_cfg * y_c + (1.0 - style_cfg) * y_uc
                self.mean_bank, self.var_bank, self.style_cfgs = [], [], []
            return (x if y is None else y).to(x.dtype)

        # ---- install (hook.py ~990-1063) ----
        model._original_forward = model.forward
        outer.original_forward = model.forward
        model.forward = forward_webui.__get__(model, UNetModel)

        need_attention_hijack = any(
            p.control_model_type == ControlModelType.AttentionInjection for p in self.control_params
        )
        if batch_option_style_align:
            need_attention_hijack = True
            outer.attention_auto_machine = AutoMachine.StyleAlign
            outer.gn_auto_machine = AutoMachine.StyleAlign

        all_modules = torch_dfs(model)
        if need_attention_hijack:
            blocks = [m for m in all_modules if isinstance(m, BasicTransformerBlock)]
            blocks.sort(key=lambda m: -m.norm1.normalized_shape[0])
            for i, block in enumerate(blocks):
                if getattr(block, "_original_inner_forward_cn_hijack", None) is None:
                    block._original_inner_forward_cn_hijack = block._forward
                block._forward = hacked_basic_transformer_inner_forward.__get__(block, BasicTransformerBlock)
                block.bank = []
                block.style_cfgs = []
                block.attn_weight = float(i) / float(len(blocks))

            model.middle_block.gn_weight = 0
            gn_modules = [model.middle_block]
            for w, i in enumerate(_GN_INPUT_BLOCKS):
                model.input_blocks[i].gn_weight = 1.0 - float(w) / float(len(_GN_INPUT_BLOCKS))
                gn_modules.append(model.input_blocks[i])
            for w, i in enumerate(_GN_OUTPUT_BLOCKS):
                model.output_blocks[i].gn_weight = float(w) / float(len(_GN_OUTPUT_BLOCKS))
                gn_modules.append(model.output_blocks[i])
            for module in gn_modules:
                if getattr(module, "original_forward_cn_hijack", None) is None:
                    module.original_forward_cn_hijack = module.forward
                module.forward = hacked_group_norm_forward.__get__(module, nn.Module)
                module.mean_bank = []
                module.var_bank = []
                module.style_cfgs = []
                module.gn_weight *= 2
            outer.attn_module_list = blocks
            outer.gn_module_list = gn_modules
        else:
            _restore_secondary(all_modules)
            outer.attn_module_list = []
            outer.gn_module_list = []

    def restore(self) -> None:
        """hook.py ~1067-1074.  Leaves ``forward`` as an instance attribute; does not undo block hijacks."""
        self.control_params = None
        if self.model is not None and hasattr(self.model, "_original_forward"):
            self.model.forward = self.model._original_forward
            del self.model._original_forward


def _restore_secondary(modules: list[nn.Module]) -> None:
    for module in modules:
        inner = getattr(module, "_original_inner_forward_cn_hijack", None)
        outer_fwd = getattr(module, "original_forward_cn_hijack", None)
        if inner is not None:
            module._forward = inner
        if outer_fwd is not None:
            module.forward = outer_fwd


def clear_all_secondary_control_models(unet: nn.Module) -> None:
    """controlnet.py ~61-72: put back saved ``_forward`` / ``forward`` (as instance attributes; the saved
    ``*_cn_hijack`` attributes stay)."""
    _restore_secondary(torch_dfs(unet))
    lllite = sys.modules.get("neighbours.controlnet_lllite")  # clear_all_lllite() (~72), where that double is loaded
    if lllite is not None:
        lllite.clear_all_lllite()


# --------------------------------------------------------------------------------------------------------------
# Reference-only convenience
# --------------------------------------------------------------------------------------------------------------


def reference_params(
    reference_latent: torch.Tensor,
    *,
    mode: str = "reference_only",
    weight: float = 1.0,
    style_fidelity: float = 0.5,
    cfg_injection: bool = False,
    soft_injection: bool = False,
) -> ControlParams:
    """A reference unit as controlnet.py builds it (~912-917, ~1034): ``control_model=None``, type
    AttentionInjection, preprocessor ``mode`` (``reference_only`` / ``reference_adain`` /
    ``reference_adain+attn``) with ``threshold_a`` = style fidelity.  The latent is preset (the hook then skips
    VAE encoding, hook.py ~541)."""
    param = ControlParams(
        control_model=None,
        preprocessor={"name": mode, "threshold_a": style_fidelity, "threshold_b": 0.5},
        hint_cond=torch.zeros(1, 3, reference_latent.shape[2] * 8, reference_latent.shape[3] * 8),
        weight=weight,
        control_model_type=ControlModelType.AttentionInjection,
        cfg_injection=cfg_injection,
        soft_injection=soft_injection,
    )
    param.used_hint_cond = param.hint_cond
    param.used_hint_cond_latent = reference_latent
    return param


def enable_reference_only(
    unet: UNetModel,
    reference_latent: torch.Tensor,
    *,
    sd_ldm: Any = None,
    mode: str = "reference_only",
    weight: float = 1.0,
    style_fidelity: float = 0.5,
    extra_params: Sequence[ControlParams] = (),
) -> UnetHook:
    """Hook ``unet`` like ControlNet does for one reference unit (plus ``extra_params``)."""
    hook = UnetHook()
    params = [
        *list(extra_params),
        reference_params(reference_latent, mode=mode, weight=weight, style_fidelity=style_fidelity),
    ]
    hook.hook(
        model=unet, sd_ldm=sd_ldm if sd_ldm is not None else FakeSDModel(unet), control_params=params, process=None
    )
    return hook


def disable_reference_only(unet: UNetModel, hook: UnetHook | None) -> None:
    """What ControlNet's ``postprocess`` does (controlnet.py ~1253, ~1298): clear hijacks, then restore."""
    clear_all_secondary_control_models(unet)
    if hook is not None:
        hook.restore()


# --------------------------------------------------------------------------------------------------------------
# The Script (scripts/controlnet.py)
# --------------------------------------------------------------------------------------------------------------


@dataclass
class ControlNetUnit:
    """Minimal unit: ``model`` is a wrapper (``PlugableControlModel`` / ``PlugableAdapter``) or None for
    reference; ``module`` is the preprocessor name; ``image`` the hint tensor (1, C, 8H, 8W) in [0, 1]."""

    model: nn.Module | None = None
    image: torch.Tensor | None = None
    module: str = "none"
    enabled: bool = True
    weight: float = 1.0
    guidance_start: float = 0.0
    guidance_end: float = 1.0
    threshold_a: float = 0.5
    threshold_b: float = 0.5
    control_mode: str = "Balanced"  # "Balanced" / "My prompt is more important" / "ControlNet is more important"
    control_model_type: ControlModelType | None = None
    reference_latent: torch.Tensor | None = None
    advanced_weighting: list[float] | None = None
    extra: dict = field(default_factory=dict)


def find_cn_script(script_runner: Any):
    """internal_controlnet/external_code.py ~398-416."""
    if script_runner is None:
        return None
    for script in script_runner.alwayson_scripts:
        if script.title().lower() == "controlnet":
            return script
    return None


class ControlNetScript:
    """The ControlNet ``Script`` (controlnet.py ~295), as far as its public state goes.

    Put it in ``p.scripts.alwayson_scripts``; it reads units from ``p.script_args[args_from:args_to]`` when those
    are set (instances of ``ControlNetUnit``), else from ``self.units``.  ``process`` hooks the UNet at
    ``p.sd_model.model.diffusion_model`` and sets ``latest_network``; ``postprocess`` undoes both.
    """

    def __init__(self, units: Sequence[ControlNetUnit] = ()) -> None:
        self.latest_network: UnetHook | None = None
        self.latest_model_hash = ""
        self.enabled_units: list[ControlNetUnit] = []
        self.units = list(units)
        self.args_from: int | None = None
        self.args_to: int | None = None
        self.is_img2img = False
        self.on_hooked: Callable[[UnetHook], None] | None = None

    def title(self) -> str:
        return "ControlNet"

    def show(self, is_img2img: bool):
        return True  # scripts.AlwaysVisible in the real one

    def get_enabled_units(self, p: Any) -> list[ControlNetUnit]:
        units = self.units
        args = getattr(p, "script_args", None)
        if args is not None and self.args_from is not None:
            units = [u for u in args[self.args_from : self.args_to] if isinstance(u, ControlNetUnit)]
        return [u for u in units if u.enabled]

    def controlnet_main_entry(self, p: Any) -> None:
        """controlnet.py ~853-1202, reduced."""
        sd_ldm = p.sd_model
        unet = sd_ldm.model.diffusion_model
        if self.latest_network is not None:
            self.latest_network.restore()
        clear_all_secondary_control_models(unet)
        self.enabled_units = self.get_enabled_units(p)
        if not self.enabled_units:
            self.latest_network = None
            return
        self.latest_model_hash = getattr(sd_ldm, "sd_model_hash", "")
        params = []
        for unit in self.enabled_units:
            if unit.model is None:
                if "reference" not in unit.module:
                    raise ValueError("Unable to determine control_model_type.")
                kind = ControlModelType.AttentionInjection
                model_net = None
            else:
                kind = unit.control_model_type or (
                    ControlModelType.T2I_Adapter
                    if isinstance(unit.model, PlugableAdapter)
                    else ControlModelType.ControlNet
                )
                # controlnet.py ~416-426: cached models are handed out as a shallow copy of the wrapper (a
                # Controlllite model is loaded afresh: here the same object)
                model_net = unit.model if kind == ControlModelType.Controlllite else copy.copy(unit.model)
                model_net.reset()
            param = ControlParams(
                control_model=model_net,
                preprocessor={"name": unit.module, "threshold_a": unit.threshold_a, "threshold_b": unit.threshold_b},
                hint_cond=unit.image,
                weight=unit.weight,
                start_guidance_percent=unit.guidance_start,
                stop_guidance_percent=unit.guidance_end,
                advanced_weighting=unit.advanced_weighting,
                control_model_type=kind,
                global_average_pooling=bool(
                    kind.is_controlnet and getattr(model_net.control_model, "global_average_pooling", False)
                ),
                soft_injection=unit.control_mode != "Balanced",
                cfg_injection=unit.control_mode == "ControlNet is more important",
            )
            if unit.reference_latent is not None:
                param.used_hint_cond = param.hint_cond
                param.used_hint_cond_latent = unit.reference_latent
            params.append(param)
            if kind == ControlModelType.Controlllite:  # ~1180: LLLite patches the UNet's projections itself
                model_net.hook(
                    model=unet, cond=unit.image, weight=unit.weight, start=unit.guidance_start, end=unit.guidance_end
                )
        self.latest_network = UnetHook(lowvram=False)
        self.latest_network.hook(model=unet, sd_ldm=sd_ldm, control_params=params, process=p)
        if self.on_hooked is not None:
            self.on_hooked(self.latest_network)

    def process(self, p: Any, *args, **kwargs) -> None:
        # controlnet.py ~1226: hooks here unless an SDXL refiner is set (then in before_process_batch)
        if getattr(p, "refiner_checkpoint", None) is None:
            self.controlnet_main_entry(p)

    def before_process_batch(self, p: Any, *args, **kwargs) -> None:
        if getattr(p, "refiner_checkpoint", None) is not None:
            self.controlnet_main_entry(p)

    def postprocess(self, p: Any, processed: Any = None, *args) -> None:
        # controlnet.py ~1248-1299
        clear_all_secondary_control_models(p.sd_model.model.diffusion_model)
        self.enabled_units = []
        if self.latest_network is None:
            return
        self.latest_network.restore()
        self.latest_network = None
