"""Token Merging for Stable Diffusion UNets (ldm / sgm layout), pure torch, no WebUI imports.

import tome_core
tome_core.apply_patch(model, ratio=0.5)   # model: a UNet, or what holds it (find_unet: WebUI, Forge engine, KModel)
...
tome_core.remove_patch(model)
"""

from __future__ import annotations

from typing import Any

from .patch import Patch, apply_settings, find_unet, get_patch, remove_patch
from .report import MergeReport
from .settings import FIELDS, NAMES, SettingsError, ToMeSettings, from_args, from_dict, to_args, to_dict

__all__ = [
    "FIELDS",
    "NAMES",
    "MergeReport",
    "Patch",
    "SettingsError",
    "ToMeSettings",
    "apply_patch",
    "apply_settings",
    "cache_stats",
    "find_unet",
    "from_args",
    "from_dict",
    "get_patch",
    "remove_patch",
    "to_args",
    "to_dict",
]


def apply_patch(
    model: Any,
    ratio: float = 0.5,
    max_downsample: int | str = 1,
    sx: int = 2,
    sy: int = 2,
    use_rand: bool = True,
    seed: int | None = None,
    merge_attn: bool = True,
    merge_crossattn: bool = False,
    merge_mlp: bool = False,
    **more: Any,
) -> Patch:
    """Patch ``model`` with token merging; calling it again re-configures (never stacks).

    ``max_downsample`` is 1, 2, 4, 8 or ``"auto"`` (the highest-resolution level that has transformer
    blocks). With ``use_rand`` the destinations are drawn from a private generator derived from
    ``seed`` (``None`` means 0) and the step (the progress reported with :meth:`Patch.set_progress`, else
    the call's timestep, read back once per call), so results are reproducible and the cond and uncond
    passes of a step share one partition. Further keyword arguments are other
    :class:`ToMeSettings` fields. Invalid values raise :class:`SettingsError` and leave ``model``
    unpatched. Returns the :class:`Patch`.
    """
    settings = from_dict(
        dict(
            ratio=ratio,
            max_downsample=max_downsample,
            sx=sx,
            sy=sy,
            use_rand=use_rand,
            seed=-1 if seed is None else seed,
            merge_attn=merge_attn,
            merge_crossattn=merge_crossattn,
            merge_mlp=merge_mlp,
            **more,
        )
    )
    return apply_settings(model, settings)


def cache_stats(model: Any) -> list[dict[str, int]]:
    """The step cache's steps per sampling pass since the patch on ``model`` (or the UNet it holds) was applied:
    ``{"full": n, "cached": n, "skipped": n}`` each, in order; empty without a patch or without the step cache. A step
    counts as full when any of its UNet calls ran in full (cond and uncond may be separate calls)."""
    patch = get_patch(model)
    if patch is None or patch.cache is None:
        return []
    return [count.to_dict() for count in patch.cache.report().passes]
