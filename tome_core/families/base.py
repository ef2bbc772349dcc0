"""What a model family tells the step cache (:class:`tome_core.caching.StepCache`) about one model.

A cached step runs the model's first blocks and its last ones and skips a contiguous range in between; the range's
result comes from the cache (the forecast of its last full steps, :mod:`tome_core.caching.forecast`). A layout names:

* ``start``: the module whose call begins each pass through the blocks;
* ``skipped``: the modules a cached pass does not compute, in call order (each gets an instance ``forward`` that
  answers with :meth:`Layout.placeholder` instead; the host's own loop keeps running around them);
* ``entry``: the first module a cached pass runs after them, whose input carries the range's result: at a full
  pass :meth:`Layout.features` reads the range's contribution off it (with the probe: features a cached pass
  computes live as well), at a cached pass :meth:`Layout.inject` puts the forecast contribution into it;

and how a call of the whole model is placed in the sampling (:meth:`Layout.place`: its input and sampler time).

A layout describes the model and holds no run state: what one pass through the blocks keeps is the cache's
:class:`PassState`, handed to each method that needs it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn


def unwrap(module: Any) -> Any:
    """The module a ``torch.compile`` wrapper (``OptimizedModule``) holds, else ``module`` itself: KJNodes and ComfyUI
    put compiled blocks into the model's block lists for the length of each call."""
    inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(module, nn.Module) and isinstance(inner, nn.Module) else module


_PER_CALL = ("emb", "mod", "norm")
"""Names of the layers that run once a call, not once a position: a ResBlock's time embedding (``emb_layers``), the
adaptive norms' modulation (diffusers' ``norm1.linear``, BFL's ``img_mod``/``modulation``)."""


def _layer_weights(layer: nn.Module) -> int:
    """The logical weights of a linear layer (``in_features`` × ``out_features``: torch's, and the hosts' own linear
    modules that are not ``nn.Linear``: ComfyUI's mixed-precision and Forge's operations, whatever packs the weight:
    GGUF, fp8 with scales, nf4; a leaf module with neither but a 2-D weight, as Forge Neo's GGUF ``Linear``, by that
    weight's logical ``shape``) or of a convolution (its weight's shape); 0 for anything else (embeddings, norms)."""
    if hasattr(layer, "in_features") and hasattr(layer, "out_features"):
        return int(layer.in_features) * int(layer.out_features)
    weight = getattr(layer, "weight", None)
    if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return math.prod(weight.shape)
    if isinstance(weight, torch.Tensor) and len(weight.shape) == 2 and not isinstance(layer, nn.Embedding):
        return 0 if next(layer.children(), None) is not None else math.prod(weight.shape)
    return 0


def weights(module: nn.Module) -> int:
    """The weights of ``module``'s linear and convolution layers that run at every position (not its per-call
    modulation and embedding layers): a block's multiply-adds per position, attention's own products aside. Counted
    from the layers' sizes, never from the stored weight, which a quantized wrapper packs (ComfyUI-GGUF's
    ``GGMLTensor`` counts bytes in ``numel()``); a layer that wraps another (a LoRA wrapper around its base layer)
    counts once, as the inner one."""
    total = 0
    for name, layer in module.named_modules():
        own = _layer_weights(layer)
        if own and not any(w in name for w in _PER_CALL):
            total += 0 if any(_layer_weights(inner) for inner in list(layer.modules())[1:]) else own
    return total


@dataclass
class PassState:
    """One pass through the blocks, as the step cache keeps it: what a full pass kept of each skipped module
    (:meth:`Layout.keep`, for the cached passes' placeholders), whether the skipped range's result reached its forecast,
    and what the family carries from one hook of the pass running now to a later one (a transformer's stream as it
    left the probe, consumed at the entry)."""

    kept: dict[int, Any] = field(default_factory=dict)
    deep: bool = False
    carried: Any = None


