"""ToMe alongside ControlNet (the double of Mikubill's sd-webui-controlnet) in the WebUI double."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import controlnet_double as cnd
import generation
import harness
import pytest
import tiny_models
import torch
from generation import identical, tome_args
from modules import errors, infotext_utils, scripts
from neighbours import controlnet_lllite

import tome_core
from tome_core import run as R
from tome_core.families import transformer_blocks
from webui_tome import controlnet as tcn

ROOT = Path(__file__).resolve().parents[1]


class ControlNetScript(cnd.ControlNetScript, scripts.Script):
    """The ControlNet double as one of the WebUI double's AlwaysVisible scripts."""


@pytest.fixture(scope="module")
def sd_model():
    return tiny_models.make_tiny_sd_model("sd1", seed=0)


@pytest.fixture(scope="module")
def control():
    return cnd.make_control_net(context_dim=tiny_models.CONTEXT_DIM, model_channels=32, seed=7)


@pytest.fixture
def webui(sd_model):
    txt, _ = harness.start_webui([str(ROOT)], sd_model=sd_model)
    yield txt
    tome_core.remove_patch(sd_model)
    harness.reset_webui()


def add_controlnet(runner, units):
    script = ControlNetScript(units)  # args_from None: its units come from the constructor
    runner.alwayson_scripts.append(script)
    runner.scripts.append(script)
    return script


def hint(width, height, seed=0):
    return torch.rand(1, 3, height, width, generator=torch.Generator().manual_seed(seed))


def run(runner, script_args, sd_model, logged, **kwargs):
    """One txt2img generation; per module of ``logged``, the settings of our patch at each of its calls."""
    res, spies = generation.generate(harness.make_txt2img, runner, script_args, logged, **kwargs)
    return res, [spy.calls for spy in spies]


@pytest.mark.parametrize("width,height,batch", [(64, 64, 1), (72, 56, 2)])
def test_control_model_merges_with_the_unets_settings_and_is_clean_after(
    webui, sd_model, control, width, height, batch
):
    unet, net = sd_model.model.diffusion_model, control.control_model
    cn = add_controlnet(webui, [cnd.ControlNetUnit(model=control, image=hint(width, height), module="canny")])
    res, (unet_calls, net_calls) = run(
        webui, tome_args(webui, ratio=0.4), sd_model, [unet, net], width=width, height=height, batch_size=batch
    )
    assert net_calls and all(s is not None and s.ratio == 0.4 for s in net_calls)
    assert unet_calls and net_calls == unet_calls  # same settings, same seed, same steps
    assert tome_core.get_patch(unet) is None and tome_core.get_patch(net) is None
    assert (cn.latest_network is None and "forward" not in vars(unet)) or vars(unet)["forward"].__func__ is type(
        unet
    ).forward
    assert R.ERROR_KEY not in res.js()


def test_merging_in_control_model_changes_its_output_and_can_be_turned_off(webui, sd_model, control):
    net = control.control_model
    add_controlnet(webui, [cnd.ControlNetUnit(model=control, image=hint(64, 64), module="canny")])
    outputs = {}
    for merge_cn in (True, False):
        got = []
        handle = net.register_forward_hook(lambda m, a, out, got=got: got.append(torch.cat([o.flatten() for o in out])))
        try:
            _, (calls,) = run(webui, tome_args(webui, merge_controlnet=merge_cn), sd_model, [net])
        finally:
            handle.remove()
        outputs[merge_cn] = got
        assert calls and all((s is not None) == merge_cn for s in calls)
    assert not torch.equal(outputs[True][0], outputs[False][0])


def test_adapters_have_nothing_to_merge_and_still_work(webui, sd_model):
    adapter = cnd.make_adapter(model_channels=32)
    add_controlnet(webui, [cnd.ControlNetUnit(model=adapter, image=hint(64, 64), module="t2ia")])
    res, (unet_calls,) = run(webui, tome_args(webui), sd_model, [sd_model.model.diffusion_model])
    assert unet_calls and all(s is not None for s in unet_calls) and R.NOTE_KEY not in res.js()
    assert not any(tome_core.get_patch(m) for m in adapter.modules())


def test_unexpected_controlnet_internals_degrade_to_unet_only_with_a_note(webui, sd_model, control):
    cn = add_controlnet(webui, [cnd.ControlNetUnit(model=control, image=hint(64, 64), module="canny")])
    # a future release renames its state: the hook still works, but latest_network has no control_params
    cn.on_hooked = lambda network: setattr(cn, "latest_network", SimpleNamespace(restore=network.restore))
    res, (unet_calls,) = run(webui, tome_args(webui), sd_model, [sd_model.model.diffusion_model])
    assert unet_calls and all(s is not None for s in unet_calls)
    assert tcn.NOTE_UNEXPECTED in res.infotexts[0]


