"""Where a transformer block's tokens sit in the latent, and the merge plans over them.

A block's grid is the live one of its ``SpatialTransformer`` when its token count is that grid's; its level (what
``max_downsample`` and ToDo's factor read) is the latent-size level of that grid, or, for a grid resized inside the
UNet, the nearest power of two by area. Without a live grid the level and grid come from the token count against the
latent size of the call; a call whose token count fits neither gets no plan (:class:`Planner` tells its owner).

Plan reuse: with ``share_plan`` the first block of each UNet level computes the plan and the level's other blocks of
that forward reuse it; with ``plan_interval = k`` a plan is recomputed only every ``k`` sampling steps. Steps are told
apart by the reported progress (or, without one, the timestep: :class:`~tome_core.steps.StepClock`); the UNet calls of
one step are numbered, so separate cond and uncond calls each reuse their own plan. With ``use_rand`` each block's
partition is drawn from a generator seeded from the settings' seed, the step's key and the block: the same in every
process, shared by the cond and uncond calls of one step, never from global RNG state.

:class:`~tome_core.merging.merger.TokenMerger` owns one :class:`Planner`, which starts each UNet call's
:class:`MergeCall` (:meth:`Planner.begin`): token merging's per-call context.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..settings import ToMeSettings
from ..steps import Call
from . import merge as tm

_MAX_LEVELS = 8

Geometry = tuple[int, int, int]
"""``(downsample, h, w)``: a block's level and token grid."""


def level_sizes(h: int, w: int) -> Iterator[Geometry]:
    """``(downsample, h, w)`` of each UNet level: stride-2 convolutions with padding 1 round up."""
    for k in range(_MAX_LEVELS):
        yield 2**k, h, w
        h, w = (h + 1) // 2, (w + 1) // 2


