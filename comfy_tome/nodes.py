"""The ComfyUI nodes (V1 API): small, chainable MODEL -> MODEL patches, their inputs derived from the settings record."""

from __future__ import annotations

from typing import Any

from . import inputs, sampling

CATEGORY = "model_patches/unet"  # beside ComfyUI's own TomePatchModel, HyperTile, FreeU


class ToMe:
    """``ToMe``: token merging (ToMe for SD, or ToDo) in the UNet, and with ``merge_controlnet`` in its ControlNet
    models, for this model's samplings."""

    DESCRIPTION = (
        "Token merging (ToMe for SD: the same images as tomesd; or ToDo, key/value downsampling) in the UNet's "
        "transformer blocks, and in the ControlNet models, for the samplings of this model only. max_downsample "
        "auto merges at SDXL's first attention level too. Chain ToMeStepCache after it for both."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return inputs.input_types(inputs.merge_fields(), "The model to merge tokens in (the one given is unchanged).")

    def patch(self, model: Any, **settings: Any) -> tuple[Any]:
        return (sampling.attach(model, "merge", settings),)


class ToMeStepCache:
    """``ToMeStepCache``: the step cache (DeepCache) on the model's blocks (a UNet's or a diffusion transformer's) for
    this model's samplings."""

    DESCRIPTION = (
        "Step cache (DeepCache): every cache_interval-th step runs the whole model, the steps between run only the "
        "shallowest skip branch of a UNet (SD1, SD2, SDXL) or the first block of a diffusion transformer (FLUX, "
        "Chroma, Wan) and take the rest's result forecast from the last two full steps (cache_forecast auto: "
        "calibrated on UNets, linear on transformers; off reuses the last one, as DeepCache does). Cached steps "
        "still follow the ControlNet image. With ToMe before it, both work together (ToMe merges in UNets only)."
    )
    CATEGORY = CATEGORY
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        types = inputs.input_types(inputs.cache_fields(), "The model to cache steps of (the one given is unchanged).")
        return {**types, "hidden": {"unique_id": "UNIQUE_ID"}}  # where the node shows how the cache ran

    def patch(self, model: Any, unique_id: str | None = None, **settings: Any) -> tuple[Any]:
        return (sampling.attach(model, "cache", settings, node=unique_id),)


NODE_CLASS_MAPPINGS = {"ToMe": ToMe, "ToMeStepCache": ToMeStepCache}
NODE_DISPLAY_NAME_MAPPINGS = {"ToMe": "ToMe: token merging", "ToMeStepCache": "ToMe: step cache (DeepCache)"}
