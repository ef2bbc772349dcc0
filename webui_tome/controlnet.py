"""Finding the control models of Mikubill's sd-webui-controlnet, so that they merge tokens too.

ControlNet keeps its state on its Script instance: ``latest_network`` (a ``UnetHook``, set in its
``process`` and cleared in its ``postprocess``) holds ``control_params``, each with a
``control_model`` wrapper (``PlugableControlModel`` / ``PlugableAdapter``) whose ``control_model`` is
the ``nn.Module`` it calls with ``x, hint, timesteps, context``. Those internals change often, so
every step is checked and anything unexpected degrades to merging in the UNet only, with one note.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import nn

from tome_core import has_transformer_blocks

NOTE_UNEXPECTED = "ControlNet internals not recognised: merging in the UNet only"


def _controlnet_script(p: Any) -> Any | None:
    runner = getattr(p, "scripts", None)
    for script in getattr(runner, "alwayson_scripts", None) or ():
        try:
            if str(script.title()).lower() == "controlnet":
                return script
        except Exception:  # another extension's broken title() is not our failure
            continue
    return None


def _module_of(param: Any) -> nn.Module | None:
    """The nn.Module a ControlNet unit runs: the wrapper's ``control_model``, or the wrapper itself."""
    wrapper = getattr(param, "control_model", None)
    inner = getattr(wrapper, "control_model", None)
    for candidate in (inner, wrapper):
        if isinstance(candidate, nn.Module):
            return candidate
    return None


def control_models(p: Any, notes: list[str]) -> Iterator[nn.Module]:
    """The active control models that have transformer blocks (adapters have none: nothing to merge).

    Appends a note (once) to ``notes`` when ControlNet is present but not laid out as expected."""
    script = _controlnet_script(p)
    if script is None:
        return
    network = getattr(script, "latest_network", None)
    if network is None:  # no enabled unit in this generation
        return
    params = getattr(network, "control_params", None)
    if not isinstance(params, (list, tuple)):
        if NOTE_UNEXPECTED not in notes:
            notes.append(NOTE_UNEXPECTED)
        return
    seen: set[int] = set()
    for param in params:
        if getattr(param, "control_model", None) is None:
            continue  # reference-only / attention-injection units have no model of their own
        module = _module_of(param)
        if module is None:
            if NOTE_UNEXPECTED not in notes:
                notes.append(NOTE_UNEXPECTED)
            continue
        if id(module) not in seen and has_transformer_blocks(module):
            seen.add(id(module))
            yield module
