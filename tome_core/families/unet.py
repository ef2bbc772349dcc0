"""The UNets: ldm's and sgm's ``UNetModel`` (A1111, SD1/SD2/SDXL), Forge's and ComfyUI's (DeepCache's layout), and
diffusers' ``UNet2DConditionModel`` read in that layout (:class:`DiffusersUNet`).

A UNet's input blocks each leave a skip connection that the output block of the same depth takes back:
``input_blocks[i]`` feeds ``output_blocks[n - 1 - i]``, ``n = len(input_blocks)``. With ``branch`` ``b`` a cached
pass runs input blocks ``0 … b`` and output blocks ``n - 1 - b …``; it skips input blocks ``b + 1 …``, the middle
block and output blocks ``… n - 2 - b``, whose result is the deep features that enter output block ``n - 1 - b``
beside the skip connection: the first channels of its input (the rest, the live skip connection, is the probe).
Branch 0 is the shallowest: a cached step runs the first convolution, the last output block and the output layer.

The cache acts on a block's layers (:func:`block_layers`), not on the block, because ComfyUI's loop iterates a
block's layers instead of calling the block (``forward_timestep_embed``); the other hosts call the block, which calls
its layers. A skipped layer answers with zeros of the shape it returned at the last full pass: the host's loop
concatenates and adds as it always does (also a control model's residuals, in place in Forge and ComfyUI).

The UNet family also says where token merging acts (:func:`transformer_blocks`: ldm/sgm's ``BasicTransformerBlock``
layout, held by a ``SpatialTransformer``, :func:`block_holders`), how a call reads (:func:`unet_input`), and which
modules of a ControlNet model a cached call never reads (:func:`control_skipped`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..settings import SettingsError
from ..steps import call_arg
from .base import Layout, PassState, unwrap, weights


def unet_input(module: nn.Module, args: tuple, kwargs: dict) -> tuple[Any, Any]:
    """A UNet call's input ``x`` and its ``timesteps``, by keyword or position (ldm's, sgm's, Forge's, ComfyUI's; and
    diffusers' ``sample`` and ``timestep``: its UNet and ControlNet models, which a ``MultiControlNetModel`` calls by
    keyword)."""
    x = args[0] if args else kwargs.get("x", kwargs.get("sample"))
    timesteps = call_arg(module, args, kwargs, "timesteps")
    return x, timesteps if timesteps is not None else call_arg(module, args, kwargs, "timestep")


# --- where token merging acts ------------------------------------------------------------------------------------
def is_transformer_block(module: nn.Module) -> bool:
    """A block laid out like ldm/sgm ``BasicTransformerBlock``: ``norm1, attn1, norm2, attn2, norm3, ff``."""
    return all(isinstance(getattr(module, name, None), nn.Module) for name in ("norm1", "attn1", "attn2", "ff"))


def transformer_blocks(root: nn.Module) -> Iterator[nn.Module]:
    """The blocks token merging acts on, in module order."""
    # nn.Module.modules, not root.modules: another extension's module may shadow it (Mikubill's ControlNet-LLLite
    # model keeps its modules in a dict named ``modules``, controlnet_lllite.py l.153)
    return (m for m in nn.Module.modules(root) if is_transformer_block(m))


def has_transformer_blocks(root: nn.Module) -> bool:
    """Whether ToMe has anything to merge in ``root`` (control models without blocks, e.g. adapters, have not)."""
    return next(transformer_blocks(root), None) is not None


def block_holders(root: nn.Module, index: Mapping[int, int]) -> Iterator[nn.Module]:
    """The modules whose ``transformer_blocks`` list holds blocks of ``index`` (ldm/sgm/Forge SpatialTransformer)."""
    for module in nn.Module.modules(root):  # as in transformer_blocks
        inner = getattr(module, "transformer_blocks", None)
        if isinstance(inner, nn.ModuleList) and any(id(block) in index for block in inner):
            yield module


def control_skipped(root: nn.Module, branch: int) -> list[nn.Module] | None:
    """The modules of a ControlNet model (ldm layout: ``input_blocks``, ``zero_convs``, ``middle_block``,
    ``middle_block_out``) whose residuals a UNet call cached at ``branch`` never reads: its input blocks beyond
    ``branch``, their zero convolutions, its middle block and middle-block output; None when it is not laid out so."""
    inputs, zeros = getattr(root, "input_blocks", None), getattr(root, "zero_convs", None)
    middle, middle_out = getattr(root, "middle_block", None), getattr(root, "middle_block_out", None)
    laid_out = (
        isinstance(inputs, nn.ModuleList)
        and isinstance(zeros, nn.ModuleList)
        and len(inputs) == len(zeros)
        and isinstance(middle, nn.Module)
        and isinstance(middle_out, nn.Module)
        and branch < len(inputs)
    )
    return [*inputs[branch + 1 :], *zeros[branch + 1 :], middle, middle_out] if laid_out else None


# --- the step cache's layout ------------------------------------------------------------------------------------

Block = tuple[nn.Module, ...]
"""One block of a UNet as the step cache sees it: the layers its host's loop calls, in order."""
Blocks = tuple[list[Block], Block, list[Block]]
"""A UNet's input blocks, middle block and output blocks."""


