"""ToMe beside the extensions people run with it in the WebUI 1.10.1 double: the built-in Hypertile, Kohya's HRFix,
Tiled Diffusion, ADetailer. Each neighbour is a double written from its source (``tests/webui_double/README.md``,
``tests/neighbours/README.md``); each test says what the neighbour needs and shows that it gets it, or that ToMe
steps aside there and says so, with the neighbour's own result unchanged."""

from __future__ import annotations

import sys
from pathlib import Path

import generation
import harness
import pytest
import tiny_models
import torch
from generation import identical
from modules import errors, infotext_utils, scripts, shared

import tome_core
from tome_core import run as R
from tome_core.families import transformer_blocks

ROOT = Path(__file__).resolve().parents[1]
NEIGHBOURS = ROOT / "tests" / "neighbours"


@pytest.fixture(scope="module")
def sd_model():
    return tiny_models.make_tiny_sd_model("sd1", seed=0)


@pytest.fixture
def start(sd_model):
    """``start(*extension_dirs)`` with ours loaded last; everything undone afterwards (Hypertile never unwraps the
    layers it wrapped: the double's ``unhook`` stands for a restart)."""

    def _start(*dirs: str | Path):
        return harness.start_webui([*map(str, dirs), str(ROOT)], sd_model=sd_model)

    yield _start
    hypertile = sys.modules.get("hypertile")
    if hypertile is not None:
        hypertile.unhook(sd_model.model)
        hypertile.calls.clear()
    tome_core.remove_patch(sd_model)
    harness.reset_webui()


def unet(sd_model) -> torch.nn.Module:
    return sd_model.model.diffusion_model


def generate(runner, args, sd_model, **kwargs):
    res, (spy,) = generation.generate(harness.make_txt2img, runner, args, [unet(sd_model)], **kwargs)
    assert not errors.reported, errors.reported
    return res, spy


def clean(sd_model) -> bool:
    """No patch of ours and no hook anywhere in the UNet."""
    return all(
        not (m._forward_pre_hooks or m._forward_hooks) and tome_core.get_patch(m) is None
        for m in unet(sd_model).modules()
    )


def note_of(res) -> str:
    """The ``ToMe note`` of the first image's infotext, as PNG info reads it back ("" when there is none)."""
    return infotext_utils.parse_generation_parameters(res.infotexts[0]).get(R.NOTE_KEY, "")


# --- Hypertile (built-in) -------------------------------------------------------------------------------------------


def hypertile_on(**opts) -> None:
    """Settings → Optimizations → Hypertile, as ``/sdapi/v1/options`` sets them. Tile size 128 px and swap size 1
    make its choice of tiles deterministic: 2 x 2 tiles at the top level of a 256 px image."""
    values = dict(
        hypertile_enable_unet=True, hypertile_max_tile_unet=128, hypertile_swap_size_unet=1, hypertile_max_depth_unet=3
    )
    for key, value in {**values, **opts}.items():
        shared.opts.set(key, value)


SIZE = dict(width=256, height=256, steps=2)
TOP_LEVEL = 32 * 32  # tokens of a 256 px image's top level


@pytest.mark.parametrize("method", ["merge", "downsample"])
def test_hypertile_tiles_the_full_grid_and_tome_steps_aside_there_with_a_note(start, sd_model, method):
    """Hypertile infers the grid from the token count: ToMe hands it the unmerged tokens (before this fix it got
    512 merged ones and tiled them as a grid they are not; ToDo's keys stayed whole beside tiled queries). With
    ToMe acting on the top level only (max downsample auto), the image is Hypertile's own, bit for bit."""
    txt, _ = start(harness.HYPERTILE_DIR)
    hypertile = sys.modules["hypertile"]
    hypertile_on()
    _alone, alone_spy = generate(txt, None, sd_model, **SIZE)
    seen_alone = list(hypertile.calls)
    hypertile.calls.clear()
    res, spy = generate(txt, generation.tome_args(txt, method=method), sd_model, **SIZE)
    assert spy.calls and all(s is not None for s in spy.calls)
    assert hypertile.calls == seen_alone  # every layer it wraps sees the tokens it sees without ToMe
    assert (TOP_LEVEL, 4) in {(tokens, tiles) for _, tokens, tiles in hypertile.calls}  # it really tiled
    assert identical(spy.outputs, alone_spy.outputs)
    assert note_of(res) == "self-attention not merged in 5 of 16 blocks (Hypertile tiles it)"
    assert "Hypertile U-Net: True" in res.infotexts[0]
    assert clean(sd_model)


