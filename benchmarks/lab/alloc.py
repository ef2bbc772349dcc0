"""Counting the bytes that torch code allocates, on any device, without timing or allocator statistics.

:class:`AllocationTracker` is a ``TorchDispatchMode``: it sees the output of every aten operation run
inside it, adds the bytes of each *new* storage (not views of, or writes into, storages that already
existed) to a running total, and subtracts them when the storage is freed (a weak-reference
finaliser on the storage object, which torch keeps alive exactly as long as the storage). It records
the peak of that total and the largest single allocation. Tensors that exist before entering
(inputs) are not counted. Used by the tests and the benchmark to measure the merge plan's memory.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class AllocationTracker(TorchDispatchMode):
    """``with AllocationTracker() as t: ...``, then ``t.peak_bytes``, ``t.largest_bytes``, ``t.count``."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.largest_bytes = 0
        self.count = 0
        self._live: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {
            id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.numel()
        }
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                continue
            storage = t.untyped_storage()
            key = id(storage)
            if key in inputs or key in self._live:
                continue  # a view of, or a write into, memory that is already there
            nbytes = storage.nbytes()
            self._live[key] = nbytes
            weakref.finalize(storage, self._free, key)
            self.count += 1
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            self.largest_bytes = max(self.largest_bytes, nbytes)
        return out
