"""Diffusion transformers with one chain of blocks, as ComfyUI and Forge Neo (which ported the loops) run them:

* Wan 2.1 / 2.2, VACE, camera (``comfy/ldm/wan/model.py`` ``WanModel``; Neo ``backend/nn/wan.py``): ``blocks``,
  each ``block(x, e=, freqs=, context=, ...)`` returning the token stream (text enters by cross-attention), then
  ``head(x, e)``; the timestep is the flow-matching sigma times 1000 already. VACE adds its residuals in place after
  blocks of the chain. diffusers' ``WanTransformer3DModel`` (the lab's Wan-layout model) is the same chain under
  other names: ``blocks``, each ``block(hidden_states, encoder_hidden_states, temb, rotary_emb)``, then
  ``norm_out(hidden_states.float())``, the modulation and ``proj_out``; its timestep too is the sigma times 1000. The
  correction acts on it through the modulation's scale (read from ``condition_embedder``'s time embedding).
* Lumina 2 and Z-Image (``comfy/ldm/lumina/model.py`` ``NextDiT``; Neo ``backend/nn/lumina.py``): ``layers``, each ``layer(x, mask, freqs_cis,
  adaln_input, ...)`` returning the joint stream (caption tokens, then image tokens), then ``final_layer(x, c)``; the
  timestep is the sigma (0–1).
* Qwen-Image (``comfy/ldm/qwen_image/model.py`` ``QwenImageTransformer2DModel``; Neo ``backend/nn/qwen.py``, whose
  forward names its time ``timesteps``): ``transformer_blocks``, each called
  with ``hidden_states=``, ``encoder_hidden_states=`` and returning ``(encoder_hidden_states, hidden_states)``, a
  ControlNet's residual added in place after each, then ``norm_out(hidden_states, temb)``; the timestep is the sigma.
* Cosmos Predict2 (``comfy/ldm/cosmos/predict2.py`` ``MiniTrainDIT``) and Anima, its text-to-image descendant (Neo
  ``backend/nn/anima.py``, a port of it): ``blocks``, each ``block(x, t_emb, context, ...)`` returning the stream of
  image tokens kept on its (B, T, H, W, D) grid, then ``final_layer(x, t_emb, ...)`` (Neo's Anima keeps the stream in
  float32 under a float16 model and hands the layer a copy in the model's dtype).
* SD3 and SD3.5 (``comfy/ldm/modules/diffusionmodules/mmdit.py`` ``OpenAISignatureMMDITWrapper``, MMDiT):
  ``joint_blocks``, each ``block(context, x, c=, ...)`` returning ``(context, x)`` (the last one no context), a
  ControlNet's residual added in place after each, then ``final_layer(x, c)``; the timestep is the sigma times 1000.
  diffusers' ``SD3Transformer2DModel`` is the same chain as Qwen-Image's calls: ``transformer_blocks``, each called
  with ``hidden_states=``, ``encoder_hidden_states=`` and returning ``(encoder_hidden_states, hidden_states)``, a
  ControlNet's residual added after each, then ``norm_out(hidden_states, temb)`` (its time modulation included) and
  ``proj_out``; the timestep is the sigma times 1000. Other diffusers transformers have those three names too
  (HunyuanVideo, whose blocks return the streams the other way round): only that class is this family.

Other diffusers transformers with one chain, each a family restricted to its class (their names are common ones):

* HunyuanVideo 1.5 (``HunyuanVideo15Transformer3DModel``): ``transformer_blocks``, each called by position,
  ``block(hidden_states, encoder_hidden_states, temb, ...)``, returning ``(hidden_states, encoder_hidden_states)``,
  then ``norm_out(hidden_states, temb)`` (its time modulation inside) and ``proj_out``; the timestep is the
  scheduler's (0–1000).
* CogVideoX (``CogVideoXTransformer3DModel``, 1.0 and 1.5): ``transformer_blocks``, called with keywords and returning
  ``(hidden_states, encoder_hidden_states)``, then ``norm_final`` (a plain LayerNorm: the entry), then the
  time-modulated ``norm_out`` and ``proj_out``; the timestep is the scheduler's (0–1000).
* Lumina 2 (``Lumina2Transformer2DModel``): ``layers``, each ``layer(hidden_states, mask, rotary_emb, temb)``
  returning the joint stream (caption tokens, then the image's, padded), then ``norm_out(hidden_states, temb)`` (time
  modulation and projection inside) over that joint stream; the timestep is ``1 − σ``.
* LTX-Video (``LTXVideoTransformer3DModel``): ``transformer_blocks``, called with keywords and returning the token
  stream, then ``norm_out`` (a plain LayerNorm: the entry), the modulation by ``scale_shift_table`` in the model's
  forward, and ``proj_out``; the timestep is the scheduler's (0–1000).
* Cosmos (``CosmosTransformer3DModel``: Cosmos 1.0, Predict2, Predict2.5, Transfer2.5): ``transformer_blocks``, each
  called by position and returning the token stream (a Transfer ControlNet's residual added inside), then
  ``norm_out(hidden_states, embedded_timestep, temb)`` (time modulation inside) and ``proj_out``; the timestep is
  ``σ / (σ + 1)`` (Cosmos 1.0's EDM pipelines give the scheduler's own, another scale).

A cached pass runs the first ``branch + 1`` blocks and skips the rest up to the output layer (:mod:`.residual`). These
models run classifier-free guidance: cond and uncond are streams of their own (``cond_or_uncond``), and each model
(Wan 2.2's two experts) has its own cache.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ..settings import SettingsError
from ..steps import call_arg
from .residual import HiddenFirst, ResidualLayout, arg, sigma_time, tensor


def _first(args: tuple, kwargs: dict, name: str = "x") -> torch.Tensor | None:
    return tensor(arg(args, kwargs, 0, name))


class ChainLayout(ResidualLayout):
    """One chain of blocks, then an output layer (:attr:`names`, a subclass's: the blocks, the output layer, a marker;
    see the module); a subclass reads its calls."""

    least = 2
    time: ClassVar[tuple[float, str, str]] = (1.0, "timestep", "timesteps")
    """What makes the root's timestep 0–1000, and its argument's names (ComfyUI's and Neo's differ)."""
    stream_arg: ClassVar[str] = "x"
    """The name of the root's and the blocks' first argument, the token stream."""

    def split(self, lists: list[list[nn.Module]], branch: int) -> tuple[nn.Module, list[nn.Module]]:
        (blocks,) = lists
        if not branch < len(blocks) - 1:
            raise SettingsError("cache_branch", branch, f"an integer from 0 to {len(blocks) - 2} for this model")
        return blocks[0], blocks[branch + 1 :]

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, Any]:
        scale, *names = self.time
        t = next((t for name in names if (t := call_arg(module, args, kwargs, name)) is not None), None)
        return _first(args, kwargs, self.stream_arg), sigma_time(t, scale)

    def stream_in(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return _first(args, kwargs, self.stream_arg)

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> Any:
        return _first(args, kwargs, self.stream_arg)


class ComfyWan(ChainLayout):
    """Wan as ComfyUI and Forge Neo run it."""

    names = ("blocks", "head", "patch_embedding")


class DiffusersWan(ChainLayout):
    """Wan as diffusers' ``WanTransformer3DModel`` runs it."""

    names = ("blocks", "norm_out", "condition_embedder")
    stream_arg = "hidden_states"
    entry_arg = "input"  # ``FP32LayerNorm.forward(input)``

    def __init__(self, root: nn.Module, lists: list[list[nn.Module]], branch: int):
        super().__init__(root, lists, branch)
        self._temb: torch.Tensor | None = None

    def watched(self) -> list[tuple[nn.Module, Any]]:
        return [(self.root.condition_embedder, self._read_temb)]

    def _read_temb(self, module: nn.Module, args: tuple, out: Any) -> None:
        self._temb = out[0] if isinstance(out, tuple) else None

    def modulation(self) -> torch.Tensor | None:
        """``1 + scale`` of the model's forward, ``(norm_out(h) · (1 + scale) + shift)`` before ``proj_out``, from
        this call's time embedding (per token where Wan 2.2's expanded timesteps make it so)."""
        temb, table = self._temb, getattr(self.root, "scale_shift_table", None)
        if not isinstance(temb, torch.Tensor) or not isinstance(table, torch.Tensor):
            return None
        if temb.ndim == 3:
            return 1 + (table.unsqueeze(0).to(temb.device) + temb.unsqueeze(2)).chunk(2, dim=2)[1].squeeze(2)
        return 1 + (table.to(temb.device) + temb.unsqueeze(1)).chunk(2, dim=1)[1]


