"""ToMe beside Forge's built-ins that patch the UNet (FreeU, SAG, PAG, Kohya HRFix, MultiDiffusion, StyleAlign,
reference-only, ControlLLLite) and beside Layer Diffuse, in the Forge double. Each built-in is a double written from
its source (``tests/forge_double/README.md``); each test shows that the built-in runs as it does alone, that ToMe
merges where it can and says where it cannot, and that nothing of ours is left."""

from __future__ import annotations

from pathlib import Path

import generation
import pytest
import torch
from forge_double import backend
from forge_double import harness as forge
from forge_double.unet import unet_from_ldm
from generation import identical
from models import make_unet, photo_latents, rel
from modules import errors, infotext_utils, scripts

import tome_core
from tome_core import run as R

ROOT = Path(__file__).resolve().parents[1]
NEIGHBOURS = ROOT / "tests" / "neighbours"


@pytest.fixture(scope="module")
def build():
    return forge.engine_builder("sd15", seed=0, name="forge-sd15")


def unet_of(build) -> torch.nn.Module:
    return build().forge_objects.unet.model.diffusion_model


@pytest.fixture
def start(build):
    """``start(*extension_dirs)``: Forge with the built-in doubles, those extensions and ours; all undone after."""

    def _start(*dirs):
        return forge.start_forge([*map(str, dirs), str(ROOT)], checkpoints={"sd15": build}, builtins=True)

    yield _start
    tome_core.remove_patch(unet_of(build))
    forge.reset_forge()


def args_for(runner, title: str | None = None, values=(), **tome):
    """The UI defaults with ToMe's dict (enabled, seed 3, and ``tome``: ``enabled=False`` for the neighbour alone) and
    ``values`` in the slots of the script called ``title``."""
    args = generation.tome_args(runner, **{"seed": 3, **tome})
    if title is not None:
        script = next(s for s in runner.alwayson_scripts if s.title() == title)
        args[script.args_from : script.args_from + len(values)] = list(values)
    return args


def generate(runner, args, build, **kwargs):
    kwargs = {"width": 256, "height": 256, "steps": 3, **kwargs}
    res, (spy,) = generation.generate(forge.make_txt2img, runner, args, [unet_of(build)], **kwargs)
    assert not errors.reported, errors.reported
    assert R.ERROR_KEY not in res.js()
    return res, spy


def note_of(res) -> str:
    return infotext_utils.parse_generation_parameters(res.infotexts[0]).get(R.NOTE_KEY, "")


def clean(build) -> bool:
    unet = unet_of(build)
    return all(
        not (m._forward_pre_hooks or m._forward_hooks) and tome_core.get_patch(m) is None for m in unet.modules()
    )


def module_of(runner, title):
    script = next(s for s in runner.alwayson_scripts if s.title() == title)
    return next(d.module for d in scripts.scripts_data if d.script_class is type(script))


HINT = photo_latents(1, 256, 256)[0, :3].clamp(-1, 1) * 0.5 + 0.5  # a control image, 3 x 256 x 256 in 0..1
REPLACED = "self-attention not merged in {} of 16 blocks (attn1 replaced by another extension)"


# --- between blocks, or in passes of their own: merged as usual -------------------------------------------------------


def test_freeu_scales_the_features_between_blocks_and_tome_merges_as_usual(start, build):
    txt, _ = start()
    title = "FreeU Integrated (SD 1.x, SD 2.x, SDXL)"
    freeu = [True, 1.5, 1.6, 0.9, 0.2, 0.0, 1.0]  # FreeU's SD1.5 preset
    _tome, tome_spy = generate(txt, args_for(txt), build)
    res, spy = generate(txt, args_for(txt, title, freeu), build)
    _alone, alone_spy = generate(txt, args_for(txt, title, freeu, enabled=False), build)
    assert spy.calls and all(s is not None for s in spy.calls) and spy.plans[-1] > 0
    assert not identical(spy.outputs, tome_spy.outputs)  # FreeU acted beside ToMe
    assert not identical(spy.outputs, alone_spy.outputs)  # ToMe acted beside FreeU
    assert note_of(res) == "" and "freeu_enabled: True" in res.infotexts[0] and clean(build)


@pytest.mark.parametrize(
    "title,values",
    [
        ("SelfAttentionGuidance Integrated (SD 1.x, SD 2.x, SDXL)", [True, 0.5, 2.0, 1.0]),
        ("PerturbedAttentionGuidance Integrated", [True, 3.0, 0.0, 0.0, 1.0]),
    ],
    ids=["sag", "pag"],
)
def test_guidance_on_the_middle_block_runs_its_extra_pass_merged_and_is_reported_only_where_tome_acts(
    start, build, title, values
):
    """SAG and PAG replace the middle block's self-attention (SAG records it; PAG's extra pass makes it the identity)
    and run the UNet once more per step, after CFG. ToMe merges the top level in both passes; the middle block is
    reported only where ToMe would have merged it (max downsample 8)."""
    txt, _ = start()
    res, spy = generate(txt, args_for(txt, title, values), build)
    assert len(spy.calls) == 2 * 3 and all(s is not None for s in spy.calls)  # main + guidance pass per step
    assert note_of(res) == ""
    res, spy = generate(txt, args_for(txt, title, values, max_downsample="8"), build)
    assert note_of(res) == REPLACED.format(1)
    _alone, alone_spy = generate(txt, args_for(txt, title, values, enabled=False), build)
    assert len(alone_spy.calls) == len(spy.calls) and clean(build)


