"""The patch under ``torch.compile`` (ComfyUI's ``TorchCompileModel`` of the whole diffusion model, KJNodes' compile of
the transformer blocks only): what dynamo must never trace. (The families see through compiled modules:
:func:`tome_core.families.base.unwrap`.)

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

Both are marked on the function and its code object when a patch is installed: outside ``torch.compile`` they cost
nothing (dynamo's frame hook is not set), and inside it the skip is decided in C from the code object, not per call in
Python as ``torch.compiler.disable(recursive=False)`` does (about 0.3 ms a call on a CPU). On a torch without those
marks (before 2.6) nothing is marked (:data:`SUPPORTED`), so eager runs cost the same; a host that compiles the model
there must let ToMe stand aside (``comfy_tome``: the step cache off, with a note).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

try:  # dynamo's per-code-object frame strategy (torch >= 2.6)
    from torch._dynamo.eval_frame import set_code_exec_strategy
    from torch._dynamo.types import FrameAction, FrameExecStrategy
except Exception:  # older torch (or a dynamo that does not import here): no marks, see SUPPORTED
    set_code_exec_strategy = None

SUPPORTED = set_code_exec_strategy is not None
"""Whether this torch can keep ToMe's decisions out of a compiled graph (torch 2.6 and newer). Without it the marks
are left off, so eager runs pay nothing, and a host that compiles the model must let ToMe stand aside."""


def _mark(fn: F, recursive: bool) -> F:
    """``fn`` marked for dynamo (see the module): its code object skipped (and, ``recursive``, what it calls), a traced
    call of it a graph break. Unmarked where this torch lacks the strategy or its signature differs."""
    if set_code_exec_strategy is not None:
        try:
            strategy = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP if recursive else FrameAction.DEFAULT)
            set_code_exec_strategy(fn.__code__, strategy)
        except Exception:  # another torch's private API: left unmarked, as on an older torch
            return fn
        fn._torchdynamo_disable = True  # a traced call of it is a graph break (as for torch.compiler.disable)
    return fn


def python_only(fn: F) -> F:
    """``fn`` (a plain function or closure) and everything it calls run as Python, never traced nor compiled."""
    return _mark(fn, recursive=True)


def opaque(fn: F) -> F:
    """Only ``fn``'s own frame (a plain function or closure) runs as Python; under ``torch.compile`` what it calls is
    compiled as frames of their own."""
    return _mark(fn, recursive=False)


def python_only_hook(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (a bound method, a hook) as :func:`python_only`: its function is marked, for every instance alike
    (ToMe's hooks never belong in a graph), and the method itself is the hook: no frame in between."""
    python_only(method.__func__)
    return method
