"""What a diffusers pipeline's scheduler says of the pass about to run, read once when its denoising loop starts: which
of the loop's steps each denoiser runs (Wan 2.2's two experts each run a part: a pass of its own, warm-up included) and,
where the sampler is a linear one the cache's correction acts under, that part's sampler.

* The loop's steps are what the pipeline's progress bar counts (``num_inference_steps``, less img2img's skipped
  start): one per sampler step, whatever the scheduler's order (Heun's two model calls are one step).
* Wan 2.2 (``WanPipeline``, ``WanImageToVideoPipeline``): ``transformer`` runs the steps whose timestep is at least
  ``boundary_ratio · num_train_timesteps``, ``transformer_2`` the rest (``pipeline_wan.py`` l.585-600).
* The correction (``cache_correction``) acts under the linear schedulers (:data:`LINEAR`): the part's sigmas and its
  sampler go to the session (:meth:`tome_core.session.Session.set_sampler`), Euler as the core's own, the multistep
  ones as the scheduler's own loop over the part (run once, on a copy, to read it as the linear map it is); under any
  other scheduler the session is told which, for the note where a gain set by hand cannot act.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

EULER = "FlowMatchEulerDiscreteScheduler"
LINEAR = (EULER, "UniPCMultistepScheduler", "DPMSolverMultistepScheduler")
"""The schedulers the correction acts under (without noise: not Euler's ``stochastic_sampling``, not DPM-Solver's SDE
algorithms)."""


@dataclass(frozen=True)
class Part:
    """The loop's steps one denoiser runs: from ``start`` (the loop's step count when it begins), ``steps`` of them;
    where the correction can act, the sampler's ``name``, the part's ``sigmas`` (``steps + 1``, the end included) and
    ``sample``, the scheduler's loop over the part as a sampler function (k-diffusion's signature), else why not."""

    start: int
    steps: int
    sigmas: list[float] | None = None
    why_not: str | None = None
    name: str | None = None
    sample: Callable[..., torch.Tensor] | None = None

    @property
    def sampler(self) -> tuple:
        """What :meth:`tome_core.session.Session.set_sampler` takes."""
        return self.name, self.sigmas, self.sample, self.why_not

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


def _linear(scheduler: Any) -> str | None:
    """Why ``scheduler`` is no linear sampler (it draws noise, or is one the correction does not know), or None."""
    name, config = type(scheduler).__name__, getattr(scheduler, "config", None)
    if name == EULER and not getattr(config, "stochastic_sampling", False):
        return None
    if name == "UniPCMultistepScheduler":
        return None
    if name == "DPMSolverMultistepScheduler" and getattr(config, "algorithm_type", "") in ("dpmsolver++", "dpmsolver"):
        return None
    return f"the scheduler is {name}; the correction acts under {', '.join(LINEAR)}"


def _sampler(scheduler: Any, begin: int, start: int, steps: int) -> Part:
    """The loop's steps ``start`` … ``start + steps`` as a part with its sampler (:class:`Part`), or why not."""
    why = _linear(scheduler)
    if why is not None:
        return Part(start, steps, why_not=why)
    sigmas = _values(getattr(scheduler, "sigmas", None))
    part = None if sigmas is None else sigmas[begin + start : begin + start + steps + 1]
    timesteps = getattr(scheduler, "timesteps", None)
    if part is None or len(part) != steps + 1 or timesteps is None or len(timesteps) < begin + start + steps:
        return Part(start, steps, why_not="the scheduler's sigmas do not match this pass's steps")
    name = type(scheduler).__name__
    if name == EULER:  # the core's own Euler on these sigmas is the scheduler's step
        return Part(start, steps, part, name="euler")
    loop = timesteps[begin : begin + start + steps]

    def sample(model: Callable, x: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
        """The scheduler's loop from the pass's start to the part's end, on a copy: the outputs before the part are
        another denoiser's (zero here: they add to ``x`` alone), the part's are the model's output, ``x − D(x, 1)``
        of k-diffusion's denoiser ``D`` at σ 1 (``D = x − σ·out``)."""
        copy, one = _copy.deepcopy(scheduler), torch.ones((), dtype=x.dtype)
        for i, t in enumerate(loop):
            out = x - model(x, one) if i >= start else torch.zeros_like(x)
            x = copy.step(out, t, x, return_dict=False)[0]
        return x

    return Part(start, steps, part, name=name, sample=sample)


def part_of(scheduler: Any) -> Part:
    """The whole loop of ``scheduler`` (its timesteps set, from its begin index) as one part, with its sampler."""
    begin = _begin(scheduler)
    return _sampler(scheduler, begin, 0, len(getattr(scheduler, "timesteps", ())) - begin)


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
        out[name] = _sampler(scheduler, begin, start, steps)
    return out
