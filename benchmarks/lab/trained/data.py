"""The training distribution: digit glyphs over crops of photographs, all from data inside pip packages.

Each image shows one digit (the class label, 0–9: ten classes that differ in shape) rendered from one of
matplotlib's bundled TrueType fonts (DejaVu, STIX, Computer Modern), at a random size, position, slant and
colour, over a dimmed random crop of one of scikit-image's bundled photographs and textures. Images are RGB
in [-1, 1], the UNet's input space (these models diffuse pixels: no VAE). Every draw is seeded: the same
``(n, size, seed)`` gives the same images in any process.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

CLASSES: tuple[str, ...] = tuple("0123456789")
FONTS: tuple[str, ...] = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "cmr10.ttf",
    "cmss10.ttf",
)
PHOTOS: tuple[str, ...] = (
    "astronaut.png",
    "camera.png",
    "chelsea.png",
    "coffee.png",
    "coins.png",
    "rocket.jpg",
    "hubble_deep_field.jpg",
    "brick.png",
    "grass.png",
    "gravel.png",
    "moon.png",
    "retina.jpg",
    "page.png",
    "text.png",
    "ihc.png",
    "motorcycle_left.png",
)
"""Files in scikit-image's wheel (``skimage/data``), read directly: nothing is fetched."""


@functools.cache
def _photos() -> tuple[np.ndarray, ...]:
    """scikit-image's bundled photographs as float RGB arrays in [0, 1]."""
    import skimage

    folder = Path(skimage.__file__).parent / "data"
    return tuple(np.asarray(Image.open(folder / name).convert("RGB"), dtype=np.float32) / 255.0 for name in PHOTOS)


@functools.cache
def _font(name: str, px: int) -> ImageFont.FreeTypeFont:
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / name
    return ImageFont.truetype(str(path), px)


def _background(rng: np.random.Generator, size: int, frames: int = 0) -> np.ndarray:
    """A random crop of a random photograph, resized to ``size`` and dimmed towards its mean (H, W, 3); with
    ``frames``, that many (F, H, W, 3), the crop panning a straight line of up to a quarter of its side."""
    photos = _photos()
    img = photos[rng.integers(len(photos))]
    h, w = img.shape[:2]
    side = int(rng.integers(max(8, min(h, w) // 16), min(h, w) // 2 + 1))
    y, x = int(rng.integers(h - side + 1)), int(rng.integers(w - side + 1))
    flip = rng.random() < 0.5
    contrast = rng.uniform(0.25, 0.6)
    pan = rng.uniform(-0.25, 0.25, 2) * side if frames else np.zeros(2)
    out = []
    for f in range(max(frames, 1)):
        dy, dx = pan * (f / max(frames - 1, 1) - 0.5)
        top, left = int(np.clip(y + dy, 0, h - side)), int(np.clip(x + dx, 0, w - side))
        crop = Image.fromarray((img[top : top + side, left : left + side] * 255).astype(np.uint8))
        if flip:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out.append(np.asarray(crop.resize((size, size), Image.Resampling.BOX), dtype=np.float32) / 255.0)
    mean = out[0].mean()
    out = [mean + contrast * (o - mean) for o in out]
    return np.stack(out) if frames else out[0]


def _glyph_mask(rng: np.random.Generator, label: int, size: int, frames: int = 0) -> np.ndarray:
    """The digit's coverage (H, W) in [0, 1]: random font, height 55–85% of the image, slant, offset; with ``frames``,
    that many (F, H, W), the digit moving a straight line of up to a third of the image across them."""
    scale = 4  # drawn at 4x and reduced: smooth edges
    big = size * scale
    font = _font(FONTS[rng.integers(len(FONTS))], int(big * rng.uniform(0.55, 0.85)))
    canvas = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(canvas)
    left, top, right, bottom = draw.textbbox((0, 0), CLASSES[label], font=font)
    gw, gh = right - left, bottom - top
    cx = big / 2 + rng.uniform(-0.12, 0.12) * big
    cy = big / 2 + rng.uniform(-0.12, 0.12) * big
    draw.text((cx - gw / 2 - left, cy - gh / 2 - top), CLASSES[label], fill=255, font=font)
    canvas = canvas.rotate(float(rng.uniform(-15, 15)), resample=Image.Resampling.BILINEAR, center=(cx, cy))
    if not frames:
        return np.asarray(canvas.resize((size, size), Image.Resampling.BOX), dtype=np.float32) / 255.0
    move = rng.uniform(-1 / 6, 1 / 6, 2) * big
    out = []
    for f in range(frames):
        dx, dy = move * (f / max(frames - 1, 1) - 0.5)
        frame = canvas.transform(canvas.size, Image.Transform.AFFINE, (1, 0, -dx, 0, 1, -dy), Image.Resampling.BILINEAR)
        out.append(np.asarray(frame.resize((size, size), Image.Resampling.BOX), dtype=np.float32) / 255.0)
    return np.stack(out)


def _colour(rng: np.random.Generator, background: np.ndarray) -> np.ndarray:
    """A glyph colour whose brightness stands out from the background's."""
    lum = float(background.mean())
    target = rng.uniform(0.75, 1.0) if lum < 0.5 else rng.uniform(0.0, 0.25)
    colour = rng.uniform(0, 1, 3).astype(np.float32)
    return np.clip(colour - colour.mean() + target, 0, 1) * 0.7 + 0.3 * target


def draw(n: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` images (n, 3, size, size) in [-1, 1] and their labels (n,), a LongTensor of class indices."""
    rng = np.random.default_rng(seed)
    images = np.empty((n, size, size, 3), dtype=np.float32)
    labels = rng.integers(len(CLASSES), size=n)
    for i, label in enumerate(labels):
        bg = _background(rng, size)
        mask = _glyph_mask(rng, int(label), size)[..., None]
        images[i] = bg * (1 - mask) + _colour(rng, bg) * mask
    x = torch.from_numpy(images).permute(0, 3, 1, 2).mul(2).sub(1).contiguous()
    return x.clamp(-1, 1), torch.from_numpy(labels).long()


def draw_clips(n: int, size: int, frames: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` clips (n, 3, frames, size, size) in [-1, 1] of the same distribution in motion (the digit moving one way,
    the photograph panning another), and their labels (n,)."""
    rng = np.random.default_rng(seed)
    clips = np.empty((n, frames, size, size, 3), dtype=np.float32)
    labels = rng.integers(len(CLASSES), size=n)
    for i, label in enumerate(labels):
        bg = _background(rng, size, frames)
        mask = _glyph_mask(rng, int(label), size, frames)[..., None]
        clips[i] = bg * (1 - mask) + _colour(rng, bg[0]) * mask
    x = torch.from_numpy(clips).permute(0, 4, 1, 2, 3).mul(2).sub(1).contiguous()
    return x.clamp(-1, 1), torch.from_numpy(labels).long()


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """Images in [-1, 1] (n, 3, h, w) as uint8 (n, h, w, 3), for saving and for skimage's metrics; clips
    (n, 3, f, h, w) as (n, f, h, w, 3)."""
    return ((x.clamp(-1, 1) + 1) * 127.5).round().byte().movedim(1, -1).numpy()
