"""Shared fixtures: real ldm UNets (random weights), natural-image latents, the merge partitions drawn."""

from __future__ import annotations

import pytest
import torch
from models import Holder, make_unet

from tome_core import merge as tm


@pytest.fixture(scope="session")
def sd15_unet():
    return make_unet("sd15")


@pytest.fixture(scope="session")
def sdxl_unet():
    return make_unet("sdxl")


@pytest.fixture
def holder(sd15_unet):
    """The SD1.5-layout UNet inside a LatentDiffusion-like holder; always left unpatched."""
    import tomesd

    import tome_core

    h = Holder(sd15_unet)
    yield h
    tome_core.remove_patch(h)
    tomesd.remove_patch(h)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@pytest.fixture
def partitions(monkeypatch):
    """The ``(h, w)`` of every merge partition drawn."""
    seen: list[tuple[int, int]] = []
    make = tm.make_partition

    def make_partition(h, w, *args, **kwargs):
        seen.append((h, w))
        return make(h, w, *args, **kwargs)

    monkeypatch.setattr(tm, "make_partition", make_partition)
    return seen
