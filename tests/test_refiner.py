"""The refiner switches models mid-sampling (in the CFG denoiser, before ``on_cfg_denoiser``): the model switched in
is merged with the pass's settings and the one switched out is left clean, on the WebUI 1.10.1 double (Forge's
case is in test_forge_host.py)."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import harness
import tiny_models
from generation import tome_args
from modules import processing, sd_models, shared

import tome_core
from tome_core import run as R

ROOT = Path(__file__).resolve().parents[1]


def test_webui_refiner_model_is_merged_from_the_switch_on_and_both_left_clean():
    main = tiny_models.make_tiny_sd_model("sd1", seed=0)
    refiner = tiny_models.TinySdModel(tiny_models.make_tiny_sd15_unet(1), name="tiny-refiner")
    txt, _ = harness.start_webui([str(ROOT)], sd_model=refiner)
    seen = []  # (model, settings of our patch on it) per UNet call
    handles = [
        m.model.diffusion_model.register_forward_pre_hook(
            lambda mod, a, m=m: seen.append((m, tome_core.get_patch(mod) and tome_core.get_patch(mod).settings))
        )
        for m in (main, refiner)
    ]
    try:
        sd_models.load_model(main)  # the selected checkpoint; the refiner stays loaded (checkpoint cache)
        args = tome_args(txt, ratio=0.4, seed=3)
        p = harness.make_txt2img(
            txt, script_args=args, steps=4, refiner_checkpoint="tiny-refiner", refiner_switch_at=0.5
        )
        with closing(p):
            res = processing.process_images(p)
        assert [m for m, _ in seen] == [main, main, refiner, refiner]
        assert all(s is not None and s.ratio == 0.4 and s.seed == 3 for _, s in seen)
        assert "Refiner: tiny-refiner" in res.infotexts[0] and R.ERROR_KEY not in res.js()
        assert tome_core.get_patch(main) is None and tome_core.get_patch(refiner) is None
        assert shared.sd_model is refiner  # the WebUI swaps back at the next generation's reload
    finally:
        for h in handles:
            h.remove()
        tome_core.remove_patch(main)
        tome_core.remove_patch(refiner)
        harness.reset_webui()
