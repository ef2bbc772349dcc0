"""What the diffusion transformers' families share: a cached pass runs the first blocks (the probe) and skips every
block after them up to the output layer (the entry); each skipped block hands its input streams on unchanged.

At a full pass the skipped range's contribution is its residual on the image stream (what enters the entry minus
what left the probe: the input of the first skipped block), and the probe is what left it. A cached pass gives the
entry what left its own probe plus the forecast residual. Whatever the host's loop adds to the image stream between
the skipped blocks at a cached pass (ComfyUI's and Forge Neo's FLUX add a ControlNet's residual after each block) is
replaced with the forecast, which carries what was added at the full passes, as a UNet's skipped blocks drop the
control residuals they would have read. The stream leaving the probe is copied, not held: the host's blocks and its
ControlNet add to it in place.

The first skipped block may be a single-stream one, whose input is the text tokens followed by the image tokens: the
entry's input is the image tokens alone, so the last of the kept tokens are the image's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from .base import Layout, PassState, unwrap, weights


def arg(args: tuple, kwargs: dict, position: int, name: str) -> Any:
    """A call's argument ``name`` at ``position``, by keyword or position; None when absent."""
    return kwargs[name] if name in kwargs else (args[position] if len(args) > position else None)


def sigma_time(t: Any, scale: float = 1000.0) -> torch.Tensor | None:
    """A call's first timestep on the UNets' 0–1000 scale (``scale``: what makes it so; a flow-matching sigma's 1000,
    as FLUX scales it), left on its device; None without one."""
    return t.flatten()[0] * scale if isinstance(t, torch.Tensor) and t.numel() else None


def tensor(value: Any) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) else None