def test_hypertile_at_the_top_level_only_leaves_the_level_below_to_tome(start, sd_model):
    """Hypertile max depth 0 tiles the top level; with max downsample 2 ToMe merges the level below, which Hypertile
    wraps but does not tile: the image differs from Hypertile's alone, and only the top level is reported."""
    txt, _ = start(harness.HYPERTILE_DIR)
    hypertile = sys.modules["hypertile"]
    hypertile_on(hypertile_max_depth_unet=0)
    _alone, alone_spy = generate(txt, None, sd_model, **SIZE)
    hypertile.calls.clear()
    res, spy = generate(txt, generation.tome_args(txt, max_downsample="2"), sd_model, **SIZE)
    assert {tokens for _, tokens, _ in hypertile.calls} == {TOP_LEVEL}
    assert not identical(spy.outputs, alone_spy.outputs)
    assert note_of(res) == "self-attention not merged in 5 of 16 blocks (Hypertile tiles it)"


def test_hypertile_for_the_hires_pass_only_leaves_the_first_pass_merged(start, sd_model):
    """With "Hypertile U-Net for hires fix second pass" the first pass is ToMe's (Hypertile is configured off there), the
    hires pass is Hypertile's at the hires size, and the note says so."""
    txt, _ = start(harness.HYPERTILE_DIR)
    hypertile = sys.modules["hypertile"]
    hypertile_on(hypertile_enable_unet=False, hypertile_enable_unet_secondpass=True, hypertile_max_depth_unet=0)
    hires = dict(enable_hr=True, hr_scale=2, hr_upscaler="Latent", denoising_strength=0.5, width=128, height=128)
    res, spy = generate(txt, generation.tome_args(txt), sd_model, steps=2, **hires)
    assert {tokens for _, tokens, _ in hypertile.calls} == {TOP_LEVEL}  # hires pass only: 256 px
    first_pass_plans = [n for n in spy.plans[:2] if n is not None]
    assert first_pass_plans and first_pass_plans[-1] > 0  # merged in the first pass
    assert "Hypertile U-Net second pass: True" in res.infotexts[0]
    assert note_of(res) == "self-attention not merged in 5 of 16 blocks (Hypertile tiles it)"
    assert clean(sd_model)


def test_hypertile_off_again_gives_tome_back_every_block(start, sd_model):
    """Hypertile's wrappers stay on the model after it is turned off (it only disables them): ToMe merges there again
    and says nothing about Hypertile."""
    txt, _ = start(harness.HYPERTILE_DIR)
    hypertile_on()
    generate(txt, generation.tome_args(txt), sd_model, **SIZE)
    shared.opts.set("hypertile_enable_unet", False)
    res, spy = generate(txt, generation.tome_args(txt), sd_model, **SIZE)
    assert "Hypertile" not in note_of(res) and spy.plans[-1] > 0
    assert all("__webui_hypertile_params" in b.attn1.__dict__ for b in list(transformer_blocks(unet(sd_model)))[:2])


# --- Kohya HRFix / Deep Shrink (wcde/sd-webui-kohya-hiresfix) ----------------------------------------------------------


def script_of(runner, title):
    return next(s for s in runner.alwayson_scripts if s.title() == title)


