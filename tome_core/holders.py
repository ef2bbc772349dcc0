"""Objects that hold the models a library samples with, and the adapter package that patches them: a diffusers
pipeline (its UNet or transformers, its ControlNets, and the denoising loop and scheduler that drive them) is patched
by ``diffusers_tome``. The core names the adapter and never imports the library: the adapter is imported only when
one of the library's objects is given, so ``tome_core.apply_patch(pipe)`` works as ``tomesd.apply_patch(pipe)`` does.

An adapter module has ``apply(holder, settings)`` (the holder's patch, re-configured if it has one; raises
:class:`~tome_core.settings.SettingsError` or ``TypeError`` with nothing patched), ``get(holder)`` (its patch or None)
and ``remove(holder)``. A module (``pipe.unet``) is never a holder: the core patches it directly."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from torch import nn

ADAPTERS = {"diffusers": "diffusers_tome"}
"""The adapter package of each library whose objects hold models, by the library's top-level package."""


def adapter_for(obj: Any) -> ModuleType | None:
    """The adapter that patches ``obj``, where ``obj`` is a holder of a library :data:`ADAPTERS` names (its class or a
    base class defined there, so a user's subclass of a pipeline counts); else None."""
    if obj is None or isinstance(obj, nn.Module):
        return None
    for cls in type(obj).__mro__:
        name = ADAPTERS.get(cls.__module__.partition(".")[0])
        if name is not None:
            return importlib.import_module(name)
    return None