class ResidualLayout(Layout):
    """A transformer family for the step cache (see the module): a subclass names the root's block lists and reads its
    host's calls."""

    names: ClassVar[tuple[str, ...]] = ()
    """Attributes of the root: its block lists in call order, then the output layer (the entry), then a module only
    this family has (to tell it from others with lists of those names)."""
    least: ClassVar[int] = 1
    """The fewest blocks the first list must hold for the family to know the model."""
    classes: ClassVar[tuple[str, ...]] = ()
    """Where other models have the same names but call their blocks otherwise (diffusers' transformers: HunyuanVideo,
    Chroma and others have FLUX's lists, SD3's names are HunyuanVideo's too), the model classes (or their bases) this
    family knows; empty: any model with :attr:`names`."""
    entry_arg: ClassVar[str] = "x"
    """The name of the entry's first argument, the image stream."""

    transformer = True
    corrects = True
    auto = ("linear", "uniform")
    """On the trained FLUX-layout model (``benchmarks.quality.dit_fidelity``) the linear forecast on the uniform schedule beat
    the UNets' calibrated forecast on the time schedule at every matched speed (by 1.2–2.2 dB)."""

    def __init__(self, root: nn.Module, lists: list[list[nn.Module]], branch: int):
        self.root, self.entry = root, getattr(root, self.names[-2])
        self.start, self.skipped = self.split(lists, branch)
        self._identity = self._modules(root)

    @classmethod
    def _lists(cls, root: nn.Module) -> list[list[nn.Module]] | None:
        *list_names, entry_name, marker = cls.names
        lists = [getattr(root, name, None) for name in list_names]
        if not all(isinstance(blocks, nn.ModuleList) for blocks in lists) or len(lists[0]) < cls.least:
            return None
        if not isinstance(getattr(root, entry_name, None), nn.Module) or not hasattr(root, marker):
            return None
        return [list(blocks) for blocks in lists]

    @classmethod
    def _modules(cls, root: nn.Module) -> list[int] | None:
        """The identity of every block and of the output layer, in order: what the cache wrapped and hooked."""
        lists = cls._lists(root)
        if lists is None:
            return None
        return [id(unwrap(m)) for blocks in lists for m in blocks] + [id(unwrap(getattr(root, cls.names[-2])))]

    @classmethod
    def find(cls, root: nn.Module, branch: int) -> ResidualLayout | None:
        if cls.classes and not any(c.__name__ in cls.classes for c in type(root).__mro__):
            return None
        lists = cls._lists(root)
        return None if lists is None else cls(root, lists, branch)

    def intact(self) -> bool:
        return self._modules(self.root) == self._identity

    def skipped_share(self, size: tuple[int, int] | None) -> float:
        """Every block runs over the same tokens, so its share of the work is its share of the blocks' weights."""
        lists = self._lists(self.root) or []
        total = sum(weights(unwrap(m)) for blocks in lists for m in blocks)
        return sum(weights(unwrap(m)) for m in self.skipped) / total if total else 0.0

    # --- what a subclass says of its model and reads from its host's calls ---------------------------------
    def split(self, lists: list[list[nn.Module]], branch: int) -> tuple[nn.Module, list[nn.Module]]:
        """The first block and the blocks a cached pass skips at ``branch``; ``SettingsError`` for one it lacks."""
        raise NotImplementedError

    def stream_in(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The image (or joint) stream entering the first skipped block."""
        raise NotImplementedError

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> Any:
        """What skipped block ``index`` returns to hand its input streams on unchanged."""
        raise NotImplementedError

    def entry_image(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The image stream entering the entry: its first argument (:attr:`entry_arg`)."""
        return tensor(arg(args, kwargs, 0, self.entry_arg))

    def with_entry_image(self, args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
        """The entry's arguments with ``x`` as its image stream."""
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, self.entry_arg: x})

    def head(self, args: tuple, kwargs: dict, x: torch.Tensor) -> torch.Tensor:
        a, k = self.with_entry_image(args, kwargs, x)
        return unwrap(self.entry).forward(*a, **k)

    # --- the Layout --------------------------------------------------------------------------------------------
    def _keep_left(self, args: tuple, kwargs: dict, state: PassState) -> None:
        """Carry a copy of the stream as it leaves the probe (the first skipped block's input) to the entry."""
        x = self.stream_in(args, kwargs)
        state.carried = x.clone() if x is not None else None

    def enter(self, index: int, args: tuple, kwargs: dict, state: PassState) -> None:
        if index == 0:
            self._keep_left(args, kwargs, state)

    def keep(self, index: int, out: Any, args: tuple, kwargs: dict) -> Any:
        return True

    def placeholder(self, index: int, args: tuple, kwargs: dict, state: PassState) -> Any:
        if index == 0:
            self._keep_left(args, kwargs, state)
        return self.pass_on(index, args, kwargs)

    @staticmethod
    def _left_of(x: torch.Tensor | None, state: PassState) -> torch.Tensor | None:
        """What left the probe, as many of its last tokens as ``x`` (the entry's image stream) has (a stream on a grid,
        not a sequence: itself, where it has ``x``'s shape); None if unfit."""
        left = state.carried
        if x is not None and left is not None and left.shape == x.shape:
            return left
        if x is None or left is None or left.dim() != 3 or x.dim() != 3:
            return None
        if left.shape[0] != x.shape[0] or left.shape[2] != x.shape[2] or left.shape[1] < x.shape[1]:
            return None
        return left[:, left.shape[1] - x.shape[1] :]

    def features(self, args: tuple, kwargs: dict, state: PassState) -> tuple[torch.Tensor, torch.Tensor] | None:
        x = self.entry_image(args, kwargs)
        left = self._left_of(x, state)
        state.carried = None
        return None if left is None else (x - left, left)

    def probe(self, args: tuple, kwargs: dict, state: PassState) -> torch.Tensor | None:
        return self._left_of(self.entry_image(args, kwargs), state)

    def inject(self, args: tuple, kwargs: dict, state: PassState, deep: torch.Tensor) -> tuple[tuple, dict] | None:
        x = self.entry_image(args, kwargs)
        left = self._left_of(x, state)
        state.carried = None
        if x is None or left is None or x.shape != deep.shape:
            return None
        return self.with_entry_image(args, kwargs, (left + deep.to(left.dtype)).to(x.dtype))


class HiddenFirst:
    """Blocks called ``block(hidden_states, encoder_hidden_states, ...)``, by position or keyword, that return
    ``(hidden_states, encoder_hidden_states)``: the image stream first (diffusers' HunyuanVideo, HunyuanVideo 1.5,
    CogVideoX). Mixed in before a :class:`ResidualLayout`."""

    def stream_in(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return tensor(arg(args, kwargs, 0, "hidden_states"))

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        return arg(args, kwargs, 0, "hidden_states"), arg(args, kwargs, 1, "encoder_hidden_states")
