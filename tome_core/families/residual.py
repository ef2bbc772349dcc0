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

from typing import Any

import torch
from torch import nn

from .base import Layout


class ResidualLayout(Layout):
    """A transformer family for the step cache (see the module); a subclass reads its host's calls."""

    auto = ("linear", "uniform")
    """On the trained FLUX-layout model (``benchmarks.dit_fidelity``) the linear forecast on the uniform schedule beat
    the UNets' calibrated forecast on the time schedule at every matched speed (by 1.2–2.2 dB)."""

    def __init__(self, root: nn.Module, start: nn.Module, skipped: list[nn.Module], entry: nn.Module):
        self.root, self.start, self.skipped, self.entry = root, start, skipped, entry
        self._left: torch.Tensor | None = None  # a copy of the stream as it left the probe, in the pass running now

    # --- what a subclass reads from its host's calls ---------------------------------------------------------
    def stream_in(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The image (or joint) stream entering the first skipped block."""
        raise NotImplementedError

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> Any:
        """What skipped block ``index`` returns to hand its input streams on unchanged."""
        raise NotImplementedError

    def entry_image(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The image stream entering the entry."""
        raise NotImplementedError

    def with_entry_image(self, args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
        """The entry's arguments with ``x`` as its image stream."""
        raise NotImplementedError

    # --- the Layout --------------------------------------------------------------------------------------------
    def _keep_left(self, args: tuple, kwargs: dict) -> None:
        x = self.stream_in(args, kwargs)
        self._left = x.clone() if isinstance(x, torch.Tensor) else None

    def enter(self, index: int, args: tuple, kwargs: dict) -> None:
        if index == 0:
            self._keep_left(args, kwargs)

    def keep(self, index: int, out: Any, args: tuple, kwargs: dict) -> Any:
        return True

    def placeholder(self, index: int, kept: Any, args: tuple, kwargs: dict) -> Any:
        if index == 0:
            self._keep_left(args, kwargs)
        return self.pass_on(index, args, kwargs)

    def _left_of(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """What left the probe, as many of its last tokens as ``x`` (the entry's image stream) has; None if unfit."""
        left = self._left
        if x is None or left is None or left.dim() != 3 or x.dim() != 3:
            return None
        if left.shape[0] != x.shape[0] or left.shape[2] != x.shape[2] or left.shape[1] < x.shape[1]:
            return None
        return left[:, left.shape[1] - x.shape[1] :]

    def features(self, args: tuple, kwargs: dict, kept: dict[int, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
        x = self.entry_image(args, kwargs)
        left = self._left_of(x)
        self._left = None
        return None if left is None else (x - left, left)

    def probe(self, args: tuple, kwargs: dict, kept: dict[int, Any]) -> torch.Tensor | None:
        return self._left_of(self.entry_image(args, kwargs))

    def inject(self, args: tuple, kwargs: dict, kept: dict[int, Any], deep: torch.Tensor) -> tuple[tuple, dict] | None:
        x = self.entry_image(args, kwargs)
        left = self._left_of(x)
        self._left = None
        if x is None or left is None or x.shape != deep.shape:
            return None
        return self.with_entry_image(args, kwargs, left + deep.to(x.dtype))
