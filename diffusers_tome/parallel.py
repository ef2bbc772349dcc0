"""The step cache under diffusers' parallelism: a transformer given ``enable_parallelism(config=ContextParallelConfig(
ulysses_degree=...))`` (or ``ring_degree``, or a ``TensorParallelConfig``) runs each call on every rank of its mesh,
and the cache on each rank must decide as the others do (:mod:`tome_core.caching.ranks`).

diffusers records the parallel set-up on the model (``ModelMixin._parallel_config``, a ``ParallelConfig`` whose
``context_parallel_config._flattened_mesh`` spans the ring and Ulysses ranks, or whose ``tensor_parallel_config._mesh``
the tensor-parallel ones; ``_device``: this rank's device). :func:`ranks_of` reads it, duck-typed (no diffusers
import), into the core's :class:`~tome_core.caching.ranks.Ranks`: a sum over that mesh's process group. Where nothing is
recorded, or the mesh is one rank, the cache is alone and meets no one.

Our root hook runs before diffusers' split of the inputs (its hooks wrap the model's ``forward``; ours are forward
pre-hooks), so every rank reads the whole input; each measures its share of the adaptive signal
(:meth:`~tome_core.caching.ranks.Ranks.share`), and the ranks sum them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tome_core.caching.ranks import ALONE, Ranks


def _mesh(model: Any) -> Any:
    """The device mesh of the ranks that run ``model``'s calls together, or None."""
    config = getattr(model, "_parallel_config", None)
    if config is None:
        return None
    context = getattr(config, "context_parallel_config", None)
    if context is not None:
        return getattr(context, "_flattened_mesh", None)
    tensor = getattr(config, "tensor_parallel_config", None)
    return getattr(tensor, "_mesh", None) if tensor is not None else None


def ranks_of(model: Any) -> Ranks:
    """The ranks that run ``model``'s calls together under diffusers' parallelism, as the core's cache meets them;
    :data:`~tome_core.caching.ranks.ALONE` without any."""
    mesh = _mesh(model)
    if mesh is None or not dist.is_available() or not dist.is_initialized() or mesh.size() <= 1:
        return ALONE
    group = mesh.get_group()
    device = getattr(getattr(model, "_parallel_config", None), "_device", None)

    def reduce(values: torch.Tensor) -> torch.Tensor:
        values = values.to(device) if device is not None else values
        dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
        return values

    return Ranks(mesh.size(), mesh.get_local_rank(), reduce)


def join(session: Any, model: Any) -> None:
    """Hand ``session``'s step cache (if any) the ranks that run ``model`` with this process."""
    cache = getattr(session, "cache", None)
    if cache is not None:
        cache.set_ranks(ranks_of(model))