def block_layers(block: nn.Module) -> list[nn.Module]:
    """The modules a host's UNet loop calls for one block: the layers of a ``TimestepEmbedSequential`` (an
    ``nn.Sequential``: ComfyUI's loop calls them one by one, the other hosts' block forwards do the same), else the
    block itself."""
    return list(block) if isinstance(block, nn.Sequential) and len(block) else [block]


def _ldm_blocks(root: nn.Module) -> tuple[Blocks, list[int]] | None:
    """The blocks of an ldm/sgm/Forge-layout UNet (``input_blocks``, ``middle_block``, ``output_blocks``; a ControlNet
    has no output blocks: None) and the identity of every block and of each one's layers, or None when ``root`` is not
    laid out so."""
    inputs, middle, outputs = (getattr(root, name, None) for name in ("input_blocks", "middle_block", "output_blocks"))
    if not isinstance(inputs, nn.ModuleList) or not isinstance(outputs, nn.ModuleList) or middle is None:
        return None
    if len(inputs) != len(outputs) or not inputs:
        return None
    every = (*inputs, middle, *outputs)
    identity = [id(unwrap(m)) for block in every for m in (block, *block_layers(unwrap(block)))]
    blocks = [tuple(block_layers(block)) for block in every]
    return (blocks[: len(inputs)], blocks[len(inputs)], blocks[len(inputs) + 1 :]), identity


_DIFFUSERS_DOWN = ("DownBlock2D", "CrossAttnDownBlock2D")
_DIFFUSERS_MID = ("UNetMidBlock2D", "UNetMidBlock2DCrossAttn")
_DIFFUSERS_UP = ("UpBlock2D", "CrossAttnUpBlock2D")
_DIFFUSERS_SAMPLERS = {"downsamplers": "Downsample2D", "upsamplers": "Upsample2D"}


def _diffusers_levels(block: nn.Module, names: tuple[str, ...], samplers: str) -> list[Block] | None:
    """One of diffusers' down or up blocks as ldm's blocks: each resnet with its attention (if any), then its
    resampler on its own (down) or with the last pair (up); None for a block of another kind."""
    if type(block).__name__ not in names:
        return None
    resnets, attentions = block.resnets, getattr(block, "attentions", None)
    pairs = [(r, attentions[i]) if attentions is not None else (r,) for i, r in enumerate(resnets)]
    resamplers = list(getattr(block, samplers, None) or [])
    if not pairs or any(type(m).__name__ != _DIFFUSERS_SAMPLERS[samplers] for m in resamplers):
        return None
    if samplers == "downsamplers":
        return [*pairs, *((m,) for m in resamplers)]
    return [*pairs[:-1], (*pairs[-1], *resamplers)]