def test_multidiffusion_tiles_are_merged_as_images_of_their_own(start, build, partitions):
    """Forge's MultiDiffusion (128 px tiles, the UNet function wrapper) calls the UNet on batches of 16 x 16 latent
    tiles of a 256 px image: each is merged on the tile's grid."""
    txt, _ = start()
    md = module_of(txt, "MultiDiffusion Integrated")
    md.calls.clear()
    res, spy = generate(
        txt, args_for(txt, "MultiDiffusion Integrated", [True, "MultiDiffusion", 128, 128, 64, 4]), build
    )
    assert md.calls and {(h, w) for _, h, w in md.calls} == {(16, 16)}
    assert set(partitions) == {(16, 16)} and note_of(res) == "" and clean(build)
    assert spy.calls and all(s is not None for s in spy.calls)


# --- Kohya HRFix (Forge): features resized inside the UNet -----------------------------------------------------------


@pytest.mark.parametrize("block,factor,cache", [(3, 2.0, False), (1, 2.0, False), (1, 1.25, False), (1, 1.25, True)])
def test_kohya_hrfix_resized_blocks_are_merged_on_their_grid(start, build, partitions, block, factor, cache):
    """Kohya HRFix (Forge) shrinks the features after input block ``block`` while the sigma is in range (end 1: every
    step here): with its default (block 3) the top level is untouched; from block 1 the rest of the top level runs
    at 1/``factor``: halved it is the next level (not merged under max downsample 1), at 1/1.25 it is a 26 x 26 grid
    that is merged as such (it used to be left out: "token count does not fit"). With the step cache: no crash, no
    unfit block."""
    txt, _ = start()
    kohya = [True, block, factor, 0.0, 1.0, True, "bicubic", "bicubic"]
    res, spy = generate(txt, args_for(txt, "Kohya HRFix Integrated", kohya, cache=cache, cache_interval=2), build)
    assert spy.calls and all(s is not None for s in spy.calls)
    assert "does not fit" not in note_of(res) and clean(build)
    grids = set(partitions)
    if block == 3:
        assert grids == {(32, 32)}
    elif factor == 2.0:
        assert grids == {(32, 32)}  # input 1 and output 9-11 at full size; input 2 at 16 x 16 (level 2)
    else:
        assert (26, 26) in grids


# --- attn1 replaced or patched: stepped aside, with a note ------------------------------------------------------------


def test_stylealign_shares_attention_in_the_batch_and_tome_says_where_it_stepped_aside(start, build):
    txt, _ = start()
    res, spy = generate(txt, args_for(txt, "StyleAlign Integrated", [True, 1.0]), build, batch_size=2)
    _alone, alone_spy = generate(
        txt, args_for(txt, "StyleAlign Integrated", [True, 1.0], enabled=False), build, batch_size=2
    )
    assert note_of(res) == REPLACED.format(5)
    assert identical(spy.outputs, alone_spy.outputs)  # ToMe acts on the top level only: StyleAlign's own image
    assert clean(build)


def test_reference_only_records_and_reuses_attention_and_tome_steps_aside_there(start, build):
    txt, _ = start()
    title = "reference_only (ControlNet unit)"
    ref = [True, 1.0, 0.5, 0.0, 1.0, HINT]
    res, spy = generate(txt, args_for(txt, title, ref), build)
    _alone, alone_spy = generate(txt, args_for(txt, title, ref, enabled=False), build)
    assert len(spy.calls) == 2 * 3  # the reference pass and the main pass, per step
    assert note_of(res) == REPLACED.format(5) and identical(spy.outputs, alone_spy.outputs) and clean(build)


@pytest.mark.parametrize(
    "method,note",
    [
        ("merge", "only queries merged in 5 of 16 blocks (an attn1 patch set keys/values)"),
        ("downsample", "no token downsampling in 5 of 16 blocks (an attn1 patch set keys/values)"),
    ],
)
def test_controllllite_embeds_the_full_grid_and_tome_merges_only_the_queries(start, build, method, note):
    """Forge's ControlLLLite is an attn1 patch: it runs before attn1, on the block's full token grid (its embedding
    has as many tokens), and returns keys/values of its own; ToMe then merges the queries only (ToDo: nothing)."""
    txt, _ = start()
    lllite = module_of(txt, "ControlLLLite (ControlNet unit)")
    lllite.calls.clear()
    res, spy = generate(txt, args_for(txt, "ControlLLLite (ControlNet unit)", [True, 1.0, HINT], method=method), build)
    assert lllite.calls and all(n == m for n, m in lllite.calls)
    assert spy.calls and all(s is not None for s in spy.calls)
    assert note_of(res) == note and clean(build)


