"""When a stream of UNet calls runs a full step and when a cached one (``cache_schedule``).

The schedules keep DeepCache's guard rails: the first and the last step of a pass are full, and so is every step
outside ``cache_start <= progress < cache_end``; and a stream never goes ``cache_interval`` steps without a full one
(the time schedule: ``2 × cache_interval - 1``).

* ``uniform`` (DeepCache's): inside those rails every step is cached, so full steps fall at 0, N, 2N, … .
* ``early``: the uniform schedule's full steps, as many, with the grid one step earlier where the pass allows it: the
  stream's second full step at N - 1 (N of 3 or more), then every N: 0, N - 1, 2N - 1, … . The steps before the
  second full step have no forecast (a forecast needs two full steps: they reuse the first one's features unchanged),
  so that run is one step shorter than the others. Where the uniform grid ends on the pass's last step (its last run
  is as long as the others), moving it would add a full step: there it is the uniform schedule; so it is where the
  pass's step count is not reported. On the trained FLUX- and Wan-layout models (``benchmarks.quality.dit_samplers``,
  64 seeds, eight samplers, N = 3 to 8, where it differs) the worst seed kept 0.2 to 9.0 dB more than on the uniform
  schedule at the same speed (most at N = 3), the mean -0.5 to +1.0 dB on FLUX and -2.4 to +1.5 on Wan (less under
  DEIS and DPM-Solver++ at N = 3, more under ComfyUI's UniPC): a choice for fewer bad images, not the default.
* ``time``: full steps spread evenly in the sampler's time instead of in steps: a step is cached while the sampler
  time since the stream's last full step is below ``cache_interval`` average steps' worth (the time from the stream's
  first full step down to 0, over its steps), and a full step at least every ``2 × cache_interval - 1`` steps. At an even
  spacing of the timesteps (Euler, Euler a, DDIM and UniPC on the WebUI's default schedule) this is the uniform
  schedule; under Karras' and the exponential sigmas, which cross the middle of the trajectory (where the image
  forms) in steps twice as long in time and its ends in short ones, it puts the full steps where the time goes, in
  no more of them: where the time alone would run more full steps than the uniform schedule (one more, at some step
  counts), a step is cached while the full steps so far and those the rest of the pass needs would exceed the
  uniform schedule's count. It needs the pass's step count and the call's timestep (read back as a number, once per
  call); without them it is the uniform schedule.
* ``adaptive``: a step is also full when the UNet's input has moved away from where the stream expected it by more
  than ``cache_threshold``: the relative L1 distance between the call's input and its forecast from the stream's last
  full steps (the same forecast the deep features get, :class:`tome_core.caching.forecast.Forecast`: linear in the sampler's time,
  or, with ``cache_forecast`` off, the last full step's input). Where the trajectory bends, the deep features' forecast
  goes wrong with it, so a full step comes sooner; where it runs straight, later. Threshold 0 makes every step full.
  The distance is measured on every 4th position of the input's last two dimensions (a latent's pixels per side, a
  video latent's in every frame, a token sequence's tokens and channels) and read back once per cached-step candidate
  (the one device-to-host read the adaptive schedule costs).
"""

from __future__ import annotations

import torch

from ..settings import AUTO, ToMeSettings
from ..steps import Call
from .forecast import Forecast
from .ranks import ALONE, Ranks

SUBSAMPLE = 4
"""The signal's stride over the input's last two dimensions (1/16 of a latent's pixels)."""
TOLERANCE = 0.02
"""The time schedule takes a step within 2 % of N average steps from the last full one as N steps away (full): an
even spacing rounded to integer timesteps (diffusers' UniPC: steps of 49 to 51) stays the uniform schedule."""


def may_cache(
    settings: ToMeSettings, step: int, progress: float | None, last: bool, since_full: int, interval: int | None = None
) -> bool:
    """The guard rails: whether a step may be cached at all — not the pass's first or last, inside ``cache_start <=
    progress < cache_end``, and fewer than ``interval`` (default ``cache_interval``) steps since the stream's last
    full step."""
    if step == 0 or last or progress is None:
        return False
    if not settings.cache_start <= progress < settings.cache_end:
        return False
    return since_full < (settings.cache_interval if interval is None else interval)


