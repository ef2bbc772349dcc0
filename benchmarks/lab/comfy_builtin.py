"""ComfyUI's built-in token merging, ``TomePatchModel`` (``comfy_extras/nodes_tomesd.py`` at 3cd7b32f), written from
its description for a bare ldm UNet: the ComfyUI anchor of the benchmarks (``benchmarks.lab.modes``, ``comfy-tome``).

What it does: before the self-attention (``attn1``) of each transformer block whose token count is the latent's
``h * w`` (the highest-resolution level only: ``max_downsample`` 1), the *queries* are merged with tomesd's bipartite
soft matching (stride 2x2, one random destination per cell, ``ratio`` of the tokens merged away); keys and values are
computed from the full block input, and the attention output is unmerged right after. Cross-attention and the MLP
see every token. So on SDXL, which has no transformer block at the highest level, it changes nothing. ComfyUI draws
the destinations from the global RNG; here a private generator, seeded when the merging is applied, draws the same
kind of partition reproducibly.
"""

from __future__ import annotations

from typing import Any

import torch
from tomesd.merge import bipartite_soft_matching_random2d
from torch import nn

from tome_core.families import transformer_blocks

_ATTR = "_comfy_builtin_tome"


class QueryMerging:
    """The hooks of ComfyUI's built-in on one UNet. Create with :func:`apply`, undo with :func:`remove`."""

    def __init__(self, unet: nn.Module, ratio: float, seed: int):
        self.unet, self.ratio, self.seed = unet, ratio, seed
        self.size: tuple[int, int] | None = None
        self._generator: torch.Generator | None = None
        self._unmerge: dict[int, Any] = {}
        self._handles = [unet.register_forward_pre_hook(self._root_pre)]
        for block in transformer_blocks(unet):
            self._handles += [
                block.attn1.register_forward_pre_hook(self._attn1_pre, with_kwargs=True),
                block.attn1.register_forward_hook(self._attn1_post),
            ]

    def _root_pre(self, module: nn.Module, args: tuple) -> None:
        x = args[0]
        self.size = (int(x.shape[-2]), int(x.shape[-1]))

    def _generator_for(self, device: torch.device) -> torch.Generator:
        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device=device).manual_seed(self.seed)
        return self._generator

    def _attn1_pre(self, attn: nn.Module, args: tuple, kwargs: dict) -> Any:
        self._unmerge.pop(id(attn), None)
        x = args[0] if args else kwargs.get("x")
        if self.size is None or kwargs.get("context") is not None or x.shape[1] != self.size[0] * self.size[1]:
            return None  # not the highest level (or not a self-attention): as it is
        h, w = self.size
        r = int(x.shape[1] * self.ratio)
        merge, unmerge = bipartite_soft_matching_random2d(x, w, h, 2, 2, r, False, self._generator_for(x.device))
        self._unmerge[id(attn)] = unmerge
        return (merge(x), *args[1:]), {**kwargs, "context": x}  # queries merged; keys and values from every token

    def _attn1_post(self, attn: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        unmerge = self._unmerge.pop(id(attn), None)
        return None if unmerge is None else unmerge(output)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._unmerge.clear()


def apply(unet: nn.Module, ratio: float, seed: int) -> QueryMerging:
    """ComfyUI's built-in on ``unet`` at ``ratio`` (replacing one applied before)."""
    remove(unet)
    merging = unet.__dict__[_ATTR] = QueryMerging(unet, ratio, seed)
    return merging


def remove(unet: nn.Module) -> None:
    """Undo :func:`apply`; a no-op when it is not there."""
    merging = unet.__dict__.pop(_ATTR, None)
    if merging is not None:
        merging.remove()
