"""Model families: how the step cache finds, in one model, the blocks a cached step skips and where their result
enters again (:class:`~tome_core.families.base.Layout`). The cache speaks of blocks; a family is an adapter that
knows one model's layout: the ldm/sgm/Forge/ComfyUI UNets (:mod:`.unet`), diffusers' FLUX transformer (:mod:`.flux`)
FLUX/Chroma (:mod:`.bfl`) as ComfyUI, Forge and Forge Neo run it, Wan, Lumina 2/Z-Image and Qwen-Image (:mod:`.chain`)
as ComfyUI and Forge Neo run them, SD3/SD3.5 and Cosmos Predict2 (:mod:`.chain`) as ComfyUI runs them, and Anima
(:mod:`.chain`) as Forge Neo runs it."""

from __future__ import annotations

from torch import nn

from .base import Layout
from .bfl import BflFlux
from .chain import ComfyCosmos, ComfyLumina, ComfyMMDiT, ComfyQwenImage, ComfyWan
from .flux import DiffusersFlux
from .unet import UNetLayout

FAMILIES: tuple[type[Layout], ...] = (
    UNetLayout,
    DiffusersFlux,
    BflFlux,
    ComfyWan,
    ComfyLumina,
    ComfyQwenImage,
    ComfyMMDiT,
    ComfyCosmos,
)


def layout_for(root: nn.Module, branch: int) -> Layout | None:
    """The layout of the first family that recognises ``root`` (``branch``: how deep a cached step runs before and
    after the skipped blocks), or None."""
    for family in FAMILIES:
        layout = family.find(root, branch)
        if layout is not None:
            return layout
    return None


def is_transformer(root: nn.Module) -> bool:
    """Whether ``root`` is a diffusion transformer a family knows (its blocks are the step cache's, not ToMe's)."""
    layout = layout_for(root, 0)
    return layout is not None and layout.transformer


__all__ = [
    "FAMILIES",
    "BflFlux",
    "ComfyCosmos",
    "ComfyLumina",
    "ComfyMMDiT",
    "ComfyQwenImage",
    "ComfyWan",
    "DiffusersFlux",
    "Layout",
    "UNetLayout",
    "is_transformer",
    "layout_for",
]
