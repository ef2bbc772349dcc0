"""FLUX as diffusers' ``FluxTransformer2DModel`` runs it: double-stream blocks (``transformer_blocks``: image and text
tokens in streams of their own, joint attention), then single-stream blocks (``single_transformer_blocks``), then
the output norm and projection (``norm_out``, ``proj_out``). Every block is called with keywords and returns
``(encoder_hidden_states, hidden_states)``: the text and the image stream.

A cached pass runs the first ``branch + 1`` double-stream blocks (the probe: First Block Cache's first block) and
skips every block after them up to ``norm_out`` (:mod:`.residual`). (ComfyUI's and Forge Neo's FLUX, in Black Forest
Labs' layout, are :mod:`.bfl`.)
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ..settings import SettingsError
from .residual import ResidualLayout


def sigma_time(t: Any) -> torch.Tensor | None:
    """A call's first flow-matching time (0–1) on the UNets' 0–1000 scale, as FLUX scales it (on its device)."""
    return t.flatten()[0] * 1000 if isinstance(t, torch.Tensor) and t.numel() else None


class FluxLayout(ResidualLayout):
    """Double-stream blocks, then single-stream blocks, then an output layer: the attribute names of each (and of one
    more module the family has) are a subclass's; see :mod:`.residual` for the cache's use of them."""

    names: ClassVar[tuple[str, str, str, str]] = ("", "", "", "")
    """Attributes of the root: double-stream blocks, single-stream blocks, the output layer (the entry), a marker."""

    def __init__(self, root: nn.Module, streams: tuple[list[nn.Module], list[nn.Module]], branch: int):
        double, single = streams
        if not branch < len(double):
            raise SettingsError("cache_branch", branch, f"an integer from 0 to {len(double) - 1} for this model")
        super().__init__(root, double[0], [*double[branch + 1 :], *single], getattr(root, self.names[2]))
        self.doubles = len(double) - branch - 1  # skipped double-stream blocks: the first of ``skipped``
        self._identity = self._modules(root)

    @classmethod
    def _streams(cls, root: nn.Module) -> tuple[list[nn.Module], list[nn.Module]] | None:
        double_name, single_name, entry_name, marker = cls.names
        double, single = getattr(root, double_name, None), getattr(root, single_name, None)
        if not isinstance(double, nn.ModuleList) or not isinstance(single, nn.ModuleList) or not double:
            return None
        if not isinstance(getattr(root, entry_name, None), nn.Module) or not hasattr(root, marker):
            return None
        return list(double), list(single)

    @classmethod
    def _modules(cls, root: nn.Module) -> list[int] | None:
        """The identity of every block and of the output layer, in order: what the cache wrapped and hooked."""
        streams = cls._streams(root)
        return None if streams is None else [id(m) for m in (*streams[0], *streams[1], getattr(root, cls.names[2]))]

    @classmethod
    def find(cls, root: nn.Module, branch: int) -> FluxLayout | None:
        streams = cls._streams(root)
        return None if streams is None else cls(root, streams, branch)

    def intact(self) -> bool:
        return self._modules(self.root) == self._identity


class DiffusersFlux(FluxLayout):
    """diffusers' FLUX transformer for the step cache (see the module)."""

    names = ("transformer_blocks", "single_transformer_blocks", "norm_out", "x_embedder")

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, Any]:
        x = kwargs.get("hidden_states", args[0] if args else None)
        t = kwargs.get("timestep", args[3] if len(args) > 3 else None)
        return (x if isinstance(x, torch.Tensor) else None), sigma_time(t)

    def stream_in(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return kwargs.get("hidden_states")  # every block is called with keywords

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return kwargs["encoder_hidden_states"], kwargs["hidden_states"]

    def entry_image(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        x = args[0] if args else kwargs.get("hidden_states")  # ``norm_out(hidden_states, temb)``
        return x if isinstance(x, torch.Tensor) else None

    def with_entry_image(self, args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})
