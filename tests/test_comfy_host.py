"""The ComfyUI nodes (comfy_tome) in the ComfyUI double: whole prompts through ComfyUI's model patcher, wrappers and
sampler, on the ComfyUI-layout UNet that really runs (``BaseModel.diffusion_model``, shared by every clone)."""

from __future__ import annotations

from pathlib import Path

import comfy_harness as ch
import execution
import pytest
import torch
from comfy import model_management
from comfy.ldm import unet_from_ldm
from models import make_unet

import tome_core
from tome_core import run as R
from tome_core import settings as S
from tome_core.caching.schedule import uniform_plan
from tome_core.families import layout_for

ROOT = Path(__file__).resolve().parents[1]
SIZE = dict(width=64, height=64)  # 8x8 latents: 64 tokens at the first level


@pytest.fixture(scope="module", autouse=True)
def comfy():
    ch.start(str(ROOT))
    yield
    for kind in ("sd15", "sd15b", "sdxl"):
        tome_core.remove_patch(ch.base_model(kind).diffusion_model)


def unet(kind: str = "sd15") -> torch.nn.Module:
    return ch.base_model(kind).diffusion_model


def untouched(module: torch.nn.Module) -> bool:
    """No patch, hook or instance-level forward anywhere in ``module``."""
    return all(
        tome_core.get_patch(m) is None
        and "forward" not in m.__dict__
        and not (m._forward_pre_hooks or m._forward_hooks)
        for m in module.modules()
    )


def sample(patches=(), kind="sd15", **kwargs) -> torch.Tensor:
    return ch.samples(ch.run(ch.txt2img(kind, patches, **{**SIZE, **kwargs})))


def direct(settings: dict, kind="sd15", steps=4, **kwargs) -> torch.Tensor:
    """The plain prompt with ``tome_core`` applied to the UNet by hand and the progress reported per call (one UNet
    call per step: cond and uncond batched), as the nodes should do it."""
    module, calls = unet(kind), []

    def report(m, args, kw):
        tome_core.get_patch(m).set_progress(len(calls) / steps, steps)
        calls.append(None)

    handle = module.register_forward_pre_hook(report, with_kwargs=True)  # before the patch's own hook
    tome_core.apply_settings(module, S.from_dict({"enabled": True, "seed": 1, **settings}))
    try:
        return sample(kind=kind, steps=steps, **kwargs)
    finally:
        tome_core.remove_patch(module)
        handle.remove()


class Calls:
    """Per UNet call of ``kind``: where the patch placed it (progress, steps, cond/uncond chunk) and whether the step
    cache served it."""

    def __init__(self, kind: str = "sd15"):
        self.module, self.seen = unet(kind), []
        self.handle = self.module.register_forward_hook(self._post)

    def _post(self, module, args, out):
        patch = tome_core.get_patch(module)
        call = patch.clock.call
        self.seen.append((call.progress, call.steps, call.chunk, bool(patch.cache and patch.cache.cached_now)))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def test_the_comfy_unet_double_computes_what_the_ldm_unet_does():
    ldm = make_unet("sd15")
    x, t, ctx = torch.randn(2, 4, 8, 8), torch.tensor([500.0, 500.0]), torch.randn(2, 7, 64)
    assert torch.equal(unet_from_ldm(ldm)(x, t, context=ctx, transformer_options={}), ldm(x, t, ctx))


def test_tome_merges_as_tome_core_does_with_the_steps_from_the_sigmas_and_leaves_nothing(console):
    plain = sample()
    with Calls() as calls:
        merged = sample([("ToMe", {"ratio": 0.5})])
    assert torch.equal(merged, direct({"ratio": 0.5})) and not torch.equal(merged, plain)
    assert [(p, n, chunk) for p, n, chunk, _ in calls.seen] == [(i / 4, 4, (1, 0)) for i in range(4)]
    assert untouched(unet())
    assert console() == ["ToMe: True, ToMe seed: 1"]  # the infotext the WebUI writes, no note
    assert torch.equal(sample(), plain)