class ComfyLumina(ChainLayout):
    """Lumina 2 and Z-Image (``NextDiT``) as ComfyUI and Forge Neo run them."""

    names = ("layers", "final_layer", "noise_refiner")
    time = (1000.0, "timesteps", "timestep")


class ComfyQwenImage(ChainLayout):
    """Qwen-Image as ComfyUI and Forge Neo run it: blocks called with keywords, returning the text and the image
    stream."""

    names = ("transformer_blocks", "norm_out", "txt_norm")
    time = (1000.0, "timestep", "timesteps")

    def stream_in(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return _first(args, kwargs, "hidden_states")

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        return kwargs.get("encoder_hidden_states"), _first(args, kwargs, "hidden_states")


class ComfyCosmos(ChainLayout):
    """Cosmos Predict2 as ComfyUI runs it and Anima as Forge Neo runs it."""

    names = ("blocks", "final_layer", "t_embedding_norm")
    time = (1000.0, "timesteps", "timestep")


class ComfyMMDiT(ChainLayout):
    """SD3 and SD3.5 (MMDiT) as ComfyUI runs them: joint blocks called with the text stream, then the image stream,
    returning both."""

    names = ("joint_blocks", "final_layer", "x_embedder")
    time = (1.0, "timesteps", "t")

    def stream_in(self, args: tuple, kwargs: dict) -> torch.Tensor | None:
        return tensor(arg(args, kwargs, 1, "x"))

    def pass_on(self, index: int, args: tuple, kwargs: dict) -> tuple[Any, Any]:
        return arg(args, kwargs, 0, "context"), self.stream_in(args, kwargs)


class DiffusersSD3(ComfyQwenImage):
    """SD3 and SD3.5 as diffusers' ``SD3Transformer2DModel`` runs them (the class or a subclass: see the module)."""

    names = ("transformer_blocks", "norm_out", "context_embedder")
    time = (1.0, "timestep", "timesteps")
    stream_arg = "hidden_states"
    classes = ("SD3Transformer2DModel",)


class DiffusersHunyuanVideo15(HiddenFirst, ChainLayout):
    """HunyuanVideo 1.5 as diffusers' ``HunyuanVideo15Transformer3DModel`` runs it."""

    names = ("transformer_blocks", "norm_out", "context_embedder_2")
    stream_arg = "hidden_states"
    entry_arg = "x"  # ``AdaLayerNormContinuous.forward(x, conditioning_embedding)``
    classes = ("HunyuanVideo15Transformer3DModel",)


class DiffusersCogVideoX(HiddenFirst, ChainLayout):
    """CogVideoX as diffusers' ``CogVideoXTransformer3DModel`` runs it."""

    names = ("transformer_blocks", "norm_final", "patch_embed")
    stream_arg = "hidden_states"
    entry_arg = "input"  # ``nn.LayerNorm.forward(input)``
    classes = ("CogVideoXTransformer3DModel",)
    corrects = False  # the time-modulated ``norm_out`` runs after the entry, ``norm_final``


class DiffusersLumina2(ChainLayout):
    """Lumina 2 as diffusers' ``Lumina2Transformer2DModel`` runs it."""

    names = ("layers", "norm_out", "context_refiner")
    stream_arg = "hidden_states"
    entry_arg = "x"  # ``LuminaLayerNormContinuous.forward(x, conditioning_embedding)``
    classes = ("Lumina2Transformer2DModel",)
    corrects = False  # its pipeline rescales the guided prediction (``cfg_normalization``, on by default): not linear

    def place(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, Any]:
        t = tensor(call_arg(module, args, kwargs, "timestep"))
        return _first(args, kwargs, self.stream_arg), sigma_time(1 - t if t is not None else None)


class DiffusersLTXVideo(ChainLayout):
    """LTX-Video as diffusers' ``LTXVideoTransformer3DModel`` runs it."""

    names = ("transformer_blocks", "norm_out", "caption_projection")
    stream_arg = "hidden_states"
    entry_arg = "input"  # ``nn.LayerNorm.forward(input)``
    classes = ("LTXVideoTransformer3DModel",)
    corrects = False  # its output layer's time modulation runs in the model's forward, after ``norm_out``


class DiffusersCosmos(ChainLayout):
    """Cosmos as diffusers' ``CosmosTransformer3DModel`` runs it."""

    names = ("transformer_blocks", "norm_out", "patch_embed")
    time = (1000.0, "timestep", "timesteps")
    stream_arg = "hidden_states"
    entry_arg = "hidden_states"  # ``CosmosAdaLayerNorm.forward(hidden_states, embedded_timestep, temb)``
    classes = ("CosmosTransformer3DModel",)
    corrects = False  # its pipelines map the output to the Euler step with per-step weights (EDM's c_skip, c_out)
