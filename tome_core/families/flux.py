"""FLUX as diffusers' ``FluxTransformer2DModel`` runs it: double-stream blocks (``transformer_blocks``: image and text
tokens in streams of their own, joint attention), then single-stream blocks (``single_transformer_blocks``), then
the output norm and projection (``norm_out``, ``proj_out``). Every block is called with keywords and returns
``(encoder_hidden_states, hidden_states)``: the text and the image stream.

A cached pass runs the first ``branch + 1`` double-stream blocks (the probe: First Block Cache's first block) and
skips every block after them up to ``norm_out`` (:mod:`.residual`). (ComfyUI's and Forge Neo's FLUX, in Black Forest
Labs' layout, are :mod:`.bfl`.)

Other diffusers transformers have the same two lists and output layer but call their blocks otherwise, each a family
of its own restricted to its class:

* FLUX.2 (``Flux2Transformer2DModel``, FLUX.2 [dev] and [klein]) and Chroma (``ChromaTransformer2DModel``): the
  double-stream blocks as FLUX.1's; a single-stream block gets the joint stream (text tokens, then the image's) as
  ``hidden_states=`` alone (FLUX.2: ``encoder_hidden_states=None``) and returns it alone. Both take the sigma as their
  timestep (the model scales it by 1000) and end in ``norm_out(hidden_states, temb)``, an adaptive norm with the time
  modulation inside, then ``proj_out``.
* HunyuanVideo (``HunyuanVideoTransformer3DModel``, text-to-video and image-to-video): every block, double- or
  single-stream, is called by position, ``block(hidden_states, encoder_hidden_states, temb, ...)``, and returns
  ``(hidden_states, encoder_hidden_states)`` (a single-stream block joins and splits the streams inside); the timestep
  is the scheduler's (0–1000), the output layer ``norm_out(hidden_states, temb)`` as FLUX's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..settings import SettingsError
from ..steps import call_arg
from .residual import HiddenFirst, ResidualLayout, arg, sigma_time, tensor


class FluxLayout(ResidualLayout):
    """Double-stream blocks, then single-stream blocks, then an output layer (:attr:`names`, a subclass's: the two
    lists, the output layer, a marker); see :mod:`.residual` for the cache's use of them."""

    def split(self, lists: list[list[nn.Module]], branch: int) -> tuple[nn.Module, list[nn.Module]]:
        double, single = lists
        if not branch < len(double):
            raise SettingsError("cache_branch", branch, f"an integer from 0 to {len(double) - 1} for this model")
        self.doubles = len(double) - branch - 1  # skipped double-stream blocks: the first of ``skipped``
        return double[0], [*double[branch + 1 :], *single]


class DiffusersFlux(FluxLayout):
    """diffusers' FLUX transformer for the step cache (see the module)."""

    names = ("transformer_blocks", "single_transformer_blocks", "norm_out", "x_embedder")
    entry_arg = "hidden_states"  # ``norm_out(hidden_states, temb)``
    classes = ("FluxTransformer2DModel",)  # HunyuanVideo (positional, the streams the other way round), Chroma (its
    # single-stream blocks return the joint stream alone) and others have these names too

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, Any]:
        return tensor(arg(args, kwargs, 0, "hidden_states")), sigma_time(arg(args, kwargs, 3, "timestep"))

    def stream_in(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return tensor(kwargs.get("hidden_states"))  # every block is called with keywords

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        return kwargs["encoder_hidden_states"], kwargs["hidden_states"]


class DiffusersFlux2(DiffusersFlux):
    """FLUX.2 and Chroma as diffusers runs them (see the module): FLUX.1's calls but for the single-stream blocks'."""

    entry_arg = "x"  # ``AdaLayerNormContinuous.forward(x, conditioning_embedding)``; Chroma's pruned one too
    classes = ("Flux2Transformer2DModel", "ChromaTransformer2DModel")

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, Any]:
        return tensor(arg(args, kwargs, 0, "hidden_states")), sigma_time(call_arg(module, args, kwargs, "timestep"))

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> Any:
        if index < self.doubles:
            return kwargs["encoder_hidden_states"], kwargs["hidden_states"]
        return kwargs["hidden_states"]  # the joint stream, alone


class DiffusersHunyuanVideo(HiddenFirst, FluxLayout):
    """HunyuanVideo as diffusers' ``HunyuanVideoTransformer3DModel`` runs it (see the module)."""

    names = ("transformer_blocks", "single_transformer_blocks", "norm_out", "context_embedder")
    entry_arg = "x"
    classes = ("HunyuanVideoTransformer3DModel",)

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, Any]:
        t = call_arg(module, args, kwargs, "timestep")
        return tensor(arg(args, kwargs, 0, "hidden_states")), sigma_time(t, 1.0)
