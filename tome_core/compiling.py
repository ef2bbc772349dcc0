"""The patch under ``torch.compile`` (ComfyUI's ``TorchCompileModel`` of the whole diffusion model, KJNodes' compile of
the transformer blocks only): what dynamo must never trace, and the compiled modules seen through.

Everything that decides or keeps something per call (the root's pre-hook: the step, the stream, whether the call is
cached; the step cache's hooks; a skipped module's decision, placeholder and bookkeeping) reads and writes Python state
that changes every call. Traced, it would be specialised into the graph and guarded on (a recompile per step, stream
or block, up to dynamo's limit, after which the frame runs uncompiled, quietly), or, where the host drops the guards
(ComfyUI's filter drops all of ``transformer_options``; dynamo never guards hooks by default), a decision traced once
would be replayed at every step. So:

- :func:`python_only` (the hooks, a skipped module's decision and bookkeeping): where compiled code calls it, dynamo
  breaks the graph and calls it; it and everything it calls run as Python, never compiled;
- :func:`opaque` (a skipped module's instance ``forward``): the same graph break, but only its own frame runs as Python:
  the module's own ``forward`` it calls is compiled, as a frame of its own, one graph for all the blocks of a class.

Both are marked on the function and its code object, once: outside ``torch.compile`` they cost nothing (dynamo's frame
hook is not set), and inside it the skip is decided in C from the code object, not per call in Python as
``torch.compiler.disable(recursive=False)`` does (about 0.3 ms a call on a CPU). Where this torch lacks those marks,
``torch.compiler.disable`` stands in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

F = TypeVar("F", bound=Callable[..., Any])

try:  # dynamo's per-code-object frame strategy (torch >= 2.6)
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy
except ImportError:  # pragma: no cover - older torch
    set_code_exec_strategy = None


def _mark(fn: F, recursive: bool) -> F:
    """``fn`` marked for dynamo (see the module); ``torch.compiler.disable`` where this torch's private API differs."""
    if set_code_exec_strategy is not None:
        try:
            strategy = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP if recursive else FrameAction.DEFAULT)
            set_code_exec_strategy(fn.__code__, strategy)
        except Exception:  # another torch's signature: the public way, a little slower under compile
            return torch.compiler.disable(fn, recursive=recursive)
        fn._torchdynamo_disable = True  # a traced call of it is a graph break (as for torch.compiler.disable)
        return fn
    return torch.compiler.disable(fn, recursive=recursive)


def python_only(fn: F) -> F:
    """``fn`` (a plain function or closure) and everything it calls run as Python, never traced nor compiled."""
    return _mark(fn, recursive=True)


def opaque(fn: F) -> F:
    """Only ``fn``'s own frame (a plain function or closure) runs as Python; under ``torch.compile`` what it calls is
    compiled as frames of their own."""
    return _mark(fn, recursive=False)


def unwrap(module: Any) -> Any:
    """The module a ``torch.compile`` wrapper (``OptimizedModule``) holds, else ``module`` itself: KJNodes and ComfyUI
    put compiled blocks into the model's block lists for the length of each call."""
    inner = getattr(module, "_orig_mod", None)
    return inner if isinstance(module, nn.Module) and isinstance(inner, nn.Module) else module
