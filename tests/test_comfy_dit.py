"""The ComfyUI nodes on FLUX (issue 26) in the ComfyUI double: whole prompts on the Black Forest Labs-layout double
(``flux1``: ``tests/bfl_flux_double.py`` in ``model_base.Flux``, flow-matching sigmas as timesteps)."""

from __future__ import annotations

from pathlib import Path

import comfy_harness as ch
import execution
import pytest
import server
import torch
from test_cache_hosts import untouched

import tome_core
from tome_core import run as R
from tome_core import settings as S
from tome_core.caching.correction import output_is_direction
from tome_core.caching.samplers import ACTS_UNDER
from tome_core.families import layout_for

ROOT = Path(__file__).resolve().parents[1]
SIZE = dict(width=64, height=64, steps=6)  # 8x8 latents: 16 image tokens


@pytest.fixture(scope="module", autouse=True)
def comfy():
    ch.start(str(ROOT))
    yield
    tome_core.remove_patch(ch.base_model("flux1").diffusion_model)


def model() -> torch.nn.Module:
    return ch.base_model("flux1").diffusion_model


def sample(patches=(), **kwargs) -> torch.Tensor:
    return ch.samples(ch.run(ch.txt2img("flux1", patches, **{**SIZE, **kwargs})))


def direct(settings: dict, steps: int = 6, euler: bool = False, sampler: str | None = None) -> torch.Tensor:
    """The prompt (under ``sampler``, else euler) with ``tome_core`` applied to the model by hand, the progress
    reported per call (``euler``: and the sampler's sigmas, from the call's ``transformer_options``, as an Euler
    schedule; ``sampler``: as that sampler's, the core's own of that name)."""
    module, calls = model(), []

    def report(m, args, kw):
        tome_core.get_patch(m).set_progress(len(calls) / steps, steps)
        sigmas = kw["transformer_options"]["sample_sigmas"].tolist()
        if euler and not calls:
            tome_core.get_patch(m).set_euler(sigmas)
        if sampler is not None and not calls:
            tome_core.get_patch(m).set_sampler(sampler, sigmas)
        calls.append(None)

    handle = module.register_forward_pre_hook(report, with_kwargs=True)
    tome_core.apply_settings(module, S.from_dict({"enabled": True, "seed": 1, **settings}))
    try:
        return sample(sampler=sampler or "euler")
    finally:
        tome_core.remove_patch(module)
        handle.remove()


def implied(module: torch.nn.Module, full: int, cached: int) -> str:
    """The speed-up ``full`` and ``cached`` steps imply on a transformer (its blocks' share a cached step skips)."""
    share = layout_for(module, 0).skipped_share(None)
    return f"{(full + cached) / (full + cached * (1 - share)):.2f}x"


def test_the_step_cache_node_caches_flux_steps_as_the_core_does_and_leaves_the_plain_image(console):
    plain = sample()
    cache = {"cache_interval": 3, "cache_forecast": "linear", "cache_schedule": "uniform"}
    cached = sample([("ToMeStepCache", cache)])
    speed = implied(model(), 3, 3)
    assert console()[-1].endswith(f"ToMe cache steps: 3 full, 3 cached, ToMe cache speed-up: {speed}")
    # and under the node ("10": the first patch node), as ComfyUI's own nodes show text
    assert server.PromptServer.instance.texts[-1] == (
        "10",
        f"ToMe cache steps: 3 full, 3 cached\nToMe cache speed-up: {speed}",
    )
    # the node's default corrects under KSampler's euler (cache_correction 0.75): the core's given those sigmas
    assert torch.equal(cached, direct({"ratio": 0.0, "cache": True, **cache}, euler=True))
    assert not torch.equal(cached, direct({"ratio": 0.0, "cache": True, **cache, "cache_correction": 0.0}))
    assert not torch.equal(cached, plain) and (cached - plain).abs().max() < 0.25 * plain.abs().max()
    assert untouched(model()) and torch.equal(sample(), plain)


def test_with_the_merge_node_too_the_cache_acts_and_the_note_says_nothing_was_merged(console):
    cached = sample([("ToMeStepCache", {})])
    assert torch.equal(sample([("ToMe", {}), ("ToMeStepCache", {})]), cached)
    assert (
        console()[-1]
        == f"{R.NOTE_KEY}: nothing merged (Flux is a diffusion transformer: only the step cache acts on it)"
    )
    assert untouched(model())