def _diffusers_blocks(root: nn.Module) -> tuple[Blocks, list[int]] | None:
    """The blocks of diffusers' ``UNet2DConditionModel`` (and ``UNet2DModel``) in ldm's layout: ``conv_in``; each down
    block's resnet-attention pairs and downsampler; the mid block; each up block's pairs, its upsampler with the last
    (where ldm's output block holds its ``Upsample``): the skip connections pair up as ldm's. Down and up blocks of
    the kinds SD1.x/2.x and SDXL have (the others resample inside resnets: not this layout); identity: every layer."""
    names = ("conv_in", "down_blocks", "mid_block", "up_blocks", "conv_out")
    conv_in, downs, mid, ups, conv_out = (getattr(root, name, None) for name in names)
    if not all(isinstance(m, nn.Module) for m in (conv_in, mid, conv_out)):
        return None
    if not isinstance(downs, nn.ModuleList) or not isinstance(ups, nn.ModuleList):
        return None
    if type(mid).__name__ not in _DIFFUSERS_MID:
        return None
    inputs, outputs = [(conv_in,)], []
    for block in downs:
        levels = _diffusers_levels(block, _DIFFUSERS_DOWN, "downsamplers")
        if levels is None:
            return None
        inputs += levels
    for block in ups:
        levels = _diffusers_levels(block, _DIFFUSERS_UP, "upsamplers")
        if levels is None:
            return None
        outputs += levels
    if len(inputs) != len(outputs):
        return None
    identity = [id(unwrap(m)) for block in (*inputs, (mid,), *outputs) for m in block]
    return (inputs, (mid,), outputs), identity


def _modules(block: Block) -> list[nn.Module]:
    return [m for layer in block for m in unwrap(layer).modules()]


def _levels(blocks: Blocks) -> list[tuple[Block, int]]:
    """Every block with its level (0: the latent's resolution; each level halves it): an input block after one that
    holds a ``Downsample`` runs a level deeper, the middle block at the deepest, an output block after one that holds
    an ``Upsample`` a level shallower (ldm's classes; diffusers' ``Downsample2D``, ``Upsample2D``)."""
    inputs, middle, outputs = blocks
    out, level = [], 0
    for block in inputs:
        out.append((block, level))
        level += any(type(m).__name__.startswith("Downsample") for m in _modules(block))
    out.append((middle, level))
    for block in outputs:
        out.append((block, level))
        level -= any(type(m).__name__.startswith("Upsample") for m in _modules(block))
    return out


def _width(block: nn.Module) -> int:
    """The width of a transformer block's self-attention (its queries' features)."""
    norm = getattr(block, "norm1", None)
    shape = getattr(norm, "normalized_shape", None)
    return int(shape[0]) if shape else 0


def _entry_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    x = args[0] if args else kwargs.get("x", kwargs.get("input_tensor"))
    return x if isinstance(x, torch.Tensor) and x.dim() == 4 else None


@dataclass(frozen=True)
class _Kept:
    """What a full pass keeps of a skipped layer's call: its output's shape, dtype and device, and whether the output
    was a one-tensor tuple (diffusers' attention blocks called with ``return_dict=False``)."""

    shape: torch.Size
    dtype: torch.dtype
    device: torch.device
    in_tuple: bool = False


