"""The ComfyUI nodes beside what ComfyUI users combine them with, in the ComfyUI double (its built-ins are written from
ComfyUI's ``comfy_extras`` at 3cd7b32f): each works with ToMe, or ToMe steps aside and says so in the console."""

from __future__ import annotations

from pathlib import Path

import comfy_harness as ch
import pytest
import torch

import tome_core
from tome_core import run as R

ROOT = Path(__file__).resolve().parents[1]
SIZE = dict(width=64, height=64)
NOT_MERGED = "self-attention not merged in {} of 16 blocks ({})"


@pytest.fixture(scope="module", autouse=True)
def comfy():
    ch.start(str(ROOT))
    yield
    tome_core.remove_patch(ch.base_model("sd15").diffusion_model)


def unet() -> torch.nn.Module:
    return ch.base_model("sd15").diffusion_model


def untouched(module: torch.nn.Module) -> bool:
    return all(
        tome_core.get_patch(m) is None
        and "forward" not in m.__dict__
        and not (m._forward_pre_hooks or m._forward_hooks)
        for m in module.modules()
    )


def sample(patches=(), **kwargs) -> torch.Tensor:
    return ch.samples(ch.run(ch.txt2img("sd15", patches, **{**SIZE, **kwargs})))


TOME, CACHE = ("ToMe", {}), ("ToMeStepCache", {})
BUILTIN = ("TomePatchModel", {"ratio": 0.5})


# --- ComfyUI's token merging and caches ---------------------------------------------------------------------------


@pytest.mark.parametrize("builtin_first", [True, False])
def test_the_builtin_tomepatchmodel_is_taken_over_while_ours_merges_and_that_is_said(builtin_first, console):
    chain = [BUILTIN, TOME] if builtin_first else [TOME, BUILTIN]
    chained = sample(chain)
    assert console()[-1] == f"ToMe: True, ToMe seed: 1, {R.BUILTIN_KEY}: 0.5"
    assert torch.equal(chained, sample([TOME]))
    assert untouched(unet())


def test_the_builtin_tomepatchmodel_keeps_merging_beside_our_step_cache_alone(console):
    with_builtin = sample([BUILTIN, CACHE])  # its partition from the global RNG, which the noise seeds
    assert not torch.equal(with_builtin, sample([CACHE]))
    assert all(R.BUILTIN_KEY not in line for line in console())


@pytest.mark.parametrize("method", ["merge", "downsample"])
def test_hypertile_keeps_the_tiles_it_tiles_and_tome_says_so(method, console):
    hypertile = ("HyperTile", {"tile_size": 32, "swap_size": 2, "max_depth": 0, "scale_depth": False})
    alone = sample([hypertile])
    assert torch.equal(sample([hypertile, ("ToMe", {"method": method})]), alone)  # every first-level block tiled
    reason = tome_core.merging.neighbours.RESHAPED
    assert console()[-1] == f"{R.NOTE_KEY}: {NOT_MERGED.format(5, reason)}"


@pytest.mark.parametrize("other", ["EasyCache", "LazyCache"])
def test_beside_easycache_or_lazycache_our_step_cache_steps_aside_and_merging_stays(other, console):
    theirs = (other, {"reuse_threshold": 0.2})
    both = sample([theirs, TOME, CACHE])
    note = f"{R.NOTE_KEY}: step cache off: {other} already skips steps (two caches never both run)"
    assert console()[-1] == note
    assert torch.equal(both, sample([theirs, TOME])) and not torch.equal(both, sample([theirs]))
    assert torch.equal(sample([theirs, CACHE]), sample([theirs]))  # the cache alone: nothing of ours runs
    assert console()[-1] == note


# --- model patches -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "patch",
    [
        ("FreeU", {"b1": 1.1, "b2": 1.2, "s1": 0.9, "s2": 0.2}),
        ("SelfAttentionGuidance", {"scale": 0.5, "blur_sigma": 2.0}),
        ("PerturbedAttentionGuidance", {"scale": 3.0}),
        (
            "PatchModelAddDownscale",
            {
                "block_number": 3,
                "downscale_factor": 2.0,
                "start_percent": 0.0,
                "end_percent": 0.35,
                "downscale_after_skip": True,
            },
        ),
    ],
)
def test_freeu_sag_pag_and_deep_shrink_are_merged_with_and_without_the_cache(patch, console):
    alone = sample([patch])
    for chain in ([patch, TOME], [patch, TOME, CACHE]):
        assert not torch.equal(sample(chain), alone), chain
        assert not any(line.startswith(R.NOTE_KEY) for line in console()), console()
    assert untouched(unet())


