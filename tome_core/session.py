"""One patched model: a session holds the model's family and the capabilities the settings ask for, side by side —
token merging (:class:`~tome_core.merging.TokenMerger`) and the step cache (:class:`~tome_core.caching.StepCache`) —
and places every call of the model in the sampling for both.

* The family is recognised once (:func:`tome_core.families.layout_for`): it says how a call reads (its input and
  time), where the cache skips blocks and, for the UNets, where merging acts. A capability is built only where it
  acts: no merger on a diffusion transformer or without a ratio, no cache without ``cache``.
* A forward pre-hook on the root places each call (:class:`~tome_core.steps.StepClock`: latent size, step, the call's
  number within its step, its stream) and hands it to each capability (:meth:`Session._root_pre`). The step is what
  the caller reports through :meth:`Session.set_progress` (the WebUI script: step index / steps of the sampling
  pass; the hires pass restarts at 0); when nothing was reported it is derived from the call's timestep as
  ``1 - t / 1000`` (a 1000-step DDPM schedule).
* Everything is hooks, and instance ``forward``\\ s only where the cache must skip compute, so the module tree, the
  classes and ``state_dict()`` never change; :meth:`Session.remove` restores the model exactly, and a failure
  part-way through installing removes what was installed.
* :meth:`Session.report` says what each capability could not do (:class:`~tome_core.report.Report`): a module without
  transformer blocks (Forge's Flux, SD3, Chroma: merged nothing), blocks whose ``attn1`` never ran, a cache that stood
  aside, and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .caching import ControlFollower, StepCache
from .caching.samplers import SamplerFunction
from .compiling import python_only_hook
from .families import aside, layout_for, transformer_blocks, unet_input
from .holders import adapter_for
from .merging import TokenMerger
from .report import Report
from .settings import ToMeSettings
from .steps import StepClock

_ATTR = "_tome_core_patch"  # our only attribute on the root module; tomesd's remove_patch ignores it


def _attr(obj: Any, path: str) -> Any:
    """``obj.a.b.c`` for ``path="a.b.c"``, or None if any step is missing or fails."""
    for name in path.split("."):
        try:
            obj = getattr(obj, name, None)
        except Exception:  # a property that raises (a model half loaded): nothing there
            return None
        if obj is None:
            return None
    return obj


_UNET_PATHS = (
    "forge_objects.unet.model.diffusion_model",  # Forge: ForgeDiffusionEngine (a plain object) -> UnetPatcher -> KModel
    "model.diffusion_model",  # A1111 / Forge Classic LatentDiffusion, sgm DiffusionEngine; Forge's UnetPatcher
    "diffusion_model",  # Forge's KModel, ldm's DiffusionWrapper
)


def find_unet(model: Any) -> nn.Module | None:
    """The module that really runs, the one to patch and to clean: the first ``nn.Module`` at one of
    ``forge_objects.unet.model.diffusion_model`` (a Forge engine), ``model.diffusion_model`` (WebUI
    LatentDiffusion / SDXL DiffusionEngine, Forge Classic, a Forge ``UnetPatcher``), ``diffusion_model``
    (a Forge ``KModel``, whose own hooks would never fire: Forge calls ``apply_model``), else ``model``
    itself if it is a module. None when there is no module (Forge's ``FakeInitialModel``, ``None``).
    Patching, :func:`get_patch` and :func:`remove_patch` all resolve through it."""
    for path in _UNET_PATHS:
        inner = _attr(model, path)
        if isinstance(inner, nn.Module):
            return inner
    return model if isinstance(model, nn.Module) else None


class Session:
    """ToMe on one root module: its family and capabilities (see the module). Create through :func:`apply_settings`.

    ``leader``: for a ControlNet model that runs inside the UNet's call, the UNet's step cache, whose cached calls
    then shorten the control model's forward (:class:`~tome_core.caching.ControlFollower`)."""

    def __init__(
        self, root: nn.Module, settings: ToMeSettings, leader: StepCache | None = None, name: str | None = None
    ):
        self.root = root
        self.name = name or type(root).__name__  # what the report's notes call the model
        self.settings = settings
        self.clock = StepClock()
        self.forwards = 0  # calls of the root seen
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        blocks = list(transformer_blocks(root)) if settings.merges else []
        # the family, recognised once where the cache needs its layout or a model with nothing to merge is told apart
        # (SettingsError for a cache_branch it lacks, before any hook)
        wanted = settings.caches or (settings.merges and not blocks)
        self.layout = layout_for(root, settings.cache_branch if settings.caches else 0) if wanted else None
        self.transformer = self.layout is not None and self.layout.transformer
        self.merger = TokenMerger(root, settings, blocks) if blocks and not self.transformer else None
        self.cache = None
        if settings.caches:  # a model no family knows: the cache stands aside, saying why where the families know
            self.cache = StepCache(root, settings, self.layout, aside(root) if self.layout is None else None)
        self.follower = ControlFollower(root, leader) if leader is not None else None  # a control model's
        self._place = self.layout.place if self.layout is not None else unet_input
        self._install()

    @property
    def progress(self) -> float | None:
        """The sampling progress last reported (:meth:`set_progress`), or None."""
        return self.clock.progress

    def set_progress(self, fraction: float | None, steps: int | None = None) -> None:
        """Report sampling progress (0 at the first step, 1 at the end; ``None`` when unknown) and, if known, the
        pass's number of steps.

        A sampling pass reports its steps in order; a smaller value starts a new pass (hires fix, the
        next generation), which also drops the plans kept for reuse."""
        self.clock.set_progress(fraction, steps)

    def set_sampler(
        self,
        name: str | None,
        sigmas: Sequence[float] | None = None,
        sample: SamplerFunction | None = None,
        why_not: str | None = None,
    ) -> None:
        """Say the sampler of the passes to come: ``name`` (ComfyUI's sampler names: ``euler``, ``uni_pc``,
        ``uni_pc_bh2``, ``res_multistep``, ``dpmpp_2m``, ``deis``, …) on ``sigmas`` (the pass's schedule, its end
        included) and, where the host has it, its ``sample`` function (k-diffusion's signature); with
        ``cache_correction`` the step cache then corrects its cached steps under that sampler
        (:mod:`tome_core.caching.samplers`). None, or a sampler that is no linear one (ancestral, SDE, two calls a
        step): the correction stands aside (``why_not``: why, for the note). A caller that does not report each step's
        progress (:meth:`set_progress`) needs nothing more: each call is placed on ``sigmas`` by its timestep."""
        self.clock.set_schedule(sigmas)
        if self.cache is not None:
            self.cache.set_sampler(name, sigmas, sample, why_not)

    def set_euler(self, sigmas: Sequence[float] | None, why_not: str | None = None) -> None:
        """:meth:`set_sampler`'s Euler case: the first-order Euler sampler on ``sigmas``, or None: another sampler
        (``why_not``: which)."""
        self.set_sampler(None if sigmas is None else "euler", sigmas, why_not=why_not)

    # --- installing ---------------------------------------------------------------------------------
    def _install(self) -> None:
        """Register every hook of every capability, or none: a failure part-way removes those already registered."""
        if self.follower is not None and self.follower.usable:
            self.follower.install()
        if self.merger is None and self.cache is None:
            return
        try:
            self._handles.append(
                self.root.register_forward_pre_hook(python_only_hook(self._root_pre), with_kwargs=True)
            )
            if self.merger is not None:
                self.merger.install()
            if self.cache is not None:
                self.cache.install()
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.merger is not None:
            self.merger.remove()
        if self.cache is not None:
            self.cache.remove()
        if self.follower is not None:
            self.follower.remove()
        if self.root.__dict__.get(_ATTR) is self:
            del self.root.__dict__[_ATTR]

    # --- per call ------------------------------------------------------------------------------------
    def _root_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """Start of a call of the model: place it in the sampling (:class:`~tome_core.steps.StepClock`: latent size,
        step, the call's number within its step) and hand it to each capability.

        With progress reported (:meth:`set_progress`, as the WebUI script does every step) all of that
        comes from the reported value and the call reads nothing back from the device: no host
        synchronisation. Without it, the timestep is read as a Python number (one device-to-host read
        per call) when a capability needs it: the cache, ``use_rand``, plan reuse, or a step schedule other than 0–1.
        Either key is shared by the cond and uncond calls of one step and is the same in every process.
        """
        self.forwards += 1
        x, timesteps = self._place(module, args, kwargs)
        call = self.clock.begin(x, timesteps, kwargs, read_timestep=self._needs_timestep)
        if self.merger is not None:
            self.merger.begin(call)
        if self.cache is not None:
            self.cache.begin(call, x)

    @property
    def _needs_timestep(self) -> bool:
        """Whether a call without reported progress has to read its timestep (never when nothing merges or caches)."""
        return self.cache is not None or (self.merger is not None and self.merger.needs_timestep)

    # --- what was done -----------------------------------------------------------------------------
    def report(self) -> Report:
        """What each capability did and could not do since the session began or :meth:`reset_report` (see
        :class:`Report`; its ``notes`` are the phrases a host shows). Never raises."""
        return Report(
            model=self.name,
            forwards=self.forwards,
            merge=None if self.merger is None else self.merger.report(),
            cache=None if self.cache is None else self.cache.report(),
            merging=self.settings.merges,
            transformer=self.transformer,
        )

    def reset_report(self) -> None:
        """Start counting afresh (e.g. at the start of each sampling pass)."""
        self.forwards = 0
        if self.merger is not None:
            self.merger.reset_report()


def get_patch(model: Any) -> Session | Any | None:
    """The session on ``model`` (or on the UNet :func:`find_unet` resolves), if any; for a holder of several models (a
    diffusers pipeline, :mod:`tome_core.holders`) its adapter's patch."""
    adapter = adapter_for(model)
    if adapter is not None:
        return adapter.get(model)
    root = find_unet(model)
    return None if root is None else root.__dict__.get(_ATTR)


def apply_settings(model: Any, settings: ToMeSettings, leader: StepCache | None = None) -> Session | Any:
    """Patch the UNet or transformer :func:`find_unet` resolves with validated settings, replacing (never stacking
    on) a session already there. A model without transformer blocks gets a session that merges nothing and says so
    (:meth:`Session.report`, whose notes name the class of ``model``: Forge's engine ``Flux``); ``TypeError`` (nothing
    patched) when there is no module at all. ``leader``: see :class:`Session`. A holder of several models (a diffusers
    pipeline) goes to its adapter (:mod:`tome_core.holders`), which returns its own patch."""
    adapter = adapter_for(model)
    if adapter is not None:
        return adapter.apply(model, settings)
    root = find_unet(model)
    if root is None:
        looked = ", ".join(f".{path}" for path in _UNET_PATHS)
        raise TypeError(f"ToMe: no UNet module in {type(model).__name__} (looked for {looked}, or a module itself)")
    remove_patch(root)
    session = Session(root, settings, leader, type(model).__name__)
    root.__dict__[_ATTR] = session
    return session


def remove_patch(model: Any) -> Any:
    """Remove our session from ``model`` (or the UNet it holds, or every model a holder's adapter patched); a no-op if
    it has none. Returns ``model``."""
    adapter = adapter_for(model)
    if adapter is not None:
        return adapter.remove(model)
    session = get_patch(model)
    if session is not None:
        session.remove()
    return model
