"""Real ldm UNets with random weights, small enough for CPU tests, and natural-image latents; the benchmarks'
configurations of them (:class:`Config`: layout, size, width, batch), their inputs, and our ToMe at the suite's
settings (:func:`ours`). The tests import these from here, through their own ``models`` module."""

from __future__ import annotations

import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

import tome_core


@functools.cache
def install_unet_cat_hijack() -> None:
    """Let the ldm UNet take any latent size, as the WebUI does (modules/sd_hijack_unet.py):
    its skip concatenation resizes the upsampled tensor to the skip connection's size."""
    import ldm.modules.diffusionmodules.openaimodel as openaimodel

    real_th = openaimodel.th

    class _Torch:
        def __getattr__(self, name):
            return getattr(real_th, name)

        @staticmethod
        def cat(tensors, *args, **kwargs):
            if len(tensors) == 2:
                a, b = tensors
                if a.shape[-2:] != b.shape[-2:]:
                    a = nn.functional.interpolate(a, b.shape[-2:], mode="nearest")
                tensors = (a, b)
            return real_th.cat(tensors, *args, **kwargs)

    openaimodel.th = _Torch()


@functools.cache
def install_sdp_attention() -> None:
    """Run ldm's CrossAttention through torch's scaled_dot_product_attention, as the WebUI's default
    "sdp" optimisation does (it replaces ``CrossAttention.forward`` at class level)."""
    from ldm.modules.attention import CrossAttention

    def forward(self, x, context=None, mask=None, **kwargs):
        b, n, _ = x.shape
        context = x if context is None else context
        q, k, v = self.to_q(x), self.to_k(context), self.to_v(context)
        q, k, v = (t.view(b, t.shape[1], self.heads, -1).transpose(1, 2) for t in (q, k, v))
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))

    CrossAttention.forward = forward


def reinit_zero_modules(model: nn.Module, seed: int = 0, scale: float = 0.05) -> nn.Module:
    """ldm zero-initialises output projections (zero_module); give every all-zero weight small random
    values so that each transformer block really contributes to the output."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1 and not p.is_meta and not p.any():
                p.copy_(torch.randn(p.shape, generator=gen) * scale / p[0].numel() ** 0.5 * 4)
    return model


def one_context_per_block(unet: nn.Module) -> None:
    """sgm's SpatialTransformer gives one context to each block of a deep transformer; this ldm wants a
    list. Subclass (same name, same submodules) the deep ones so that SDXL-like layouts run."""
    from ldm.modules.attention import SpatialTransformer as LdmSpatialTransformer

    class SpatialTransformer(LdmSpatialTransformer):
        def forward(self, x, context=None):
            if not isinstance(context, list):
                context = [context] * len(self.transformer_blocks)
            return super().forward(x, context=context)

    for module in unet.modules():
        if type(module) is LdmSpatialTransformer:
            module.__class__ = SpatialTransformer


def make_unet(
    layout: str = "sd15", model_channels: int = 32, seed: int = 0, context_dim: int = 64, **overrides
) -> nn.Module:
    """A real ldm ``UNetModel`` in the SD1.5 or SDXL-like layout, random weights, eval mode, float32.

    The global RNG is left as it was."""
    from ldm.modules.diffusionmodules.openaimodel import UNetModel

    install_unet_cat_hijack()
    install_sdp_attention()
    if layout == "sd15":
        cfg = dict(attention_resolutions=[4, 2, 1], channel_mult=[1, 2, 4, 4], num_res_blocks=2, transformer_depth=1)
    elif layout == "sdxl":
        cfg = dict(
            attention_resolutions=[4, 2],
            channel_mult=[1, 2, 4],
            num_res_blocks=2,
            transformer_depth=2,
            context_dim=[context_dim] * overrides.get("transformer_depth", 2),  # this ldm wants one per block
            use_linear_in_transformer=True,
        )
    else:
        raise ValueError(layout)
    cfg.update(
        image_size=32,
        in_channels=4,
        out_channels=4,
        model_channels=model_channels,
        num_head_channels=16,
        use_spatial_transformer=True,
        use_checkpoint=False,
        legacy=False,
    )
    cfg.setdefault("context_dim", context_dim)
    cfg.update(overrides)
    if "num_heads" in overrides:
        cfg["num_head_channels"] = -1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        unet = UNetModel(**cfg)
    if layout == "sdxl":
        one_context_per_block(unet)
    return reinit_zero_modules(unet, seed).eval().requires_grad_(False)


class Holder(nn.Module):
    """Like the WebUI's LatentDiffusion: the UNet at ``.model.diffusion_model``."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.model = nn.Module()
        self.model.diffusion_model = unet


