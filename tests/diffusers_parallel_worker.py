"""One rank of tests/test_diffusers_parallel.py: started twice, torchrun-like (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), it joins a gloo process group on the CPU, runs the tiny pipelines of
:mod:`diffusers_pipelines` with diffusers' Ulysses context parallelism and ToMe's step cache, and writes what each
rank saw to ``<out>/rank<r>.pt``: per run its latents, ``cache_stats``, notes, and the adaptive schedule's every
candidate (step, this rank's share of the signal, the signal summed over the ranks, the decision); for the runs with an
error injected on one rank, the error each rank raised; and rank 0 makes one process's runs first, the reference.

    python tests/diffusers_parallel_worker.py <out>
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

FLUX = dict(cache=True, cache_schedule="adaptive", cache_threshold=0.05)
FLUX_CALL = dict(steps=10, text=6)  # context parallelism splits the prompt's tokens too: an even number
WAN = dict(cache=True, cache_schedule="adaptive", cache_threshold=0.05)
WAN_CALL = dict(steps=10, height=64, width=64)  # 2x8x8 latent tokens: each rank's share of the signal is a row


class Injected(RuntimeError):
    """The error injected on one rank."""


def spy_on_schedule() -> tuple[list[tuple], Callable[[], None]]:
    """Every adaptive candidate from now on: ``(step, share, signal, cached)``; and the undo."""
    from tome_core.caching import schedule as S

    seen: list[tuple] = []
    original = S.Schedule.may_cache

    def may_cache(self: Any, call: Any, since_full: int, x: Any, timed: bool = True) -> bool:
        cached = original(self, call, since_full, x, timed)
        if self.adaptive and self.last_signal is not None:
            seen.append((call.step, self.last_share, self.last_signal, cached))
        return cached

    S.Schedule.may_cache = may_cache
    return seen, lambda: setattr(S.Schedule, "may_cache", original)


def parallel(pipe: Any) -> Any:
    from diffusers import ContextParallelConfig

    for model in (pipe.transformer, getattr(pipe, "transformer_2", None)):
        if model is not None:
            model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=dist.get_world_size()))
    return pipe


def run(pipe: Any, call: Any, settings: dict, seen: list, **kwargs: Any) -> dict:
    import tome_core
    from diffusers_tome.parallel import ranks_of

    seen.clear()
    tome_core.apply_patch(pipe, **settings)
    latents = call(pipe, **kwargs)
    patch = tome_core.get_patch(pipe)
    out = {
        "world": ranks_of(pipe.transformer).world,  # the ranks the cache decided with (1: one process)
        "latents": latents,
        "stats": tome_core.cache_stats(pipe),
        "notes": patch.last.note_text if patch.last is not None else "",
        "seen": list(seen),
    }
    tome_core.remove_patch(pipe)
    return out


def alone(pipe: Any, call: Any, settings: dict, seen: list, **kwargs: Any) -> dict:
    """One process's run (no parallelism on the pipeline: the cache meets no one), the reference."""
    return run(pipe, call, settings, seen, **kwargs)


def failing(pipe: Any, call: Any, settings: dict, where: str, step: int, **kwargs: Any) -> dict:
    """A run with the schedule's ``where`` raising on rank 1 at ``step``: which error each rank raised."""
    import tome_core
    from tome_core.caching import schedule as S

    original = getattr(S.Schedule, where)
    rank = dist.get_rank()

    def broken(self: Any, call_: Any, *args: Any, **kw: Any) -> Any:
        if rank == 1 and call_.step == step:
            raise Injected(f"injected in Schedule.{where} on rank 1")
        return original(self, call_, *args, **kw)

    setattr(S.Schedule, where, broken)
    tome_core.apply_patch(pipe, **settings)
    try:
        call(pipe, **kwargs)
        error = None
    except BaseException as e:  # what this rank raised: the injected error, or the other rank's failure
        error = (type(e).__name__, str(e))
    finally:
        setattr(S.Schedule, where, original)
        tome_core.remove_patch(pipe)
    return {"error": error}


def main(out: Path) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # diffusers 0.42.1 places each rank on ``torch.device(accelerator, rank % torch.accelerator.device_count())``,
    # which is 0 on a machine without an accelerator (ZeroDivisionError): one CPU "device" per process
    torch.accelerator.device_count = lambda: 1
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from diffusers_pipelines import flux_call, flux_pipeline, wan_call, wan_pipeline

    seen, _ = spy_on_schedule()
    results: dict[str, Any] = {}
    try:
        if rank == 0:  # one process's runs, the reference (the other rank waits for it at the first collective)
            results["single"] = {
                "flux": alone(flux_pipeline(), flux_call, FLUX, seen, **FLUX_CALL),
                "wan": alone(wan_pipeline(), wan_call, WAN, seen, **WAN_CALL),
            }
        flux = parallel(flux_pipeline())
        results["flux"] = run(flux, flux_call, FLUX, seen, **FLUX_CALL)
        results["wan"] = run(parallel(wan_pipeline()), wan_call, WAN, seen, **WAN_CALL)
        # an error on one rank: in the signal (before the candidate's meeting), then after the decision (a full
        # step's bookkeeping, before the call's last meeting); then the same pipeline once more, clean
        results["fail_signal"] = failing(flux, flux_call, FLUX, "_together", 5, **FLUX_CALL)
        results["fail_full"] = failing(flux, flux_call, FLUX, "full", 4, **FLUX_CALL)
        results["after"] = run(flux, flux_call, FLUX, seen, **FLUX_CALL)
        results["cache_dit"] = cache_dit_beside(seen)
    except BaseException:
        results["crash"] = traceback.format_exc()
        raise
    finally:
        torch.save(results, out / f"rank{rank}.pt")
        dist.destroy_process_group()


def cache_dit_beside(seen: list) -> dict:
    """cache-dit's own Ulysses parallelism and cache on the pipeline, ours asked for too: ours steps aside."""
    import cache_dit
    from cache_dit import DBCacheConfig, ParallelismConfig
    from diffusers_pipelines import flux_call, flux_pipeline

    pipe = flux_pipeline()
    parallelism = ParallelismConfig(ulysses_size=dist.get_world_size())
    cache = DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0)  # the tiny FLUX has 5 blocks in all
    cache_dit.enable_cache(pipe, cache_config=cache, parallelism_config=parallelism)
    return run(pipe, flux_call, FLUX, seen, **FLUX_CALL)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
