"""FLUX and Chroma in Black Forest Labs' reference layout, as ComfyUI (``comfy/ldm/flux/model.py``,
``comfy/ldm/chroma/model.py``) and Forge Neo (``backend/nn/flux.py``, ``chroma.py``) run them, and HunyuanVideo, whose
ComfyUI loop (``comfy/ldm/hunyuan_video/model.py``) is the same but joins the streams image first and takes the sigma
times 1000 as its timestep (the probe is a double-stream block, so the order of the joint stream never matters).

``forward(x, timestep, context, ...)`` takes the latent and the flow-matching sigma (0–1) as the timestep;
``forward_orig`` runs the double-stream blocks (``double_blocks``: ``block(img=, txt=, vec=, pe=, ...)`` returns
``(img, txt)``), joins the streams (text tokens first), runs the single-stream blocks (``single_blocks``:
``block(x, vec=, pe=, ...)`` returns the joint stream), cuts the image tokens out and calls
``final_layer(img, vec)``. The blocks add to their input in place, and a ControlNet's residual is added in place after
each block (``control["input"]``, ``control["output"]``); another node's ``patches_replace["dit"]`` entry calls the
block through a wrapper of its own with the same keywords. A cached pass runs the first ``branch + 1`` double-stream
blocks and skips the rest up to ``final_layer`` (:mod:`.residual`); Chroma's ``skip_mmdit``/``skip_dit`` blocks, never
called, leave the passes incomplete and the model then runs in full.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..steps import call_arg
from .flux import FluxLayout
from .residual import arg, sigma_time, tensor


class BflFlux(FluxLayout):
    """FLUX (and Chroma) as ComfyUI and Forge Neo run it, for the step cache (see the module)."""

    names = ("double_blocks", "single_blocks", "final_layer", "img_in")

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, Any]:
        return tensor(arg(args, kwargs, 0, "x")), sigma_time(call_arg(module, args, kwargs, "timestep"))

    def stream_in(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return tensor(arg(args, kwargs, 0, "img" if "img" in kwargs else "x"))

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> Any:
        if index < self.doubles:  # ``block(img=, txt=, ...)``
            return arg(args, kwargs, 0, "img"), arg(args, kwargs, 1, "txt")
        return arg(args, kwargs, 0, "x")  # ``block(x, vec=, ...)``
