"""A ControlNet model that follows the UNet's step cache, where the control model runs inside the UNet's call
(Mikubill's sd-webui-controlnet computes its residuals in its own UNet loop, after the call has been placed)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..families import control_skipped
from .cache import StepCache
from .forwards import Replaced, replace_forward, restore_forwards, skippable


class ControlFollower:
    """Shortens a ControlNet model's forward on the UNet's cached calls.

    A cached UNet call reads only the residuals of the skip branches it runs (``0 … b``): the control model's modules
    whose residuals it never reads (:func:`tome_core.families.control_skipped`) then return zeros of the shape they
    return for that input (recorded at full calls) instead of computing values nobody reads, so the UNet's output is
    bit-identical and the control model costs a few percent of itself. Anything not laid out so, or an input never
    seen at a full call, runs as it is."""

    def __init__(self, root: nn.Module, leader: StepCache):
        self.root, self.leader = root, leader
        skipped = control_skipped(root, leader.settings.cache_branch) if leader.usable else None
        self.usable = skipped is not None
        self.skipped: list[nn.Module] = skipped or []
        self._shapes: dict[tuple, tuple[torch.Size, torch.dtype, torch.device]] = {}
        self._originals: list[Replaced] = []
        self.shortened = 0  # module calls answered with zeros

    def install(self) -> None:
        try:
            for i, module in enumerate(self.skipped):
                self._wrap(i, module)
        except BaseException:
            self.remove()
            raise

    def _wrap(self, index: int, module: nn.Module) -> None:
        """As :meth:`StepCache._wrap`: the decision out of any graph, the module's own ``forward`` compiled."""

        def before(args: tuple, kwargs: dict) -> tuple[bool, Any]:
            """(skip, zeros) on a cached call whose input was seen at a full one; else (False, the input's key)."""
            x = args[0] if args else kwargs.get("x")
            key = (index, tuple(x.shape)) if isinstance(x, torch.Tensor) else None
            if key is not None and self.leader.cached_now and key in self._shapes:
                self.shortened += 1
                shape, dtype, device = self._shapes[key]
                return True, torch.zeros(shape, dtype=dtype, device=device)
            return False, key

        def after(key: tuple | None, out: Any, args: tuple, kwargs: dict) -> None:
            if key is not None and not self.leader.cached_now and isinstance(out, torch.Tensor):
                self._shapes[key] = (out.shape, out.dtype, out.device)

        forward = skippable(module.forward, before, after)
        self._originals.append(replace_forward(module, forward))

    def remove(self) -> None:
        """Restore every wrapped module's ``forward`` exactly (see :meth:`StepCache.remove`)."""
        restore_forwards(self._originals)
        self._shapes.clear()
