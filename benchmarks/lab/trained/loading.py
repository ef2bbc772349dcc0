"""The shipped models, loaded into their documented architectures."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from safetensors.torch import load_file
from torch import nn

from . import architectures as A
from . import data, flux, wan
from .classifier import Classifier


@dataclass(frozen=True)
class Model:
    """A trained model: ``unet`` (ldm ``UNetModel``, eval mode, float32), its ``classes``, trained ``size`` (side in
    UNet input pixels), input ``channels``, and ``condition(labels)`` → the UNet's keyword arguments."""

    name: str
    unet: nn.Module
    conditioner: A.Conditioner
    classes: tuple[str, ...]
    size: int
    channels: int

    def condition(self, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """``context`` (and ``y`` for the SDXL layout) for a LongTensor of labels; −1 is the empty prompt."""
        with torch.no_grad():
            return self.conditioner(labels.long())


def _load(module: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    module.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
    return module.eval().requires_grad_(False)


def load_model(name: str, path: str | None = None) -> Model:
    """The shipped ``sd15`` or ``sdxl`` model (``path``: another weights file of the same architecture)."""
    arch = A.ARCHITECTURES[name]
    A.install_attention()
    unet, conditioner = A.build(arch, len(data.CLASSES))
    state = load_file(str(path or A.weights_path(name)))
    _load(unet, {k.removeprefix("unet."): v for k, v in state.items() if k.startswith("unet.")})
    _load(conditioner, {k.removeprefix("conditioner."): v for k, v in state.items() if k.startswith("conditioner.")})
    return Model(name, unet, conditioner, data.CLASSES, arch.size, arch.channels)


def load_flux(path: str | None = None) -> flux.FluxLayout:
    """The shipped FLUX-layout model (:mod:`.flux`; ``path``: another weights file of the same architecture)."""
    return _load(flux.build(len(data.CLASSES)), load_file(str(path or A.weights_path(flux.NAME))))


def load_wan(path: str | None = None) -> wan.WanLayout:
    """The shipped Wan-layout video model (:mod:`.wan`; ``path``: another weights file of the same architecture)."""
    return _load(wan.build(len(data.CLASSES)), load_file(str(path or A.weights_path(wan.NAME))))


def load_wan_long(path: str | None = None) -> wan.WanLayout:
    """The shipped long-clip Wan-layout model (:data:`.wan.LONG_NAME`: the same architecture, its positions
    interpolated, 4,096 tokens a clip)."""
    return _load(wan.build_long(len(data.CLASSES)), load_file(str(path or A.weights_path(wan.LONG_NAME))))


@functools.cache
def load_classifier() -> Classifier:
    """The shipped judge of class accuracy (and feature space of the KID-style distance)."""
    return _load(Classifier(len(data.CLASSES)), load_file(str(A.weights_path("classifier"))))


def training_data(name: str, n: int, seed: int, size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)``: ``n`` draws from the training distribution of model ``name``, in the UNet's input space
    (RGB in [−1, 1]) at its trained side (or ``size``)."""
    return data.draw(n, size or A.ARCHITECTURES[name].size, seed)
