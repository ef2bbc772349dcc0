"""Token merging, one of the session's two capabilities: hooks on a UNet's transformer blocks (ldm, sgm, or anything
with the same block layout: :func:`tome_core.families.transformer_blocks`).

The capability is made only of PyTorch hooks, so the module tree, the classes and ``state_dict()`` stay as they are
and other extensions that address modules by name (LoRA) or replace a block's ``_forward`` on the instance
(ControlNet's reference-only) keep working:

* a forward pre/post-hook pair on each module holding transformer blocks (ldm/sgm/Forge ``SpatialTransformer``)
  records the ``h x w`` grid of its 4-D input while it runs: the token grid of its blocks, read from the live
  input, so that features resized inside the UNet (Kohya's HRFix / Deep Shrink) are merged as the grid they are;
* a forward pre/post-hook pair on each transformer block marks the block input ``x`` whose tokens
  the merge plan is computed from: lazily in ``attn1``'s pre-hook when ``attn1`` is the only merge target,
  else in the block's pre-hook, since Forge's / ComfyUI's blocks add into ``x`` in place (``x += n``)
  before ``attn2`` and ``ff`` run;
* forward pre/post-hooks on ``attn1`` / ``attn2`` / ``ff`` merge their input (first positional, or ``x=``) and unmerge
  their output (``method="merge"``), or a pre-hook on a self-attention ``attn1`` passes ``context=`` its input
  with the token grid subsampled, so that keys and values are downsampled and queries kept
  (``method="downsample"``, ToDo). When keys/values reach ``attn1`` as ``context=``/``value=`` (a Forge
  ``attn1_patch`` sets both to the block's ``n``): the very input tensor is merged (or downsampled) with
  it, as if they had not been given; other full-length ones leave only the queries merged (ToDo: nothing),
  which :meth:`TokenMerger.report` counts.

Step schedule: merging is active while ``start <= progress < end`` (``end == 1`` includes the last step), the
progress of the call as the session placed it (:class:`~tome_core.steps.StepClock`). An inactive call touches
nothing, so it is bit-identical to the unpatched model.

Merge plans, and the level and token grid of a block's tokens they are made on, come from
:class:`~tome_core.merging.planning.Planner` (plan reuse, random partitions from the seed).

Under ``torch.compile`` every hook runs as Python, out of any graph (:mod:`tome_core.compiling`): the merge and unmerge
run between the compiled parts of a block (its attention, its MLP), never replayed from a graph traced at another step.

Another extension that takes an attention layer over (:mod:`.neighbours`: Hypertile's tiling, Mikubill's
ControlNet-LLLite, a module that is no attention any more) gets that layer's input as it is, per call, and the
report says where. A block whose ``attn1``/``attn2``/``ff`` was swapped for another module since the patch was
applied (Forge's object patches, applied when sampling starts and taken off at the next model load) gets the hooks
moved to the module it holds now, at its next call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..compiling import python_only, python_only_hook
from ..families import block_holders
from ..report import MergeReport
from ..settings import ToMeSettings
from ..steps import Call
from . import merge as tm
from . import neighbours
from .planning import BlockCall, MergeCall, Planner

log = logging.getLogger("tome_core")

_TARGETS = (("attn1", "merge_attn"), ("attn2", "merge_crossattn"), ("ff", "merge_mlp"))


@dataclass
class _Shortfalls:
    """The sets behind :class:`MergeReport`: indices into ``TokenMerger.blocks``."""

    attn1_skipped: set[int] = field(default_factory=set)
    query_only: set[int] = field(default_factory=set)
    todo_off: set[int] = field(default_factory=set)
    unfit: set[int] = field(default_factory=set)
    aside: dict[tuple[str, str], set[int]] = field(default_factory=dict)  # (layer, reason) -> blocks


_LAYERS = {"attn1": "self-attention", "attn2": "cross-attention", "ff": "MLP"}


class TokenMerger:
    """Token merging on the transformer ``blocks`` of one model (see the module). Made and removed by
    :class:`tome_core.session.Session`, which places each call (:meth:`begin`)."""

    def __init__(self, root: nn.Module, settings: ToMeSettings, blocks: list[nn.Module]):
        self.root = root
        self.settings = settings
        self.blocks = blocks
        self.now = MergeCall()  # the context of the call running now (or the last one)
        self._warned: set[str] = set()
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._subs: dict[tuple[int, str], tuple[nn.Module, list[torch.utils.hooks.RemovableHandle]]] = {}
        self._index = {id(block): i for i, block in enumerate(self.blocks)}
        self._holder: dict[int, int] = {}  # block -> the module holding it (its SpatialTransformer)
        self._shortfalls = _Shortfalls()
        self._plans_in_block_pre = settings.method == "merge" and (settings.merge_crossattn or settings.merge_mlp)
        self.planner = Planner(root, settings, self._unfit)

    # --- hooks ------------------------------------------------------------------------------------
    def install(self) -> None:
        """Register every hook; the caller removes them all (:meth:`remove`) if one fails."""
        # every hook out of any graph (:mod:`tome_core.compiling`): each decides per call, on Python state
        for holder in block_holders(self.root, self._index):
            for block in holder.transformer_blocks:
                self._holder[id(block)] = id(holder)
            pre = python_only_hook(self._holder_pre)
            self._handles.append(holder.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(holder.register_forward_hook(python_only_hook(self._holder_post)))
        for block in self.blocks:
            pre = python_only_hook(self._block_pre)
            self._handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
            self._handles.append(block.register_forward_hook(python_only_hook(self._block_post)))
            for name, _flag in _TARGETS:
                self._hook_sub(block, name, getattr(block, name))

    def _hook_sub(self, block: nn.Module, name: str, sub: nn.Module) -> None:
        """Hook ``block``'s ``name`` (``attn1``/``attn2``/``ff``): a merge pre-hook and an unmerge post-hook."""
        key = (id(block), name)
        old = self._subs.pop(key, None)
        for handle in old[1] if old is not None else ():
            handle.remove()
        handles: list[torch.utils.hooks.RemovableHandle] = []
        self._subs[key] = (sub, handles)
        for register in (
            lambda: sub.register_forward_pre_hook(python_only(self._make_sub_pre(block, name)), with_kwargs=True),
            lambda: sub.register_forward_hook(python_only_hook(self._sub_post)),
        ):
            handles.append(register())
            self._handles.append(handles[-1])  # at once: a failure in the next one leaves nothing behind

    def _follow_subs(self, block: nn.Module) -> None:
        """Move the hooks of ``block``'s attention/MLP modules to the ones it holds now: Forge's object patches put an
        extension's module in place of ``attn1`` when sampling starts (Layer Diffuse's attention sharing) and put the
        original back when the next model is loaded, both after our hooks were placed."""
        for name, _flag in _TARGETS:
            sub = block._modules.get(name)
            hooked = self._subs.get((id(block), name))
            if isinstance(sub, nn.Module) and hooked is not None and hooked[0] is not sub:
                self._hook_sub(block, name, sub)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._subs.clear()
        self.now = MergeCall()

    def begin(self, call: Call) -> None:
        """A call of the model starts (placed by the session): its context (:class:`MergeCall`: the step schedule, the
        latent size, the partitions' key), made afresh."""
        self.now = self.planner.begin(call, self.now)
        self.now.active = self._in_schedule(call.progress)

    @property
    def active(self) -> bool:
        """Whether the call running now (or the last one) is inside the step schedule."""
        return self.now.active

    def _in_schedule(self, progress: float | None) -> bool:
        s = self.settings
        if progress is None:
            return True
        return s.start <= progress and (progress < s.end or s.end >= 1.0)

    @property
    def needs_timestep(self) -> bool:
        """Whether a call without reported progress has to read its timestep: for the random partition's key, plan
        reuse, or a step schedule other than 0–1."""
        s = self.settings
        return s.use_rand or self.planner.reuses or s.start > 0 or s.end < 1

    def _holder_pre(self, holder: nn.Module, args: tuple, kwargs: dict) -> None:
        """A SpatialTransformer starts: the grid of its 4-D input is its blocks' token grid for this call."""
        x = args[0] if args else kwargs.get("x")
        if isinstance(x, torch.Tensor) and x.dim() == 4:
            self.now.grids[id(holder)] = (int(x.shape[2]), int(x.shape[3]))
        else:
            self.now.grids.pop(id(holder), None)

    def _holder_post(self, holder: nn.Module, args: tuple, output: Any) -> None:
        self.now.grids.pop(id(holder), None)

    def _block_pre(self, block: nn.Module, args: tuple, kwargs: dict) -> None:
        self._follow_subs(block)
        x = args[0] if args else kwargs.get("x")
        now = self.now
        ok = now.active and isinstance(x, torch.Tensor) and x.dim() == 3
        grid = now.grids.get(self._holder.get(id(block), -1))
        now.block = BlockCall(block, x, self._index[id(block)], grid) if ok else None
        if now.block is not None and self._plans_in_block_pre:
            self._plan(now.block)  # before the block adds into x in place (Forge, ComfyUI)

    def _block_post(self, block: nn.Module, args: tuple, output: Any) -> None:
        call, self.now.block = self.now.block, None
        if call is not None and not call.attn1_ran and self._acts_on(call, "attn1", call.x.shape[1]):
            self._shortfalls.attn1_skipped.add(self._index[id(block)])

    def _acts_on(self, call: BlockCall, name: str, num_tokens: int) -> bool:
        """Whether these settings change ``name`` (``attn1``/``attn2``/``ff``) in a block call of ``num_tokens``
        tokens: merge it (at least one token at a level up to ``max_downsample``) or, for ``attn1``, downsample its
        keys/values (a factor above 1 there)."""
        s = self.settings
        geometry = self.planner.geometry(num_tokens, call.grid, self.now.size)
        if geometry is None:
            return False
        level = geometry[0]
        if s.method == "downsample":
            return name == "attn1" and self.planner.kv_factor(level) > 1
        flag = getattr(s, dict(_TARGETS)[name])
        return flag and level <= self.planner.max_downsample(level) and int(num_tokens * s.ratio) > 0

    def _steps_aside(self, call: BlockCall, name: str, sub: nn.Module, num_tokens: int) -> bool:
        """Whether another extension takes this attention call over (:func:`neighbours.taken_over`): then its input
        stays as it is, counted in the report where ToMe would have changed it."""
        reason = None if name == "ff" else neighbours.taken_over(sub)
        if reason is None:
            return False
        if self._acts_on(call, name, num_tokens):
            index = self._index[id(call.block)]
            if name == "attn1" and reason == neighbours.REPLACED:
                self._shortfalls.attn1_skipped.add(index)  # the same as an attn1 Forge never calls
            else:
                self._shortfalls.aside.setdefault((_LAYERS[name], reason), set()).add(index)
        return True

    def _reshaped(self, call: BlockCall, name: str, hidden: torch.Tensor) -> bool:
        """Whether an attention patch changed the layer's input from the block's tokens (ComfyUI's HyperTile tiles
        ``attn1``'s queries into the batch, its TomePatchModel merges them): then the call runs as it is, counted in
        the report where ToMe would have changed it."""
        if hidden.shape[:2] == call.x.shape[:2]:
            return False
        if self._acts_on(call, name, call.x.shape[1]):
            reason = (_LAYERS[name], neighbours.RESHAPED)
            self._shortfalls.aside.setdefault(reason, set()).add(self._index[id(call.block)])
        return True

    def _make_sub_pre(self, block: nn.Module, name: str):
        flag = dict(_TARGETS)[name]

        def hook(sub: nn.Module, args: tuple, kwargs: dict):
            self.now.plans.pop(id(sub), None)
            call = self.now.block
            if call is None or call.block is not block:
                return None
            if name == "attn1":
                call.attn1_ran = True
            downsample = self.settings.method == "downsample"
            if not (name == "attn1" if downsample else getattr(self.settings, flag)):
                return None
            hidden = args[0] if args else kwargs.get("x")
            if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3:
                return None
            if self._steps_aside(call, name, sub, hidden.shape[1]) or self._reshaped(call, name, hidden):
                return None
            if downsample:
                return self._downsample_kv(call, name, args, kwargs)
            plan = self._plan(call)
            if plan is None:
                return None
            self.now.plans[id(sub)] = plan
            merged = plan.merge(hidden)
            if name == "attn1" and self._own_kv(call, hidden, args, kwargs, "query_only"):
                args = tuple(merged if t is hidden else t for t in args)
                kwargs = {k: merged if t is hidden else t for k, t in kwargs.items()}
            if args:
                return (merged, *args[1:]), kwargs
            return args, {**kwargs, "x": merged}

        return hook

    def _own_kv(self, call: BlockCall, hidden: torch.Tensor, args: tuple, kwargs: dict, kind: str) -> bool:
        """Whether ``attn1``'s keys and values come from its input: none given (``context=``/``value=`` or a
        positional context), or the input tensor itself (Forge's ``attn1_patch`` protocol sets both to ``n``).
        Otherwise only the queries may change; that is counted under ``kind`` unless ``attn1`` is
        cross-attention here (``disable_self_attn``, where keys and values are never merged)."""
        if all(t is None or t is hidden for t in (*args[1:2], kwargs.get("context"), kwargs.get("value"))):
            return True
        if not getattr(call.block, "disable_self_attn", False):
            getattr(self._shortfalls, kind).add(self._index[id(call.block)])
        return False

    def _sub_post(self, sub: nn.Module, args: tuple, output: Any) -> Any:
        plan = self.now.plans.pop(id(sub), None)
        if plan is None or not isinstance(output, torch.Tensor):
            return None
        return plan.unmerge(output)

    def _downsample_kv(self, call: BlockCall, name: str, args: tuple, kwargs: dict) -> Any:
        if name != "attn1" or not args or not isinstance(args[0], torch.Tensor) or args[0].dim() != 3:
            return None
        hidden = args[0]
        geometry = self.planner.geometry(hidden.shape[1], call.grid, self.now.size)
        if geometry is None:
            self._unfit(call.ordinal, hidden.shape[1])
            return None
        downsample, h, w = geometry
        factor = self.planner.kv_factor(downsample)
        if factor <= 1 or not self._own_kv(call, hidden, args, kwargs, "todo_off"):
            return None
        down = tm.downsample_tokens(hidden, h, w, factor)
        kwargs = {**kwargs, "context": down}
        if kwargs.get("value") is not None:  # it is the input: downsampled with the keys; None stays None
            kwargs["value"] = down  # (Forge's CrossAttention then takes the values from ``context``)
        return args[:1], kwargs

    def _plan(self, call: BlockCall) -> tm.MergePlan | None:
        """The block call's merge plan, made (or reused) once per call."""
        if not call.planned:
            call.planned = True
            call.plan = self.planner.plan(self.now, call)
        return call.plan

    def _unfit(self, ordinal: int, num_tokens: int) -> None:
        """A block's tokens fit no grid of the latent (:meth:`Planner.geometry`): it runs unmerged, counted and warned."""
        self._shortfalls.unfit.add(ordinal)
        self._warn_once(
            "geometry",
            f"ToMe: a block with {num_tokens} tokens does not fit the latent size {self.now.size}; it runs unmerged",
        )

    # --- what was not merged ----------------------------------------------------------------------
    def report(self) -> MergeReport:
        """What could not be merged since the capability was applied or :meth:`reset_report` (see
        :class:`MergeReport`). Never raises."""
        f = self._shortfalls
        return MergeReport(
            blocks=len(self.blocks),
            attn1_skipped=len(f.attn1_skipped),
            query_only=len(f.query_only),
            todo_off=len(f.todo_off),
            unfit=len(f.unfit),
            aside=tuple((layer, reason, len(blocks)) for (layer, reason), blocks in f.aside.items()),
        )

    def reset_report(self) -> None:
        """Start counting afresh."""
        self._shortfalls = _Shortfalls()

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)