def test_the_merge_node_alone_leaves_flux_as_it_is_and_names_the_step_cache(console):
    assert torch.equal(sample([("ToMe", {})]), sample())
    expected = "nothing merged (Flux is a diffusion transformer: only the step cache acts on it, and it is off)"
    assert console()[-1] == f"{R.NOTE_KEY}: {expected}"
    assert untouched(model())


def test_a_cache_branch_the_model_lacks_is_named_and_the_next_prompt_is_plain():
    plain = sample()
    with pytest.raises(execution.ExecutionFailed) as failed:
        sample([("ToMeStepCache", {"cache_branch": 2})])
    message = failed.value.exception_message
    assert "'cache_branch' = 2" in message and "0 to 1 for this model" in message
    assert untouched(model()) and torch.equal(sample(), plain)


def test_the_cache_correction_under_euler_is_the_cores_and_under_another_sampler_it_stands_aside(console):
    """``cache_correction`` (issue 36): under KSampler's euler the node's pass is the core's given the sampler's
    sigmas; under heun (two model calls a step) it stays off, says so, and the pass is the uncorrected one."""
    cache, corrected = {"cache_interval": 2, "cache_forecast": "linear", "cache_schedule": "uniform"}, 0.5
    uncorrected = sample([("ToMeStepCache", cache)])
    with_correction = sample([("ToMeStepCache", {**cache, "cache_correction": corrected})])
    assert not any("cache correction off" in line for line in console())
    assert "ToMe cache correction: 0.5" in console()[-1]  # the settings line, as the WebUI's infotext
    assert not torch.equal(with_correction, uncorrected)
    by_hand = direct({"ratio": 0.0, "cache": True, **cache, "cache_correction": corrected}, euler=True)
    assert torch.equal(with_correction, by_hand)
    heun = sample([("ToMeStepCache", {**cache, "cache_correction": corrected})], sampler="heun")
    assert f"cache correction off: the sampler is heun; {ACTS_UNDER}" in console()[-1]
    assert torch.equal(heun, sample([("ToMeStepCache", cache)], sampler="heun"))
    assert untouched(model())


@pytest.mark.parametrize("sampler", ["dpmpp_2m", "res_multistep", "uni_pc"])
def test_under_a_multistep_sampler_the_correction_acts_through_the_samplers_own_function(sampler, console):
    """Issue 53: under KSampler's linear multistep samplers the node's default correction acts, read from the
    sampler's own function (``KSAMPLER.sampler_function``), and the pass is the core's told the sampler by name (its
    own implementation of it); the note says which correction acted; plain after it."""
    plain = sample(sampler=sampler)
    cache = {"cache_interval": 2, "cache_forecast": "linear", "cache_schedule": "uniform"}
    uncorrected = sample([("ToMeStepCache", {**cache, "cache_correction": 0.0})], sampler=sampler)
    corrected = sample([("ToMeStepCache", cache)], sampler=sampler)
    assert console()[-1] == f"{R.NOTE_KEY}: cache correction under {sampler}"
    assert not torch.equal(corrected, uncorrected)
    by_hand = direct({"ratio": 0.0, "cache": True, **cache}, sampler=sampler)
    assert torch.allclose(corrected, by_hand, atol=1e-5) and not torch.allclose(uncorrected, by_hand, atol=1e-5)
    assert torch.equal(sample([("ToMeStepCache", cache)], sampler=sampler), corrected)
    assert untouched(model()) and torch.equal(sample(sampler=sampler), plain)


class _VPrediction:
    """A v-prediction schedule's ``calculate_denoised`` (ComfyUI's ``V_PREDICTION``, sigma_data 1)."""

    def calculate_denoised(self, sigma, model_output, model_input):
        sigma = sigma.view(sigma.shape[:1] + (1,) * (model_output.ndim - 1))
        return model_input / (sigma**2 + 1) - model_output * sigma / (sigma**2 + 1) ** 0.5


def test_the_correction_knows_which_schedules_make_the_models_output_eulers_direction():
    assert output_is_direction(ch.base_model("flux1").model_sampling)  # flow matching (CONST)
    assert output_is_direction(ch.base_model("sd15").model_sampling)  # epsilon (EPS)
    assert not output_is_direction(_VPrediction()) and not output_is_direction(None)


