"""The extension (scripts/tome.py) in the Forge Neo double, where Neo differs from Forge (``tests/neo_double/README.md``):
its hires pass, its built-in token merging and options, its model families without the ldm/sgm UNet and its refiner
(by sigma, or the refiner's weights loaded in place). Its built-in step caches: ``test_neighbours_neo.py``."""

from __future__ import annotations

import pytest
import torch
from forge_double import sd_models as forge_models
from forge_double.backend import EpsPredictor
from forge_double.sd_samplers import ForgeScheduleLinker
from generation import identical, pixels, tome_script
from modules import errors, shared
from neo_double import backend, sd_models
from neo_generation import C, F, generate, tome_args, unet_of
from test_cache_hosts import cached_schedule, untouched

from tome_core import run as R
from tome_core import settings as S
from tome_core.caching.samplers import ACTS_UNDER


def test_sd15_merges_and_the_next_generation_without_tome_is_the_plain_one(start_neo, neo_builders):
    unet = unet_of(neo_builders["sd15"])
    txt, _ = start_neo()
    plain, (plain_spy,) = generate(txt, None, [unet], width=64, height=64)
    res, (spy,) = generate(txt, tome_args(txt, ratio=0.5), [unet], width=64, height=64)
    assert spy.calls and all(s is not None and s.ratio == 0.5 for s in spy.calls)
    assert not any(torch.equal(a, b) for a, b in zip(spy.outputs, plain_spy.outputs))
    assert "ToMe: True" in res.infotexts[0] and R.ERROR_KEY not in res.js() and R.NOTE_KEY not in res.js()
    assert untouched(unet)
    off, (off_spy,) = generate(txt, None, [unet], width=64, height=64)
    assert identical(off_spy.outputs, plain_spy.outputs) and identical(pixels(off), pixels(plain))


def test_the_hires_pass_neo_prepares_once_gets_the_hires_ratio_and_cache_interval(start_neo, neo_builders):
    unet = unet_of(neo_builders["sd15"])
    txt, _ = start_neo()
    tome = tome_script(txt)
    hook_calls = []
    original = tome.process_before_every_sampling

    def counting(p, *args, **kwargs):
        hook_calls.append(p.is_hr_pass)
        return original(p, *args, **kwargs)

    tome.process_before_every_sampling = counting
    args = tome_args(txt, ratio=0.3, hires_ratio=0.6, cache=True, cache_interval=2, hires_cache_interval=3)
    res, (spy,) = generate(txt, args, [unet], enable_hr=True, hr_scale=2.0, hr_upscaler="Latent", steps=4)
    assert hook_calls == [False, True]  # Neo prepares the hires pass once (Forge: twice)
    sizes = [int(o.shape[-1]) for o in spy.outputs]
    assert [s.ratio for s in spy.calls] == [0.3] * 4 + [0.6] * 4 and sizes == [8] * 4 + [16] * 4
    assert spy.cached == cached_schedule(4, 2) + cached_schedule(4, 3)
    assert "ToMe hires ratio: 0.6" in res.infotexts[0] and R.ERROR_KEY not in res.js()
    assert untouched(unet)


@pytest.mark.parametrize("img2img", [False, True], ids=["txt2img", "img2img"])
def test_neos_builtin_token_merging_and_its_options_are_taken_over_and_left_as_they_are(
    start_neo, neo_builders, img2img
):
    from PIL import Image

    unet = unet_of(neo_builders["sd15"])
    txt, img = start_neo()
    runner = img if img2img else txt
    kind = {"img2img": True, "init_images": [Image.new("RGB", (64, 64), (120, 80, 40))]} if img2img else {}
    settings = {"token_merging_stride": 1, "token_merging_downsample": 2, "token_merging_no_rand": True}
    settings.update({"token_merging_ratio_img2img": 0.4} if img2img else {"token_merging_ratio": 0.4})
    for key, value in settings.items():
        setattr(shared.opts, key, value)
    _, (builtin_spy,) = generate(runner, None, [unet], **kind)  # ToMe off: Neo's built-in with its options
    assert backend.TomePatcher.calls and set(backend.TomePatcher.calls) == {(0.4, 1, 2, True)}
    assert all("attn1_patch" in patches for patches in builtin_spy.patches)
    backend.TomePatcher.calls.clear()
    sd_models.apply_token_merging_calls.clear()
    res, (spy,) = generate(runner, tome_args(runner), [unet], **kind)
    assert spy.calls and all(s is not None for s in spy.calls) and not backend.TomePatcher.calls
    assert all("attn1_patch" not in patches for patches in spy.patches)
    assert set(sd_models.apply_token_merging_calls) == {0.0}
    assert f"{R.BUILTIN_KEY}: 0.4" in res.infotexts[0] and "Token merging ratio" not in res.infotexts[0]
    assert all(getattr(shared.opts, key) == value for key, value in settings.items())
    _, (again_spy,) = generate(runner, None, [unet], **kind)  # ToMe off again: the built-in as before
    assert backend.TomePatcher.calls and identical(again_spy.outputs, builtin_spy.outputs)


