"""The caches in their home (issue 51, item 7): each method applied to a real diffusers pipeline through its own API
(ours: ``tome_core.apply_patch(pipe, ...)``; tomesd, DeepCache's ``DeepCacheSDHelper``, cache-dit's
``enable_cache(pipe)``, diffusers' ``transformer.enable_cache(config)``), what each pass executed, and its price at
the real model's width.

* UNets (:mod:`benchmarks.lab.diffusers_unets`): a pass's full and cached steps are counted (ours: from
  ``tome_core.cache_stats``; DeepCache: whether the UNet's mid block computed); a cached step costs what our branch-0
  cached step costs at the real SD1.5/SDXL width at 1024 px (``benchmarks.speed.cache``'s CPU run), DeepCache's as
  well (it skips the same blocks at branch 0), ours with its forecast's extras (``benchmarks.speed.cache_costs``'
  run), as :func:`benchmarks.lab.prices.priced` prices our modes. Merging alone is priced by
  :func:`benchmarks.lab.prices.speedups` (ours ``exact-0.5``, ``tomesd``).
* Transformers (:mod:`benchmarks.lab.diffusers_dits`): ours from its counted steps (:meth:`BlockCosts.priced`), the
  libraries by what their blocks executed (:class:`benchmarks.lab.libraries.Executed`, :func:`~.libraries.priced`).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass

import torch

import tome_core
from benchmarks.lab import libraries as L
from benchmarks.lab import prices
from benchmarks.lab.prices import FORECAST_COSTS, ExtraCosts, StepCosts
from benchmarks.lab.results import load_run_data

# --- UNets ------------------------------------------------------------------------------------------------------------

UNET_METHODS = ("plain", "ours", "ours-N4", "ours-merge", "ours-merge+cache", "tomesd", "deepcache-N3")
"""``ours``: ``apply_patch(pipe, ratio=0, cache=True)`` (its defaults: interval 3, calibrated forecast, time
schedule); ``ours-N<n>``: the same at ``cache_interval=n`` (N=4: at least DeepCache N=3's speed, which runs its last
step cached where ours runs it in full); ``ours-merge``: ``ratio=0.5, use_rand=False``; ``ours-merge+cache``: both; ``tomesd``:
``tomesd.apply_patch(pipe, ratio=0.5)``; ``deepcache-N<n>``: ``DeepCacheSDHelper`` at ``cache_interval=n``,
``cache_branch_id=0``."""
MERGE = dict(ratio=0.5, use_rand=False)


class UNetSteps:
    """Counts a diffusers UNet's calls and those that computed its mid block (a full step; DeepCache's cached calls
    return the mid block's kept output without running it)."""

    def __init__(self, unet: torch.nn.Module) -> None:
        self.calls = self.full = 0
        self._handles = [
            unet.register_forward_pre_hook(lambda *_: self._call()),
            unet.mid_block.resnets[0].register_forward_hook(lambda *_: self._full()),
        ]

    def _call(self) -> None:
        self.calls += 1

    def _full(self) -> None:
        self.full += 1

    def counts(self) -> dict[str, int]:
        return {"full": self.full, "cached": self.calls - self.full}

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


