"""What a diffusers pipeline's scheduler says of the pass about to run, read once when its denoising loop starts: which
of the loop's steps each denoiser runs (Wan 2.2's two experts each run a part: a pass of its own, warm-up included) and,
where the sampler is the first-order Euler one the cache's correction is exact for, that part's sigmas.

* The loop's steps are what the pipeline's progress bar counts (``num_inference_steps``, less img2img's skipped
  start): one per sampler step, whatever the scheduler's order (Heun's two model calls are one step).
* Wan 2.2 (``WanPipeline``, ``WanImageToVideoPipeline``): ``transformer`` runs the steps whose timestep is at least
  ``boundary_ratio · num_train_timesteps``, ``transformer_2`` the rest (``pipeline_wan.py`` l.585-600).
* The correction (``cache_correction``) is exact under ``FlowMatchEulerDiscreteScheduler`` without
  ``stochastic_sampling``: ``x ← x + (σ' − σ) · out``, the transformer's output being Euler's direction. Its sigmas
  (the loop's part, its end included) go to the session (:meth:`tome_core.session.Session.set_euler`); under any other
  scheduler the session is told which, for the note where a gain set by hand cannot act.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

EULER = "FlowMatchEulerDiscreteScheduler"


@dataclass(frozen=True)
class Part:
    """The loop's steps one denoiser runs: from ``start`` (the loop's step count when it begins), ``steps`` of them;
    their Euler ``sigmas`` (``steps + 1``, the end included) or why there are none."""

    start: int
    steps: int
    sigmas: list[float] | None = None
    why_not: str | None = None

    def progress(self, done: int) -> float:
        """The fraction of this part done when the loop has done ``done`` steps."""
        return (done - self.start) / self.steps if self.steps else 0.0


def _values(tensor: Any) -> list[float] | None:
    if isinstance(tensor, torch.Tensor):
        return [float(v) for v in tensor.detach().flatten().cpu()]
    return None


def _begin(scheduler: Any) -> int:
    """The index of the pass's first timestep (img2img skips the start: ``set_begin_index``), 0 when unset."""
    begin = getattr(scheduler, "begin_index", None)
    return int(begin) if isinstance(begin, int) else 0


def _euler(scheduler: Any, begin: int, start: int, steps: int) -> tuple[list[float] | None, str | None]:
    """The sigmas of the loop's steps ``start`` … ``start + steps`` (its end included) under the Euler scheduler, or why
    not."""
    name = type(scheduler).__name__
    config = getattr(scheduler, "config", None)
    if name != EULER or getattr(config, "stochastic_sampling", False):
        return None, f"the scheduler is {name}; the correction is exact under {EULER} only"
    sigmas = _values(getattr(scheduler, "sigmas", None))
    part = None if sigmas is None else sigmas[begin + start : begin + start + steps + 1]
    if part is None or len(part) != steps + 1:
        return None, "the scheduler's sigmas do not match this pass's steps"
    return part, None


def _split(pipe: Any, names: Sequence[str], scheduler: Any, begin: int, total: int) -> list[tuple[int, int]] | None:
    """Each denoiser's ``(start, steps)`` where the pipeline hands the loop's steps to two experts by timestep (Wan
    2.2's ``boundary_ratio``); None where one denoiser runs them all."""
    ratio = getattr(getattr(pipe, "config", None), "boundary_ratio", None)
    if tuple(names) != ("transformer", "transformer_2") or ratio is None:
        return None
    train = getattr(getattr(scheduler, "config", None), "num_train_timesteps", None)
    timesteps = _values(getattr(scheduler, "timesteps", None))
    if train is None or timesteps is None:
        return None
    tail = timesteps[begin : begin + total]
    high = sum(1 for t in tail if t >= float(ratio) * float(train))
    return [(0, high), (high, len(tail) - high)]


def parts(pipe: Any, names: Sequence[str], total: int) -> dict[str, Part]:
    """Each denoiser's part of the loop about to run ``total`` steps (``names``: the pipeline's denoisers in order)."""
    scheduler = getattr(pipe, "scheduler", None)
    begin = _begin(scheduler)
    split = _split(pipe, names, scheduler, begin, total) or [(0, total)] * len(names)
    out = {}
    for name, (start, steps) in zip(names, split):
        sigmas, why_not = _euler(scheduler, begin, start, steps)
        out[name] = Part(start, steps, sigmas, why_not)
    return out
