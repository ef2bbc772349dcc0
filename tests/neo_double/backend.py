"""Double of what Forge Neo's ``backend/`` adds to Forge's (Neo at 5692d2d; line numbers are those of the real files;
everything else is ``forge_double.backend``).

- ``TomePatcher`` (``backend/misc/tomesd.py:130-168``): Forge's built-in token merging (a q-only ``attn1_patch`` and an
  ``attn1_output_patch`` on a clone), but ``get_functions`` reads Neo's options: ``token_merging_stride`` (both
  strides), ``token_merging_downsample`` (the largest downsample merged) and ``token_merging_no_rand``; nothing where
  ``r <= 0`` or the grid is one token wide (l.145-146).
- The engines of Neo's model families (``backend/diffusion_engine/*.py``) whose diffusion model is no ldm/sgm UNet, each
  around a small module of the class Neo's loader builds for it (``backend/loader.py:363-422``) with that model's block
  list and the names of its blocks' layers (``backend/nn/*.py``, below). For these ToMe reads nothing but that module
  tree (it looks for blocks laid out as ``norm1, attn1, attn2, ff`` and for ``input_blocks`` / ``middle_block`` /
  ``output_blocks``, which none of them has); their forward is a few convolutions and linear layers through those
  named layers, not the real model's math. FLUX, Chroma, Wan, Qwen-Image, Lumina 2 and Z-Image (``nn/flux.py``,
  ``chroma.py``, ``wan.py``, ``qwen.py``, ``lumina.py``), whose blocks the step cache knows, are ComfyUI's loops (Neo
  ported them): ``tests/bfl_flux_double.py``, ``tests/wan_double.py`` and ``tests/chain_doubles.py``, without
  ComfyUI's wrappers; Wan and Qwen-Image on one frame (the double's processing makes image latents).
  Neo runs them on flow-matching predictors; the double keeps Forge's discrete one (their timesteps are 0–999).
"""

from __future__ import annotations

import math
from typing import ClassVar

import tomesd.merge
import torch
from bfl_flux_double import Flux as BflFlux
from chain_doubles import MiniTrainDIT
from chain_doubles import NextDiT as LuminaDouble
from chain_doubles import QwenImageTransformer2DModel as QwenDouble
from forge_double import backend as forge
from modules.shared import opts
from torch import nn
from wan_double import WanModel as WanDouble


def _tome_functions(x: torch.Tensor, ratio: float, original_shape):
    """``get_functions`` (l.130-150): the global RNG draws the partition unless ``token_merging_no_rand``."""
    stride, max_downsample, no_rand = (
        opts.token_merging_stride,
        opts.token_merging_downsample,
        bool(opts.token_merging_no_rand),
    )
    TomePatcher.calls.append((ratio, stride, max_downsample, no_rand))
    _, _, original_h, original_w = original_shape
    downsample = math.ceil(math.sqrt(original_h * original_w // x.shape[1]))
    if downsample <= max_downsample:
        w, h = math.ceil(original_w / downsample), math.ceil(original_h / downsample)
        r = int(x.shape[1] * ratio)
        if r <= 0 or w == 1 or h == 1:
            return (lambda y: y), (lambda y: y)
        return tomesd.merge.bipartite_soft_matching_random2d(
            x, w, h, stride, stride, r, no_rand, torch.default_generator
        )
    return (lambda y: y), (lambda y: y)


class TomePatcher(forge.TomePatcher):
    """``TomePatcher.patch`` (l.153-168): Forge's, with Neo's ``get_functions``."""

    functions = staticmethod(_tome_functions)
    calls: ClassVar[list[tuple[float, int, int, bool]]] = []
    """Test-only: ``(ratio, stride, max downsample, no_rand)`` of every attn1 call the built-in patched."""


# --- the model families without the ldm/sgm UNet ------------------------------------------------------------------


class _Layer(nn.Module):
    """One named layer of a DiT block (an attention, an MLP, a norm or a modulation): a linear map of the tokens."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class _Block(nn.Module):
    """A DiT block with its layers under the real names (``LAYERS``), applied in turn as residuals."""

    LAYERS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, width: int):
        super().__init__()
        for name in self.LAYERS:
            self.add_module(name, _Layer(width))

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        for name in self.LAYERS:
            x = x + 0.1 * torch.tanh(getattr(self, name)(x + context))
        return x


class DiTDouble(nn.Module):
    """A diffusion model of one family: patch in, the family's block lists (``BLOCKS``: attribute -> block class), out.
    Called as Neo's ``KModel.apply_model`` calls every diffusion model (``x, timestep, context=…,
    transformer_options=…``), on the double's 4-D latents (Wan's video latents are 5-D: not modelled)."""

    BLOCKS: ClassVar[dict[str, type[_Block]]] = {}
    WIDTH = 16

    def __init__(self, channels: int = 4, context_dim: int = 32, seed: int = 0, depth: int = 2):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.img_in = nn.Conv2d(channels, self.WIDTH, 2, stride=2)
            self.txt_in = nn.Linear(context_dim, self.WIDTH)
            for name, block in self.BLOCKS.items():
                self.add_module(name, nn.ModuleList(block(self.WIDTH) for _ in range(depth)))
            self.final_layer = nn.ConvTranspose2d(self.WIDTH, channels, 2, stride=2)

    def forward(self, x, timestep, context=None, y=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        h = self.img_in(x)
        b, c, hh, ww = h.shape
        tokens = h.flatten(2).transpose(1, 2)
        ctx = self.txt_in(context).mean(dim=1, keepdim=True) * (1 + timestep.view(-1, 1, 1) / 1000)
        for name in self.BLOCKS:
            for block in getattr(self, name):
                tokens = block(tokens, ctx)
        return self.final_layer(tokens.transpose(1, 2).reshape(b, c, hh, ww))


def _blocks(name: str, layers: tuple[str, ...]) -> type[_Block]:
    return type(name, (_Block,), {"LAYERS": layers})


class IntegratedFluxTransformer2DModel(BflFlux):  # nn/flux.py:349; Flux, Flux.2 Klein: ComfyUI's loop, no wrappers
    WRAPPERS = False


class IntegratedChromaTransformer2DModel(BflFlux):  # nn/chroma.py:87: flux's blocks and loop
    WRAPPERS = False


class WanModel(WanDouble):  # nn/wan.py:266: ComfyUI's loop, no wrappers
    """Neo samples Wan on video latents ``(B, C, T, H, W)``; the double's processing makes image latents: one frame."""

    WRAPPERS = False

    def forward(self, x, timestep, context, **kwargs):
        return super().forward(x.unsqueeze(2), timestep, context, **kwargs).squeeze(2)


