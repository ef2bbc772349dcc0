"""The UNets: ldm's and sgm's ``UNetModel`` (A1111, SD1/SD2/SDXL), Forge's and ComfyUI's (DeepCache's layout).

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


def unet_blocks(root: nn.Module) -> tuple[list[nn.Module], nn.Module, list[nn.Module]] | None:
    """``(input_blocks, middle_block, output_blocks)`` of an ldm/sgm/Forge-layout UNet (or ControlNet: no output
    blocks, returns None), or None when ``root`` is not laid out so."""
    inputs, middle, outputs = (getattr(root, name, None) for name in ("input_blocks", "middle_block", "output_blocks"))
    if not isinstance(inputs, nn.ModuleList) or not isinstance(outputs, nn.ModuleList) or middle is None:
        return None
    if len(inputs) != len(outputs) or not inputs:
        return None
    return list(inputs), middle, list(outputs)


def block_layers(block: nn.Module) -> list[nn.Module]:
    """The modules a host's UNet loop calls for one block: the layers of a ``TimestepEmbedSequential`` (an
    ``nn.Sequential``: ComfyUI's loop calls them one by one, the other hosts' block forwards do the same), else the
    block itself."""
    return list(block) if isinstance(block, nn.Sequential) and len(block) else [block]


def _identity(blocks: tuple[list[nn.Module], nn.Module, list[nn.Module]]) -> list[int]:
    """The identity of every block and of each one's layers, in order: what the cache wrapped and hooked."""
    inputs, middle, outputs = blocks
    return [id(unwrap(m)) for block in (*inputs, middle, *outputs) for m in (block, *block_layers(unwrap(block)))]


def _levels(blocks: tuple[list[nn.Module], nn.Module, list[nn.Module]]) -> list[tuple[nn.Module, int]]:
    """Every block with its level (0: the latent's resolution; each level halves it): an input block after one that
    holds a ``Downsample`` runs a level deeper, the middle block at the deepest, an output block after one that holds
    an ``Upsample`` a level shallower."""
    inputs, middle, outputs = blocks
    out, level = [], 0
    for block in inputs:
        out.append((block, level))
        level += any(type(m).__name__ == "Downsample" for m in unwrap(block).modules())
    out.append((middle, level))
    for block in outputs:
        out.append((block, level))
        level -= any(type(m).__name__ == "Upsample" for m in unwrap(block).modules())
    return out


def _width(block: nn.Module) -> int:
    """The width of a transformer block's self-attention (its queries' features)."""
    norm = getattr(block, "norm1", None)
    shape = getattr(norm, "normalized_shape", None)
    return int(shape[0]) if shape else 0


def _entry_input(args: tuple, kwargs: dict) -> torch.Tensor | None:
    x = args[0] if args else kwargs.get("x")
    return x if isinstance(x, torch.Tensor) and x.dim() == 4 else None


class UNetLayout(Layout):
    """A UNet's blocks for the step cache (see the module)."""

    def __init__(self, root: nn.Module, blocks: tuple[list[nn.Module], nn.Module, list[nn.Module]], branch: int):
        inputs, middle, outputs = blocks
        n = len(inputs)
        if not branch < n:
            raise SettingsError("cache_branch", branch, f"an integer from 0 to {n - 1} for this UNet")
        self.root = root
        entry = n - 1 - branch
        self.entry = block_layers(outputs[entry])[0]  # the entry block's first layer: its input is the block's
        self.start = block_layers(inputs[0])[0]
        skipped_blocks = [*inputs[branch + 1 :], middle, *outputs[:entry]]
        self.skipped = [layer for block in skipped_blocks for layer in block_layers(block)]
        self._below = len(self.skipped) - 1  # the skipped layer whose output enters the entry block
        self._identity = _identity(blocks)
        self._skipped_blocks = {id(b) for b in skipped_blocks}
        self._blocks = blocks

    @classmethod
    def find(cls, root: nn.Module, branch: int) -> UNetLayout | None:
        blocks = unet_blocks(root)
        return None if blocks is None else cls(root, blocks, branch)

    def intact(self) -> bool:
        blocks = unet_blocks(self.root)
        return blocks is not None and _identity(blocks) == self._identity

    def skipped_share(self, size: tuple[int, int] | None) -> float:
        """A block's work: its weights times its positions (a quarter at each level deeper) and, for a latent of known
        ``size``, its self-attentions' products (two of positions² × width each: at the latent's resolution they
        outweigh the layers)."""
        positions = size[0] * size[1] if size is not None else 0
        work = []
        for block, level in _levels(self._blocks):
            n = positions / 4**level
            attention = sum(2 * n * _width(t) for t in unwrap(block).modules() if is_transformer_block(t))
            work.append((id(block), weights(unwrap(block)) / 4**level + attention))
        total = sum(w for _, w in work)
        return sum(w for key, w in work if key in self._skipped_blocks) / total if total else 0.0

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        return unet_input(module, args, kwargs)

    def keep(self, index: int, out: Any, args: tuple, kwargs: dict) -> Any:
        return (out.shape, out.dtype, out.device) if isinstance(out, torch.Tensor) else None

    def placeholder(self, index: int, args: tuple, kwargs: dict, state: PassState) -> torch.Tensor:
        shape, dtype, device = state.kept[index]
        return torch.zeros(shape, dtype=dtype, device=device)

    def _split(self, args: tuple, kwargs: dict, state: PassState) -> tuple[torch.Tensor, int] | None:
        """The entry block's input and the deep features' channels in it (what the layer below returned), or None."""
        x, below = _entry_input(args, kwargs), state.kept.get(self._below)
        if x is None or below is None or not below[0][1] < x.shape[1]:
            return None
        return x, below[0][1]

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
        return ((merged, *args[1:]), kwargs) if args else (args, {**kwargs, "x": merged})
