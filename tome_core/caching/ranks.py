"""The step cache on several processes that run each call of one model together (context parallelism: Ulysses or ring
attention, each rank on its shard of the tokens), which must all decide alike: a cached step skips blocks, and with
them the collectives inside them (Ulysses' all-to-alls), so one rank caching a step that another runs in full leaves
that one waiting in a collective for ever.

:class:`Ranks` is how the cache meets the other ranks; the default, :data:`ALONE`, is one process and costs nothing.
A host that runs the model under a process group hands the cache one that sums over that group (the diffusers
adapter: :mod:`diffusers_tome.parallel`); the core knows no host and no ``torch.distributed`` set-up.

* **The adaptive schedule's signal** (:mod:`.schedule`): each rank measures its own share of the subsampled input
  (:meth:`Ranks.share`) and the ranks sum the relative L1 distance's numerator and denominator before dividing (as
  cache-dit and xDiT all-reduce theirs), so every rank compares the whole input's distance with the threshold: the
  same number, the same decision.
* **Errors**: every call the cache places ends with a meeting (:meth:`Ranks.meet`, one all-reduce of a few numbers)
  that carries, beside the sums, whether each rank failed. A rank whose decision raised still comes to the meeting
  (with its flag up) and then raises its own error; the others raise :class:`RanksFailed` naming it. No rank goes on
  into the model's collectives while another has left. What the cache cannot see, a rank failing inside the model or
  between calls, leaves the others in the next collective until the process group's timeout, as in any
  ``torch.distributed`` program.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

SLOTS = 3
"""The values a meeting sums (the adaptive signal's numerator and denominator, and how many ranks had no forecast to
measure it against), before each rank's failure flag."""


class RanksFailed(RuntimeError):
    """Another rank's step cache failed at the meeting of this call: this rank stops too, rather than wait."""


class Ranks:
    """This process among the ``world`` ranks that run each call of the model together (see the module).

    ``reduce`` sums a small float64 tensor over the ranks (an all-reduce) and returns the sum; the host that makes the
    ranks gives it, on its process group."""

    def __init__(self, world: int = 1, rank: int = 0, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if world > 1 and reduce is None:
            raise ValueError("Ranks: several ranks need a reduce (a sum over their process group)")
        self.world, self.rank = int(world), int(rank)
        self._reduce = reduce
        self.broken = False  # a meeting saw a rank fail: no rank meets again (each has raised)
        self.met = 0  # meetings so far (for tests: every rank has the same count)

    def share(self, signal: torch.Tensor) -> torch.Tensor:
        """This rank's share of ``signal`` (a slice of its next-to-last dimension; the whole of it when alone)."""
        if self.world == 1:
            return signal
        return torch.tensor_split(signal, self.world, dim=-2)[self.rank]

    def meet(self, values: torch.Tensor | Sequence[float] = (), error: BaseException | None = None) -> list[float]:
        """Meet the other ranks: ``values`` (at most :data:`SLOTS`; a tensor stays on its device for the sum) summed
        over them, read back once; or, where any rank failed (this one: ``error``), an exception on every rank — this
        rank's own ``error``, else :class:`RanksFailed`. Alone: ``values`` as they are (or ``error`` raised)."""
        if self.world == 1:
            if error is not None:
                raise error
            return [float(v) for v in values]
        if self.broken:
            raise RanksFailed("ToMe: step cache: a rank failed earlier in this pass")
        device = values.device if isinstance(values, torch.Tensor) else None
        mine = torch.zeros(SLOTS + self.world, dtype=torch.float64, device=device)  # one layout: any two meetings pair
        if len(values):
            given = torch.as_tensor(values, dtype=torch.float64, device=device).flatten()
            if given.numel() > SLOTS:
                raise ValueError(f"Ranks.meet: at most {SLOTS} values")
            mine[: given.numel()] = given
        mine[SLOTS + self.rank] = 1.0 if error is not None else 0.0
        self.met += 1
        total = [float(v) for v in self._reduce(mine).double().cpu()]
        failed = [r for r in range(self.world) if total[SLOTS + r] > 0]
        if failed:
            self.broken = True
            if error is not None:
                raise error
            ranks = ", ".join(map(str, failed))
            raise RanksFailed(f"ToMe: step cache: rank {ranks} of {self.world} failed (its error is raised there)")
        return total[: len(values)]


ALONE = Ranks()
"""One process: the cache meets no one."""
