"""Model families: the only place that names a model's modules or reads its calls. A family is an adapter that knows
one model's layout: where a call's input and time are (:meth:`Layout.place`), where the step cache skips blocks and
where their result enters again (:class:`~tome_core.families.base.Layout`), and, for the UNets, where token merging
acts (:func:`transformer_blocks`) and what a ControlNet model's cached call never reads (:func:`control_skipped`). The
families: the ldm/sgm/Forge/ComfyUI UNets (:mod:`.unet`); diffusers' transformers, each restricted to its class:
FLUX.1 (Kontext too), FLUX.2 and Chroma, HunyuanVideo (:mod:`.flux`), Wan, SD3/SD3.5, HunyuanVideo 1.5, CogVideoX,
Lumina 2, LTX-Video and Cosmos (:mod:`.chain`; Qwen-Image is ComfyUI's family below, its names and calls being the
same); FLUX/Chroma (:mod:`.bfl`) as ComfyUI, Forge and Forge Neo run it, Wan, Lumina 2/Z-Image and Qwen-Image
(:mod:`.chain`) as ComfyUI and Forge Neo run them, SD3/SD3.5 and Cosmos Predict2 (:mod:`.chain`) as ComfyUI runs them,
and Anima (:mod:`.chain`) as Forge Neo runs it.

:data:`ASIDE` names the model classes no family knows on purpose, and why: the step cache stands aside on them and its
note says so (:func:`aside`)."""

from __future__ import annotations

from torch import nn

from .base import Layout, PassState
from .bfl import BflFlux
from .chain import (
    ComfyCosmos,
    ComfyLumina,
    ComfyMMDiT,
    ComfyQwenImage,
    ComfyWan,
    DiffusersCogVideoX,
    DiffusersCosmos,
    DiffusersHunyuanVideo15,
    DiffusersLTXVideo,
    DiffusersLumina2,
    DiffusersSD3,
    DiffusersWan,
)
from .flux import DiffusersFlux, DiffusersFlux2, DiffusersHunyuanVideo
from .unet import (
    DiffusersUNet,
    UNetLayout,
    block_holders,
    control_skipped,
    has_transformer_blocks,
    transformer_blocks,
    unet_input,
)

FAMILIES: tuple[type[Layout], ...] = (
    UNetLayout,
    DiffusersUNet,
    DiffusersFlux,
    BflFlux,
    ComfyWan,
    DiffusersWan,
    ComfyLumina,
    ComfyQwenImage,
    ComfyMMDiT,
    ComfyCosmos,
    DiffusersSD3,
    DiffusersFlux2,
    DiffusersHunyuanVideo,
    DiffusersHunyuanVideo15,
    DiffusersCogVideoX,
    DiffusersLumina2,
    DiffusersLTXVideo,
    DiffusersCosmos,
)

ASIDE: dict[str, str] = {
    "ZImageTransformer2DModel": (
        "its input is a list of latents and its output layer one of all_final_layer, picked per call by patch size"
    ),
}
"""Model classes (by name, as in their MRO) the step cache knows and leaves alone, and why: a layout that does not fit
the families' machinery."""


def layout_for(root: nn.Module, branch: int) -> Layout | None:
    """The layout of the first family that recognises ``root`` (``branch``: how deep a cached step runs before and
    after the skipped blocks), or None."""
    for family in FAMILIES:
        layout = family.find(root, branch)
        if layout is not None:
            return layout
    return None


def aside(root: nn.Module) -> str | None:
    """Why the step cache leaves ``root`` alone, naming its class (:data:`ASIDE`); None for any other model."""
    for c in type(root).__mro__:
        if c.__name__ in ASIDE:
            return f"{c.__name__}: {ASIDE[c.__name__]}"
    return None


__all__ = [
    "ASIDE",
    "FAMILIES",
    "BflFlux",
    "ComfyCosmos",
    "ComfyLumina",
    "ComfyMMDiT",
    "ComfyQwenImage",
    "ComfyWan",
    "DiffusersFlux",
    "DiffusersSD3",
    "DiffusersUNet",
    "DiffusersWan",
    "Layout",
    "PassState",
    "UNetLayout",
    "aside",
    "block_holders",
    "control_skipped",
    "has_transformer_blocks",
    "layout_for",
    "transformer_blocks",
    "unet_input",
]
