"""The judge of the samples: a small CNN that recognises the digit, and whose pooled features the KID-style
distance compares."""

from __future__ import annotations

import torch
from torch import nn

SIDE = 32  # the side it was trained at; larger images are reduced to it (area)


def _stage(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1), nn.GroupNorm(8, cout), nn.SiLU())


class Classifier(nn.Module):
    """conv 32 → 64 → 128 → 128 (stride 1, 2, 2, 2), global average pool (128-d features), linear to the classes."""

    def __init__(self, classes: int):
        super().__init__()
        self.body = nn.Sequential(_stage(3, 32, 1), _stage(32, 64, 2), _stage(64, 128, 2), _stage(128, 128, 2))
        self.head = nn.Linear(128, classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(n, 128) pooled features of images in [-1, 1] (any side; reduced to :data:`SIDE`)."""
        if x.shape[-1] != SIDE or x.shape[-2] != SIDE:
            x = nn.functional.interpolate(x, size=(SIDE, SIDE), mode="area")
        return self.body(x).mean(dim=(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
