"""ToMe beside Forge Neo's built-in step caches (upstream Neo's Spectrum Integrated and First Block Cache Integrated,
doubles written from their source: ``tests/neo_double/README.md``): the two step caches never both run; ours steps
aside with a note, token merging goes on where the model runs, and nothing of ours is left."""

from __future__ import annotations

import torch
from forge_double import sd_models as forge_models
from generation import identical, pixels
from neo_generation import generate, module_of, tome_args, unet_of, with_script
from test_cache_hosts import cached_schedule, untouched

from tome_core import run as R
from webui_tome import forge_caches


def spectrum_args(runner, **tome):
    """ToMe's dict and Spectrum on: warm-up 1 step, window 2 (every other step forecast), the last 10 % in full."""
    return with_script(runner, tome_args(runner, **tome), "Spectrum Integrated", True, 0.25, 6, 0.5, 2, 0.0, 1, 0.9)


def test_spectrum_forecasts_steps_and_our_step_cache_steps_aside_while_merging_goes_on(start_neo, neo_builders):
    unet = unet_of(neo_builders["sd15"])
    txt, _ = start_neo(builtins=True)
    spectrum = module_of(txt, "Spectrum Integrated")
    spectrum.runs.clear()
    alone, (alone_spy,) = generate(txt, spectrum_args(txt, enabled=False), [unet], steps=6)
    assert spectrum.runs == [True, False, True, False, True, True]  # the model runs on 4 of 6 steps
    assert len(alone_spy.outputs) == 4
    res, (spy,) = generate(txt, spectrum_args(txt, ratio=0.5, cache=True), [unet], steps=6)
    assert "step cache off: Spectrum Integrated caches the steps" in res.infotexts[0]
    assert len(spy.calls) == 4 and all(s is not None and s.ratio == 0.5 and not s.cache for s in spy.calls)
    assert not any(spy.cached) and R.ERROR_KEY not in res.js() and untouched(unet)
    cache_only, (cache_spy,) = generate(txt, spectrum_args(txt, ratio=0.0, cache=True), [unet], steps=6)
    assert identical(cache_spy.outputs, alone_spy.outputs) and identical(pixels(cache_only), pixels(alone))
    assert "step cache off: Spectrum Integrated caches the steps" in cache_only.infotexts[0]


def test_first_block_cache_on_anima_takes_the_steps_and_on_sd15_skips_so_ours_caches(start_neo, neo_builders):
    anima, sd15 = unet_of(neo_builders["Anima"]), unet_of(neo_builders["sd15"])
    txt, _ = start_neo(checkpoint="Anima", builtins=True)
    args = with_script(txt, tome_args(txt, cache=True), "First Block Cache Integrated", True, 0.1, 3, 20)
    res, (spy,) = generate(txt, args, [anima], steps=4)
    assert "fbcache: 0.1/3/20" in res.infotexts[0]
    assert (
        "nothing merged (Anima is a diffusion transformer: only the step cache acts on it, and it is off)"
        in res.infotexts[0]
    )
    assert "step cache off: First Block Cache Integrated caches the steps" in res.infotexts[0]
    assert R.ERROR_KEY not in res.js() and untouched(anima)
    forge_models.select_checkpoint("sd15")  # FBCache does not support SD1.5 and skips: our step cache runs
    res, (spy,) = generate(txt, args, [sd15], steps=4)
    assert "fbcache" not in res.infotexts[0] and "First Block Cache" not in res.js()
    assert spy.cached == cached_schedule(4, 3) and untouched(sd15)


def test_no_other_cache_is_seen_on_a_plain_patcher_or_a_webui_model(start_neo, neo_builders):
    start_neo()
    assert forge_caches.other_cache(forge_models.model_data.get_sd_model()) is None
    assert forge_caches.other_cache(torch.nn.Linear(1, 1)) is None and forge_caches.other_cache(None) is None