class QwenImageTransformer2DModel(QwenDouble):  # nn/qwen.py:335: ComfyUI's loop, its time named ``timesteps``
    """Neo samples Qwen-Image on Wan-VAE latents ``(B, C, 1, H, W)``; the double's processing makes image latents."""

    def forward(self, x, timesteps, context, **kwargs):
        return super().forward(x.unsqueeze(2), timesteps, context, **kwargs).squeeze(2)


class NextDiT(LuminaDouble):  # nn/lumina.py:215: ComfyUI's loop; Lumina 2, Z-Image
    pass


class Anima(MiniTrainDIT):  # nn/anima.py:370 (Block l.248): ComfyUI's Cosmos Predict2 loop, ported
    """Neo samples Anima on Wan-VAE latents ``(B, C, 1, H, W)``; the double's processing makes image latents: one
    frame. ``final_layer`` gets the stream in the context's dtype (l.499; the stream itself is float32 under a float16
    model)."""

    def forward(self, x, timesteps, context, padding_mask=None, **kwargs):
        return super().forward(x.unsqueeze(2), timesteps, context, **kwargs).squeeze(2)

    def to_output(self, grid: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return grid.to(context.dtype)

    def fbc_reset(self) -> None:
        """First Block Cache's reset of its state: upstream Neo's Anima has it (``forge_fbcache.py`` looks for it and
        supports Anima only); the distribution's ``nn/anima.py`` has not (FBCache is not in it either)."""


class ErnieImageModel(DiTDouble):  # nn/ernie.py:190, ErnieImageSharedAdaLNBlock l.150
    BLOCKS: ClassVar[dict[str, type[_Block]]] = {
        "layers": _blocks("ErnieImageSharedAdaLNBlock", ("adaLN_sa_ln", "self_attention", "adaLN_mlp_ln", "mlp"))
    }


class SingleStreamDiT(DiTDouble):  # nn/krea.py:304, SingleStreamBlock l.273
    BLOCKS: ClassVar[dict[str, type[_Block]]] = {
        "blocks": _blocks("SingleStreamBlock", ("mod", "prenorm", "attn", "postnorm", "mlp"))
    }


class PidNet(DiTDouble):  # nn/pixeldit/pid.py:126 around PixDiT_T2I (pixeldit/model.py:114, MMDiTBlockT2I l.83)
    BLOCKS: ClassVar[dict[str, type[_Block]]] = {
        "patch_blocks": _blocks("MMDiTBlockT2I", ("norm_x1", "attn", "norm_x2", "mlp_x", "mlp_y"))
    }


FAMILIES: dict[str, tuple[type[DiTDouble], bool]] = {
    # engine (backend/diffusion_engine/<file>.py: class line) -> (its diffusion model, whether it is a Wan-VAE engine)
    "Flux": (IntegratedFluxTransformer2DModel, False),  # flux.py:19 (FLUX.1 dev / schnell)
    "Flux2": (IntegratedFluxTransformer2DModel, False),  # flux2.py:19 (FLUX.2 Klein 4B / 9B)
    "Chroma": (IntegratedChromaTransformer2DModel, False),  # chroma.py:12
    "ZImage": (NextDiT, False),  # zimage.py:12
    "Lumina2": (NextDiT, False),  # lumina.py:12
    "QwenImage": (QwenImageTransformer2DModel, True),  # qwen.py:20 (is_wan: l.43)
    "Wan": (WanModel, True),  # wan.py:19 (Wan 2.1 / 2.2, is_wan: l.43)
    "Anima": (Anima, True),  # anima.py:14 (is_wan: l.38)
    "Krea2": (SingleStreamDiT, True),  # krea.py:15 (is_wan: l.38)
    "ErnieImage": (ErnieImageModel, False),  # ernie.py:12
    "PiD": (PidNet, False),  # pid.py:18
}
"""Every Neo engine whose diffusion model is no ldm/sgm UNet. The UNet ones (``StableDiffusion``, ``StableDiffusionXL``,
``StableDiffusionXLRefiner``, ``Mugen``: an SDXL UNet with 32 output channels, ``mugen.py:15``) are Forge's."""


def family_engine(family: str, model: nn.Module, name: str) -> forge.ForgeDiffusionEngine:
    """An engine of class ``family`` (the name ToMe's note gives) around ``model``."""
    engine_class = type(family, (forge.ForgeDiffusionEngine,), {})
    engine = engine_class(model, name)
    engine.is_wan = FAMILIES[family][1]
    return engine
