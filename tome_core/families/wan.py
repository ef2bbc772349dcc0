"""Wan 2.1 / 2.2 (and VACE, camera) as ComfyUI (``comfy/ldm/wan/model.py``) and Forge Neo (``backend/nn/wan.py``) run
them: one list of blocks (``blocks``: ``block(x, e=, freqs=, context=, context_img_len=, transformer_options=)``
returns the token stream, video latent patchified into one sequence; text enters by cross-attention), then
``head(x, e)``. The timestep is the flow-matching sigma times 1000 already (``ModelSamplingDiscreteFlow``). VACE adds
its blocks' residuals in place after blocks of the list. A cached pass runs the first ``branch + 1`` blocks and skips
the rest up to ``head`` (:mod:`.residual`); Wan runs classifier-free guidance, so cond and uncond are streams of their
own (``cond_or_uncond``), and each expert of Wan 2.2 (its own model) has its own cache.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..settings import SettingsError
from ..steps import call_arg
from .residual import ResidualLayout


def _blocks(root: nn.Module) -> list[nn.Module] | None:
    blocks = getattr(root, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) < 2:
        return None
    if not isinstance(getattr(root, "head", None), nn.Module) or not hasattr(root, "patch_embedding"):
        return None
    return list(blocks)


def _first(args: tuple, kwargs: dict) -> torch.Tensor | None:
    x = args[0] if args else kwargs.get("x")
    return x if isinstance(x, torch.Tensor) else None


class ComfyWan(ResidualLayout):
    """Wan's transformer as ComfyUI and Forge Neo run it, for the step cache (see the module)."""

    def __init__(self, root: nn.Module, blocks: list[nn.Module], branch: int):
        if not branch < len(blocks) - 1:
            raise SettingsError("cache_branch", branch, f"an integer from 0 to {len(blocks) - 2} for this model")
        super().__init__(root, blocks[0], blocks[branch + 1 :], root.head)
        self._identity = [id(m) for m in (*blocks, root.head)]

    @classmethod
    def find(cls, root: nn.Module, branch: int) -> ComfyWan | None:
        blocks = _blocks(root)
        return None if blocks is None else cls(root, blocks, branch)

    def intact(self) -> bool:
        blocks = _blocks(self.root)
        return blocks is not None and [id(m) for m in (*blocks, self.root.head)] == self._identity

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, Any]:
        t = call_arg(module, args, kwargs, "timestep")
        return _first(args, kwargs), (t.flatten()[0] if isinstance(t, torch.Tensor) and t.numel() else None)

    def stream_in(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return _first(args, kwargs)

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> Any:
        return _first(args, kwargs)

    def entry_image(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return _first(args, kwargs)

    def with_entry_image(self, args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "x": x})