def too_short(settings: ToMeSettings, steps: int | None) -> bool:
    """Whether a pass of ``steps`` (None: unknown) is too short for a forecast: with a full step at 0, at
    ``cache_interval`` and at the last, a pass of at most ``cache_interval + 2`` steps caches only steps before its
    second full one, which reuse the first one's features (a forecast needs two full steps). On the trained
    FLUX-layout model (``benchmarks.quality.dit_steps``) such passes (4 steps at N=2, 4 and 5 at N=3) were further from plain
    than plain run with only their full steps; the longer ones were closer."""
    return steps is not None and settings.cache_forecast != "off" and steps <= settings.cache_interval + 2


def longest_run(settings: ToMeSettings, fulls: int, span: int | None) -> int | None:
    """The most steps a stream may go without a full one after its ``fulls`` full steps, where the schedule shortens
    it (the early schedule before its second full step: ``cache_interval - 1``, unless the stream's ``span`` of steps
    from its first full step to the pass's last, None where unknown, is a multiple of the interval); None:
    ``cache_interval``."""
    n = settings.cache_interval
    early = settings.cache_schedule == "early" and n >= 3 and span is not None and span % n != 0
    return n - 1 if early and fulls == 1 else None


def uniform_plan(settings: ToMeSettings, steps: int, first: int = 0) -> list[bool]:
    """Which of a pass's ``steps`` the uniform schedule (or, where the settings name it, the early one) caches (True)
    when every step is reported, from step ``first`` on (a patch applied mid-pass, at a refiner's switch, begins
    there, in full): for counting a run's full and cached steps ahead of it (the adaptive schedule's depend on the
    run)."""
    out, last_full, fulls = [], first, 0
    for step in range(first, steps):
        since_full, run = step - last_full, longest_run(settings, fulls, steps - 1 - first)
        cached = (
            settings.caches
            and step > first
            and may_cache(settings, step, step / steps, step == steps - 1, since_full, run)
        )
        last_full, fulls = (last_full, fulls) if cached else (step, fulls + 1)
        out.append(cached)
    return out


