"""Double of ControlNet-LLLite in Mikubill's sd-webui-controlnet (``scripts/controlnet_lllite.py`` at 56cec5b2),
written from reading it; line numbers are the real file's.

``PlugableControlLLLite.hook`` (l.161-197) finds, for each LLLite module, the block it names
(``lllite_unet_{input|output}_blocks_{i}_1_transformer_blocks_{j}_{attn1|attn2}_to_{q|k|v}``), appends the module to
that projection's ``lllite_list`` and, the first time, replaces the projection's ``forward`` on the instance
(``all_hack`` keeps the original) by one that adds ``module(x, current_h_shape) * weight`` to its input (l.199-217).
``LLLiteModule.forward`` (l.72-100) computes the control image's embedding once (``conditioning1``, then resized to
the block's ``h x w`` from ``current_h_shape`` and laid out as ``h * w`` tokens) and concatenates it with
``down(x)`` along the channels: ``x`` must have ``h * w`` tokens. ``current_h_shape`` is the shape of the block input
that ControlNet's hooked UNet forward records before each block (``scripts/hook.py`` l.808-829); here a forward
pre-hook on each UNet block records it. ``clear_all_lllite`` (l.106-112) puts every ``forward`` back and empties the
lists. Kohya's LLLite models cover attn1's ``to_q``/``to_k``/``to_v`` and attn2's ``to_q``.
"""

from __future__ import annotations

import torch
from torch import nn

all_hack: dict[nn.Module, object] = {}
_handles: list = []


