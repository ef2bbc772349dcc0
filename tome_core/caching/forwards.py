"""Instance-level ``forward`` swaps, the one kind of patch that is not a hook: where compute must be skipped (a cached
step's skipped blocks, a ControlNet model's unread ones), the module gets an instance ``forward`` of ours
(:func:`skippable`), restored exactly on removal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from ..compiling import opaque, python_only

Replaced = tuple[nn.Module, bool, Any, Callable]
"""An instance-level ``forward`` we put on a module: (module, whether it had one of its own, that one, ours)."""


def replace_forward(module: nn.Module, ours: Callable) -> Replaced:
    """Put ``ours`` as ``module``'s instance ``forward``; the record lets :func:`restore_forwards` undo it exactly."""
    own = "forward" in module.__dict__
    record = (module, own, module.__dict__.get("forward"), ours)
    module.forward = ours
    return record


def restore_forwards(replaced: list[Replaced]) -> bool:
    """Undo :func:`replace_forward`, last first (an instance ``forward`` only where there was one) and clear the
    list; a ``forward`` another extension replaced over ours is left to it. Whether every one was still ours."""
    intact = True
    for module, own, original, ours in reversed(replaced):
        if module.__dict__.get("forward") is not ours:
            intact = False
        elif own:
            module.forward = original
        else:
            del module.__dict__["forward"]
    replaced.clear()
    return intact


def skippable(original: Callable, before: Callable, after: Callable) -> Callable:
    """An instance ``forward`` around a module's ``original`` one: ``before(args, kwargs)`` decides ``(skip, value)``:
    ``value`` is returned instead of running the module, or handed to ``after(value, out, args, kwargs)`` once it ran.
    Under ``torch.compile`` both run as Python, out of any graph; only ``original`` is compiled, as a frame of its own
    (:mod:`tome_core.compiling`)."""
    before, after = python_only(before), python_only(after)

    @opaque
    def forward(*args: Any, **kwargs: Any) -> Any:
        skip, value = before(args, kwargs)
        if skip:
            return value
        out = original(*args, **kwargs)
        after(value, out, args, kwargs)
        return out

    return forward