@contextlib.contextmanager
def unet_applied(pipe, method: str) -> Iterator[dict]:
    """``method`` (:data:`UNET_METHODS`) on the diffusers pipeline ``pipe`` for the ``with`` block, removed after;
    yields a dict that holds the pass's step ``counts`` (full, cached) once the block ends."""
    import tomesd
    from DeepCache import DeepCacheSDHelper

    out: dict = {}
    steps = UNetSteps(pipe.unet)
    helper = None
    try:
        if method == "ours":
            tome_core.apply_patch(pipe, ratio=0.0, cache=True)
        elif method.startswith("ours-N"):
            tome_core.apply_patch(pipe, ratio=0.0, cache=True, cache_interval=int(method.removeprefix("ours-N")))
        elif method == "ours-merge":
            tome_core.apply_patch(pipe, **MERGE)
        elif method == "ours-merge+cache":
            tome_core.apply_patch(pipe, **MERGE, cache=True)
        elif method == "tomesd":
            tomesd.apply_patch(pipe, ratio=0.5)
        elif method.startswith("deepcache-N"):
            helper = DeepCacheSDHelper(pipe=pipe)
            helper.set_params(cache_interval=int(method.removeprefix("deepcache-N")), cache_branch_id=0)
            helper.enable()
        elif method != "plain":
            raise ValueError(f"unknown method {method!r}")
        yield out
        if method in ("ours", "ours-merge+cache") or method.startswith("ours-N"):
            stats = tome_core.cache_stats(pipe)
            out["counts"] = {"full": stats[-1]["full"], "cached": stats[-1]["cached"]}
        else:
            out["counts"] = steps.counts()
    finally:
        steps.remove()
        if helper is not None:
            helper.disable()
        if method == "tomesd":
            tomesd.remove_patch(pipe)
        elif method.startswith("ours"):
            tome_core.remove_patch(pipe)


def _real(run: str, record, layout: str):
    results, _ = load_run_data(run)
    for data in results:
        found = record(**data)
        if found.config.get("real") and found.config["layout"] == layout and found.config["px"] == 1024:
            return found
    raise FileNotFoundError(f"{run}: no real-width {layout} run at 1024 px")


def unet_priced(layout: str, method: str, counts: dict[str, int]) -> float:
    """The speed-up over plain at the real width at 1024 px of a pass of ``method`` whose steps were ``counts``
    (see the module). Merging alone: :func:`benchmarks.lab.prices.speedups`'. ``apply_patch``'s merging
    (``max_downsample`` 1) merges nothing on :data:`benchmarks.lab.prices.FIRST_LEVEL_EMPTY` layouts (SDXL), as
    tomesd: priced 1 there, the cache's steps at the plain costs."""
    costs, extra = _real("cache-cpu", StepCosts, layout), _real("cache-costs-cpu", ExtraCosts, layout)
    if method == "plain":
        return 1.0
    merges = layout not in prices.FIRST_LEVEL_EMPTY
    if method in ("tomesd", "ours-merge"):
        return prices.speedups(layout)["tomesd" if method == "tomesd" else "exact-0.5"] if merges else 1.0
    tome = "exact-0.5" if method == "ours-merge+cache" and merges else "plain"
    plain = costs.cost("full", "plain")
    full, cached = costs.cost("full", tome), costs.cost("cached", tome)
    if method.startswith("ours"):  # the calibrated forecast (the UNets' default): its update and its forecast
        update, predict = FORECAST_COSTS["calibrated"]
        full, cached = full + extra.cost(update), cached + extra.cost(predict)
    steps = counts["full"] + counts["cached"]
    return steps * plain / (counts["full"] * full + counts["cached"] * cached)


# --- transformers -----------------------------------------------------------------------------------------------------

DIT_METHODS = ("fbcache", "taylorseer", "magcache", "pab")
"""diffusers' own caches, each run at one setting of :func:`benchmarks.lab.libraries.settings` (see
:func:`picked`). FasterCache is not among them: it reads each call's batch as [uncond, cond] (pipelines that batch
CFG, as CogVideoX's), and ``WanPipeline`` calls cond and uncond apart, one image each: diffusers 0.42.1 raises
``IndexError: tuple index out of range`` (``faster_cache.py``, ``cache_output.chunk(2, dim=0)[1]``) at its first
skipped attention."""


@dataclass(frozen=True)
class DitRun:
    """One run on a transformer pipeline: ``name``, the ``library`` whose pipeline copy runs it (``ours`` runs on the
    plain copy), and its :class:`~benchmarks.lab.libraries.Setting` (None: ours, plain or cache-dit's defaults)."""

    name: str
    library: str
    setting: L.Setting | None = None


