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


# --- tiers ---------------------------------------------------------------------------------------------------------
# Every test gets one tier marker from its module; `pytest -m fast` is the inner loop (the engine, its families and
# settings: under 3 minutes on two cores), `-m host` the host doubles' whole generations, `-m lab` the benchmarks'
# commands and trained models. CI runs them all (plain `pytest`). A test of the fast tier slower than about 5 s is
# marked `slow` by name below and runs in the full suite only.

HOST_MODULES = {
    "test_cache_hosts",
    "test_comfy_dit",
    "test_comfy_host",
    "test_comfy_neighbours",
    "test_comfy_nodes",
    "test_controlnet",
    "test_controlnet_double",
    "test_diffusers_host",
    "test_extension",
    "test_forge_host",
    "test_host_reads",
    "test_neighbours_forge",
    "test_neighbours_neo",
    "test_neighbours_webui",
    "test_neo_host",
    "test_refiner",
    "test_ui",
    "test_webui_double",
}
LAB_MODULES = {
    "test_anchors",
    "test_benchmarks",
    "test_comfy_benchmark",
    "test_comfy_builtin",
    "test_dit_anchors",
    "test_correction_ceiling",
    "test_dit_correction",
    "test_dit_costs",
    "test_dit_fidelity",
    "test_dit_libraries",
    "test_dit_merge",
    "test_fidelity",
    "test_flux_model",
    "test_forecasters",
    "test_modes",
    "test_plan_memory",
    "test_samplers",
    "test_wan_costs",
    "test_wan_model",
}
SLOW_FAST_TESTS = {
    "test_same_seed_bit_identical_across_processes",  # starts another Python process
    "test_unet_output_equals_tomesd",  # the oracle at 5 sizes up to 2048 px
    "test_the_wheel_carries_the_license",  # builds the wheel
    "test_comfy_clis_registry_check_passes_and_its_archive_carries_the_nodes_and_the_license",  # runs comfy-cli
}


def tier(module: str) -> str:
    """The tier of a test module: ``host``, ``lab`` or ``fast``."""
    return "host" if module in HOST_MODULES else "lab" if module in LAB_MODULES else "fast"


def pytest_collection_modifyitems(config, items):
    for item in items:
        item.add_marker(tier(item.module.__name__.rsplit(".", 1)[-1]))
        if item.originalname in SLOW_FAST_TESTS:
            item.add_marker("slow")
