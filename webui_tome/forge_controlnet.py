"""Finding the control models of Forge's built-in ControlNet (``extensions-builtin/sd_forge_controlnet``), the
adapter beside :mod:`webui_tome.controlnet` (Mikubill's, for the WebUI).

Forge's ControlNet keeps no model on its script: each unit's ``process_before_every_sampling`` puts a copy of
its control net into a clone of the UNet patcher (``apply_controlnet_advanced`` -> ``add_patched_controlnet``),
so during sampling they are ``sd_model.forge_objects.unet.list_controlnets()``, each with the ``nn.Module`` it
calls at ``.control_model`` (the same module every generation: Forge caches loaded models). A ControlLora's
``control_model`` exists only from the sampler's start (``pre_run``) to its end (``cleanup``), so the caller
looks at the first denoiser call of each sampling pass. T2I adapters (``.t2i_model``, no transformer blocks)
and anything unexpected are left alone: the UNet still merges.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import nn

from tome_core import has_transformer_blocks


def control_models(sd_model: Any) -> Iterator[nn.Module]:
    """The control models with transformer blocks attached to the UNet patcher that samples now."""
    patcher = getattr(getattr(sd_model, "forge_objects", None), "unet", None)
    lister = getattr(patcher, "list_controlnets", None)
    if not callable(lister):
        return
    try:
        controlnets = list(lister())
    except Exception:  # a linked list in an unexpected state is not our failure: UNet only
        return
    seen: set[int] = set()
    for controlnet in controlnets:
        module = getattr(controlnet, "control_model", None)
        if isinstance(module, nn.Module) and id(module) not in seen:
            seen.add(id(module))
            if has_transformer_blocks(module):
                yield module