def module_of(runner, title):
    """The module a script was loaded from (the WebUI loads script files under their basename, not importable)."""
    return next(d.module for d in scripts.scripts_data if d.script_class is type(script_of(runner, title)))


def script_args(runner, title, values, **tome):
    """ToMe enabled with ``tome`` (its API dict form) and ``values`` in the slots of the script called ``title``."""
    args = generation.tome_args(runner, **tome)
    script = script_of(runner, title)
    args[script.args_from : script.args_from + len(values)] = values
    return args


def test_kohya_deep_shrink_blocks_are_merged_on_their_resized_grid(start, sd_model, partitions):
    """Deep Shrink (defaults: block 3 at 0.5 until 15% of the steps, block 4 until 30%, smooth scaling) resizes the
    top-level features to 26 x 26 at the second step of a 256 px image: that block is merged on its 26 x 26 grid (it
    used to run unmerged: "token count does not fit the latent size"); Kohya's blocks are back in place after."""
    txt, _ = start(NEIGHBOURS / "kohya_hiresfix")
    values = module_of(txt, "Kohya Hires.fix").args(enable=True)
    blocks = list(unet(sd_model).input_blocks), list(unet(sd_model).output_blocks)
    res, spy = generate(txt, script_args(txt, "Kohya Hires.fix", values), sd_model, width=256, height=256, steps=10)
    assert spy.calls and all(s is not None for s in spy.calls)
    assert (26, 26) in partitions and "does not fit" not in note_of(res)
    assert "DSHF_s1: 0.15" in res.infotexts[0]
    assert (list(unet(sd_model).input_blocks), list(unet(sd_model).output_blocks)) == blocks
    assert clean(sd_model)


def test_kohya_deep_shrink_beside_the_step_cache_runs_in_full_with_a_note(start, sd_model):
    """Deep Shrink swaps blocks in the UNet's lists while it acts: the step cache steps aside on those calls and
    says so; no crash, Kohya's blocks back after, nothing of ours left."""
    txt, _ = start(NEIGHBOURS / "kohya_hiresfix")
    values = module_of(txt, "Kohya Hires.fix").args(enable=True)
    res, spy = generate(
        txt,
        script_args(txt, "Kohya Hires.fix", values, cache=True, cache_interval=2),
        sd_model,
        width=256,
        height=256,
        steps=10,
    )
    assert spy.calls and all(s is not None for s in spy.calls)
    assert "step cache off: another extension replaced the UNet's blocks" in note_of(res)
    assert clean(sd_model)


# --- Tiled Diffusion (pkuliyi2015/multidiffusion-upscaler-for-automatic1111) --------------------------------------


@pytest.mark.parametrize("method", ["MultiDiffusion", "Mixture of Diffusers"])
def test_tiled_diffusion_tiles_are_merged_as_images_of_their_own(start, sd_model, partitions, method):
    """The UNet gets batches of 16 x 16 latent tiles of a 256 px image: ToMe merges each on the tile's grid (not the
    image's 32 x 32), nothing unfit, the hires pass (not tiled) on its own size."""
    txt, _ = start(NEIGHBOURS / "tiled_diffusion")
    tiled = module_of(txt, "Tiled Diffusion")
    tiled.calls.clear()
    values = [True, method, 16, 16, 8, 2]
    hires = dict(enable_hr=True, hr_scale=1.5, hr_upscaler="Latent", denoising_strength=0.5)
    res, spy = generate(
        txt, script_args(txt, "Tiled Diffusion", values), sd_model, width=256, height=256, steps=2, **hires
    )
    assert tiled.calls and {(h, w) for _, h, w in tiled.calls} == {(16, 16)}
    assert {b for b, _, _ in tiled.calls} == {4, 2}  # 9 tiles, 2 at a time (the last alone), x (cond, uncond)
    assert set(partitions) == {(16, 16), (48, 48)}  # the tiles' top level, then the 384 px hires pass's
    assert "does not fit" not in note_of(res) and spy.calls and all(s is not None for s in spy.calls)
    assert clean(sd_model) and "apply_model" not in sd_model.__dict__


