"""Paired and distributional measures of samples against plain sampling, with bootstrap 95 % intervals."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from .data import to_uint8

BOOTSTRAP = 2000
IDENTICAL_PSNR = 100.0
"""The PSNR (dB) counted for a sample identical to its reference (the true one is infinite)."""


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds and its bootstrap 95 % interval."""

    mean: float
    low: float
    high: float

    def cell(self, fmt: str = ".2f", scale: float = 1.0) -> str:
        return f"{self.mean * scale:{fmt}} [{self.low * scale:{fmt}}, {self.high * scale:{fmt}}]"

    def to_json(self) -> list[float]:
        return [self.mean, self.low, self.high]

    @classmethod
    def from_json(cls, values: list[float]) -> Estimate:
        return cls(*values)


def bootstrap(values: np.ndarray, seed: int = 0, statistic=np.mean) -> Estimate:
    """The mean of per-seed ``values`` and the 2.5–97.5 percentiles of its bootstrap distribution (seeded)."""
    values = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    index = rng.integers(len(values), size=(BOOTSTRAP, len(values)))
    stats = statistic(values[index], axis=1)
    return Estimate(float(statistic(values)), float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5)))


def psnr_ssim(samples: torch.Tensor, reference: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Per-seed PSNR (dB) and SSIM of 8-bit ``samples`` against ``reference`` (both (n, 3, h, w) in [-1, 1]; clips
    (n, 3, f, h, w): PSNR over the whole clip, SSIM the mean of its frames'). An identical pair has infinite PSNR; it is
    counted as ``IDENTICAL_PSNR`` so that means stay finite."""
    a, b = to_uint8(samples), to_uint8(reference)
    psnr, ssim = [], []
    for x, y in zip(a, b):
        psnr.append(IDENTICAL_PSNR if np.array_equal(x, y) else peak_signal_noise_ratio(y, x, data_range=255))
        frames = zip(y.reshape(-1, *y.shape[-3:]), x.reshape(-1, *x.shape[-3:]))
        ssim.append(np.mean([structural_similarity(f, g, data_range=255, channel_axis=2) for f, g in frames]))
    return np.array(psnr), np.array(ssim)


def _kernel(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """KID's cubic polynomial kernel ``(x·y / d + 1)³``."""
    return (x @ y.T / x.shape[1] + 1) ** 3


def kid(samples: np.ndarray, data: np.ndarray) -> float:
    """Unbiased squared MMD between two feature sets under the cubic kernel (Bińkowski et al. 2018)."""
    m, n = len(samples), len(data)
    kxx, kyy, kxy = _kernel(samples, samples), _kernel(data, data), _kernel(samples, data)
    xx = (kxx.sum() - np.trace(kxx)) / (m * (m - 1))
    yy = (kyy.sum() - np.trace(kyy)) / (n * (n - 1))
    return float(xx + yy - 2 * kxy.mean())


def kid_estimate(samples: np.ndarray, data: np.ndarray, seed: int = 0, rounds: int = 200) -> Estimate:
    """KID with a bootstrap interval over the samples (the data features stay fixed)."""
    rng = np.random.default_rng(seed)
    stats = [kid(samples[rng.integers(len(samples), size=len(samples))], data) for _ in range(rounds)]
    return Estimate(kid(samples, data), float(np.percentile(stats, 2.5)), float(np.percentile(stats, 97.5)))