def wan(patches=(), **kwargs) -> torch.Tensor:
    return ch.samples(ch.run(ch.txt2img("wan", patches, **{**SIZE, "length": 5, "cfg": 5.0, **kwargs})))


def test_wan_video_with_cfg_is_cached_per_stream_and_the_plain_video_follows(console):
    plain = wan()
    cache = {"cache_interval": 3, "cache_forecast": "linear", "cache_schedule": "uniform"}
    seen = []
    module = ch.base_model("wan").diffusion_model
    handle = module.register_forward_pre_hook(lambda m, a, k: seen.append(tuple(a[0].shape)), with_kwargs=True)
    try:
        cached = wan([("ToMeStepCache", cache)])
    finally:
        handle.remove()
    assert seen == [(2, 16, 2, 8, 8)] * 6  # cond and uncond batched, two latent frames
    assert console()[-1].endswith(f"ToMe cache steps: 3 full, 3 cached, ToMe cache speed-up: {implied(module, 3, 3)}")
    assert not torch.equal(cached, plain) and (cached - plain).abs().max() < 0.25 * plain.abs().max()
    assert untouched(module) and torch.equal(wan(), plain)


@pytest.mark.parametrize(
    "steps, each, warmup",
    [
        (12, ["4 full, 2 cached"] * 2, {}),
        (8, ["4 full, 0 cached"] * 2, {}),  # 4 steps an expert at N=2: its cached step could only reuse the first
        # a warm-up per expert: cache_start is a share of each expert's own steps (0, 1/6, 2/6 < 0.34: full)
        (12, ["5 full, 1 cached"] * 2, {"cache_start": 0.34}),
    ],
)
def test_wan_2_2s_two_experts_each_start_with_a_fresh_cache(console, steps, each, warmup):
    """Wan 2.2: the high-noise expert samples the first steps, the low-noise expert (another model) the rest, each
    with the step cache: each pass begins with full steps of its own (``cache_start``: as many as asked, per expert);
    a pass too short for a forecast runs in full and says so (a 4-step lightx2v chain of 2 + 2 alike)."""
    cache = {"cache_interval": 2, "cache_schedule": "uniform", **warmup}
    wf = ch.txt2img("wan", [("ToMeStepCache", cache)], **{**SIZE, "length": 5, "cfg": 5.0})
    wf["12"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "wan_low"}}
    wf["13"] = {"class_type": "ToMeStepCache", "inputs": {"model": ["12", 0], **cache}}
    base = {k: v for k, v in wf["5"]["inputs"].items() if k not in ("seed", "denoise")}
    passes = {"noise_seed": 1, "return_with_leftover_noise": "enable", "steps": steps}
    wf["5"] = {
        "class_type": "KSamplerAdvanced",
        "inputs": {**base, **passes, "add_noise": "enable", "start_at_step": 0, "end_at_step": steps // 2},
    }
    wf["6"] = {
        "class_type": "KSamplerAdvanced",
        "inputs": {
            **base,
            **passes,
            "model": ["13", 0],
            "add_noise": "disable",
            "latent_image": ["5", 0],
            "start_at_step": steps // 2,
            "end_at_step": steps,
        },
    }
    ch.run(wf)
    reported = [line for line in console() if "ToMe cache steps" in line]
    assert [line.rsplit("ToMe cache steps: ", 1)[1].split(", ToMe cache speed-up")[0] for line in reported] == each
    short = "step cache off: 4 steps are too few to forecast at cache_interval 2 (from 5)"
    assert (short in console()[-1]) == (steps == 8)
    assert untouched(ch.base_model("wan").diffusion_model) and untouched(ch.base_model("wan_low").diffusion_model)


@pytest.mark.parametrize("lora_first", [True, False])
def test_a_flux_lora_before_or_after_the_cache_node_acts_the_same_and_is_taken_off_after(lora_first):
    lora = ("LoraLoaderModelOnly", {"lora_name": "flux_lora", "strength_model": 1.0})
    cache = ("ToMeStepCache", {})
    plain = sample()
    with_lora = sample([lora, cache] if lora_first else [cache, lora])
    assert not torch.equal(with_lora, sample([cache])) and not torch.equal(with_lora, sample([lora]))
    assert torch.equal(sample([cache, lora] if lora_first else [lora, cache]), with_lora)
    assert torch.equal(sample(), plain) and untouched(model())
