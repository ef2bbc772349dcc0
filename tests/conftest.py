"""Shared fixtures: real ldm UNets (random weights) and natural-image latents."""

from __future__ import annotations

import pytest
import torch
from models import Holder, make_unet


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
