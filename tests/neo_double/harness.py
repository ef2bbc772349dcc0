"""Start a Neo double: the Forge double (``forge_double.harness``) with Neo's processing, samplers and built-in token
merging installed over it, Neo's options, its model families and the doubles of its built-in caches.

``start_neo`` loads the scripts in Neo's order (``modules/scripts.py`` as Forge's: the root ``scripts/``, then
``extensions-builtin``, then user extensions; so a built-in's ``process_before_every_sampling`` runs before ours).
:func:`reset_neo` puts the WebUI double back.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from forge_double import backend as forge_backend
from forge_double import harness as forge
from modules import shared
from modules.options import OptionInfo

from neo_double import backend, sd_models, sd_samplers
from neo_double import processing as neo_processing

HERE = os.path.dirname(os.path.abspath(__file__))
BUILTINS = ("sd_forge_spectrum", "sd_forge_fbcache")
"""Doubles of upstream Neo's built-in step caches (``extensions_builtin/<name>``), loaded with ``builtins=True``."""

OPTIONS = {
    # modules/shared_options.py:330-335, 371-373 (names and defaults of the real options)
    "token_merging_stride": OptionInfo(2, "Token Merging - Stride"),
    "token_merging_downsample": OptionInfo(1, "Token Merging - Max Downsample"),
    "token_merging_no_rand": OptionInfo(False, "Token Merging - No Random"),
    "refiner_fast_sd": OptionInfo(False, 'Reload "state_dict" Only'),
    "refiner_use_steps": OptionInfo(False, 'Switch based on "steps" instead'),
}

VERSION = "neo"
"""``modules_forge/forge_version.py``'s ``version`` in Neo at ``5692d2d`` (``release = "2.26"``)."""

make_txt2img = forge.make_txt2img
make_img2img = forge.make_img2img
default_script_args = forge.default_script_args


def reset_neo() -> None:
    forge.reset_forge()
    sd_models.reset()
    sd_samplers.original_checkpoint = None


def start_neo(
    extension_dirs=(),
    *,
    checkpoints: dict[str, Callable[[], forge_backend.ForgeDiffusionEngine]],
    builtins: bool = False,
):
    """Full start-up as :func:`forge_double.harness.start_forge`, with Neo's options and processing."""
    reset_neo()
    dirs = [os.path.join(HERE, "extensions_builtin", name) for name in BUILTINS if builtins]
    runners = forge.start_forge(
        [*dirs, *extension_dirs], checkpoints=checkpoints, grid="forge", processing=neo_processing, version=VERSION
    )
    for key, info in OPTIONS.items():  # after start_forge's reset of the options
        shared.opts.add_option(key, info)
    return runners


def engine_builder(kind: str, seed: int = 0, name: str | None = None):
    """A checkpoint, as :func:`forge_double.harness.engine_builder` (``"sd15"``, ``"sdxl"``), or one of Neo's families
    without the ldm/sgm UNet (a key of :data:`neo_double.backend.FAMILIES`)."""
    if kind not in backend.FAMILIES:
        return forge.engine_builder(kind, seed, name)
    model = backend.FAMILIES[kind][0](seed=seed)
    return lambda: backend.family_engine(kind, model, name or f"neo-{kind.lower()}")