@pytest.mark.parametrize("tome_first", [True, False])
def test_two_ksamplers_on_one_checkpoint_the_one_without_tome_gives_the_plain_image(tome_first):
    plain, merged = sample(), sample([("ToMe", {})])
    wf = ch.txt2img("sd15", [("ToMe", {})], **SIZE)
    other = {"class_type": "KSampler", "inputs": {**wf["5"]["inputs"], "model": ["1", 0]}}
    order = ["5", "6"] if tome_first else ["6", "5"]
    out = ch.run({**{k: v for k, v in wf.items() if k != "5"}, **{k: wf["5"] if k == "5" else other for k in order}})
    assert torch.equal(ch.samples(out, "6"), plain) and torch.equal(ch.samples(out, "5"), merged)
    assert untouched(unet())


@pytest.mark.parametrize("order", [("ToMe", "ToMeStepCache"), ("ToMeStepCache", "ToMe")])
def test_chaining_both_nodes_gives_merging_and_the_cache_as_cache_true_does(order, console):
    with Calls() as calls:
        both = sample([(name, {"ratio": 0.4} if name == "ToMe" else {"cache_interval": 2}) for name in order])
    expected = direct({"ratio": 0.4, "cache": True, "cache_interval": 2})
    settings = S.from_dict({"cache": True, "cache_interval": 2})
    assert torch.equal(both, expected) and [c for *_, c in calls.seen] == uniform_plan(settings, 4)
    share = layout_for(unet(), 0).skipped_share((8, 8))  # the blocks' work a cached step skips on 8x8 latents
    assert 0.5 < share < 1
    assert console()[-1] == (
        "ToMe: True, ToMe ratio: 0.4, ToMe seed: 1, ToMe cache: True, ToMe cache interval: 2, "
        "ToMe cache forecast: auto, ToMe cache schedule: auto, ToMe cache correction: 0.75, "
        "ToMe cache steps: 3 full, 1 cached, "
        f"ToMe cache speed-up: {4 / (3 + (1 - share)):.2f}x"
    )


def test_a_second_node_of_a_kind_replaces_the_first_and_the_cache_alone_merges_nothing(console):
    assert torch.equal(sample([("ToMe", {"ratio": 0.3}), ("ToMe", {"ratio": 0.5})]), sample([("ToMe", {})]))
    cache_alone = sample([("ToMeStepCache", {})])
    assert torch.equal(cache_alone, direct({"ratio": 0.0, "cache": True}))
    assert "ToMe cache: True" in console()[-1] and "ToMe seed" not in console()[-1]  # no partition drawn, no seed


@pytest.mark.parametrize(
    "node, inputs, named",
    [
        ("ToMe", {"ratio": 0.9}, ["'ratio' = 0.9", "1 - 1/(sx*sy) = 0.75 for strides 2x2"]),
        ("ToMe", {"start": 0.6, "end": 0.4}, ["'end' = 0.4", "greater than start (0.6)"]),
        ("ToMeStepCache", {"cache_start": 0.5, "cache_end": 0.5}, ["'cache_end' = 0.5", "cache_start (0.5)"]),
    ],
)
def test_settings_the_widget_bounds_allow_but_the_record_refuses_fail_the_prompt_and_patch_nothing(
    node, inputs, named, console
):
    plain = sample()
    with pytest.raises(execution.ExecutionFailed) as failed:
        sample([(node, inputs)])
    assert failed.value.node_id == "10" and failed.value.exception_type == "tome_core.settings.SettingsError"
    assert all(text in failed.value.exception_message for text in named)
    assert console() == [f"{R.ERROR_KEY}: {failed.value.exception_message}"]
    assert untouched(unet()) and torch.equal(sample(), plain)  # the next prompt runs normally


def test_a_cache_branch_the_model_lacks_is_named_when_the_node_runs():
    with pytest.raises(execution.ExecutionFailed) as failed:
        sample([("ToMeStepCache", {"cache_branch": 9})], kind="sdxl")
    assert (
        "'cache_branch' = 9" in failed.value.exception_message
        and "0 to 8 for this UNet" in failed.value.exception_message
    )
    assert untouched(unet("sdxl"))


def test_values_outside_the_widget_bounds_are_refused_by_comfy_before_anything_runs():
    with pytest.raises(execution.PromptRejected) as rejected:
        sample([("ToMe", {"ratio": 0.96, "sx": 9})])
    errors = rejected.value.node_errors["10"]
    assert [(e["type"], e["details"]) for e in errors] == [
        ("value_bigger_than_max", "ratio"),
        ("value_bigger_than_max", "sx"),
    ]