@pytest.mark.parametrize(
    "guidance",
    [("SelfAttentionGuidance", {"scale": 0.5, "blur_sigma": 2.0}), ("PerturbedAttentionGuidance", {"scale": 3.0})],
)
def test_sag_and_pag_keep_the_middle_block_they_replace_at_max_downsample_8(guidance, console):
    sample([guidance, ("ToMe", {"max_downsample": "8"})], width=128, height=128)  # 4 tokens in the middle block
    assert console()[-1] == f"{R.NOTE_KEY}: {NOT_MERGED.format(1, 'attn1 replaced by another extension')}"


def test_sag_runs_its_extra_pass_as_a_stream_of_its_own_in_the_cache():
    seen = []
    handle = unet().register_forward_hook(lambda m, a, out: seen.append(tome_core.get_patch(m).clock.call.index))
    try:
        sample([("SelfAttentionGuidance", {"scale": 0.5, "blur_sigma": 2.0}), CACHE])
    finally:
        handle.remove()
    assert seen == [0, 1] * 4  # the guided call, then SAG's, at each step


@pytest.mark.parametrize("lora_first", [True, False])
def test_a_lora_before_or_after_our_node_is_merged_with_and_taken_off_after(lora_first):
    lora = ("LoraLoaderModelOnly", {"lora_name": "lora", "strength_model": 1.0})
    chain = [lora, TOME] if lora_first else [TOME, lora]
    plain, with_lora = sample(), sample(chain)
    assert not torch.equal(with_lora, sample([TOME])) and not torch.equal(with_lora, sample([lora]))
    assert torch.equal(sample([TOME, lora] if lora_first else [lora, TOME]), with_lora)
    assert torch.equal(sample(), plain)  # the next plain prompt loads the model without the LoRA's weights


# --- ControlNet ----------------------------------------------------------------------------------------------------


def _image(seed: int) -> torch.Tensor:
    return torch.rand(1, 64, 64, 3, generator=torch.Generator().manual_seed(seed))


def test_merge_controlnet_merges_inside_the_control_model_for_the_sampling_only():
    control = ch.control_model()
    tokens = []
    handle = (
        control.input_blocks[1][1]
        .transformer_blocks[0]
        .attn1.to_q.register_forward_pre_hook(
            lambda m, args: tokens.append(args[0].shape[1])  # the queries, after our merge
        )
    )
    try:
        merged = sample([TOME], control_image=_image(0))
        unmerged = sample([("ToMe", {"merge_controlnet": False})], control_image=_image(0))
    finally:
        handle.remove()
    assert tokens == [32] * 4 + [64] * 4  # 8x8 tokens, half merged away at ratio 0.5
    assert not torch.equal(merged, unmerged) and untouched(control) and untouched(unet())


def test_cached_steps_follow_the_control_image():
    cached = [sample([TOME, CACHE], control_image=_image(seed)) for seed in (0, 1)]
    assert not torch.equal(*cached)


def test_a_cached_step_is_deepcache_with_that_steps_control_residual():
    """ComfyUI's loop adds each control residual into the skip connections in place, skipped blocks' zeros included;
    a cached step's output is the last output block on [cached deep features, first input block + this step's
    residual]."""
    from comfy.ldm import forward_timestep_embed, timestep_embedding

    model = unet()
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 4, 8, 8, generator=gen)
    x1, ctx, t1 = x0 * 0.9, torch.randn(2, 7, 32, generator=gen), torch.full((2,), 700.0)

    shapes = [tuple(h.shape) for h in _skips(model, x1, ctx, t1)]

    def control(seed: int) -> dict:
        g = torch.Generator().manual_seed(seed)
        return {"output": [0.1 * torch.randn(s, generator=g) for s in shapes], "middle": [torch.zeros(2, 128, 1, 1)]}

    patch = tome_core.apply_patch(model, ratio=0.0, cache=True, cache_interval=3)
    try:
        patch.set_progress(0.0, 4)
        model(x0, torch.full((2,), 999.0), context=ctx, control=control(1), transformer_options={})
        deep = patch.cache.cached_features()[0].clone()
        patch.set_progress(0.25, 4)
        got = model(x1, t1, context=ctx, control=control(2), transformer_options={})
        assert patch.report().cache.cached == 1
    finally:
        tome_core.remove_patch(model)
    emb = model.time_embed(timestep_embedding(t1, model.model_channels))
    skip = forward_timestep_embed(model.input_blocks[0], x1, emb, ctx, {}) + control(2)["output"][0]
    expected = model.out(forward_timestep_embed(model.output_blocks[-1], torch.cat([deep, skip], 1), emb, ctx, {}))
    assert torch.allclose(got, expected, rtol=0, atol=1e-6) and untouched(model)


def _skips(model, x, ctx, t) -> list[torch.Tensor]:
    """The input blocks' outputs (the skip connections) of an unpatched call."""
    out = []
    handles = [b[-1].register_forward_hook(lambda m, a, o: out.append(o)) for b in model.input_blocks]
    try:
        model(x, t, context=ctx, transformer_options={})
    finally:
        for h in handles:
            h.remove()
    return out
