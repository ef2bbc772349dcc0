"""Double of Forge's model management in ``modules/sd_models.py`` (Forge main ``dfdcbab``).

- ``model_data.forge_loading_parameters`` / ``forge_hash`` and ``forge_model_reload()`` (l.472-526): a new
  engine only when the loading parameters changed; the old one is dropped first; ``on_model_loaded`` fires.
  Here a checkpoint is a builder registered with :func:`register_checkpoint` (the real loader reads a file);
  each load is a fresh engine object (fresh patchers and ``forge_objects``), around the builder's UNet.
- ``apply_token_merging(sd_model, ratio)`` (l.456-469): nothing for ``ratio <= 0``, else
  ``forge_objects.unet = TomePatcher().patch(forge_objects.unet, ratio)`` (a clone: nothing to undo).
"""

from __future__ import annotations

from collections.abc import Callable

from modules import script_callbacks, shared
from modules import sd_models as webui_sd_models
from tiny_models import CheckpointInfoDouble

from forge_double import backend


class ModelData:
    def __init__(self) -> None:
        self.sd_model = None
        self.forge_loading_parameters: dict = {}
        self.forge_hash = ""

    def get_sd_model(self):
        return self.sd_model

    def set_sd_model(self, v) -> None:
        self.sd_model = v
        shared.sd_model = v


model_data = ModelData()
checkpoints: dict[str, Callable[[], backend.ForgeDiffusionEngine]] = {}
apply_token_merging_calls: list[float] = []
"""test-only: every ratio passed to apply_token_merging, in order"""
loads: list[str] = []
"""test-only: the checkpoint of every real (re)load, in order"""


def reset() -> None:
    model_data.__init__()
    checkpoints.clear()
    apply_token_merging_calls.clear()
    loads.clear()


def register_checkpoint(name: str, build: Callable[[], backend.ForgeDiffusionEngine]) -> None:
    """A checkpoint file: also listed where the WebUI's code looks checkpoints up (``checkpoints_list``, kept as in
    the WebUI: ``get_closet_checkpoint_match`` resolves ``p.refiner_checkpoint``, processing.py:872)."""
    checkpoints[name] = build
    info = CheckpointInfoDouble(name)
    webui_sd_models.checkpoints_list[info.title] = info


def select_checkpoint(name: str) -> None:
    """``main_entry.checkpoint_change`` + ``refresh_model_loading_parameters``: what the next reload loads."""
    if name not in checkpoints:
        raise ValueError(f"no checkpoint {name!r}")
    model_data.forge_loading_parameters = {"checkpoint_info": name}


def forge_model_reload():
    current_hash = str(model_data.forge_loading_parameters)
    if model_data.forge_hash == current_hash:
        return model_data.sd_model, False
    if model_data.sd_model:
        model_data.sd_model = None
    name = model_data.forge_loading_parameters["checkpoint_info"]
    sd_model = checkpoints[name]()
    sd_model.sd_checkpoint_info = webui_sd_models.get_closet_checkpoint_match(name)
    sd_model.extra_generation_params = {}
    sd_model.comments = []
    loads.append(name)
    model_data.set_sd_model(sd_model)
    script_callbacks.model_loaded_callback(sd_model)
    model_data.forge_hash = current_hash
    return sd_model, True


def apply_token_merging(sd_model, token_merging_ratio: float) -> None:
    apply_token_merging_calls.append(token_merging_ratio)
    if token_merging_ratio <= 0:
        return
    sd_model.forge_objects.unet = backend.TomePatcher().patch(
        model=sd_model.forge_objects.unet, ratio=token_merging_ratio
    )
