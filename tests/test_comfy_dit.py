"""The ComfyUI nodes on FLUX (issue 26) in the ComfyUI double: whole prompts on the Black Forest Labs-layout double
(``flux1``: ``tests/bfl_flux_double.py`` in ``model_base.Flux``, flow-matching sigmas as timesteps)."""

from __future__ import annotations

import logging
from pathlib import Path

import comfy_harness as ch
import execution
import pytest
import torch

import tome_core
from tome_core import extension as ext
from tome_core import settings as S

ROOT = Path(__file__).resolve().parents[1]
SIZE = dict(width=64, height=64, steps=6)  # 8x8 latents: 16 image tokens


@pytest.fixture(scope="module", autouse=True)
def comfy():
    ch.start(str(ROOT))
    yield
    tome_core.remove_patch(ch.base_model("flux1").diffusion_model)


@pytest.fixture
def console(caplog):
    caplog.set_level(logging.INFO, logger="tome_core")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "tome_core"]


def model() -> torch.nn.Module:
    return ch.base_model("flux1").diffusion_model


def sample(patches=(), **kwargs) -> torch.Tensor:
    return ch.samples(ch.run(ch.txt2img("flux1", patches, **{**SIZE, **kwargs})))


def untouched(module: torch.nn.Module) -> bool:
    return all(
        tome_core.get_patch(m) is None
        and "forward" not in m.__dict__
        and not (m._forward_pre_hooks or m._forward_hooks)
        for m in module.modules()
    )


def direct(settings: dict, steps: int = 6) -> torch.Tensor:
    """The plain prompt with ``tome_core`` applied to the model by hand, the progress reported per call."""
    module, calls = model(), []

    def report(m, args, kw):
        tome_core.get_patch(m).set_progress(len(calls) / steps, steps)
        calls.append(None)

    handle = module.register_forward_pre_hook(report, with_kwargs=True)
    tome_core.apply_settings(module, S.from_dict({"enabled": True, "seed": 1, **settings}))
    try:
        return sample()
    finally:
        tome_core.remove_patch(module)
        handle.remove()


def test_the_step_cache_node_caches_flux_steps_as_the_core_does_and_leaves_the_plain_image(console):
    plain = sample()
    cache = {"cache_interval": 3, "cache_forecast": "linear", "cache_schedule": "uniform"}
    cached = sample([("ToMeStepCache", cache)])
    assert console()[-1].endswith("ToMe cache steps: 3 full, 3 cached")
    assert torch.equal(cached, direct({"ratio": 0.0, "cache": True, **cache}))
    assert not torch.equal(cached, plain) and (cached - plain).abs().max() < 0.25 * plain.abs().max()
    assert untouched(model()) and torch.equal(sample(), plain)


def test_with_the_merge_node_too_the_cache_acts_and_the_note_says_nothing_was_merged(console):
    cached = sample([("ToMeStepCache", {})])
    assert torch.equal(sample([("ToMe", {}), ("ToMeStepCache", {})]), cached)
    assert console()[-1] == f"{ext.NOTE_KEY}: nothing merged (Flux has no UNet transformer blocks)"
    assert untouched(model())


def test_a_cache_branch_the_model_lacks_is_named_and_the_next_prompt_is_plain():
    plain = sample()
    with pytest.raises(execution.ExecutionFailed) as failed:
        sample([("ToMeStepCache", {"cache_branch": 2})])
    message = failed.value.exception_message
    assert "'cache_branch' = 2" in message and "0 to 1 for this model" in message
    assert untouched(model()) and torch.equal(sample(), plain)