CACHED = ("Flux", "Flux2", "Chroma", "Wan", "QwenImage", "ZImage", "Lumina2", "Anima")
"""Neo's families whose blocks the step cache knows (``tome_core.families.bfl``, ``tome_core.families.chain``)."""


@pytest.mark.parametrize("family", [f for f in backend.FAMILIES if f not in CACHED])
def test_a_model_family_without_the_unet_runs_unmerged_with_notes_and_sd15_merges_after(
    start_neo, neo_builders, family
):
    model, sd15 = unet_of(neo_builders[family]), unet_of(neo_builders["sd15"])
    txt, _ = start_neo(checkpoint=family)
    plain, (plain_spy,) = generate(txt, None, [model], steps=2)
    res, (spy,) = generate(txt, tome_args(txt, ratio=0.5, cache=True), [model], steps=2)
    notes = res.js()
    assert f"nothing merged ({family} has no UNet transformer blocks)" in res.infotexts[0]
    assert "step cache off: the cache does not know this model's blocks" in notes
    assert R.ERROR_KEY not in notes and not errors.reported  # no error, no traceback
    assert identical(spy.outputs, plain_spy.outputs) and identical(pixels(res), pixels(plain))
    assert untouched(model)
    forge_models.select_checkpoint("sd15")  # the next generation on SD1.5 is merged again
    merged, (sd_spy,) = generate(txt, tome_args(txt, ratio=0.5), [sd15], steps=2)
    assert sd_spy.calls and all(s is not None and s.ratio == 0.5 for s in sd_spy.calls)
    assert R.NOTE_KEY not in merged.js() and untouched(sd15)


@pytest.mark.parametrize("family", CACHED)
def test_the_accordions_cache_acts_on_neos_transformers_and_the_plain_image_follows(start_neo, neo_builders, family):
    model = unet_of(neo_builders[family])
    txt, _ = start_neo(checkpoint=family)
    cache = {"ratio": 0.0, "cache": True, "cache_forecast": "linear", "cache_schedule": "uniform"}
    plain, (plain_spy,) = generate(txt, None, [model], steps=6)
    res, (spy,) = generate(txt, tome_args(txt, **cache), [model], steps=6)
    again, _ = generate(txt, tome_args(txt, **cache), [model], steps=6)
    after, (after_spy,) = generate(txt, None, [model], steps=6)
    assert 'ToMe cache steps: "3 full, 3 cached"' in res.infotexts[0] and R.NOTE_KEY not in res.js()
    assert [c for c in spy.cached] == cached_schedule(6, 3) and not errors.reported
    assert not identical(spy.outputs, plain_spy.outputs) and identical(pixels(again), pixels(res))
    assert identical(after_spy.outputs, plain_spy.outputs) and identical(pixels(after), pixels(plain))
    assert untouched(model)


@pytest.mark.parametrize("family", ["Flux", "Wan"])
def test_the_cache_correction_acts_under_euler_on_neos_sigmas_and_stands_aside_under_heun(
    start_neo, neo_builders, family
):
    """``cache_correction`` (issue 36): Neo hands the model its sampler's sigmas, so under Euler the cached steps are
    corrected (txt2img, and img2img, which runs their tail), at the default (0.75) and at a gain set by hand; under
    Heun it stays off and the image is the uncorrected one: quietly at the default, with a note at 1."""
    model = unet_of(neo_builders[family])
    txt, img = start_neo(checkpoint=family)
    cache = {"ratio": 0.0, "cache": True, "cache_interval": 2, "cache_forecast": "linear", "cache_schedule": "uniform"}
    from PIL import Image

    image = Image.new("RGB", (64, 64), (120, 80, 40))
    for runner, kind in ((txt, {}), (img, {"img2img": True, "init_images": [image], "denoising_strength": 0.75})):
        steps = {"steps": 12} if kind else {"steps": 8}
        ours, _ = generate(runner, tome_args(runner, **cache, cache_correction=0.0), [model], **kind, **steps)
        default, _ = generate(runner, tome_args(runner, **cache), [model], **kind, **steps)
        fixed, _ = generate(runner, tome_args(runner, **cache, cache_correction=1.0), [model], **kind, **steps)
        assert (
            "ToMe cache correction: 0.75" in default.infotexts[0] and "ToMe cache correction: 1" in fixed.infotexts[0]
        )
        for corrected in (default, fixed):
            assert R.NOTE_KEY not in corrected.js() and "cached" in corrected.infotexts[0]
            assert not identical(pixels(corrected), pixels(ours))
    heun = {"sampler_name": "Heun", "steps": 8}
    ours, _ = generate(txt, tome_args(txt, **cache, cache_correction=0.0), [model], **heun)
    default, _ = generate(txt, tome_args(txt, **cache), [model], **heun)
    res, _ = generate(txt, tome_args(txt, **cache, cache_correction=1.0), [model], **heun)
    assert f"cache correction off: the sampler is Heun; {ACTS_UNDER}" in res.js()
    assert R.NOTE_KEY not in default.js() and identical(pixels(default), pixels(ours))
    assert identical(pixels(res), pixels(ours)) and untouched(model) and not errors.reported


