"""Start a Forge double the way Forge starts, reusing the WebUI double wherever Forge is the same.

Forge's ``modules/scripts.py``, ``script_callbacks.py``, ``shared``/options, ``ui_components`` and the API are
those of WebUI 1.10.1 for everything an extension touches (``../shared/notes/forge-facts.md`` §5), so the WebUI
double's modules serve. What differs is installed over it for the duration: ``modules.processing`` becomes
``forge_double.processing`` (so the grid scripts and the API run Forge's ``process_images``), and the model is a
``ForgeDiffusionEngine`` loaded by ``forge_double.sd_models``. :func:`reset_forge` puts the WebUI double back.

Script load order as Forge's ``load_scripts`` (``scripts.py:397-472``): the root ``scripts/`` (the grid: Forge
main's ``scripts/xyz_grid.py`` is the WebUI's), then ``extensions-builtin`` (ControlNet; Forge Classic's grid is
``extensions-builtin/xyz``), then user extensions; so the built-in ControlNet's hooks run before ours.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable

import harness as webui
import modules
import tiny_models
from modules import processing as webui_processing
from modules import script_callbacks, scripts

from forge_double import backend, sd_models
from forge_double import processing as forge_processing
from forge_double.unet import unet_from_ldm

HERE = os.path.dirname(os.path.abspath(__file__))
CONTROLNET_DIR = os.path.join(HERE, "extensions_builtin", "sd_forge_controlnet")
CLASSIC_XYZ_DIR = os.path.join(HERE, "extensions_builtin", "xyz")
BUILTINS = (
    "sd_forge_freeu",
    "sd_forge_sag",
    "sd_forge_perturbed_attention",
    "sd_forge_kohya_hrfix",
    "sd_forge_multidiffusion",
    "sd_forge_stylealign",
    "forge_preprocessor_reference",
    "sd_forge_controlllite",
)
"""Doubles of Forge's built-ins that patch the UNet (``extensions_builtin/<name>``), loaded with ``builtins=True``."""

FORGE_VERSION = "2.0.1v1.10.1"
"""``modules_forge/forge_version.py``'s ``version`` in Forge main at ``dfdcbab`` (Forge Classic's at ``1f95d71``:
``classic``; Neo's at ``5692d2d``: ``neo``). The only part of ``modules_forge`` the extension reads."""

default_script_args = webui.default_script_args


def _use_version(version: str | None) -> None:
    """``modules_forge.forge_version`` as the host has it (None: none, as in A1111)."""
    for name in ("modules_forge.forge_version", "modules_forge"):
        sys.modules.pop(name, None)
    if version is None:
        return
    package, module = types.ModuleType("modules_forge"), types.ModuleType("modules_forge.forge_version")
    package.__path__ = []  # a package, as the real folder is
    module.version = version
    package.forge_version = module
    sys.modules["modules_forge"], sys.modules["modules_forge.forge_version"] = package, module


def _use_processing(module) -> None:
    sys.modules["modules.processing"] = module
    modules.processing = module


def reset_forge() -> None:
    """The WebUI double as it was: options, scripts, callbacks, no model, ``modules.processing`` of the WebUI."""
    webui.reset_webui()
    sd_models.reset()
    backend.CONTROL_MODELS.clear()
    while backend._loaded:
        backend._loaded.pop().forge_unpatch_model()
    _use_processing(webui_processing)
    _use_version(None)


def start_forge(
    extension_dirs=(),
    *,
    checkpoints: dict[str, Callable[[], backend.ForgeDiffusionEngine]],
    grid: str | None = "forge",
    controlnet: bool = True,
    builtins: bool = False,
    processing=forge_processing,
    version: str | None = None,
):
    """Full start-up: load the scripts in Forge's order, load the first checkpoint, before_ui, build both tabs.

    ``grid`` is "forge" (root ``scripts/xyz_grid.py``), "classic" (Forge Classic's ``extensions-builtin/xyz``)
    or None; ``builtins`` loads the doubles of :data:`BUILTINS` too (in the order of Forge's listing);
    ``processing``: the host's ``modules.processing`` (a Forge variant's: ``neo_double.processing``); ``version``:
    ``modules_forge.forge_version.version`` (default: Forge Classic's ``classic`` with its grid, else
    :data:`FORGE_VERSION`)."""
    reset_forge()
    _use_processing(processing)
    _use_version(version or ("classic" if grid == "classic" else FORGE_VERSION))
    if grid == "forge":
        webui.register_xyz_grid()
    builtin = ([CONTROLNET_DIR] if controlnet else []) + ([CLASSIC_XYZ_DIR] if grid == "classic" else [])
    builtin += [os.path.join(HERE, "extensions_builtin", name) for name in sorted(BUILTINS) if builtins]
    for ext_dir in [*builtin, *extension_dirs]:
        webui.load_extension(ext_dir)
    for name, build in checkpoints.items():
        sd_models.register_checkpoint(name, build)
    sd_models.select_checkpoint(next(iter(checkpoints)))
    sd_models.forge_model_reload()
    script_callbacks.before_ui_callback()
    webui.build_runner(False)
    webui.build_runner(True)
    return scripts.scripts_txt2img, scripts.scripts_img2img


def make_txt2img(runner=None, script_args=None, **kwargs):
    """A Forge txt2img processing object set up like ``modules/txt2img.py`` (scripts, then script_args)."""
    return webui.make_txt2img(runner, script_args, **kwargs)


def make_img2img(runner=None, script_args=None, **kwargs):
    runner = runner or scripts.scripts_img2img
    defaults = {"prompt": "a cat", "steps": 3, "width": 64, "height": 64, "seed": 1, "sampler_name": "Euler"}
    defaults.update(do_not_save_samples=True, do_not_save_grid=True, **kwargs)
    p = modules.processing.StableDiffusionProcessingImg2Img(**defaults)  # the host's (Forge's or a variant's)
    p.scripts = runner
    p.script_args = script_args if script_args is not None else default_script_args(runner)
    return p


def engine_builder(kind: str, seed: int = 0, name: str | None = None) -> Callable[[], backend.ForgeDiffusionEngine]:
    """A checkpoint: every load is a fresh engine around the same Forge-layout UNet (built once, from the tiny
    ldm UNet of that seed: the weights the tests already use), so anything a generation leaves on the UNet is
    still there at the next load. ``kind``: "sd15", "sdxl" or "flux" (Forge's FLUX: no UNet transformer blocks, the
    step cache knows its blocks)."""
    if kind == "flux":
        model = backend.IntegratedFluxTransformer2DModel(seed=seed)
        return lambda: backend.Flux(model, name or "forge-flux")
    ldm = tiny_models.make_tiny_sdxl_unet(seed) if kind == "sdxl" else tiny_models.make_tiny_sd15_unet(seed)
    unet = unet_from_ldm(ldm)
    engine = backend.StableDiffusionXL if kind == "sdxl" else backend.StableDiffusion
    return lambda: engine(unet, name or f"forge-{kind}")