def _mix(*values: int) -> int:
    """A stable 63-bit mix of integers (splitmix64), identical in every process."""
    z = 0x9E3779B97F4A7C15
    for v in values:
        z = (z ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        z = (z ^ (z >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        z ^= z >> 31
    return z & 0x7FFFFFFFFFFFFFFF


def _bits(value: float | None) -> int:
    """The bits of a float (0 for none): the cond and uncond passes of one step share their timestep."""
    return 0 if value is None else struct.unpack("<q", struct.pack("<d", value))[0]


@dataclass
class BlockCall:
    """One running transformer block: its input and, once needed, its merge plan."""

    block: nn.Module
    x: torch.Tensor
    ordinal: int  # the block's index in ``TokenMerger.blocks``: its plan slot and partition key
    grid: tuple[int, int] | None = None  # the live h x w of its SpatialTransformer's input, when known
    plan: tm.MergePlan | None = None
    planned: bool = False
    attn1_ran: bool = False


@dataclass
class MergeCall:
    """Token merging's context of one call of the model: everything the hooks of that call read and write, made afresh
    for each call (:meth:`Planner.begin`), so nothing of one call leaks into the next."""

    call: Call | None = None  # where the call sits in the sampling (step, call in step)
    size: tuple[int, int] | None = None  # the latent size: the call's, or the last one known
    key: int = 0  # the key of its random partitions (``use_rand``)
    active: bool = True  # inside the step schedule
    block: BlockCall | None = None  # the transformer block running now
    grids: dict[int, tuple[int, int]] = field(default_factory=dict)  # SpatialTransformer -> h x w while it runs
    plans: dict[int, Any] = field(default_factory=dict)  # attention/MLP module running now -> its plan to unmerge


@dataclass
class _CachedPlan:
    step: int  # step index at which the plan was computed
    plan: tm.MergePlan


class Planner:
    """The geometry and merge plans of one patched model. ``on_unfit(ordinal, num_tokens)`` is told of a block whose
    token count fits no grid (it then runs unmerged)."""

    def __init__(self, root: nn.Module, settings: ToMeSettings, on_unfit: Callable[[int, int], None]):
        self.settings = settings
        self.on_unfit = on_unfit
        self.auto_downsample = _auto_downsample(root)
        self.plans_computed = 0  # merge plans computed so far (plan reuse is measured by it)
        self.freeze_plans = False  # measurement aid: reuse every cached plan forever (the benchmark's "limit")
        self._partitions: dict[tuple, tm.Partition] = {}
        self._plans: dict[tuple, _CachedPlan] = {}

    def begin(self, call: Call, before: MergeCall) -> MergeCall:
        """A UNet call starts (``before``: the last one's context): its context, with its latent size and its
        partitions' key; a new pass drops the plans kept for reuse."""
        if call.restarted and not self.freeze_plans:
            self._plans.clear()
        key = _mix(max(self.settings.seed, 0), _bits(call.key)) if self.settings.use_rand else 0
        return MergeCall(call, call.size if call.size is not None else before.size, key)

    # --- levels ---------------------------------------------------------------------------------
    def highest_level(self, level_downsample: int) -> int:
        """Downsample of the highest-resolution level with transformer blocks: from the module's configuration
        (:func:`_auto_downsample`), else the level of the first block seen (the first block of a forward is the
        highest level)."""
        if self.auto_downsample is None:
            self.auto_downsample = level_downsample
        return self.auto_downsample

    def max_downsample(self, level_downsample: int) -> int:
        md = self.settings.max_downsample
        return self.highest_level(level_downsample) if md == "auto" else int(md)

    def kv_factor(self, downsample: int) -> int:
        """Key/value subsampling factor per side at a level (ToDo): ``downsample_factor`` at the highest-resolution
        level with transformer blocks, halved per level below it (at least 1), 1 above ``max_downsample``."""
        if downsample > self.max_downsample(downsample):
            return 1
        base = self.highest_level(downsample)
        return max(1, self.settings.downsample_factor * base // max(downsample, base))

    def geometry(self, num_tokens: int, grid: tuple[int, int] | None, size: tuple[int, int] | None) -> Geometry | None:
        """``(downsample, h, w)`` of a block call's ``num_tokens`` tokens in a latent of ``size``: its live ``grid`` if
        that has as many tokens, with the level of :meth:`_level_of`; else the level of the latent size with that many
        tokens; None if neither fits."""
        if grid is not None and grid[0] * grid[1] == num_tokens and size is not None:
            return (_level_of(grid, size), *grid)
        if size is not None:
            for level in level_sizes(*size):
                if level[1] * level[2] == num_tokens:
                    return level
        return None

    # --- plans ----------------------------------------------------------------------------------
    @property
    def reuses(self) -> bool:
        """Whether plans are kept for reuse."""
        s = self.settings
        return self.freeze_plans or s.share_plan or s.plan_interval > 1

    def plan(self, now: MergeCall, block: BlockCall) -> tm.MergePlan | None:
        """The merge plan of ``block``'s input in the call ``now``: computed, or reused."""
        x, ordinal = block.x, block.ordinal
        if not self.reuses:
            return self._make(now, block)
        s = self.settings
        n, b = x.shape[1], x.shape[0]
        slot = ("level", n) if s.share_plan else ("block", ordinal)
        call_in_step = now.call.index if now.call is not None else 0
        key = (0 if self.freeze_plans else call_in_step, *slot)
        cached = self._plans.get(key)
        fits = cached is not None and cached.plan.num_tokens == n and cached.plan.batch == b
        step = now.call.step if now.call is not None else 0
        if fits and (self.freeze_plans or step - cached.step < s.plan_interval):
            return cached.plan
        plan = self._make(now, block)
        if plan is not None:
            self._plans[key] = _CachedPlan(step, plan)
        return plan

    def _make(self, now: MergeCall, block: BlockCall) -> tm.MergePlan | None:
        s, x, ordinal = self.settings, block.x, block.ordinal
        geometry = self.geometry(x.shape[1], block.grid, now.size)
        if geometry is None:
            self.on_unfit(ordinal, x.shape[1])
            return None
        downsample, h, w = geometry
        if downsample > self.max_downsample(downsample):
            return None
        r = int(x.shape[1] * s.ratio)
        if r <= 0:
            return None
        part = self._partition(h, w, x.device, ordinal, now.key)
        if part.dst.numel() == 0:
            return None
        self.plans_computed += 1
        return tm.plan_merge(x, part, r)

    def _partition(self, h: int, w: int, device: torch.device, ordinal: int, key: int) -> tm.Partition:
        s = self.settings
        if not s.use_rand:
            key = (h, w, s.sx, s.sy, device)
            if key not in self._partitions:
                self._partitions[key] = tm.make_partition(h, w, s.sx, s.sy, None, device)
            return self._partitions[key]
        generator = torch.Generator().manual_seed(_mix(key, ordinal))
        return tm.make_partition(h, w, s.sx, s.sy, generator, device)


def _level_of(grid: tuple[int, int], size: tuple[int, int]) -> int:
    """The downsample of a live grid in a latent of ``size``: the latent-size level of that size, else (features resized
    inside the UNet) the power of two nearest to the latent-to-grid ratio by area (at least 1)."""
    for downsample, h, w in level_sizes(*size):
        if (h, w) == grid:
            return downsample
    ratio = math.sqrt(size[0] * size[1] / max(grid[0] * grid[1], 1))
    return 2 ** max(0, round(math.log2(ratio)))


def _auto_downsample(root: nn.Module) -> int | None:
    """The highest level with transformer blocks, from the module's configuration: ldm's ``attention_resolutions``,
    else Forge's ``config`` (:func:`_first_level_with_blocks`); None when neither says (the first block seen
    decides)."""
    res = getattr(root, "attention_resolutions", None)
    try:
        values = [int(v) for v in res] if res is not None else []
    except (TypeError, ValueError):
        values = []
    return min(values) if values else _first_level_with_blocks(root)


def _first_level_with_blocks(root: nn.Module) -> int | None:
    """Downsample factor of the highest level with transformer blocks from a Forge-style ``config``
    (huggingface_guess's: ``transformer_depth`` per input res-block, ``num_res_blocks``, ``channel_mult``),
    or the same attributes on the module; None when they are missing or do not add up."""
    config = getattr(root, "config", None)
    config = config if isinstance(config, Mapping) else {}
    depth, nrb, mult = (
        config.get(k, getattr(root, k, None)) for k in ("transformer_depth", "num_res_blocks", "channel_mult")
    )
    try:
        depth = [int(d) for d in depth]
        nrb = [int(nrb)] * len(mult) if isinstance(nrb, int) else [int(n) for n in nrb]
    except (TypeError, ValueError):
        return None
    if sum(nrb) != len(depth):
        return None
    start = 0
    for level, count in enumerate(nrb):
        if any(depth[start : start + count]):
            return 2**level
        start += count
    return None