def test_neos_accordion_shows_the_cache_correction(start_neo):
    """Neo runs transformers under Euler with the sampler's sigmas handed to the model, where *Cache correction*
    acts: its control is shown there, and hidden in A1111, Forge and Forge Classic (issue 54)."""
    txt, img = start_neo()
    for runner in (txt, img):
        script = tome_script(runner)
        got = dict(zip(S.NAMES, runner.inputs[script.args_from : script.args_to]))
        assert got["cache_correction"].visible is not False
        assert [n for n, c in got.items() if c.visible is False] == ["enabled"]  # the accordion's checkbox


def test_a_cache_branch_too_deep_for_the_model_is_named_and_tome_is_off_for_the_generation(start_neo, neo_builders):
    """The bound that only the model knows (found when patching, not when parsing) ends like any invalid value: the
    error alone in the infotext, the model's own image (seen in the real Neo with Wan, where it was not so)."""
    model = unet_of(neo_builders["Wan"])
    txt, _ = start_neo(checkpoint="Wan")
    plain, (plain_spy,) = generate(txt, None, [model], steps=4)
    res, (spy,) = generate(txt, tome_args(txt, ratio=0.0, cache=True, cache_branch=11), [model], steps=4)
    info = res.infotexts[0]
    assert "'cache_branch' = 11 is invalid" in info and "for this model; ToMe is off for this generation" in info
    assert "ToMe: True" not in info and "ToMe cache branch" not in info and "ToMe seed" not in info
    assert identical(spy.outputs, plain_spy.outputs) and identical(pixels(res), pixels(plain)) and untouched(model)
    after, _ = generate(txt, tome_args(txt, ratio=0.0, cache=True), [model], steps=4)
    assert "ToMe cache steps" in after.infotexts[0] and R.ERROR_KEY not in after.js()  # the next one runs


def _switch_sigma(steps: int, at_step: int) -> float:
    """A "Switch at (in sigmas)" value that Neo's refiner meets first at step ``at_step`` of an Euler run."""
    return float(ForgeScheduleLinker(EpsPredictor()).get_sigmas(steps)[at_step])


@pytest.mark.parametrize("fast_sd", [False, True], ids=["new-engine", "state-dict-in-place"])
@pytest.mark.parametrize(
    "at,cached",
    [(2, [F, C, F, C, C, F]), (3, [F, C, C, F, C, F])],  # a fresh cache from the switch; the pass's last step full
    ids=["switch-at-step-2", "switch-at-step-3"],
)
def test_the_refiner_by_sigma_starts_a_fresh_cache_also_when_its_weights_load_into_the_same_unet(
    start_neo, neo_builders, fast_sd, at, cached
):
    first, refiner = unet_of(neo_builders["sd15"]), unet_of(neo_builders["refiner"])
    weights = {k: v.clone() for k, v in first.state_dict().items()}
    txt, _ = start_neo()
    shared.opts.refiner_fast_sd = fast_sd
    args = tome_args(txt, ratio=0.4, cache=True, cache_interval=3)
    switch = {"refiner_checkpoint": "refiner", "refiner_switch_at": _switch_sigma(6, at)}
    res, (first_spy, refiner_spy) = generate(txt, args, [first, refiner], steps=6, **switch)
    assert (first_spy.cached if fast_sd else first_spy.cached + refiner_spy.cached) == cached
    assert len(first_spy.calls) == (6 if fast_sd else at) and len(refiner_spy.calls) == (0 if fast_sd else 6 - at)
    assert all(s is not None and s.ratio == 0.4 for s in first_spy.calls + refiner_spy.calls)
    assert "Refiner: refiner" in res.infotexts[0] and R.ERROR_KEY not in res.js()
    assert untouched(first) and untouched(refiner)
    assert all(torch.equal(v, first.state_dict()[k]) for k, v in weights.items())  # Neo put the weights back
