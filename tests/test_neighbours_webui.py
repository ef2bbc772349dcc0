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
from modules import errors, infotext_utils, shared

import tome_core
from tome_core import extension as ext
from tome_core.patch import transformer_blocks

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
    return infotext_utils.parse_generation_parameters(res.infotexts[0]).get(ext.NOTE_KEY, "")


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