def picked(transformer: str, steps: int, recorded: dict | None) -> list[DitRun]:
    """The transformer runs: plain, ours at its defaults, cache-dit at its defaults and at its best recorded setting,
    and each of diffusers' caches (:data:`DIT_METHODS`) at one setting. ``recorded``: the ``dit_libraries`` run of this model (its results); the best setting is
    the one of the highest PSNR at our default's recorded speed (``ours-N3``, N=3 the default) or faster, on that
    run's 64 seeds for cache-dit (its frontier) and on its 8-seed sweep for diffusers' (the fastest where none is that
    fast). Without ``recorded`` (a quick run) each method's first setting of the sweep."""
    menu = {s.name: s for s in L.settings(steps, transformer)}
    runs = [DitRun("plain", "ours"), DitRun("ours", "ours"), DitRun("cache-dit default", "cache-dit")]

    def best(rows: list[dict], target: float) -> dict:
        fast = [r for r in rows if r["speed"] >= target]
        return max(fast, key=lambda r: r["psnr"]) if fast else max(rows, key=lambda r: r["speed"])

    target = recorded["final"]["ours-N3"]["speed"] if recorded else 0.0
    if recorded:
        cache_dit = [r for r in recorded["final"].values() if r["library"] == "cache-dit"]
        choice = menu[best(cache_dit, target)["name"]]
    else:
        choice = next(s for s in menu.values() if s.library == "cache-dit")
    runs.append(DitRun("cache-dit best", "cache-dit", choice))
    for method in DIT_METHODS:
        rows = [s for s in menu.values() if s.library == "diffusers" and s.method == method]
        if not rows:
            continue
        if recorded:
            swept = [r for r in recorded["sweep"] if r["name"] in {s.name for s in rows}]
            setting = menu[best(swept, target)["name"]]
        else:
            setting = rows[0]
        runs.append(DitRun(f"diffusers {method}", "diffusers", setting))
    return runs


def _cache_dit_on(pipe, steps: int, p: dict | None) -> None:
    """cache-dit on the pipeline: its defaults (``p`` None), else the setting's DBCache with cond and uncond as the
    separate calls the pipeline makes."""
    import cache_dit

    with contextlib.redirect_stdout(io.StringIO()):
        if p is None:
            cache_dit.enable_cache(pipe)
        else:
            config, calibrator = L.cache_dit_configs(steps, p, separate_cfg=True)
            cache_dit.enable_cache(pipe, cache_config=config, calibrator_config=calibrator)
    L._quiet()


@contextlib.contextmanager
def dit_applied(pipe, run: DitRun, steps: int, costs, ratios: list[float] | None) -> Iterator[dict]:
    """``run`` on the transformer pipeline ``pipe`` for the ``with`` block, removed after; yields a dict that holds
    the pass's priced ``speed`` (at the real width ``costs`` prices) once the block ends."""
    out: dict = {}
    transformer = pipe.transformer
    if run.name in ("plain", "ours"):
        if run.name == "ours":
            tome_core.apply_patch(pipe, ratio=0.0, cache=True)
        try:
            yield out
            stats = tome_core.cache_stats(pipe) if run.name == "ours" else []
            counts = {"full": stats[-1]["full"], "cached": stats[-1]["cached"]} if stats else {"full": steps}
            out["speed"] = costs.priced(counts)
            out["counts"] = counts
        finally:
            if run.name == "ours":
                tome_core.remove_patch(pipe)
        return
    executed = L.Executed(transformer)
    try:
        if run.library == "cache-dit":
            import cache_dit

            _cache_dit_on(pipe, steps, None if run.setting is None else dict(run.setting.params))
            try:
                yield out
            finally:
                with contextlib.redirect_stdout(io.StringIO()):
                    cache_dit.disable_cache(pipe)
            overhead = L.Overhead(signal=True) if run.setting is None else run.setting.overhead
        else:
            with run.setting.applied(transformer, steps, ratios):
                yield out
            overhead = run.setting.overhead
        out["speed"] = L.priced(executed, costs, overhead)
    finally:
        executed.remove()