# --- Layer Diffuse (SD1.5 attention sharing) ---------------------------------------------------------------------------


def test_layer_diffuse_attention_sharing_is_left_alone_and_the_next_generation_merges_again(start, build):
    """Layer Diffuse's units take the place of attn1/attn2 when Forge loads the model for sampling (object patches),
    after ToMe placed its hooks, and stay until another patcher is loaded. ToMe's hooks follow the module in place:
    on the units it steps aside (they index their control signals by token count), and in the next generation
    without Layer Diffuse (the originals back at its sampling start) it merges again, with no note. The hooks used
    to stay on whatever was there at patch time: on a stale unit they never ran, so that generation went unmerged
    with a note blaming "another extension"."""
    txt, _ = start(NEIGHBOURS / "layer_diffuse")
    layer = [True, 2, True, HINT]
    res, spy = generate(txt, args_for(txt, "LayerDiffuse", layer), build, batch_size=2)
    _alone, alone_spy = generate(txt, args_for(txt, "LayerDiffuse", layer, enabled=False), build, batch_size=2)
    assert note_of(res) == REPLACED.format(5) and identical(spy.outputs, alone_spy.outputs)
    res, _spy = generate(txt, args_for(txt, "LayerDiffuse", layer), build, batch_size=2)
    assert note_of(res) == REPLACED.format(5)
    res, spy = generate(txt, args_for(txt), build, batch_size=2)
    assert note_of(res) == "" and spy.plans[-1] > 0
    assert clean(build)


def test_a_unit_already_in_place_when_tome_patches_is_not_merged_into():
    """Patched while the units are in place and called (a model left loaded with them), ToMe merges nothing into
    them: before, its merged tokens reached the unit, which looked up a control signal for that token count and
    raised KeyError."""
    from neighbours.layer_diffuse.lib_layerdiffusion.attention_sharing import AttentionSharingPatcher

    unet = unet_from_ldm(make_unet("sd15"))
    patcher = backend.UnetPatcher.from_model(unet)
    sharing = AttentionSharingPatcher(patcher, frames=2, use_control=True)
    sharing.set_control(HINT[None])
    patcher.forge_patch_model()
    x, t = photo_latents(2, 32, 32), torch.full((2,), 500.0)
    ctx = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(0))
    options = {"cond_or_uncond": [0], "sigmas": torch.ones(2)}
    alone = unet(x, t, context=ctx, transformer_options=dict(options))
    patch = tome_core.apply_patch(unet, ratio=0.5, max_downsample=8)
    out = unet(x, t, context=ctx, transformer_options=dict(options))
    assert torch.equal(out, alone) and all(u.calls for u in sharing.hookers)
    assert patch.report().notes == (REPLACED.format(16),)
    tome_core.remove_patch(unet)
    patcher.forge_unpatch_model()
    assert rel(unet(x, t, context=ctx, transformer_options=dict(options)), alone) > 1e-4


# --- ADetailer on Forge -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call_outer_scripts", [True, False], ids=["adetailer", "without-outer-postprocess"])
def test_adetailer_passes_on_forge_never_run_on_the_main_passes_patch(start, build, call_outer_scripts):
    """As on the WebUI: ADetailer's nested img2img (a 64 px crop) runs unmerged, the main job's batches merged with
    their own settings; Forge resets its patchers per pass, but ToMe's hooks sit on the UNet module itself."""
    txt, _ = start(NEIGHBOURS / "adetailer")
    module_of(txt, "ADetailer").CALL_OUTER_SCRIPTS = call_outer_scripts
    ad = [True, {"ad_use_inpaint_width_height": True, "ad_inpaint_width": 64, "ad_inpaint_height": 64}]
    hires = dict(enable_hr=True, hr_scale=2, hr_upscaler="Latent", denoising_strength=0.5, width=128, height=128)
    res, spy = generate(txt, args_for(txt, "ADetailer", ad, hires_ratio=0.3), build, steps=2, n_iter=2, **hires)
    nested = [s for s, out in zip(spy.calls, spy.outputs) if out.shape[-1] == 8]
    main = [s for s, out in zip(spy.calls, spy.outputs) if out.shape[-1] != 8]
    assert nested and all(s is None for s in nested)
    assert [s and s.ratio for s in main] == [0.5, 0.5, 0.3, 0.3] * 2 and clean(build)
    assert len(res.images) == 2 and R.ERROR_KEY not in res.js()  # both images, and no ToMe error in the infotext
