"""ToMe on a diffusers pipeline: its denoisers patched for the length of each denoising loop, driven by that loop.

* **What is patched.** The pipeline's denoisers (``unet``; ``transformer``, and Wan 2.2's ``transformer_2``: each its
  own session, so each expert warms its cache up on its own part of the loop) and, with ``merge_controlnet``, its
  ControlNet models (``controlnet``, or each of a ``MultiControlNetModel``'s ``nets``) with merging alone: diffusers
  runs them before the UNet's call, as Forge does.
* **When.** Every diffusers pipeline opens its progress bar once its scheduler's timesteps are set, right before the
  denoising loop, and updates it after each step (``with self.progress_bar(total=num_inference_steps) as
  progress_bar``; a few older ones iterate ``self.progress_bar(timesteps)``). The patch answers the pipeline's
  ``progress_bar`` with the real bar, wrapped: opening it patches the denoisers (:func:`tome_core.apply_settings`),
  each update is one step of the loop, closing it (the loop's end, or an exception leaving it) removes every hook. So
  patches live as long as the loop, and the module tree, classes and weights never change. The instance attribute
  ``progress_bar`` is the only thing the patch puts on the pipeline (beside its record); :func:`remove` takes both off.
* **The step.** Each call of a denoiser is placed by the loop's step count (:class:`~diffusers_tome.schedule.Part`):
  the session is told its progress and steps before the call (a forward pre-hook ahead of the session's own), and
  the sampler where the scheduler is a linear one the correction acts under. No user calls ``set_progress``.
* **What happened** goes to the ``tome_core`` logger at the loop's end, as the ComfyUI nodes' console line: the
  settings, ``ToMe cache steps`` (and the speed-up they imply), and ``ToMe note`` (a warning) where ToMe could not
  act; :attr:`PipelinePatch.last` keeps that run record.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from tome_core import run as R
from tome_core.compiling import python_only
from tome_core.families import has_transformer_blocks
from tome_core.families.base import unwrap
from tome_core.report import PassCount
from tome_core.session import Session, apply_settings, remove_patch
from tome_core.settings import ToMeSettings

from .parallel import join
from .schedule import Part, parts

log = logging.getLogger("tome_core")

ATTR = "_tome_core_patch"
"""The patch's record on the pipeline (in its ``__dict__``: a pipeline's ``__setattr__`` would register it as config)."""
DENOISERS = ("unet", "transformer", "transformer_2")
"""The pipeline attributes that hold its denoisers, in the order its loop runs them."""


def denoisers(pipe: Any) -> list[tuple[str, nn.Module]]:
    """The pipeline's denoisers: ``(attribute, module)`` for each of :data:`DENOISERS` it holds."""
    found = ((name, getattr(pipe, name, None)) for name in DENOISERS)
    return [(name, module) for name, module in found if isinstance(module, nn.Module)]


def control_models(pipe: Any) -> list[nn.Module]:
    """The pipeline's ControlNet models with transformer blocks to merge (a ``MultiControlNetModel``'s ``nets``)."""
    control = getattr(pipe, "controlnet", None)
    nets = getattr(control, "nets", None)
    models = list(nets) if isinstance(nets, nn.ModuleList) else [control] if isinstance(control, nn.Module) else []
    return [m for m in models if has_transformer_blocks(m)]


def other_cache(model: nn.Module) -> str | None:
    """The step cache already on ``model``, by name, or None: diffusers' own (``enable_cache``: First Block Cache,
    TaylorSeer, MagCache, FasterCache, PAB; ``model._cache_config``), cache-dit's (``enable_cache(pipe)`` marks the
    transformer ``_is_cached``), or DeepCache's ``DeepCacheSDHelper`` (an instance ``forward`` on the UNet, under
    any of accelerate's and diffusers' hooks: :func:`_foreign_forward`)."""
    config = getattr(model, "_cache_config", None)
    if config is not None:
        return f"diffusers' {type(config).__name__.removesuffix('Config')}"
    if getattr(model, "_is_cached", False) is True:
        return "cache-dit"
    if _foreign_forward(model):
        return "another wrapper of its forward (DeepCache's helper)"
    return None


