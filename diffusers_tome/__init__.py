"""The diffusers adapter: ToMe on a diffusers pipeline, as ``tomesd.apply_patch(pipe)`` puts token merging on one.

    import tome_core
    pipe = StableDiffusionPipeline.from_pretrained(...)
    tome_core.apply_patch(pipe, ratio=0.5)   # or pipe.unet / pipe.transformer, patched as any module
    image = pipe("a photo of an astronaut riding a horse on mars").images[0]
    tome_core.remove_patch(pipe)

``tome_core`` hands a pipeline here (:mod:`tome_core.holders`); this package reads the pipeline, its scheduler and
its denoising loop (:mod:`.pipeline`, :mod:`.schedule`) and imports diffusers nowhere: it duck-types what every
diffusers pipeline has. The engine is ``tome_core``, which imports no host.
"""

from __future__ import annotations

from typing import Any

from tome_core.settings import ToMeSettings

from .pipeline import ATTR, PipelinePatch, control_models, denoisers

__all__ = ["PipelinePatch", "apply", "control_models", "denoisers", "get", "remove"]


def get(pipe: Any) -> PipelinePatch | None:
    """The patch on ``pipe``, if any."""
    patch = getattr(pipe, "__dict__", {}).get(ATTR)
    return patch if isinstance(patch, PipelinePatch) else None


def apply(pipe: Any, settings: ToMeSettings) -> PipelinePatch:
    """Patch ``pipe`` with validated ``settings`` for its denoising loops to come, or re-configure the patch it has
    (never stacking). ``SettingsError`` (a setting one of its models cannot take) or ``TypeError`` (no UNet or
    transformer) leave it as it was."""
    patch = get(pipe)
    if patch is not None:
        patch.configure(settings)
        return patch
    patch = PipelinePatch(pipe, settings)
    patch.install()
    return patch


def remove(pipe: Any) -> Any:
    """Take the patch off ``pipe`` (a no-op without one); returns ``pipe``."""
    patch = get(pipe)
    if patch is not None:
        patch.uninstall()
    return pipe
