"""FLUX as diffusers' ``FluxTransformer2DModel`` runs it: double-stream blocks (``transformer_blocks``: image and text
tokens in streams of their own, joint attention), then single-stream blocks (``single_transformer_blocks``), then
the output norm and projection (``norm_out``, ``proj_out``). Every block is called with keywords and returns
``(encoder_hidden_states, hidden_states)``: the text and the image stream.

A cached pass runs the first ``branch + 1`` double-stream blocks (the probe: First Block Cache's first block) and
skips every block after them; each skipped block hands its input streams on unchanged, so the image stream reaches
``norm_out`` as it left the probe. At a full pass the skipped range's contribution is its residual on the image
stream (what enters ``norm_out`` minus what left the probe), and the probe is what left it; a cached pass adds the
forecast residual to what left its own probe. (ComfyUI's and Forge Neo's FLUX classes are families of their own.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..settings import SettingsError
from .base import Layout


def _streams(root: nn.Module) -> tuple[list[nn.Module], list[nn.Module]] | None:
    double, single = getattr(root, "transformer_blocks", None), getattr(root, "single_transformer_blocks", None)
    if not isinstance(double, nn.ModuleList) or not isinstance(single, nn.ModuleList) or not double:
        return None
    if not isinstance(getattr(root, "norm_out", None), nn.Module) or not hasattr(root, "x_embedder"):
        return None
    return list(double), list(single)


def _identity(root: nn.Module, streams: tuple[list[nn.Module], list[nn.Module]]) -> list[int]:
    """The identity of every block and of the output norm, in order: what the cache wrapped and hooked."""
    return [id(m) for m in (*streams[0], *streams[1], root.norm_out)]


def _image(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The image stream entering ``norm_out`` (called as ``norm_out(hidden_states, temb)``)."""
    x = args[0] if args else kwargs.get("hidden_states")
    return x if isinstance(x, torch.Tensor) else None


class DiffusersFlux(Layout):
    """diffusers' FLUX transformer for the step cache (see the module)."""

    def __init__(self, root: nn.Module, streams: tuple[list[nn.Module], list[nn.Module]], branch: int):
        double, single = streams
        if not branch < len(double):
            raise SettingsError("cache_branch", branch, f"an integer from 0 to {len(double) - 1} for this model")
        self.root = root
        self.start = double[0]
        self.skipped = [*double[branch + 1 :], *single]
        self.entry = root.norm_out
        self._identity = _identity(root, streams)
        self._left_probe: torch.Tensor | None = None  # the image stream as it left the probe, in a full pass

    @classmethod
    def find(cls, root: nn.Module, branch: int) -> DiffusersFlux | None:
        streams = _streams(root)
        return None if streams is None else cls(root, streams, branch)

    def intact(self) -> bool:
        streams = _streams(self.root)
        return streams is not None and _identity(self.root, streams) == self._identity

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, Any]:
        x = kwargs.get("hidden_states", args[0] if args else None)
        t = kwargs.get("timestep", args[3] if len(args) > 3 else None)
        time = t.flatten()[0] * 1000 if isinstance(t, torch.Tensor) and t.numel() else None  # as the model scales it
        return (x if isinstance(x, torch.Tensor) else None), time

    def keep(self, index: int, out: Any, args: tuple, kwargs: dict) -> Any:
        if index == 0:
            self._left_probe = kwargs.get("hidden_states")
        return True

    def placeholder(self, index: int, kept: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return kwargs["encoder_hidden_states"], kwargs["hidden_states"]

    def features(self, args: tuple, kwargs: dict, kept: dict[int, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
        x, left = _image(args, kwargs), self._left_probe
        self._left_probe = None
        if x is None or not isinstance(left, torch.Tensor) or x.shape != left.shape:
            return None
        return x - left, left

    def probe(self, args: tuple, kwargs: dict, kept: dict[int, Any]) -> torch.Tensor | None:
        return _image(args, kwargs)

    def inject(self, args: tuple, kwargs: dict, kept: dict[int, Any], deep: torch.Tensor) -> tuple[tuple, dict] | None:
        x = _image(args, kwargs)
        if x is None or x.shape != deep.shape:
            return None
        merged = x + deep.to(x.dtype)
        return ((merged, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": merged})
