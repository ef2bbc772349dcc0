"""Recognising another step cache on the UNet patcher that samples: Forge Neo's built-in caches, beside
:mod:`webui_tome.forge_controlnet` (another adapter that reads Forge's patcher).

Two step caches never run on one model: each would take the other's skipped or forecast steps for real ones. Where one
of these is set on the patcher, ToMe's step cache steps aside for that pass (token merging still acts on the steps the
UNet runs). Read from upstream Neo's source (Haoming02/sd-webui-forge-classic, branch ``neo``):

* **Spectrum Integrated** (``extensions-builtin/sd_forge_spectrum``: ``lib_spectrum/forecaster.py``,
  ``SpectrumNode.patch``): a UNet function wrapper named ``spectrum_unet_wrapper`` on a clone of the patcher
  (``set_model_unet_function_wrapper``), which on its cached steps returns a Chebyshev forecast without calling the
  model at all.
* **First Block Cache Integrated** (``extensions-builtin/sd_forge_fbcache/scripts/forge_fbcache.py``): its settings at
  ``model_options["transformer_options"]["fbcache"]`` on a clone, read by the diffusion model itself (DiTs only).
"""

from __future__ import annotations

from typing import Any

SPECTRUM = "Spectrum Integrated"
FBCACHE = "First Block Cache Integrated"
_SPECTRUM_WRAPPER = "spectrum_unet_wrapper"


def other_cache(sd_model: Any) -> str | None:
    """The title of another step cache set on ``sd_model.forge_objects.unet`` now, or None (also for anything that is
    not laid out so: the WebUI's models)."""
    patcher = getattr(getattr(sd_model, "forge_objects", None), "unet", None)
    options = getattr(patcher, "model_options", None)
    if not isinstance(options, dict):
        return None
    wrapper = options.get("model_function_wrapper")
    if getattr(wrapper, "__name__", None) == _SPECTRUM_WRAPPER:
        return SPECTRUM
    transformer_options = options.get("transformer_options")
    if isinstance(transformer_options, dict) and transformer_options.get("fbcache"):
        return FBCACHE
    return None