class LLLiteModule(nn.Module):
    """A linear (transformer-input) LLLite module, depth 1: conditioning 4x then 2x down, one MLP on [emb, down(x)]."""

    def __init__(self, name: str, in_dim: int, cond_emb_dim: int = 16, mlp_dim: int = 16, seed: int = 0):
        super().__init__()
        self.name = name
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.conditioning1 = nn.Sequential(
                nn.Conv2d(3, cond_emb_dim // 2, kernel_size=4, stride=4),
                nn.ReLU(),
                nn.Conv2d(cond_emb_dim // 2, cond_emb_dim, kernel_size=2, stride=2),
            )
            self.down = nn.Sequential(nn.Linear(in_dim, mlp_dim), nn.ReLU())
            self.mid = nn.Sequential(nn.Linear(mlp_dim + cond_emb_dim, mlp_dim), nn.ReLU())
            self.up = nn.Sequential(nn.Linear(mlp_dim, in_dim))
        self.cond_image: torch.Tensor | None = None
        self.cond_emb: torch.Tensor | None = None
        self.calls: list[tuple[int, int, int]] = []  # test-only: (tokens of x, h, w of the embedding)

    def set_cond_image(self, cond_image: torch.Tensor) -> None:
        self.cond_image, self.cond_emb = cond_image, None

    def forward(self, x: torch.Tensor, blk_shape) -> torch.Tensor:
        if self.cond_emb is None:
            cx = self.conditioning1(self.cond_image.to(x.device, dtype=x.dtype))
            if blk_shape is not None:
                cx = nn.functional.interpolate(cx, tuple(blk_shape[2:]), mode="nearest-exact")
            n, c, h, w = cx.shape
            self.cond_emb = cx.view(n, c, h * w).permute(0, 2, 1)
            self.grid = (h, w)
        cx = self.cond_emb
        if x.shape[0] != cx.shape[0]:
            cx = cx.repeat(x.shape[0] // cx.shape[0], 1, 1)
        self.calls.append((x.shape[1], *self.grid))
        cx = torch.cat([cx, self.down(x)], dim=2)
        return self.up(self.mid(cx))


class LLLite(nn.Module):
    """``PlugableControlLLLite`` (l.115-158): what a ControlNet unit holds as its ``control_model`` (a module, not a
    ControlNet: no transformer blocks). As the real one, it registers each LLLite module as a child and keeps them in
    a dict named ``modules`` too (l.153), an instance attribute over ``nn.Module.modules()``. ``hook`` attaches them to
    a UNet (l.160-197); ``calls`` is every ``(tokens, h, w)`` they were called with (test-only)."""

    def __init__(self, modules: dict[str, LLLiteModule]):
        super().__init__()
        for name, module in modules.items():
            setattr(self, name, module)
        self.modules = modules  # as the real one: shadows nn.Module.modules on the instance
        self.cache: dict = {}

    def reset(self) -> None:
        self.cache = {}

    @property
    def calls(self) -> list[tuple[int, int, int]]:
        return [c for m in self.modules.values() for c in m.calls]

    @torch.no_grad()
    def hook(self, model: nn.Module, cond: torch.Tensor, weight: float, start: float = 0.0, end: float = 1.0):
        """As ControlNet calls it for a Controlllite unit (controlnet.py ~1180): ``cond`` in 0..1."""
        for module in self.modules.values():
            module.set_cond_image(cond * 2.0 - 1.0)
        for name, module in self.modules.items():
            root, index, attn, proj = _target_of(name)
            target = getattr(
                getattr(getattr(model, f"{root}_blocks")[index][1].transformer_blocks[0], attn), f"to_{proj}"
            )
            if not getattr(target, "lllite_list", None):
                target.lllite_list = []
                all_hack[target] = target.forward
                target.forward = _hacked_forward(target.forward, model, target, weight)
            target.lllite_list.append(module)

        def record_shape(module, args):
            model.current_h_shape = tuple(args[0].shape)

        for seq in (*model.input_blocks, model.middle_block, *model.output_blocks):
            _handles.append(seq.register_forward_pre_hook(record_shape))


def _target_of(name: str) -> tuple[str, int, str, str]:
    """``lllite_unet_input_blocks_1_1_transformer_blocks_0_attn1_to_q`` -> ("input", 1, "attn1", "q")."""
    parts = name.split("_")
    return parts[2], int(parts[4]), parts[-3], parts[-1]


def _hacked_forward(original, model: nn.Module, blk: nn.Module, weight: float):
    @torch.no_grad()
    def forward(x, **kwargs):
        hack = 0
        for module in blk.lllite_list:
            hack = hack + module(x, getattr(model, "current_h_shape", None)) * weight
        return original(x + hack, **kwargs)

    return forward


def make(unet: nn.Module, blocks: str = "top", seed: int = 0) -> LLLite:
    """A random-weight LLLite model for an ldm SD-layout UNet: attn1 (q, k, v) and attn2 (q) of the top-level blocks
    (``blocks="top"``: input 1-2, output 9-11), sized from ``unet``'s projections; not attached yet."""
    assert blocks == "top"
    names = [("input", i) for i in (1, 2)] + [("output", i) for i in (9, 10, 11)]
    modules: dict[str, LLLiteModule] = {}
    for k, (root, index) in enumerate(names):
        block = getattr(unet, f"{root}_blocks")[index][1].transformer_blocks[0]
        for attn, projs in (("attn1", "qkv"), ("attn2", "q")):
            for proj in projs:
                target = getattr(getattr(block, attn), f"to_{proj}")
                name = f"lllite_unet_{root}_blocks_{index}_1_transformer_blocks_0_{attn}_to_{proj}"
                modules[name] = LLLiteModule(name, target.in_features, seed=seed + k * 8 + len(modules))
    return LLLite(modules)


def hook(unet: nn.Module, hint: torch.Tensor, blocks: str = "top", weight: float = 1.0) -> LLLite:
    """LLLite on ``unet`` (see :func:`make`), with the control image ``hint`` (B, 3, H, W) in 0..1."""
    lllite = make(unet, blocks)
    lllite.hook(unet, hint, weight)
    return lllite


def clear_all_lllite() -> None:
    for target in all_hack:
        del target.__dict__["forward"]  # the real one assigns the saved bound method back: the same calls
        target.lllite_list = []
    all_hack.clear()
    for handle in _handles:
        handle.remove()
    _handles.clear()