def _foreign_forward(model: nn.Module) -> bool:
    """Whether an instance ``forward`` that is neither accelerate's hook (``enable_model_cpu_offload``, sequential
    offload: ``add_hook_to_module`` keeps the forward it wraps as ``_old_forward``) nor diffusers' hook registry (group
    offloading, layerwise casting: ``_diffusers_hook``, which keeps the forward its first hook wraps) wraps ``model``'s
    own: those run the model's call unchanged, what is under them is looked at in turn."""
    forward = vars(model).get("forward")
    for _ in range(8):  # a few wrappers deep at most; deeper is treated as foreign
        if forward is None or getattr(forward, "__func__", None) is type(model).forward:
            return False  # the class's own forward
        qualname = getattr(getattr(forward, "func", None), "__qualname__", "")  # both wrap with functools.partial
        if qualname.startswith("add_hook_to_module.") and "_old_forward" in vars(model):
            forward = vars(model)["_old_forward"]
        elif qualname.startswith("HookRegistry.") and getattr(model, "_diffusers_hook", None) is not None:
            first = model._diffusers_hook._fn_refs[0]
            forward = first.original_forward if first.original_forward is not None else first.forward
        else:
            return True
    return True


class PipelinePatch:
    """ToMe's settings on one pipeline, and the sessions of the denoising loop running now (see the module)."""

    def __init__(self, pipe: Any, settings: ToMeSettings):
        self.pipe = pipe
        self.models = denoisers(pipe)
        if not self.models:
            looked = ", ".join(f".{name}" for name in DENOISERS)
            raise TypeError(f"ToMe: no UNet or transformer in {type(pipe).__name__} (looked for {looked})")
        self.settings = self._checked(settings)
        self.sessions: dict[str, Session] = {}
        self.last: R.Run | None = None  # what the last loop asked for and what happened
        self.steps: dict[str, PassCount] = {}  # the step cache's steps in the last loop, per denoiser
        self._parts: dict[str, Part] = {}
        self._done = 0  # the loop's steps done
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def _checked(self, settings: ToMeSettings) -> ToMeSettings:
        """``settings`` once every denoiser takes them (a ``cache_branch`` one of them lacks raises ``SettingsError``):
        a session made and removed again on each, nothing left."""
        for _, model in self.models:
            Session(unwrap(model), settings).remove()
        return settings

    def configure(self, settings: ToMeSettings) -> None:
        """New settings for the loops to come (a second ``apply_patch``): checked first, kept only if valid."""
        self.settings = self._checked(settings)

    # --- the pipeline's progress bar -------------------------------------------------------------------------
    def install(self) -> None:
        self.pipe.__dict__["progress_bar"] = self.progress_bar
        self.pipe.__dict__[ATTR] = self

    def uninstall(self) -> None:
        self.end()
        for name in ("progress_bar", ATTR):
            self.pipe.__dict__.pop(name, None)

    def progress_bar(self, iterable: Iterable | None = None, total: int | None = None) -> Any:
        """The pipeline's own progress bar (``DiffusionPipeline.progress_bar``), whose opening patches the denoisers for
        the loop and whose closing unpatches them; a bar opened inside a running loop is the plain one."""
        bar = type(self.pipe).progress_bar(self.pipe, iterable=iterable, total=total)
        if self.sessions:
            return bar
        if iterable is not None:
            return self._iterate(bar, len(iterable) if hasattr(iterable, "__len__") else None)
        return _Bar(self, bar, total)

    def _iterate(self, bar: Any, total: int | None) -> Iterator[Any]:
        self.begin(total)
        try:
            for item in bar:
                yield item
                self.step()
        finally:
            self.end()

    # --- one loop ------------------------------------------------------------------------------------------
    def begin(self, total: int | None) -> None:
        """The loop starts, ``total`` steps: patch the denoisers (all or none) with their parts of it."""
        self.end()  # a loop whose bar was never closed
        self.models = denoisers(self.pipe) or self.models  # as the pipeline holds them now (a model swapped in)
        settings = self.settings
        self.last = R.Run(settings)
        self.steps = {}
        self._done = 0
        names = [name for name, _ in self.models]
        self._parts = parts(self.pipe, names, total) if total else {}
        try:
            for name, held in self.models:
                # ``torch.compile(pipe.transformer)``: the session on the module it holds, whose hooks and blocks the
                # compiled call runs (ToMe's decisions out of its graph: :mod:`tome_core.compiling`); our step's hook
                # on the wrapper, before the compiled call
                model = unwrap(held)
                other = other_cache(model) if settings.caches else None
                if other is not None:  # two caches never both run; merging stays
                    self.last.note(f"step cache off: {other} already caches {name} (two caches never both run)")
                session = apply_settings(model, settings if other is None else settings.replace(cache=False))
                self.sessions[name] = session
                join(session, model)  # under diffusers' parallelism: the ranks its cache decides with (.parallel)
                part = self._parts.get(name)
                if part is not None:
                    session.set_sampler(*part.sampler)
                hook = functools.partial(self._place, name)
                self._handles.append(held.register_forward_pre_hook(hook, with_kwargs=True, prepend=True))
            if settings.merges and settings.merge_controlnet:
                first = self._parts.get(names[0])  # the control models run beside the (first) denoiser, at its step
                for i, control in enumerate(control_models(self.pipe)):
                    self.sessions[f"control {i}"] = apply_settings(control, settings.replace(cache=False))
                    hook = functools.partial(self._place, f"control {i}", part=first)
                    self._handles.append(control.register_forward_pre_hook(hook, with_kwargs=True, prepend=True))
        except BaseException:
            self.end()
            raise

    @python_only  # under ``pipe.transformer.compile()`` too: read afresh at every call, never traced into a graph
    def _place(self, name: str, module: nn.Module, args: tuple, kwargs: dict, part: Part | None = None) -> None:
        """Before a call of the model whose session is ``name``: its progress in its part of the loop (``part``, else
        the denoiser's own), before the session places the call."""
        part, session = part or self._parts.get(name), self.sessions.get(name)
        if part is not None and session is not None:
            session.set_progress(part.progress(self._done), part.steps)

    def step(self, n: int = 1) -> None:
        """The loop finished ``n`` steps (the progress bar's update)."""
        self._done += int(n)

    def end(self) -> None:
        """The loop ended (or failed): say what happened and remove every hook of the loop."""
        if not self.sessions:
            return
        run = self.last
        try:
            for name, session in self.sessions.items():
                report = session.report()
                passes = report.cache.passes if report.cache is not None else ()
                if passes:
                    self.steps[name] = sum(passes[1:], passes[0])  # one loop: one pass of this denoiser
                if run is not None:
                    run.note(*report.notes)
            if run is not None:
                run.count_cache(self.steps.values())
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()
            for session in self.sessions.values():
                remove_patch(session.root)
            self.sessions.clear()
        if run is not None:
            _say(run)

    def cache_stats(self) -> list[dict[str, int]]:
        """The step cache's steps in the last loop, one pass per denoiser in the loop's order (Wan 2.2's experts each
        their own), as :func:`tome_core.cache_stats` gives them for a model."""
        return [count.to_dict() for count in self.steps.values()]


def _say(run: R.Run) -> None:
    info = {**R.infotext(run.settings, None), **run.cache_entries()}
    log.info(", ".join(f"{key}: {value}" for key, value in info.items()))
    if run.note_text:
        log.warning(f"{R.NOTE_KEY}: {run.note_text}")


class _Bar(contextlib.AbstractContextManager):
    """The pipeline's progress bar (a tqdm), opening and closing the loop's patch; everything else is the bar's."""

    def __init__(self, patch: PipelinePatch, bar: Any, total: int | None):
        self._patch, self._bar = patch, bar
        patch.begin(total)  # opened here, not at __enter__: a pipeline may use the bar without ``with``

    def __enter__(self) -> _Bar:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        try:
            self._patch.end()
        except BaseException:
            self._bar.__exit__(*exc)
            raise
        return self._bar.__exit__(*exc)

    def update(self, n: int = 1) -> Any:
        self._patch.step(n)
        return self._bar.update(n)

    def close(self) -> Any:
        self._patch.end()
        return self._bar.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bar, name)
