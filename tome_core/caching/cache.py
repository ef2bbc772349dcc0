"""A step cache over a model's blocks: DeepCache (Ma et al., CVPR 2024, arXiv 2312.00858), written from the paper, for
any model family that lays its blocks out for it (:mod:`tome_core.families`: the UNets and the diffusion transformers).

On every ``cache_interval``-th step the model runs in full and the cache keeps, per stream of calls, the result of
the blocks a cached step skips (a UNet's deep features, a transformer's residual over its later blocks), as the
family reads it at the first block a cached step runs again (the entry). On the steps in between ("cached steps")
only the family's first and last blocks run, and the skipped range's result comes from the cache.

The cache works at the level of the block modules and leaves each host's loop as it is, so ControlNet's forward
(Mikubill's), sgm's, Forge's, ComfyUI's, ldm's and diffusers' alike keep running their own code: each skipped module
answers with the family's placeholder (a UNet layer: zeros of the shape it returned at the last full step, which
the loop concatenates and adds as it always does, also ControlNet's residuals; a transformer block: its input
streams unchanged), and the entry gets the cached result in place, next to what the cached step computed live.
Only the skipped modules get an instance-level ``forward`` (their compute must be skipped; restored exactly on
removal); everything else is hooks.

Schedule and forecast (:mod:`.schedule`, :mod:`.forecast`): the first and the last step of a pass
are full, and so is any step outside ``cache_start <= progress < cache_end``; inside, a step is cached unless
``cache_interval`` steps have passed since the stream's last full step (DeepCache's uniform schedule: full steps at 0,
N, 2N, …), or N average steps of sampler time (the time schedule), or, with the adaptive schedule, the call's input
strays from its forecast by more than ``cache_threshold``. A cached step takes the skipped range's result of the
stream's last full step (``cache_forecast`` off: DeepCache exactly) or its forecast in the sampler's time from the
last two full steps (linear, or calibrated on the probe); with ``cache_correction`` (on by default), under the
sampler the host names with its schedule (:meth:`StepCache.set_sampler`: Euler, or a linear multistep sampler,
:mod:`.samplers`), each full step's output also carries what the cached steps since the last one should have added,
re-estimated from the full steps around them (:mod:`.correction`), and the next few outputs what it still does through
the sampler's history;
where it cannot act it stays off, with a note unless it is at its default.

Streams: the calls of a step are told apart by their number within the step (under ComfyUI's context windows, also
by the frames the call covers) and Forge's ``cond_or_uncond`` chunk (cond and uncond batched, or separate calls, or extra guidance passes), and each keeps its own
cache, dropped when its batch or latent size changes; a call that runs the blocks more than once (Mikubill's
ControlNet runs reference-only's reference pass before the main one) keeps one per pass through them. A new sampling
pass (hires fix, img2img) starts with none. :meth:`StepCache.report` counts, per sampling pass, the steps run in full
and cached.

Under ``torch.compile`` (the whole model, or its blocks) every decision and all bookkeeping run as Python, out of any
graph (:mod:`tome_core.compiling`); the blocks themselves are compiled, one graph per block class and shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..compiling import python_only_hook
from ..families import Layout, PassState
from ..report import CacheReport, PassCount
from ..settings import DEFAULTS, ToMeSettings
from ..steps import Call
from .correction import Correction
from .forecast import Forecast
from .forwards import Replaced, replace_forward, restore_forwards, skippable
from .ranks import ALONE, Ranks
from .samplers import ACTS_UNDER, BUILT_IN, LinearSampler, NotLinear, SamplerFunction, linearize
from .schedule import Schedule, too_short

log = logging.getLogger("tome_core")


@dataclass
class _Stream:
    """One stream of calls: what its last full call left for the cached ones, per pass through the blocks (a call
    may run the blocks more than once: ControlNet's reference-only runs a reference pass before the main one), the
    deep features' forecast per pass (kept across full calls) and its schedule."""

    shape: tuple[int, ...] | None  # of its calls' input, without the batch
    batch: int | None
    last_full: int  # step of its last full call
    schedule: Schedule
    passes: list[PassState] = field(default_factory=list)
    forecasts: list[Forecast] = field(default_factory=list)
    corrections: list[Correction] = field(default_factory=list)  # per pass, with ``cache_correction``


@dataclass
class CacheCall:
    """The step cache's context of one call of the model: everything its hooks and skipped blocks read and write during
    that call, made afresh for each call (:meth:`StepCache.begin`), so nothing of one call leaks into the next."""

    call: Call | None = None  # where the call sits in the sampling (step, stream, sampler time)
    stream: _Stream | None = None  # its stream (None: the cache does not act on this call)
    cached: bool = False  # the call is a cached one
    passes: int = 0  # passes through the blocks begun so far
    running: PassState | None = None  # the pass running now: its record
    skipping: bool = False  # the pass running now is a cached one

    @property
    def time(self) -> Any:
        """The call's sampler time (never read back)."""
        return None if self.call is None else self.call.time


CORRECTION_FAMILY_NOTE = (
    "cache correction off: it acts on diffusion transformers whose output layer runs as one module or only scaled "
    "after it (not UNets)"
)


TWO_TIMES_NOTE = "cache schedule uniform: the sampler calls the UNet at two times a step"
"""Said when the time schedule stands down: under a sampler whose steps call the UNet at a second, later time (DPM++
SDE, DPM++ 2S a, DPM2, Heun) it lost to the uniform schedule (issue 27's sampler table, DPM++ SDE), which runs
instead for that pass."""


def _later_time(call: Call) -> bool:
    """Whether a later call of the step runs at another time than the step's first (one read back from the device,
    only for the time schedule's later calls)."""
    if call.time is None or call.step_time is None:
        return False
    return float(call.time) != float(call.step_time)


class StepCache:
    """The step cache of one model (see the module), on its family's layout (:attr:`layout`, found by the session at
    ``cache_branch``; None: a model no family knows, and the cache stands aside with a note, which ``aside`` completes:
    the model's class and why no family knows it, :func:`tome_core.families.aside`). Made and removed by
    :class:`tome_core.session.Session`."""

    def __init__(self, root: nn.Module, settings: ToMeSettings, layout: Layout | None, aside: str | None = None):
        self.root = root
        self.layout = layout
        self.settings = settings.resolved(*(self.layout or Layout).auto)  # what ``auto`` means on this model
        self.now = CacheCall()  # the context of the call running now (or the last one)
        self._streams: dict[tuple, _Stream] = {}
        self._steps: list[dict[int, bool]] = []  # per sampling pass: step -> whether a call of it ran in full
        self._sizes: list[tuple[int, int] | None] = []  # per sampling pass: its latent size
        self._shares: dict[tuple[int, int] | None, float] = {}  # latent size -> what a cached pass skips of the work
        self.make_schedule: Callable[[ToMeSettings], Schedule] = Schedule
        """Makes each stream's schedule (a benchmark may put another rule of the same interface here)."""
        self.ranks: Ranks = ALONE
        """The ranks that run each call together (context parallelism: :mod:`.ranks`, :meth:`set_ranks`)."""
        self.short_passes = False
        """Whether a transformer's pass too short for a forecast is cached too (a benchmark's measurement of it)."""
        self._originals: list[Replaced] = []
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._full = self._cached = 0
        self._notes: list[str] = []
        self._warned: set[str] = set()
        self._timed = self.settings.cache_schedule == "time"
        self._store = torch.device("cpu") if self.settings.cache_device == "cpu" else None  # where forecasts keep
        self._two_times = False  # this pass's steps call the UNet at two times (the time schedule stands down)
        self._correcting = self.settings.cache_correction > 0 and self.layout is not None and self.layout.corrects
        self._sampler: LinearSampler | None = None  # the sampler and its schedule (:meth:`set_sampler`)
        self._no_sampler = "the host gives no sampler's schedule (Session.set_sampler)"
        self._says_why_uncorrected = self.settings.cache_correction not in (0, DEFAULTS.cache_correction)
        """Whether the correction's standing aside is said (a note): for a gain set by hand, not at the default, which
        corrects wherever it is exact and stays quiet elsewhere (UNets, other samplers, hosts without the schedule)."""
        if self.layout is None:
            why = f" ({aside})" if aside else ""
            self._notes.append(f"step cache off: the cache does not know this model's blocks{why}")
        elif self._says_why_uncorrected and not self.layout.corrects:
            self._notes.append(CORRECTION_FAMILY_NOTE)

    @property
    def usable(self) -> bool:
        """Whether a family knows the model (else the cache stands aside)."""
        return self.layout is not None

    # --- installing -----------------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap the skippable blocks' layers and hook the entry block, or nothing: a failure part-way undoes it all."""
        if self.layout is None:
            return
        try:
            for i, module in enumerate(self.layout.skipped):
                self._wrap(i, module)
            self._handles.append(self.layout.start.register_forward_pre_hook(python_only_hook(self._pass_pre)))
            self._handles.append(
                self.layout.entry.register_forward_pre_hook(python_only_hook(self._entry_pre), with_kwargs=True)
            )
            if self._correcting:
                self._handles.append(
                    self.layout.entry.register_forward_hook(python_only_hook(self._entry_post), with_kwargs=True)
                )
                for module, hook in self.layout.watched():
                    self._handles.append(module.register_forward_hook(python_only_hook(hook)))
        except BaseException:
            self.remove()
            raise

    def _wrap(self, index: int, module: nn.Module) -> None:
        """The skipped module's instance ``forward``: under ``torch.compile`` (of the whole model, or of this block) the
        decision and the bookkeeping run as Python (:func:`~tome_core.compiling.python_only`), out of any graph; only
        the module's own ``forward`` is compiled, as a frame of its own (:func:`~tome_core.compiling.opaque`): one graph
        serves every call and step."""

        def before(args: tuple, kwargs: dict) -> tuple[bool, Any]:
            """(skip, the placeholder) at a cached pass; else (False, whether this full pass keeps the module's call)."""
            now = self.now
            if now.skipping:
                assert now.running is not None and self.layout is not None
                return True, self.layout.placeholder(index, args, kwargs, now.running)
            keeping = now.running is not None and not now.cached and self.layout is not None
            if keeping:
                self.layout.enter(index, args, kwargs, now.running)
            return False, keeping

        def after(keeping: bool, out: Any, args: tuple, kwargs: dict) -> None:
            kept = self.layout.keep(index, out, args, kwargs) if keeping else None
            if kept is not None:
                self.now.running.kept[index] = kept

        forward = skippable(module.forward, before, after)
        self._originals.append(replace_forward(module, forward))

    def remove(self) -> None:
        """Restore every wrapped layer's ``forward`` exactly (an instance attribute only if it had one) and remove the
        hooks; a layer whose ``forward`` another extension wrapped since is left to it, our wrapper made inert."""
        self.now = CacheCall()
        self._streams.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if not restore_forwards(self._originals):
            log.warning("ToMe: a UNet block's forward was replaced over the step cache's; left as it is")

    def set_sampler(
        self,
        name: str | None,
        sigmas: Sequence[float] | None = None,
        sample: SamplerFunction | None = None,
        why_not: str | None = None,
    ) -> None:
        """The sampler of the passes to come, which ``cache_correction`` needs: ``name`` on ``sigmas`` (the pass's
        schedule, its end included), read as a linear map (:mod:`.samplers`) from ``sample`` (the host's own function,
        k-diffusion's signature) or else the core's own sampler of that name; None, or a sampler that is no linear
        one: the correction stands aside (``why_not`` says why, in the note where it is said)."""
        known = self._sampler
        if known is not None and sigmas is not None and (known.name, known.sigmas) == (name, tuple(map(float, sigmas))):
            return  # said again (the WebUI says it at every call): read once
        self._sampler = None
        if name is None or sigmas is None:
            self._no_sampler = why_not or self._no_sampler
            return
        sample = sample or BUILT_IN.get(name)
        if sample is None:
            self._no_sampler = why_not or f"the sampler is {name}; {ACTS_UNDER}"
            return
        try:
            self._sampler = linearize(name, sample, sigmas)
        except NotLinear as error:
            self._no_sampler = f"{error}; the correction acts under samplers that call the model once a step"
        except Exception as error:  # the host's function cannot run on its own: no correction, never a failed image
            self._no_sampler = f"the sampler {name} could not be read ({type(error).__name__}: {error})"

    def set_ranks(self, ranks: Ranks) -> None:
        """The calls to come run on ``ranks`` together (a host's process group, :mod:`.ranks`): every rank decides
        alike, and a rank whose decision fails makes every rank's fail. Set before the pass begins."""
        self.ranks = ranks
        for stream in self._streams.values():
            stream.schedule.ranks = ranks

    def _sampler_step(self, call: Call | None) -> int | None:
        """The index of ``call``'s step in the sampler's schedule, where the correction acts on it; else None (with a
        note where it would have, for a gain set by hand)."""
        if not self._correcting or call is None:
            return None
        sampler = self._sampler
        if sampler is None or call.steps is None or call.progress is None or sampler.steps != call.steps:
            if self._says_why_uncorrected:
                self._note(f"cache correction off: {self._no_sampler}")
            return None
        return min(round(call.progress * call.steps), call.steps - 1)

    # --- per call ---------------------------------------------------------------------------------------
    def begin(self, call: Call, x: Any = None) -> None:
        """Decide whether the call starting now (on the UNet input ``x``) runs in full or cached (the root's forward
        pre-hook): its context (:class:`CacheCall`), made afresh. On several ranks (:meth:`set_ranks`) the decision
        ends with a meeting of all of them, which a rank whose decision raised attends too, so that every rank raises
        (:mod:`.ranks`)."""
        ranks = self.ranks
        if ranks.world == 1:
            return self._begin(call, x)
        try:
            self._begin(call, x)
        except BaseException as error:
            if not ranks.broken:
                ranks.meet(error=error)  # raises ``error`` here, ``RanksFailed`` on the others
            raise
        ranks.meet()  # the call's last meeting: no rank goes on into the model's collectives while another has failed

    def _begin(self, call: Call, x: Any = None) -> None:
        self.now = CacheCall(call)
        if not self.usable:
            return
        if call.restarted:
            self._streams.clear()
            self._steps.append({})
            self._sizes.append(call.size)
            self._two_times = False
        if self._timed and call.index and not self._two_times and _later_time(call):
            self._two_times = True
            self._note(TWO_TIMES_NOTE)
        if not self._intact():
            self._note("step cache off: another extension replaced the UNet's blocks")
            self._streams.clear()  # what was cached came from other blocks
            self._count(call, full=True)
            return
        if self.layout.transformer and not self.short_passes and too_short(self.settings, call.steps):
            n = self.settings.cache_interval
            self._note(
                f"step cache off: {call.steps} steps are too few to forecast at cache_interval {n} (from {n + 3})"
            )
            self._count(call, full=True)
            return
        # a context window's calls are also told apart by the frames they cover: a window never gets another's residual
        key = (call.index, call.chunk, call.window)
        stream = self._streams.get(key)
        same = stream is not None and stream.shape == call.shape and stream.batch == call.batch
        fits = same and bool(stream.passes) and all(self._complete(p) for p in stream.passes)
        since_full = call.step - stream.last_full if stream is not None else 0
        if fits and stream.schedule.may_cache(call, since_full, x, timed=not self._two_times):
            self.now = CacheCall(call, stream, cached=True)
            self._cached += 1
            self._count(call, full=False)
            return
        schedule, forecasts, corrections = (
            (stream.schedule, stream.forecasts, stream.corrections)
            if same
            else (self.make_schedule(self.settings), [], [])
        )
        schedule.ranks = self.ranks
        self._streams[key] = stream = _Stream(
            call.shape, call.batch, call.step, schedule, forecasts=forecasts, corrections=corrections
        )
        schedule.full(call, x)
        self.now = CacheCall(call, stream)
        self._full += 1
        self._count(call, full=True)

    def _count(self, call: Call, full: bool) -> None:
        """Count the call's step in its sampling pass: full if any of its calls ran in full."""
        if not self._steps:
            self._steps.append({})
            self._sizes.append(call.size)
        steps = self._steps[-1]
        steps[call.step] = steps.get(call.step, False) or full

    @property
    def cached_now(self) -> bool:
        """Whether the call running now (or the last one) is a cached one."""
        return self.now.cached

    def _complete(self, record: PassState) -> bool:
        return record.deep and self.layout is not None and len(record.kept) == len(self.layout.skipped)

    def _pass_pre(self, module: nn.Module, args: tuple) -> None:
        """A pass through the blocks begins (``input_blocks[0]``'s first layer): its record, and whether it is
        skipped — at a cached call, when the full call had a complete pass of this number (else it runs in full)."""
        now = self.now
        stream, number = now.stream, now.passes
        now.passes += 1
        if stream is None:
            now.running, now.skipping = None, False
        elif now.cached:
            record = stream.passes[number] if number < len(stream.passes) else None
            now.running = record
            now.skipping = record is not None and self._complete(record)
            if now.skipping and number < len(stream.forecasts):
                stream.forecasts[number].fetch()  # features kept on the CPU start back now, ahead of the probe
        else:
            now.running = PassState()
            stream.passes.append(now.running)
            while len(stream.forecasts) < len(stream.passes):
                stream.forecasts.append(Forecast(self.settings.cache_forecast, self._store))
            while self._correcting and len(stream.corrections) < len(stream.passes):
                stream.corrections.append(Correction(self.settings.cache_correction, self._store))
            now.skipping = False

    def _intact(self) -> bool:
        """The model still holds the blocks we wrapped, with our wrappers: another extension may have swapped a block
        in its lists (Kohya's HRFix for the WebUI wraps one in a module of its own) or replaced a forward."""
        if self.layout is None or not self.layout.intact():
            return False
        return all(module.__dict__.get("forward") is ours for module, _, _, ours in self._originals)

    def _entry_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> Any:
        """The entry of a cached pass: the cached result in place (:meth:`Layout.inject`). In a full pass: keep the
        skipped range's result (:meth:`Layout.features`) on the stream's forecast."""
        now, layout = self.now, self.layout
        record = now.running
        if record is None or layout is None:
            return None
        forecast = now.stream.forecasts[now.passes - 1] if now.stream is not None else None
        correction, step = self._correction(), self._sampler_step(now.call)
        if not now.skipping:
            if not now.cached and forecast is not None:
                found = layout.features(args, kwargs, record)
                if found is not None:
                    forecast.add(now.time, *found)
                    record.deep = True
                    if correction is not None and step is not None:
                        correction.full(self._sampler.sigmas[step], found[0])
            return None
        assert forecast is not None  # a skipped pass had a complete full one
        left = layout.probe(args, kwargs, record)
        deep = forecast.predict(now.time, left)
        assert deep is not None
        out = layout.inject(args, kwargs, record, deep)
        if out is None:
            self._note("step cache: a cached step's features did not fit; that step's image may be off")
            self._warn_once("fit", f"ToMe: cached features {tuple(deep.shape)} do not fit the entry's input")
        elif correction is not None and step is not None and left is not None:
            image = layout.entry_image(*out)
            correction.cached(step, *layout.with_entry_image(*out, None), left, image.dtype, layout.modulation())
        return out

    def _correction(self) -> Correction | None:
        """The correction of the pass running now (with ``cache_correction``, on a stream the cache acts on)."""
        stream, number = self.now.stream, self.now.passes - 1
        return stream.corrections[number] if stream is not None and 0 <= number < len(stream.corrections) else None

    def _entry_post(self, module: nn.Module, args: tuple, kwargs: dict, out: Any) -> Any:
        """The output layer (with ``cache_correction``): at a cached pass, what it gave is kept; at a full one, its
        output carries the cached steps since the last full one (:meth:`Correction.correct`)."""
        correction = self._correction()
        if correction is None or not isinstance(out, torch.Tensor):
            return None
        if self.now.cached:
            return correction.output(out, self.layout.modulation()) if self.now.skipping else None
        step = self._sampler_step(self.now.call)
        if step is None:
            return None
        if self._sampler.name != "euler":
            self._note(f"cache correction under {self._sampler.name}")
        return correction.correct(out, step, self._sampler, self.layout.head, self.layout.modulation())

    # --- reporting -------------------------------------------------------------------------------------
    def report(self) -> CacheReport:
        """The calls run in full and cached, each sampling pass's steps and their work (:class:`PassCount`), the notes."""
        passes = []
        for steps, size in zip(self._steps, self._sizes):
            if steps:
                full, cached = sum(steps.values()), len(steps) - sum(steps.values())
                passes.append(PassCount(full, cached, work=full + cached * (1 - self._share(size))))
        return CacheReport(self._full, self._cached, tuple(self._notes), tuple(passes))

    def _share(self, size: tuple[int, int] | None) -> float:
        """The share of the blocks' work a cached pass skips at latent ``size`` (0 where no family knows the model)."""
        if size not in self._shares:
            self._shares[size] = 0.0 if self.layout is None else self.layout.skipped_share(size)
        return self._shares[size]

    def cached_features(self) -> list[torch.Tensor]:
        """The deep features held now, one per stream and pass (the last full step's: what cached passes feed their
        first output block, or forecast from)."""
        return [t.deep for s in self._streams.values() for t in s.forecasts if t.deep is not None]

    def cached_bytes(self) -> int:
        """Bytes the cache holds now: the deep features of every stream and pass and, for the linear forecast, their
        slopes; the adaptive schedule's subsampled inputs."""
        return sum(t.nbytes() for s in self._streams.values() for t in (*s.forecasts, *s.schedule.forecasts()))

    def _note(self, text: str) -> None:
        if text not in self._notes:
            self._notes.append(text)

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message)
