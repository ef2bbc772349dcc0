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
from .schedule import part_of

__all__ = ["PipelinePatch", "apply", "control_models", "denoisers", "get", "remove", "set_scheduler"]


def set_scheduler(patch: Any, scheduler: Any) -> None:
    """Tell a patched transformer's session (``tome_core.apply_patch(transformer, …)``) the sampler of a denoising
    loop of one's own over ``scheduler`` (its timesteps set): the loop's sigmas and, where the scheduler is a linear one
    (:data:`.schedule.LINEAR`), its own stepping as the sampler the correction reads; each call is then placed on
    those sigmas by its timestep (no ``set_progress``). A pipeline's loop needs none of this: the pipeline patch does
    it."""
    patch.set_sampler(*part_of(scheduler).sampler)


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