@functools.cache
def _photo_latent_base() -> torch.Tensor:
    from skimage import data

    img = torch.tensor(data.astronaut(), dtype=torch.float32).permute(2, 0, 1) / 127.5 - 1  # 3 x 512 x 512
    return img


def photo_latents(batch: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    """Latent-like tensors (B, 4, h, w) from real photos: downsampled RGB + luminance, a little noise."""
    img = _photo_latent_base()
    base = nn.functional.interpolate(img[None], size=(h, w), mode="area")[0]
    lum = base.mean(0, keepdim=True)
    lat = torch.cat([base, lum], 0)
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([lat.roll(i * 3, dims=-1) + 0.1 * torch.randn(lat.shape, generator=gen) for i in range(batch)])


# The shipped widths: SD1.5 (v1-inference.yaml) and SDXL base (sd_xl_base.yaml).
REAL = {
    "sd15": dict(model_channels=320, context_dim=768, num_heads=8),
    "sdxl": dict(model_channels=320, context_dim=2048, depths=(2, 10), adm_in_channels=2816),
}


def make_real_unet(layout: str, seed: int = 0) -> nn.Module:
    """A real ldm ``UNetModel`` at the shipped width of SD1.5 or SDXL, random weights, float32.

    SD1.5: model_channels 320, 8 heads, context 768, one transformer block at downsample 1/2/4.
    SDXL: 320/640/1280 channels, transformer depth 0/2/10 (10 in the middle block too), 64-dim heads,
    context 2048, an ``adm`` vector of 2816 (pass ``y``); this ldm builds one depth for every level, so
    the blocks beyond 2 at downsample 2 are dropped after construction, and its label embedding is the
    SDXL one (Linear 2816→1280, SiLU, Linear), built here."""
    if layout == "sd15":
        return make_unet("sd15", seed=seed, **REAL["sd15"])
    cfg = REAL["sdxl"]
    low, high = cfg["depths"]
    unet = make_unet(
        "sdxl",
        model_channels=cfg["model_channels"],
        seed=seed,
        context_dim=cfg["context_dim"],
        transformer_depth=high,
        num_head_channels=64,
        num_classes="continuous",
    )
    from ldm.modules.attention import SpatialTransformer

    for module in unet.modules():
        if isinstance(module, SpatialTransformer) and module.in_channels == 2 * cfg["model_channels"]:
            module.transformer_blocks = module.transformer_blocks[:low]
    emb = 4 * cfg["model_channels"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        unet.label_emb = nn.Sequential(nn.Linear(cfg["adm_in_channels"], emb), nn.SiLU(), nn.Linear(emb, emb))
    return unet.eval().requires_grad_(False)


@dataclass(frozen=True)
class Config:
    layout: str
    px: int
    channels: int
    batch: int
    real: bool = False  # the shipped architecture (:data:`REAL`); ``channels`` is then 320

    @property
    def name(self) -> str:
        return f"{'SD1.5' if self.layout == 'sd15' else 'SDXL'} {self.px} px"

    @property
    def width(self) -> str:
        return "real width" if self.real else f"model_channels {self.channels}"

    @property
    def context_dim(self) -> int:
        return REAL[self.layout]["context_dim"] if self.real else 64

    @property
    def adm_channels(self) -> int | None:
        """Width of SDXL's ``y`` vector (real width only; None: the model takes none)."""
        return REAL[self.layout].get("adm_in_channels") if self.real else None

    def build(self) -> torch.nn.Module:
        if self.real:
            return make_real_unet(self.layout)
        return make_unet(self.layout, model_channels=self.channels)

    def conditioning(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Text context (batch, 77, context_dim) and extra UNet keyword arguments (SDXL's ``y``)."""
        gen = torch.Generator().manual_seed(0)
        ctx = torch.randn(self.batch, 77, self.context_dim, generator=gen)
        adm = self.adm_channels
        return ctx, ({"y": torch.randn(self.batch, adm, generator=gen)} if adm else {})


RATIO = 0.5


def ours(unet: torch.nn.Module, **extra) -> tome_core.Session:
    return tome_core.apply_patch(unet, ratio=RATIO, max_downsample="auto", use_rand=False, **extra)


def step_inputs(config: Config, device: torch.device, dtype: torch.dtype):
    side = config.px // 8
    x = photo_latents(config.batch, side, side).to(device, dtype)
    t = torch.full((config.batch,), 601.0, device=device)
    ctx, extra = config.conditioning()
    return x, t, {k: v.to(device, dtype) for k, v in {"context": ctx, **extra}.items()}


def module_from_file(name: str, path: Path) -> ModuleType:
    """The module in the file ``path``, imported as ``name`` (the one already imported under that name, if any),
    without putting its folder on ``sys.path``: for a command that drives a test double, which names the double's
    file itself (the tests own their doubles; the lab never imports from ``tests/``)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
