"""Double of the WebUI 1.10.1 built-in Hypertile's U-Net part (``extensions-builtin/hypertile/hypertile.py`` at
82a973c0), written from reading it; line numbers are the real file's.

What a neighbour sees: for every self-attention module whose name ends in one of the depth lists (l.34-186), the
module's ``forward`` is replaced on the instance by a wrapper (l.318-339) and ``module.__webui_hypertile_params``
holds its :class:`HypertileParams` (l.331). Each configuration (l.341-351) sets ``tile_size``, ``swap_size``,
``aspect_ratio = width / height`` and ``enabled = enable and depth <= max_depth``. An enabled wrapper (l.269-315)
infers ``h, w`` from the token count and the aspect ratio (``find_hw_candidates``, l.247-266, which puts
``round(sqrt(n * aspect))`` first), picks ``nh``/``nw`` among the divisors of ``h``/``w`` no smaller than the latent
tile (``random_divisor`` with the module-level ``random.Random``, l.189-214) and runs the layer on the
``(b nh nw) (h w) c`` tiles. The VAE part (4-D inputs) is left out: the double has no VAE.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cache, wraps
from typing import Any

from einops import rearrange
from torch import nn


@dataclass
class HypertileParams:
    depth = 0
    layer_name = ""
    tile_size: int = 0
    swap_size: int = 0
    aspect_ratio: float = 1.0
    forward = None
    enabled = False


def _ldm(prefix: str, indices, blocks=(0,)) -> list[str]:
    return [f"{prefix}.{i}.1.transformer_blocks.{b}.attn1" for i in indices for b in blocks]


DEPTH_LAYERS = {  # SD1.5 ldm names (l.34-86)
    0: _ldm("input_blocks", (1, 2)) + _ldm("output_blocks", (9, 10, 11)),
    1: _ldm("input_blocks", (4, 5)) + _ldm("output_blocks", (6, 7, 8)),
    2: _ldm("input_blocks", (7, 8)) + _ldm("output_blocks", (3, 4, 5)),
    3: ["middle_block.1.transformer_blocks.0.attn1"],
}
DEPTH_LAYERS_XL = {  # SDXL ldm/sgm names (l.88-186): depth 1 takes the second block at downsample 2 too
    0: _ldm("input_blocks", (4, 5)) + _ldm("output_blocks", (3, 4, 5)),
    1: _ldm("input_blocks", (4, 5), (1,))
    + _ldm("output_blocks", (3, 4, 5), (1,))
    + _ldm("input_blocks", (7, 8), range(10))
    + _ldm("output_blocks", (0, 1, 2), range(10)),
    2: [f"middle_block.1.transformer_blocks.{b}.attn1" for b in range(10)],
    3: [],
}

RNG_INSTANCE = random.Random()


@cache
def get_divisors(value: int, min_value: int, /, max_options: int = 1) -> list[int]:
    """``value // d`` for the smallest ``max_options`` divisors ``d >= min(min_value, value)``, largest first."""
    max_options = max(1, max_options)
    min_value = min(min_value, value)
    divisors = [i for i in range(min_value, value + 1) if value % i == 0]
    return [value // i for i in divisors[:max_options]]


def random_divisor(value: int, min_value: int, /, max_options: int = 1) -> int:
    options = get_divisors(value, min_value, max_options=max_options)
    return options[RNG_INSTANCE.randint(0, len(options) - 1)]


def set_hypertile_seed(seed: int) -> None:
    RNG_INSTANCE.seed(seed)


@cache
def largest_tile_size_available(width: int, height: int) -> int:
    gcd, size = math.gcd(width, height), 1
    while gcd % (size * 2) == 0:
        size *= 2
    return size


def iterative_closest_divisors(hw: int, aspect_ratio: float) -> tuple[int, int]:
    pairs = [(i, hw // i) for i in range(2, hw + 1) if hw % i == 0]
    ratios = [w / h for h, w in pairs]
    closest = min(ratios, key=lambda r: abs(r - aspect_ratio))
    return pairs[ratios.index(closest)]


@cache
def find_hw_candidates(hw: int, aspect_ratio: float) -> tuple[int, int]:
    h, w = round(math.sqrt(hw * aspect_ratio)), round(math.sqrt(hw / aspect_ratio))
    if h * w != hw:
        if (hw / h).is_integer():
            w = int(hw / h)
        elif (hw / w).is_integer():
            h = int(hw / w)
        else:
            return iterative_closest_divisors(hw, aspect_ratio)
    return h, w


calls: list[tuple[str, int, int]] = []
"""Test-only: ``(layer_name, tokens, tiles)`` of every enabled U-Net call, in order."""


def self_attn_forward(params: HypertileParams, scale_depth: bool = True):
    @wraps(params.forward)
    def wrapper(*args: Any, **kwargs: Any):
        if not params.enabled:
            return params.forward(*args, **kwargs)
        latent_tile_size = max(128, params.tile_size) // 8
        x = args[0]
        hw = x.size(1)
        h, w = find_hw_candidates(hw, params.aspect_ratio)
        assert h * w == hw, f"Invalid aspect ratio {params.aspect_ratio} for input of shape {x.shape}"
        factor = 2**params.depth if scale_depth else 1
        nh = random_divisor(h, latent_tile_size * factor, params.swap_size)
        nw = random_divisor(w, latent_tile_size * factor, params.swap_size)
        calls.append((params.layer_name, hw, nh * nw))
        if nh * nw > 1:
            x = rearrange(x, "b (nh h nw w) c -> (b nh nw) (h w) c", h=h // nh, w=w // nw, nh=nh, nw=nw)
        out = params.forward(x, *args[1:], **kwargs)
        if nh * nw > 1:
            out = rearrange(out, "(b nh nw) hw c -> b nh nw hw c", nh=nh, nw=nw)
            out = rearrange(out, "b nh nw (h w) c -> b (nh h nw w) c", h=h // nh, w=w // nw)
        return out

    return wrapper


def hypertile_hook_model(
    model: nn.Module, width, height, *, enable=False, tile_size_max=128, swap_size=1, max_depth=3, is_sdxl=False
) -> None:
    """Wrap the listed layers once (only when first enabled), then configure them for this pass."""
    layers_done = getattr(model, "__webui_hypertile_layers", None)
    if layers_done is None:
        if not enable:
            return
        layers_done = {}
        layers = DEPTH_LAYERS_XL if is_sdxl else DEPTH_LAYERS
        for depth in range(4):
            for layer_name, module in model.named_modules():
                if any(layer_name.endswith(name) for name in layers[depth]):
                    params = HypertileParams()
                    setattr(module, "__webui_hypertile_params", params)  # as the real l.331 (no name mangling)
                    params.forward = module.forward
                    params.depth = depth
                    params.layer_name = layer_name
                    module.forward = self_attn_forward(params)
                    layers_done[layer_name] = 1
        setattr(model, "__webui_hypertile_layers", layers_done)
    aspect_ratio = width / height
    tile_size = min(largest_tile_size_available(width, height), tile_size_max)
    for layer_name, module in model.named_modules():
        if layer_name in layers_done:
            params = getattr(module, "__webui_hypertile_params")
            params.tile_size = tile_size
            params.swap_size = swap_size
            params.aspect_ratio = aspect_ratio
            params.enabled = enable and params.depth <= max_depth


def unhook(model: nn.Module) -> None:
    """Test-only: what a restart gives (the real Hypertile never unwraps): every wrapped layer as it was."""
    for _name, module in model.named_modules():
        params = module.__dict__.pop("__webui_hypertile_params", None)
        if params is not None:
            del module.__dict__["forward"]
    model.__dict__.pop("__webui_hypertile_layers", None)