# --- ADetailer (Bing-su/adetailer) ------------------------------------------------------------------------------------


@pytest.fixture
def adetailer(start):
    """``adetailer(call_outer_scripts=True)``: a WebUI with ADetailer and ToMe; its module."""

    def _start(call_outer_scripts: bool = True):
        txt, _ = start(NEIGHBOURS / "adetailer")
        module = module_of(txt, "ADetailer")
        module.CALL_OUTER_SCRIPTS = call_outer_scripts
        return txt, module

    return _start


def split_by_size(spy, size: int):
    """The spied calls' settings (None: unpatched) whose latent is ``size`` wide, and the others."""
    mine = [s for s, out in zip(spy.calls, spy.outputs) if out.shape[-1] == size]
    rest = [s for s, out in zip(spy.calls, spy.outputs) if out.shape[-1] != size]
    return mine, rest


@pytest.mark.parametrize("call_outer_scripts", [True, False], ids=["adetailer", "without-outer-postprocess"])
def test_adetailer_passes_never_run_on_the_main_passes_patch(adetailer, sd_model, call_outer_scripts):
    """ToMe is not in ADetailer's script list (its default): its inpainting passes (64 px crops here) run unmerged.
    ADetailer itself calls the generation's postprocess before them; an extension with nested passes that does not
    (``without-outer-postprocess``) met ToMe's patch of the main pass, hires settings and all, before ToMe unpatched
    after sampling. Every batch of the main job is still merged with its own settings."""
    txt, _module = adetailer(call_outer_scripts)
    ad = [True, {"ad_use_inpaint_width_height": True, "ad_inpaint_width": 64, "ad_inpaint_height": 64}]
    hires = dict(enable_hr=True, hr_scale=2, hr_upscaler="Latent", denoising_strength=0.5, width=128, height=128)
    args = script_args(txt, "ADetailer", ad, hires_ratio=0.3)
    res, spy = generate(txt, args, sd_model, steps=2, n_iter=2, **hires)
    nested, main = split_by_size(spy, 8)
    assert nested and all(s is None for s in nested)
    assert main and all(s is not None for s in main)
    assert [s.ratio for s in main] == [0.5, 0.5, 0.3, 0.3] * 2  # first pass, hires pass, per batch
    assert len(res.images) == 2 and R.ERROR_KEY not in res.js() and clean(sd_model)


def test_adetailer_with_tome_in_its_script_list_gets_a_decision_of_its_own(adetailer, sd_model):
    """With "tome" in ADetailer's script names, ToMe runs its own lifecycle in each inpainting pass: the first-pass
    ratio (not the hires one in force at the end of the main job), its minimum size against the crop (a 64 px crop
    stays unmerged under min size 96, a 160 px one is merged), and the main job's next batch is merged again."""
    txt, _module = adetailer()
    shared.opts.set("ad_script_names", "tome")
    hires = dict(enable_hr=True, hr_scale=2, hr_upscaler="Latent", denoising_strength=0.5, width=128, height=128)
    for crop, merged in ((64, False), (160, True)):
        ad = [True, {"ad_use_inpaint_width_height": True, "ad_inpaint_width": crop, "ad_inpaint_height": crop}]
        args = script_args(txt, "ADetailer", ad, hires_ratio=0.3, min_size=96)
        res, spy = generate(txt, args, sd_model, steps=2, n_iter=2, **hires)
        nested, main = split_by_size(spy, crop // 8)
        assert nested and all((s is not None and s.ratio == 0.5) if merged else s is None for s in nested)
        assert [s and s.ratio for s in main] == [0.5, 0.5, 0.3, 0.3] * 2
        assert R.ERROR_KEY not in res.js() and clean(sd_model)