class Schedule:
    """One stream's schedule: whether its next call may be cached (see the module)."""

    def __init__(self, settings: ToMeSettings) -> None:
        if AUTO in (settings.cache_schedule, settings.cache_forecast):
            raise ValueError(f"cache schedule and forecast {AUTO!r}: a model family resolves them first")
        self.settings = settings
        self.adaptive = settings.cache_schedule == "adaptive"
        self.timed = settings.cache_schedule == "time"
        self._inputs = Forecast(settings.cache_forecast) if self.adaptive else None
        self._start: tuple[float, float] | None = None  # time: the progress and time of the stream's first full step
        self._last_time: float | None = None  # time: the sampler time of its last full step
        self._fulls = 0  # time, early: the stream's full steps so far
        self._first: float | None = None  # early: the progress of the stream's first full step
        self.last_signal: float | None = None  # the adaptive signal of the last candidate (for reports and tests)
        self.ranks: Ranks = ALONE
        """The ranks that run each call together (:mod:`.ranks`): the adaptive signal is summed over them."""
        self._share: torch.Tensor | None = None  # this rank's numerator and denominator at the last candidate

    @property
    def last_share(self) -> float | None:
        """The adaptive signal of this rank's share alone at the last candidate on several ranks (for tests); read back
        only when asked, so the decision reads back once."""
        share = self._share
        return None if share is None else float(share[0] / share[1].clamp_min(torch.finfo(share.dtype).tiny))

    def may_cache(self, call: Call, since_full: int, x: torch.Tensor | None, timed: bool = True) -> bool:
        """Whether ``call`` (on the input ``x``, ``since_full`` steps after the stream's last full one) may be cached:
        the guard rails, then (time) the sampler time since the last full step, or (adaptive) the input's distance
        from its forecast. The time schedule needs the pass's step count and places every call of a step by the
        step's first call's time (``call.step_time``), so that the streams of a step decide alike (DPM++ SDE's second
        call runs at another time); ``timed=False`` makes it the uniform schedule for this call."""
        self.last_signal, self._share = None, None
        step, progress, last, steps = call.step, call.progress, call.last, call.steps if timed else None
        step_time = call.time if call.step_time is None else call.step_time
        if self.timed and self._start is not None and self._last_time is not None and steps and step_time is not None:
            first, start = self._start
            interval = 2 * self.settings.cache_interval - 1
            if not may_cache(self.settings, step, progress, last, since_full, interval):
                return False
            average = start / max(steps * (1 - first), 1)  # the stream's time per step, down to 0
            # within N average steps (a step N of them away, as at an even spacing, is full: :data:`TOLERANCE`)
            if self._last_time - float(step_time) < self.settings.cache_interval * average * (1 - TOLERANCE):
                return True
            # no more full steps than the uniform schedule's: this one and those the rest of the pass needs must fit
            at = step if progress is None else round(progress * steps)  # the pass's step (a refiner's starts late)
            needed = -(-(steps - 1 - at) // interval)
            return self._fulls + 1 + needed > self._uniform_fulls(steps)
        span = None if call.steps is None or self._first is None else call.steps - 1 - round(self._first * call.steps)
        if not may_cache(
            self.settings, step, progress, last, since_full, longest_run(self.settings, self._fulls, span)
        ):
            return False
        if self._inputs is None:
            return True
        if self.ranks.world > 1:
            return self._together(call, x)
        expected = self._inputs.predict(call.time) if _usable(x) else None
        if expected is None or expected.shape != _signal(x).shape:
            return False
        self.last_signal = _relative_l1(_signal(x), expected)
        return self.last_signal < self.settings.cache_threshold

    def _together(self, call: Call, x: torch.Tensor | None) -> bool:
        """The adaptive decision on several ranks: each measures its share of the input against its share's forecast,
        the ranks sum the distance's numerator and denominator (and whether any had no forecast), and all compare the
        whole input's distance with the threshold: one decision, the same on every rank."""
        expected = self._inputs.predict(call.time) if _usable(x) else None
        share = self.ranks.share(_signal(x)) if expected is not None else None
        if share is None or expected.shape != share.shape:
            self.ranks.meet((0.0, 0.0, 1.0))
            return False
        mine = torch.stack([(share - expected).abs().sum(), share.abs().sum(), share.new_zeros(())])
        distance, scale, missing = self.ranks.meet(mine)  # the one read back
        self._share = mine[:2]
        if missing:
            return False
        self.last_signal = distance / max(scale, torch.finfo(torch.float32).tiny)
        return self.last_signal < self.settings.cache_threshold

    def full(self, call: Call, x: torch.Tensor | None) -> None:
        """The stream ran ``call`` in full on ``x``."""
        if self._fulls == 0:
            self._first = call.progress
        self._fulls += 1
        if self.timed:
            step_time = call.time if call.step_time is None else call.step_time
            self._last_time = None if step_time is None else float(step_time)
            if self._start is None and self._last_time is not None and call.progress is not None:
                self._start = (call.progress, self._last_time)
        if self._inputs is not None and _usable(x):
            self._inputs.add(call.time, self.ranks.share(_signal(x)).clone())

    def _uniform_fulls(self, steps: int) -> int:
        """The full steps the uniform schedule runs in this stream's pass of ``steps``, from its first full step."""
        first = round(self._start[0] * steps) if self._start is not None else 0
        return uniform_plan(self.settings, steps, first).count(False)

    def forecasts(self) -> tuple[Forecast, ...]:
        """What the schedule holds (the adaptive one: the subsampled inputs of the last full steps)."""
        return () if self._inputs is None else (self._inputs,)


def _usable(x: object) -> bool:
    """Any input a family places: an image latent (B, C, H, W), a token sequence (B, tokens, width) or a video latent
    (B, C, T, H, W) alike."""
    return isinstance(x, torch.Tensor) and x.dim() >= 3 and x.is_floating_point()


def _signal(x: torch.Tensor) -> torch.Tensor:
    return x[..., ::SUBSAMPLE, ::SUBSAMPLE].float()


def _relative_l1(x: torch.Tensor, expected: torch.Tensor) -> float:
    """``mean |x - expected| / mean |x|`` as a number (one read back from the device); 0 for an all-zero ``x``."""
    scale = x.abs().mean()
    return float((x - expected).abs().mean() / scale.clamp_min(torch.finfo(scale.dtype).tiny))
