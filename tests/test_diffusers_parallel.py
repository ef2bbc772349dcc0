"""The step cache under diffusers' context parallelism (Ulysses, 2 gloo processes on the CPU): every rank makes the
same decisions as the others and as one process does, its output is one process's, and an error on one rank is an
error on both (tests/diffusers_parallel_worker.py runs the ranks; issue 51, "Past one GPU")."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import diffusers_parallel_worker as worker
import pytest
import torch

from tome_core.caching.ranks import ALONE, Ranks, RanksFailed

WORLD = 2
TIMEOUT = 150  # seconds for both ranks, every run included: past it they hang, and are killed
TOLERANCE = 1e-5  # max |diff| from one process's latents (float32 sums in another order)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The two ranks' results (started torchrun-like, on a port of their own), and one process's runs (rank 0's,
    before its parallel ones)."""
    out = tmp_path_factory.mktemp("ranks")
    env = {**os.environ, "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    script = Path(worker.__file__)
    start = time.monotonic()
    with contextlib.ExitStack() as files:
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(out)],
                env={**env, "RANK": str(rank)},
                stdout=files.enter_context(open(out / f"log{rank}", "w")),
                stderr=subprocess.STDOUT,
            )
            for rank in range(WORLD)
        ]
        try:
            codes = [p.wait(timeout=max(1.0, TIMEOUT - (time.monotonic() - start))) for p in procs]
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            logs = "\n".join((out / f"log{r}").read_text()[-2000:] for r in range(WORLD))
            pytest.fail(f"the ranks hung past {TIMEOUT} s:\n{logs}")
    results = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    for rank, (code, result) in enumerate(zip(codes, results)):
        assert code == 0 and "crash" not in result, result.get("crash") or (out / f"log{rank}").read_text()[-4000:]
    return {"ranks": results, "single": results[0]["single"]}


@pytest.mark.parametrize("model", ["flux", "wan"])
def test_ranks_decide_as_one_process(ranks: dict, model: str) -> None:
    """Each rank measures its own share of the adaptive signal, and the shares differ; summed over the ranks, every
    rank sees the same signal as one process, makes the same full and cached steps, and the latents are one
    process's."""
    mine, theirs = (r[model] for r in ranks["ranks"])
    single = ranks["single"][model]
    assert mine["world"] == theirs["world"] == WORLD and single["world"] == 1
    assert mine["seen"] and len(mine["seen"]) == len(theirs["seen"]) == len(single["seen"])
    for a, b, one in zip(mine["seen"], theirs["seen"], single["seen"]):  # (step, share, signal, cached)
        assert a[0] == b[0] == one[0] and a[3] == b[3] == one[3]
        assert a[2] == b[2]  # the one sum every rank read back
        assert a[2] == pytest.approx(one[2], rel=1e-5)
    shares = [(a[1], b[1]) for a, b in zip(mine["seen"], theirs["seen"])]
    assert all(abs(a - b) > 1e-4 for a, b in shares)  # each rank's own share of the signal is another number
    if model == "flux":  # at threshold 0.05 the ranks' shares alone would have decided step 1 apart
        threshold = worker.FLUX["cache_threshold"]
        assert any((a < threshold) != (b < threshold) for a, b in shares)
    assert mine["stats"] == theirs["stats"] == single["stats"]
    assert 0 < single["stats"][0]["cached"] < sum(single["stats"][0].values())
    for result in (mine, theirs):
        assert (result["latents"] - single["latents"]).abs().max().item() < TOLERANCE


def test_an_error_on_one_rank_is_an_error_on_both(ranks: dict) -> None:
    """An error raised on rank 1, in the adaptive signal (before the ranks' meeting at a candidate step) or after the
    decision (a full step's bookkeeping), surfaces on rank 0 too (:class:`RanksFailed`), neither hangs (the fixture's
    timeout), and the next generation on the same process group is the clean one's."""
    first, second = ranks["ranks"]
    for run in ("fail_signal", "fail_full"):
        assert second[run]["error"][0] == "Injected"
        assert first[run]["error"][0] == "RanksFailed" and "rank 1 of 2 failed" in first[run]["error"][1]
    for result in (first, second):
        assert torch.equal(result["after"]["latents"], result["flux"]["latents"])
        assert result["after"]["seen"] == result["flux"]["seen"]


def test_cache_dit_parallel_and_cache_beside_ours(ranks: dict) -> None:
    """cache-dit's own Ulysses parallelism and cache on the pipeline: our cache, asked for too, steps aside, named."""
    for result in ranks["ranks"]:
        assert "step cache off: cache-dit already caches transformer" in result["cache_dit"]["notes"]
        assert result["cache_dit"]["stats"] == [] and not result["cache_dit"]["seen"]


class _Pair:
    """Two ranks in one process for :class:`Ranks`' own logic: each meeting's sum is this rank's values plus the
    other's, given ahead."""

    def __init__(self, other: list[float]):
        self.other = torch.tensor(other, dtype=torch.float64)

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        return values + self.other


def test_ranks_meet() -> None:
    """The sums, the failure flags (``[num, den, missing, failed on rank 0, failed on rank 1]``), and alone."""
    assert ALONE.meet((1.0, 2.0)) == [1.0, 2.0] and ALONE.share(t := torch.ones(4, 4)) is t
    with pytest.raises(KeyError):
        ALONE.meet(error=KeyError("mine"))
    ranks = Ranks(2, 1, _Pair([3.0, 4.0, 0.0, 0.0, 0.0]))
    assert ranks.meet(torch.tensor([1.0, 2.0, 0.0])) == [4.0, 6.0, 0.0]
    assert ranks.share(torch.arange(8.0).reshape(4, 2)).tolist() == [[4.0, 5.0], [6.0, 7.0]]
    failed = Ranks(2, 1, _Pair([0.0, 0.0, 0.0, 1.0, 0.0]))  # rank 0 failed
    with pytest.raises(RanksFailed, match="rank 0 of 2 failed"):
        failed.meet((1.0, 2.0))
    with pytest.raises(RanksFailed, match="earlier"):  # no second meeting: the other rank has left
        failed.meet()
    with pytest.raises(KeyError):  # this rank's own error, once the other knows
        Ranks(2, 0, _Pair([0.0] * 5)).meet(error=KeyError("mine"))
    with pytest.raises(ValueError):
        Ranks(2, 0)