@pytest.mark.parametrize("mode", ["reference_only", "reference_adain", "reference_adain+attn"])
def test_reference_modes_work_with_tome_and_after_it(webui, sd_model, mode):
    unet = sd_model.model.diffusion_model
    reference = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    unit = cnd.ControlNetUnit(model=None, module=mode, image=hint(64, 64), reference_latent=reference)
    add_controlnet(webui, [unit])
    outputs = []
    handle = unet.register_forward_hook(lambda m, a, out: outputs.append(out.clone()))
    # reference-only noises its latent with the global RNG (hook.py): seed it the same way for every run
    handle_seed = unet.register_forward_pre_hook(lambda m, a: torch.manual_seed(len(outputs)) and None)
    try:
        run(webui, None, sd_model, [])  # ToMe off: the reference
        off_before = outputs[:]
        outputs.clear()
        _, (calls,) = run(webui, tome_args(webui), sd_model, [unet])
        on = outputs[:]
        outputs.clear()
        run(webui, None, sd_model, [])
        off_after = outputs[:]
    finally:
        handle.remove()
        handle_seed.remove()
    assert calls and all(s is not None for s in calls)
    assert any(not torch.equal(a, b) for a, b in zip(on, off_before))  # merged while reference-only is active
    assert identical(off_after, off_before)  # nothing stale pinned afterwards
    assert all(tome_core.get_patch(m) is None for m in [unet, *transformer_blocks(unet)])


def test_controlnet_lllite_unit_has_nothing_to_merge_and_its_layers_are_left_alone_with_a_note(webui, sd_model):
    """An LLLite model is a unit's ``control_model`` but no ControlNet, and (as Mikubill's ``PlugableControlLLLite``)
    keeps its modules in a dict named ``modules``, over ``nn.Module.modules()``: looking for blocks in it raised
    ``TypeError: 'dict' object is not callable`` in the real A1111, so ToMe's script failed and the image came out
    unmerged, with a traceback in the log and no note. It has no blocks: the UNet is merged, except where LLLite
    patches the layers, and the note says so."""
    unet = sd_model.model.diffusion_model
    model = controlnet_lllite.make(unet, seed=11)
    unit = cnd.ControlNetUnit(model=model, image=hint(64, 64), control_model_type=cnd.ControlModelType.Controlllite)
    cn = add_controlnet(webui, [])
    reported, outputs = len(errors.reported), {}
    handle = unet.register_forward_hook(lambda m, a, out: outputs.setdefault(key, []).append(out.clone()))
    runs = (("plain", None), ("alone", None), ("top", tome_args(webui)), ("md2", tome_args(webui, max_downsample="2")))
    try:
        for key, args in runs:
            cn.units = [unit] if key != "plain" else []
            res, (calls,) = run(webui, args, sd_model, [unet])
            assert len(errors.reported) == reported and R.ERROR_KEY not in res.js()
            assert not controlnet_lllite.all_hack  # ControlNet cleared LLLite after the generation
            if args is not None:
                assert calls and all(s is not None for s in calls)
                assert infotext_utils.parse_generation_parameters(res.infotexts[0]).get(R.NOTE_KEY) == (
                    "self-attention not merged in 5 of 16 blocks (ControlNet-LLLite patches it)"
                )
    finally:
        handle.remove()
    assert not identical(outputs["alone"], outputs["plain"])  # LLLite acts
    assert identical(outputs["top"], outputs["alone"])  # ToMe's only level is LLLite's here: nothing else to merge
    assert not identical(outputs["md2"], outputs["alone"])  # the level below is merged
    assert model.calls and all(n == h * w for n, h, w in model.calls)  # LLLite always got its full grid


def test_control_models_lookup_ignores_other_scripts_and_missing_network(webui, control):
    notes = []

    class P:
        scripts = webui

    assert list(tcn.control_models(P, notes)) == [] and notes == []
    cn = add_controlnet(webui, [])
    assert list(tcn.control_models(P, notes)) == []
    cn.latest_network = type("Hook", (), {"control_params": [cnd.ControlParams(control_model=control)]})()
    assert list(tcn.control_models(P, notes)) == [control.control_model] and notes == []


def test_sdxl_layout_control_model_merges_at_its_first_attention_level_and_removes_cleanly():
    """cldm.ControlNet for SDXL: transformer blocks at downsample 2 and 4 only, depth 2."""
    from models import install_sdp_attention, one_context_per_block, photo_latents

    install_sdp_attention()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = cnd.ControlNet(
            context_dim=[64, 64],
            model_channels=32,
            channel_mult=(1, 2, 4),
            attention_resolutions=(2, 4),
            transformer_depth=(0, 2, 2),
            num_heads=2,
        )
    one_context_per_block(net)
    cnd.reinit_zero_layers(net, seed=1, scale=0.5)
    net.eval()
    call = dict(
        x=photo_latents(2, 24, 32),
        hint=torch.rand(2, 3, 192, 256),
        timesteps=torch.tensor([500.0, 500.0]),
        context=torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(0)),
    )
    base = net(**call)
    patch = tome_core.apply_patch(net, ratio=0.5, max_downsample="auto", use_rand=True, seed=3)
    assert patch.merger.planner.auto_downsample == 2 and len(patch.merger.blocks) == 9
    merged = net(**call)
    tome_core.remove_patch(net)
    assert all(((a - b).norm() / b.norm()).item() > 1e-3 for a, b in zip(merged[-3:], base[-3:]))
    assert identical(net(**call), base)
