"""ToMe's engine, pure torch, no host imports: two training-free speed-ups for diffusion models, as peers of one
session per model (:mod:`tome_core.session`) — token merging on the UNets' transformer blocks (:mod:`.merging`) and a
step cache over the blocks of UNets and diffusion transformers (:mod:`.caching`) — over the model families that say
where each acts (:mod:`.families`), driven by one settings record (:mod:`.settings`).

import tome_core
tome_core.apply_patch(model, ratio=0.5, cache=True)   # model: a UNet or transformer, what holds it (find_unet),
                                                      # or a diffusers pipeline (tome_core.holders -> diffusers_tome)
...
tome_core.remove_patch(model)
"""

from __future__ import annotations

from typing import Any

from .families import has_transformer_blocks
from .report import CacheReport, MergeReport, PassCount, Report
from .session import Session, apply_settings, find_unet, get_patch, remove_patch
from .settings import FIELDS, NAMES, SettingsError, ToMeSettings, from_args, from_dict, to_args, to_dict

__all__ = [
    "FIELDS",
    "NAMES",
    "CacheReport",
    "MergeReport",
    "PassCount",
    "Report",
    "Session",
    "SettingsError",
    "ToMeSettings",
    "apply_patch",
    "apply_settings",
    "cache_stats",
    "find_unet",
    "from_args",
    "from_dict",
    "get_patch",
    "has_transformer_blocks",
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
) -> Session | Any:
    """Patch ``model`` with token merging (and, with ``cache=True``, the step cache); calling it again re-configures
    (never stacks).

    ``max_downsample`` is 1, 2, 4, 8 or ``"auto"`` (the highest-resolution level that has transformer
    blocks). With ``use_rand`` the destinations are drawn from a private generator derived from
    ``seed`` (``None`` means 0) and the step (the progress reported with :meth:`Session.set_progress`, else
    the call's timestep, read back once per call), so results are reproducible and the cond and uncond
    passes of a step share one partition. Further keyword arguments are other
    :class:`ToMeSettings` fields. Invalid values raise :class:`SettingsError` and leave ``model``
    unpatched. Returns the :class:`Session`; for a diffusers pipeline, whose denoising loop then drives the patch
    (the step, the steps and the sampler's sigmas from its progress bar and scheduler), its
    ``diffusers_tome.PipelinePatch`` (:mod:`tome_core.holders`).
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
    counts as full when any of its model calls ran in full (cond and uncond may be separate calls)."""
    patch = get_patch(model)
    if patch is not None and not isinstance(patch, Session):  # a holder's patch (a diffusers pipeline): its last loop
        return patch.cache_stats()
    if patch is None or patch.cache is None:
        return []
    return [count.to_dict() for count in patch.cache.report().passes]
