"""Double of Forge's built-in ControlNet script (``extensions-builtin/sd_forge_controlnet/scripts/controlnet.py``,
Forge main ``dfdcbab``): class ``ControlNetForForgeOfficial``, title "ControlNet" (l.58-62), no ``latest_network``.

- ``process`` (l.547-556) fills ``self.current_params[i]`` for every enabled unit;
- ``process_before_every_sampling`` (l.559-562) -> ``ControlNetPatcher.process_before_every_sampling``
  (``modules_forge/supported_controlnet.py:148-164``): ``forge_objects.unet = apply_controlnet_advanced(unet, ...)``,
  a clone carrying a copy of the control model in its linked list;
- ``postprocess`` (l.570-572) clears ``current_params``.

A unit is a dict ``{"model": name in backend.CONTROL_MODELS, "image": tensor [B,3,H,W] or None, "weight",
"start", "end"}``; the UI is one ``gr.State`` holding the list of units (the real one has a tab per unit).
"""

from dataclasses import dataclass
from typing import Any

import gradio as gr
import modules.scripts as scripts
import torch
from forge_double import backend


@dataclass
class ControlNetCachedParameters:
    model: backend.ControlBase
    hint: torch.Tensor | None
    weight: float
    start: float
    end: float


class ControlNetForForgeOfficial(scripts.Script):
    sorting_priority = 10

    def __init__(self) -> None:
        self.current_params: dict[int, ControlNetCachedParameters] = {}

    def title(self) -> str:
        return "ControlNet"

    def show(self, is_img2img: bool) -> Any:
        return scripts.AlwaysVisible

    def ui(self, is_img2img: bool) -> list[Any]:
        return [gr.State(value=[])]

    @staticmethod
    def get_enabled_units(args) -> list[dict]:
        units = args[0] if args else []
        return [u for u in units or [] if u.get("enabled", True)]

    def process(self, p, *args, **kwargs) -> None:
        self.current_params = {}
        for i, unit in enumerate(self.get_enabled_units(args)):
            self.current_params[i] = ControlNetCachedParameters(
                backend.CONTROL_MODELS[unit["model"]],
                unit.get("image"),
                unit.get("weight", 1.0),
                unit.get("start", 0.0),
                unit.get("end", 1.0),
            )

    def process_before_every_sampling(self, p, *args, **kwargs) -> None:
        for i, _unit in enumerate(self.get_enabled_units(args)):
            params = self.current_params[i]
            hint = params.hint if params.hint is not None else torch.zeros(1, 3, p.height, p.width)
            unet = p.sd_model.forge_objects.unet
            p.sd_model.forge_objects.unet = backend.apply_controlnet_advanced(
                unet, params.model, hint, params.weight, params.start, params.end
            )

    def postprocess(self, p, processed, *args) -> None:
        self.current_params = {}