class Layout:
    """One model's blocks as the step cache uses them (see the module)."""

    start: nn.Module
    entry: nn.Module
    skipped: list[nn.Module]
    transformer: ClassVar[bool] = False
    """Whether the family is a diffusion transformer's (where token merging does not act: only the step cache; and
    where the cache stands aside on a pass too short for a forecast, :func:`tome_core.caching.schedule.too_short`, as measured
    there; the UNets' few-step passes were not)."""
    auto: ClassVar[tuple[str, str]] = ("calibrated", "time")
    """What ``auto`` means on this family: the forecast and the schedule measured best on it (the UNets')."""
    corrects: ClassVar[bool] = False
    """Whether the cache's deferred correction (:mod:`tome_core.caching.correction`) acts on this family: a
    transformer whose entry is its whole output layer, time modulation included, which :meth:`head` runs again; or
    whose entry's output the model only scales by a time modulation of its own before a fixed linear map
    (:meth:`modulation`)."""

    @classmethod
    def find(cls, root: nn.Module, branch: int) -> Layout | None:
        """The layout of ``root`` if it is of this family, else None; ``SettingsError`` for a ``branch`` it lacks."""
        raise NotImplementedError

    def skipped_share(self, size: tuple[int, int] | None) -> float:
        """The share of a full pass's work through the blocks that a cached pass skips (0 to 1) for a call of latent
        ``size`` (:attr:`tome_core.steps.Call.size`), estimated from the blocks' weights and the positions each runs at:
        what the speed a host reports is made of."""
        raise NotImplementedError

    def intact(self) -> bool:
        """Whether ``root`` still holds the modules found (another extension may swap one in its lists)."""
        raise NotImplementedError

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, Any]:
        """A call of the whole model: its input (the latent or token sequence) and its timesteps on the UNets' scale
        (0–1000, as the model takes them or scaled so; tensors stay on their device: nothing is read back)."""
        raise NotImplementedError

    def enter(self, index: int, args: tuple, kwargs: dict, state: PassState) -> None:
        """Skipped module ``index`` is about to run in a full pass (a block may change its input in place)."""

    def keep(self, index: int, out: Any, args: tuple, kwargs: dict) -> Any:
        """What a full pass keeps of skipped module ``index``'s call (its output ``out``) for the cached passes'
        placeholder; None: nothing (the pass is then incomplete and later ones of its number run in full)."""
        raise NotImplementedError

    def placeholder(self, index: int, args: tuple, kwargs: dict, state: PassState) -> Any:
        """What skipped module ``index`` returns in a cached pass (``state.kept[index]``: what the full pass kept of
        it)."""
        raise NotImplementedError

    def features(self, args: tuple, kwargs: dict, state: PassState) -> tuple[torch.Tensor, torch.Tensor] | None:
        """At the entry of a full pass: the range's contribution (a tensor the caller may keep) and the probe."""
        raise NotImplementedError

    def probe(self, args: tuple, kwargs: dict, state: PassState) -> torch.Tensor | None:
        """At the entry of a cached pass: the live probe."""
        raise NotImplementedError

    def inject(self, args: tuple, kwargs: dict, state: PassState, deep: torch.Tensor) -> tuple[tuple, dict] | None:
        """At the entry of a cached pass: its arguments with ``deep`` (the forecast contribution) in place; None
        where it does not fit (the entry then runs on what it got)."""
        raise NotImplementedError

    def entry_image(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The image stream in a call of the entry (where :attr:`corrects`)."""
        raise NotImplementedError

    def head(self, args: tuple, kwargs: dict, x: torch.Tensor) -> torch.Tensor:
        """The entry's output on a call's arguments with ``x`` as its image stream, run again without any hook (where
        :attr:`corrects`)."""
        raise NotImplementedError

    def watched(self) -> list[tuple[nn.Module, Callable[..., None]]]:
        """Forward hooks the family needs to read its :meth:`modulation` (a module and its hook), installed with the
        correction; none by default."""
        return []

    def modulation(self) -> torch.Tensor | None:
        """The factor by which the model scales the entry's output in the call running now before a linear map that is
        the same at every step (its output layer's time modulation, where it runs after the entry); None where the
        entry's output is the model's output up to such a map."""
        return None