class UNetLayout(Layout):
    """A UNet's blocks for the step cache (see the module): ldm/sgm/Forge/ComfyUI's (``input_blocks``, ...)."""

    @staticmethod
    def _found(root: nn.Module) -> tuple[Blocks, list[int]] | None:
        """The model's blocks and their identity (what the cache wrapped and hooked), or None: not this layout."""
        return _ldm_blocks(root)

    def __init__(self, root: nn.Module, found: tuple[Blocks, list[int]], branch: int):
        blocks, self._identity = found
        inputs, middle, outputs = blocks
        n = len(inputs)
        if not branch < n:
            raise SettingsError("cache_branch", branch, f"an integer from 0 to {n - 1} for this UNet")
        self.root = root
        entry = n - 1 - branch
        self.entry = outputs[entry][0]  # the entry block's first layer: its input is the block's
        self.start = inputs[0][0]
        skipped_blocks = [*inputs[branch + 1 :], middle, *outputs[:entry]]
        self.skipped = [layer for block in skipped_blocks for layer in block]
        self._below = len(self.skipped) - 1  # the skipped layer whose output enters the entry block
        self._skipped_blocks = {id(b) for b in skipped_blocks}
        self._blocks = blocks

    @classmethod
    def find(cls, root: nn.Module, branch: int) -> UNetLayout | None:
        found = cls._found(root)
        return None if found is None else cls(root, found, branch)

    def intact(self) -> bool:
        found = self._found(self.root)
        return found is not None and found[1] == self._identity

    def skipped_share(self, size: tuple[int, int] | None) -> float:
        """A block's work: its weights times its positions (a quarter at each level deeper) and, for a latent of known
        ``size``, its self-attentions' products (two of positions² × width each: at the latent's resolution they
        outweigh the layers)."""
        positions = size[0] * size[1] if size is not None else 0
        work = []
        for block, level in _levels(self._blocks):
            n = positions / 4**level
            attention = sum(2 * n * _width(t) for t in _modules(block) if is_transformer_block(t))
            work.append((id(block), sum(weights(unwrap(layer)) for layer in block) / 4**level + attention))
        total = sum(w for _, w in work)
        return sum(w for key, w in work if key in self._skipped_blocks) / total if total else 0.0

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        return unet_input(module, args, kwargs)

    def keep(self, index: int, out: Any, args: tuple, kwargs: dict) -> _Kept | None:
        in_tuple = isinstance(out, tuple) and len(out) == 1
        out = out[0] if in_tuple else out
        return _Kept(out.shape, out.dtype, out.device, in_tuple) if isinstance(out, torch.Tensor) else None

    def placeholder(self, index: int, args: tuple, kwargs: dict, state: PassState) -> Any:
        kept = state.kept[index]
        zeros = torch.zeros(kept.shape, dtype=kept.dtype, device=kept.device)
        return (zeros,) if kept.in_tuple else zeros

    def _split(self, args: tuple, kwargs: dict, state: PassState) -> tuple[torch.Tensor, int] | None:
        """The entry block's input and the deep features' channels in it (what the layer below returned), or None."""
        x, below = _entry_input(args, kwargs), state.kept.get(self._below)
        if x is None or below is None or not below.shape[1] < x.shape[1]:
            return None
        return x, below.shape[1]

    def features(self, args: tuple, kwargs: dict, state: PassState) -> tuple[torch.Tensor, torch.Tensor] | None:
        found = self._split(args, kwargs, state)
        if found is None:
            return None
        x, channels = found
        return x[:, :channels].clone(), x[:, channels:]  # the skip connection: the probe

    def probe(self, args: tuple, kwargs: dict, state: PassState) -> torch.Tensor | None:
        found = self._split(args, kwargs, state)
        return None if found is None else found[0][:, found[1] :]

    def inject(self, args: tuple, kwargs: dict, state: PassState, deep: torch.Tensor) -> tuple[tuple, dict] | None:
        x = _entry_input(args, kwargs)
        if x is None or deep.shape[0] != x.shape[0] or deep.shape[2:] != x.shape[2:]:
            return None
        merged = torch.cat([deep, x[:, deep.shape[1] :]], dim=1)
        if args:
            return (merged, *args[1:]), kwargs
        return args, {**kwargs, "x" if "x" in kwargs else "input_tensor": merged}


class DiffusersUNet(UNetLayout):
    """diffusers' UNets (``UNet2DConditionModel``: SD1.x/2.x, SDXL) in ldm's layout (:func:`_diffusers_blocks`): its
    entry is an up block's resnet, called with the deep features and the skip connection concatenated, as ldm's."""

    @staticmethod
    def _found(root: nn.Module) -> tuple[Blocks, list[int]] | None:
        return _diffusers_blocks(root)