@pytest.mark.parametrize(
    "error", [model_management.InterruptProcessingException, RuntimeError, torch.cuda.OutOfMemoryError]
)
def test_nothing_is_left_on_the_model_after_an_interrupted_failed_or_oom_sampling(error):
    plain = sample()
    layer = unet().output_blocks[8][1].transformer_blocks[0].ff  # raised mid-forward, as ComfyUI's ops do
    calls = []

    def fail(module, args):
        calls.append(None)
        if len(calls) == 3:  # the second step
            if error is model_management.InterruptProcessingException:
                model_management.interrupt_current_processing()
                model_management.throw_exception_if_processing_interrupted()
            raise error("out of memory" if error is torch.cuda.OutOfMemoryError else "boom")

    handle = layer.register_forward_pre_hook(fail)
    try:
        with pytest.raises(execution.ExecutionFailed) as failed:
            sample([("ToMe", {}), ("ToMeStepCache", {"cache_interval": 2})])
    finally:
        handle.remove()
    assert failed.value.interrupted == (error is model_management.InterruptProcessingException)
    assert untouched(unet()) and torch.equal(sample(), plain)


def test_the_steps_come_from_the_sample_sigmas_with_heun_img2img_and_cfg_1():
    with Calls() as calls:
        sample([("ToMe", {})], sampler="heun", steps=3)
    third = 1 / 3
    assert [(p, n) for p, n, *_ in calls.seen] == [(0, 3), (third, 3), (third, 3), (2 * third, 3), (2 * third, 3)]
    latent = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    with Calls() as calls:
        sample([("ToMe", {})], denoise=0.5, latent=latent)  # the last 4 of 8 steps
        sample([("ToMe", {})], cfg=1.0)  # the cond alone
    assert [(p, n, chunk) for p, n, chunk, _ in calls.seen] == [
        *((i / 4, 4, (1, 0)) for i in range(4)),
        *((i / 4, 4, (0,)) for i in range(4)),
    ]


def test_batch_2_and_img2img_merge_as_tome_core_does():
    latent = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(4))
    for kwargs in ({"batch_size": 2}, {"latent": latent, "denoise": 0.6}):
        assert torch.equal(sample([("ToMe", {})], **kwargs), direct({}, **kwargs)), kwargs


def test_sdxl_merges_at_its_first_attention_level_and_a_refiner_pass_gets_its_own_steps(partitions):
    wf = ch.txt2img("sdxl", [("ToMe", {}), ("ToMeStepCache", {})], **SIZE)
    base = {k: v for k, v in wf["5"]["inputs"].items() if k not in ("seed", "denoise")}
    passes = {"add_noise": "enable", "noise_seed": 1, "return_with_leftover_noise": "enable"}
    wf["5"] = {"class_type": "KSamplerAdvanced", "inputs": {**base, **passes, "start_at_step": 0, "end_at_step": 3}}
    wf["6"] = {
        "class_type": "KSamplerAdvanced",
        "inputs": {
            **base,
            **passes,
            "add_noise": "disable",
            "latent_image": ["5", 0],
            "start_at_step": 3,
            "end_at_step": 4,
        },
    }
    with Calls("sdxl") as calls:
        ch.run(wf)
    assert [(p, n) for p, n, *_ in calls.seen] == [(0, 3), (1 / 3, 3), (2 / 3, 3), (0, 1)]
    assert [c for *_, c in calls.seen] == [False, True, False, False]  # each pass's first and last step full
    assert partitions and {hw for hw in partitions} == {(4, 4)}  # 8x8 latent: SDXL's blocks start at downsample 2
    assert untouched(unet("sdxl"))


def test_a_model_without_unet_blocks_samples_as_it_is_and_says_so(console):
    plain = sample(kind="flux")
    assert torch.equal(sample([("ToMe", {}), ("ToMeStepCache", {})], kind="flux"), plain)
    assert console()[-1] == (
        f"{R.NOTE_KEY}: nothing merged (FluxLikeModel has no UNet transformer blocks); "
        "step cache off: the cache does not know this model's blocks"
    )


def test_min_size_leaves_merging_off_below_it_and_the_cache_still_runs(console):
    assert torch.equal(sample([("ToMe", {"min_size": 128})]), sample())
    assert console()[-1] == f"{R.NOTE_KEY}: pass 64x64 is below the minimum size 128 px: not merged"
    assert torch.equal(sample([("ToMe", {"min_size": 128}), ("ToMeStepCache", {})]), sample([("ToMeStepCache", {})]))
