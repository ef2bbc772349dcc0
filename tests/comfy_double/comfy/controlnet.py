"""``comfy/controlnet.py`` (3cd7b32f): a ControlNet as the conditioning carries it.

``ControlNetApplyAdvanced`` (nodes.py:870-917) puts a ``copy()`` of the loaded ``ControlNet`` (the same
``control_model`` module: loaded models are cached) with the hint at each cond's ``"control"``, chained to the one
already there through ``previous_controlnet``. ``pre_run`` (at ``process_conds``, before the sampler runs) takes the
model's sampling; ``get_control(x_noisy, t, cond, batched_number, transformer_options)`` (l.218-278) runs
``control_model(x=…, hint=…, timesteps=…, context=…, **extra)`` by keyword, before the UNet call of the same batch, and
``control_merge`` (l.155-192) scales the outputs by ``strength`` and adds the previous ControlNet's. A step outside
``timestep_percent_range`` returns the previous one's control only.
"""

from __future__ import annotations

import torch
from torch import nn


class ControlBase:
    def __init__(self) -> None:
        self.cond_hint_original = None
        self.cond_hint = None
        self.strength = 1.0
        self.timestep_percent_range = (0.0, 1.0)
        self.timestep_range = None
        self.previous_controlnet: ControlBase | None = None

    def set_cond_hint(self, cond_hint, strength=1.0, timestep_percent_range=(0.0, 1.0)) -> ControlBase:
        self.cond_hint_original, self.strength, self.timestep_percent_range = (
            cond_hint,
            strength,
            timestep_percent_range,
        )
        return self

    def pre_run(self, model, percent_to_timestep_function) -> None:
        self.timestep_range = tuple(percent_to_timestep_function(p) for p in self.timestep_percent_range)
        if self.previous_controlnet is not None:
            self.previous_controlnet.pre_run(model, percent_to_timestep_function)

    def set_previous_controlnet(self, controlnet) -> ControlBase:
        self.previous_controlnet = controlnet
        return self

    def cleanup(self) -> None:
        if self.previous_controlnet is not None:
            self.previous_controlnet.cleanup()
        self.cond_hint = None
        self.timestep_range = None

    def copy_to(self, c: ControlBase) -> None:
        c.cond_hint_original, c.strength = self.cond_hint_original, self.strength
        c.timestep_percent_range = self.timestep_percent_range

    def control_merge(self, control: dict, control_prev: dict | None) -> dict:
        out: dict[str, list] = {"input": [], "middle": [], "output": []}
        for key, outputs in control.items():
            for x in outputs:
                out[key].append(None if x is None else x * self.strength)
        if control_prev is not None:
            for key in out:
                mine = out[key]
                for i, prev in enumerate(control_prev[key]):
                    if i >= len(mine):
                        mine.append(prev)
                    elif prev is not None:
                        mine[i] = prev if mine[i] is None else prev + mine[i]
        return out


class ControlNet(ControlBase):
    def __init__(self, control_model: nn.Module | None = None) -> None:
        super().__init__()
        self.control_model = control_model
        self.model_sampling_current = None

    def get_control(self, x_noisy, t, cond, batched_number, transformer_options):
        control_prev = None
        if self.previous_controlnet is not None:
            control_prev = self.previous_controlnet.get_control(x_noisy, t, cond, batched_number, transformer_options)
        if self.timestep_range is not None and (t[0] > self.timestep_range[0] or t[0] < self.timestep_range[1]):
            return control_prev
        size = (x_noisy.shape[2] * 8, x_noisy.shape[3] * 8)
        if self.cond_hint is None or tuple(self.cond_hint.shape[2:]) != size:
            self.cond_hint = nn.functional.interpolate(self.cond_hint_original, size=size, mode="nearest-exact")
        if self.cond_hint.shape[0] != x_noisy.shape[0]:
            self.cond_hint = self.cond_hint[:1].expand(x_noisy.shape[0], -1, -1, -1)
        extra = {"y": cond["y"]} if cond.get("y") is not None else {}
        timestep = self.model_sampling_current.timestep(t)
        x_noisy = self.model_sampling_current.calculate_input(t, x_noisy)
        control = self.control_model(
            x=x_noisy, hint=self.cond_hint, timesteps=timestep.float(), context=cond["c_crossattn"], **extra
        )
        return self.control_merge(control, control_prev)

    def copy(self) -> ControlNet:
        c = ControlNet(self.control_model)
        self.copy_to(c)
        return c

    def pre_run(self, model, percent_to_timestep_function) -> None:
        super().pre_run(model, percent_to_timestep_function)
        self.model_sampling_current = model.model_sampling

    def cleanup(self) -> None:
        self.model_sampling_current = None
        super().cleanup()


def hint_from_image(image: torch.Tensor) -> torch.Tensor:
    """``ControlNetApplyAdvanced``'s ``image.movedim(-1, 1)``: an IMAGE (B, H, W, C) as the hint (B, C, H, W)."""
    return image.movedim(-1, 1)
