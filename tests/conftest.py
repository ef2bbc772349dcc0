"""Shared fixtures: real ldm UNets (random weights), natural-image latents, the merge partitions drawn."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from models import Holder, make_unet

from tome_core.merging import merge as tm

ROOT = Path(__file__).resolve().parents[1]


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


# --- the Forge Neo double (tests/test_neo_host.py, tests/test_neighbours_neo.py) -------------------------------------


@pytest.fixture(scope="module")
def neo_builders():
    """One model per checkpoint for the test module: SD1.5, an SD1.5 refiner, and each of Neo's families without the
    ldm/sgm UNet (``neo_double.backend.FAMILIES``)."""
    from neo_double import backend
    from neo_double import harness as neo

    out = {
        "sd15": neo.engine_builder("sd15", seed=0, name="neo-sd15"),
        "refiner": neo.engine_builder("sd15", seed=1, name="neo-refiner"),
    }
    out.update({family: neo.engine_builder(family, seed=0) for family in backend.FAMILIES})
    return out


@pytest.fixture
def start_neo(neo_builders):
    """``start_neo(checkpoint="sd15", builtins=False)``: the Neo double with our extension (and the doubles of its
    built-in caches); every model clean and the WebUI double back after."""
    from neo_double import harness as neo

    import tome_core

    def _start(checkpoint="sd15", builtins=False):
        order = [checkpoint, *(k for k in neo_builders if k != checkpoint)]
        checkpoints = {k: neo_builders[k] for k in order}
        return neo.start_neo([str(ROOT)], checkpoints=checkpoints, builtins=builtins)

    yield _start
    for build in neo_builders.values():
        tome_core.remove_patch(build().forge_objects.unet.model.diffusion_model)
    neo.reset_neo()


@pytest.fixture
def console(caplog):
    """The console lines ToMe wrote (its logger, INFO and above)."""
    caplog.set_level(logging.INFO, logger="tome_core")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "tome_core"]
