"""Double of Neo's ``modules/sd_models.py:308-318`` ``apply_token_merging``: Forge's, with Neo's ``TomePatcher``
(``neo_double.backend``); the epsilon scaling beside it (``opts.scaling_factor``, off by default) is left out. Model
management is Forge's (``forge_double.sd_models``)."""

from __future__ import annotations

from forge_double import sd_models as forge

from neo_double import backend

apply_token_merging_calls: list[float] = []
"""Test-only: every ratio passed to apply_token_merging, in order."""


def apply_token_merging(sd_model, token_merging_ratio: float) -> None:
    apply_token_merging_calls.append(token_merging_ratio)
    if token_merging_ratio > 0.0:
        sd_model.forge_objects.unet = backend.TomePatcher().patch(
            model=sd_model.forge_objects.unet, ratio=token_merging_ratio
        )


def reset() -> None:
    forge.reset()
    apply_token_merging_calls.clear()
    backend.TomePatcher.calls.clear()
