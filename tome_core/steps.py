"""Where a call of the model sits in the sampling: the per-call context that token merging and the step cache share.

Every call of a patched model is placed once, in the root's forward pre-hook (:meth:`StepClock.begin`): its latent
size and batch, its step (from the progress the caller reports with :meth:`StepClock.set_progress`, as the WebUI
script does every step; else from the call's timestep, placed on the sampler's schedule where the caller gave one
(:meth:`StepClock.set_schedule`)), its number within that step (cond and uncond called
separately, or extra guidance passes such as SAG/PAG, each have their own), Forge's ``cond_or_uncond`` chunk when the
host says it, and the frames of ComfyUI's context window when the call covers one. A reported progress smaller than
the last one, or a timestep larger than the last one, starts a new pass (hires fix, img2img, the next generation).

With progress reported nothing is read back from the device; without it the timestep is read as a Python number
(one device-to-host read per call), and only when the caller asks for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Call:
    """One UNet call, placed in the sampling."""

    size: tuple[int, int] | None  # the latent's height and width (a token sequence's length and width)
    batch: int | None
    progress: float | None  # fraction of the pass's steps done: reported, else 1 - t / 1000, else unknown
    key: float | None  # what tells steps apart: the reported progress, else the timestep; None: unknown
    step: int  # the step's number since the pass began (0: its first)
    index: int  # the call's number within its step
    restarted: bool  # this call began a new pass (or its step is unknown): anything kept from before is stale
    steps: int | None = None  # the pass's number of steps, when the caller reports it
    chunk: tuple[int, ...] | None = None  # Forge's ``transformer_options["cond_or_uncond"]``
    time: torch.Tensor | float | None = None  # the sampler's time: the call's first timestep, never read back
    step_time: torch.Tensor | float | None = None  # the time of the step's first call (a second-order sampler's
    # later calls of a step run at other times; the step is placed by its first)
    shape: tuple[int, ...] | None = None  # the input's shape without the batch (a video latent's frames too)
    window: tuple[int, ...] | None = None  # ComfyUI's context window: its dimension, then the frames it covers

    @property
    def last(self) -> bool:
        """Whether this is the pass's last step (known only when the step count is reported): read from the reported
        progress, not from ``step``, which counts from the patch's first call (a patch applied mid-pass at the
        refiner's switch) and only the steps that called the UNet (another cache may skip some)."""
        if self.steps is None or self.progress is None:
            return False
        return round(self.progress * self.steps) >= self.steps - 1


def _first_timestep(timesteps: Any) -> torch.Tensor | float | None:
    """The call's first timestep: a 0-d tensor where it came as one (still on its device), else a number, else None."""
    if isinstance(timesteps, torch.Tensor) and timesteps.numel():
        return timesteps.flatten()[0]
    if isinstance(timesteps, (int, float)) and not isinstance(timesteps, bool):
        return float(timesteps)
    return None


def call_arg(module: nn.Module, args: tuple, kwargs: dict, name: str) -> Any:
    """The value of ``name`` in a call of ``module.forward``, whether passed by keyword or position."""
    if name in kwargs:
        return kwargs[name]
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return None
    pos = params.index(name) if name in params else -1
    return args[pos] if 0 <= pos < len(args) else None


def _chunk(kwargs: dict) -> tuple[int, ...] | None:
    options = kwargs.get("transformer_options")
    chunk = options.get("cond_or_uncond") if isinstance(options, dict) else None
    try:
        return None if chunk is None else tuple(int(c) for c in chunk)
    except (TypeError, ValueError):
        return None


def _window(kwargs: dict) -> tuple[int, ...] | None:
    """The frames a call covers under ComfyUI's context windows: ``transformer_options["context_window"]`` is the
    call's ``IndexListContextWindow`` (comfy/context_windows.py:273), its ``index_list`` the frame indices along its
    ``dim``; ``(dim, *index_list)``, or None without one."""
    options = kwargs.get("transformer_options")
    window = options.get("context_window") if isinstance(options, dict) else None
    frames = getattr(window, "index_list", None)
    try:
        return None if frames is None else (int(getattr(window, "dim", 0)), *(int(i) for i in frames))
    except (TypeError, ValueError):
        return None


class StepClock:
    """Numbers the sampling steps of one patched UNet and the calls within each step."""

    def __init__(self) -> None:
        self.progress: float | None = None
        self.steps: int | None = None
        self.call: Call | None = None  # the call running now (or the last one)
        self._key: float | None = None
        self._step = 0
        self._index = 0
        self._step_time: torch.Tensor | float | None = None
        self._times: tuple[float, ...] = ()  # the schedule's steps on the 0–1000 scale (:meth:`set_schedule`)

    def set_schedule(self, sigmas: Sequence[float] | None) -> None:
        """The sampler's schedule (its sigmas, the end included) for calls without reported progress: a call whose
        timestep is one of its steps' (``1000 σ``, as a flow-matching transformer is called; diffusers' integer
        timesteps too) is placed there, its progress ``k / n`` of ``n`` steps, as if the caller had reported it. A
        timestep that matches no step, or several, is read as before."""
        self._times = () if sigmas is None else tuple(1000.0 * float(s) for s in list(sigmas)[:-1])

    def _placed(self, time: float) -> tuple[float, int] | None:
        """``(progress, steps)`` of the schedule's step whose time is ``time`` (within a unit: an integer timestep
        cut from ``1000 σ``), or None where no step's, or more than one's, is."""
        near = [k for k, t in enumerate(self._times) if abs(time - t) <= 1.0 + 1e-6 * t]
        if len(near) != 1:
            return None
        return near[0] / len(self._times), len(self._times)

    def set_progress(self, fraction: float | None, steps: int | None = None) -> None:
        """Report sampling progress (0 at the first step, 1 at the end; ``None`` when unknown) and, if known, the
        pass's number of steps (the step cache keeps the last one full)."""
        self.progress = None if fraction is None else float(fraction)
        self.steps = None if steps is None else int(steps)

    def begin(self, x: Any, timesteps: Any, kwargs: dict, read_timestep: bool) -> Call:
        """Place the call starting now (the root's forward pre-hook) on the model's input ``x`` (a latent, or a
        transformer's token sequence) at ``timesteps`` (on the 0–1000 scale, as a family reads it). Without reported
        progress the timestep is read only if ``read_timestep`` (else every call counts as a new, unknown step)."""
        size = batch = shape = None
        if isinstance(x, torch.Tensor) and x.dim() in (3, 4, 5):  # (B, C, [T,] H, W): H x W; (B, tokens, width): both
            size, batch, shape = (int(x.shape[-2]), int(x.shape[-1])), int(x.shape[0]), tuple(x.shape[1:])
        reported = self.progress is not None
        time = _first_timestep(timesteps)
        if reported:
            key, progress, steps = self.progress, self.progress, self.steps
        elif read_timestep and time is not None:
            key = float(time)  # the one read back from the device
            placed = self._placed(key) if self._times else None
            progress, steps = placed if placed is not None else (1.0 - key / 1000.0, None)
        else:
            key = progress = steps = None
        restarted = False
        if key is None or key != self._key:
            restarted = key is None or self._key is None or (key < self._key if reported else key > self._key)
            self._step = 0 if restarted else self._step + 1
            self._key = key
            self._index = 0
            self._step_time = time
        else:
            self._index += 1
        chunk = _chunk(kwargs)
        self.call = Call(
            size,
            batch,
            progress,
            key,
            self._step,
            self._index,
            restarted,
            steps,
            chunk,
            time,
            self._step_time,
            shape,
            _window(kwargs),
        )
        return self.call
