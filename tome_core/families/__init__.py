"""Model families: the only place that names a model's modules or reads its calls. A family is an adapter that knows
one model's layout: where a call's input and time are (:meth:`Layout.place`), where the step cache skips blocks and
where their result enters again (:class:`~tome_core.families.base.Layout`), and, for the UNets, where token merging
acts (:func:`transformer_blocks`) and what a ControlNet model's cached call never reads (:func:`control_skipped`). The
families: the ldm/sgm/Forge/ComfyUI UNets (:mod:`.unet`), diffusers' FLUX transformer (:mod:`.flux`), Wan and SD3
transformers (:mod:`.chain`), FLUX/Chroma (:mod:`.bfl`) as ComfyUI, Forge and Forge Neo run it, Wan, Lumina 2/Z-Image and Qwen-Image (:mod:`.chain`)
as ComfyUI and Forge Neo run them, SD3/SD3.5 and Cosmos Predict2 (:mod:`.chain`) as ComfyUI runs them, and Anima
(:mod:`.chain`) as Forge Neo runs it."""

from __future__ import annotations

from torch import nn

from .base import Layout, PassState
from .bfl import BflFlux
from .chain import ComfyCosmos, ComfyLumina, ComfyMMDiT, ComfyQwenImage, ComfyWan, DiffusersSD3, DiffusersWan
from .flux import DiffusersFlux
from .unet import (
    UNetLayout,
    block_holders,
    control_skipped,
    has_transformer_blocks,
    transformer_blocks,
    unet_input,
)

FAMILIES: tuple[type[Layout], ...] = (
    UNetLayout,
    DiffusersFlux,
    BflFlux,
    ComfyWan,
    DiffusersWan,
    ComfyLumina,
    ComfyQwenImage,
    ComfyMMDiT,
    ComfyCosmos,
    DiffusersSD3,
)


def layout_for(root: nn.Module, branch: int) -> Layout | None:
    """The layout of the first family that recognises ``root`` (``branch``: how deep a cached step runs before and
    after the skipped blocks), or None."""
    for family in FAMILIES:
        layout = family.find(root, branch)
        if layout is not None:
            return layout
    return None


__all__ = [
    "FAMILIES",
    "BflFlux",
    "ComfyCosmos",
    "ComfyLumina",
    "ComfyMMDiT",
    "ComfyQwenImage",
    "ComfyWan",
    "DiffusersFlux",
    "DiffusersSD3",
    "DiffusersWan",
    "Layout",
    "PassState",
    "UNetLayout",
    "block_holders",
    "control_skipped",
    "has_transformer_blocks",
    "layout_for",
    "transformer_blocks",
    "unet_input",
]
