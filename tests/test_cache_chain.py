"""The step cache on the one-chain diffusion transformers as ComfyUI runs them (issue 26): ``tome_core.families.chain``
on the doubles of Wan (``tests/wan_double.py``: cross-attention, CFG as cond/uncond streams, video latents), Lumina 2 /
Z-Image, Qwen-Image, SD3 / SD3.5 and Cosmos Predict2 (``tests/chain_doubles.py``); and on diffusers' own Wan
transformer (the lab's Wan-layout model), random and small."""

from __future__ import annotations

import pytest
import torch
from chain_doubles import MiniTrainDIT, NextDiT, OpenAISignatureMMDITWrapper, QwenImageTransformer2DModel
from wan_double import WanModel

import tome_core
from tome_core.families import (
    ComfyCosmos,
    ComfyLumina,
    ComfyMMDiT,
    ComfyQwenImage,
    ComfyWan,
    DiffusersWan,
    layout_for,
)
from tome_core.settings import SettingsError, ToMeSettings

OFF = ToMeSettings(ratio=0.0, cache=True, cache_interval=2, cache_forecast="off", cache_schedule="uniform")


@pytest.fixture(scope="module")
def model():
    return WanModel(seed=3).eval().requires_grad_(False)


def _calls(sigmas=(0.9, 0.8, 0.7, 0.6), frames=3, batch=2):
    gen = torch.Generator().manual_seed(1)
    x, context = torch.randn(batch, 4, frames, 8, 8, generator=gen), torch.randn(batch, 5, 32, generator=gen)
    return [
        {"x": x + 0.1 * i, "timestep": torch.full((batch,), 1000 * s), "context": context} for i, s in enumerate(sigmas)
    ]


def _run(model, calls, patch=None, options=None, chunks=None):
    outs = []
    with torch.no_grad():
        for i, kwargs in enumerate(calls):
            if patch is not None:
                patch.set_progress(i / len(calls), len(calls))
            for chunk in chunks or [None]:
                opts = dict(options or {}, **({"cond_or_uncond": chunk} if chunk is not None else {}))
                context = kwargs["context"] * (0.0 if chunk == [1] else 1.0)  # the uncond: another text
                outs.append(model(kwargs["x"], kwargs["timestep"], context, transformer_options=opts))
    return outs


def _cached(model, calls, settings=OFF, **kw):
    patch = tome_core.apply_settings(model, settings)
    try:
        outs = _run(model, calls, patch, **kw)
        report = patch.report()
    finally:
        tome_core.remove_patch(model)
    return outs, report


def test_cond_and_uncond_called_apart_are_streams_of_their_own(model):
    """ComfyUI batches cond and uncond where memory allows, else calls them apart (``cond_or_uncond`` [0] then [1]):
    each keeps its own cache, so the cached image is the batched one's."""
    calls = _calls(batch=1)
    apart, report = _cached(model, calls, chunks=[[0], [1]])
    assert [p.to_dict() for p in report.cache.passes] == [{"full": 3, "cached": 1, "skipped": 0}]
    alone, _ = _cached(model, calls, chunks=[[0]])
    assert torch.equal(apart[2], alone[1])  # step 1's cond call: its stream's forecast, not the uncond's
    assert not torch.equal(apart[2], apart[3])


def test_another_video_length_gets_a_fresh_cache(model):
    calls = _calls()
    longer = _calls(frames=5)
    mixed = [calls[0], longer[1], calls[2], calls[3]]  # step 1 is another length: no cache fits it
    outs, report = _cached(model, mixed)
    assert report.cache.cached == 0
    assert torch.equal(outs[1], _run(model, [longer[1]])[0])


# --- every chain family ------------------------------------------------------------------------------------------


COMFY = {"transformer_options": {}}


def diffusers_wan(seed: int) -> torch.nn.Module:
    """diffusers' ``WanTransformer3DModel`` at a toy width, random from ``seed``."""
    from diffusers import WanTransformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=32,
            freq_dim=32,
            ffn_dim=48,
            num_layers=4,
        )


def _diffusers_wan(model, i, s):
    x = torch.randn(2, 4, 3, 8, 8, generator=torch.Generator().manual_seed(1)) + 0.1 * i
    context = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))
    return (x, torch.full((2,), 1000 * s), context), {"return_dict": False}


def _wan(model, i, s):
    x = torch.randn(2, 4, 3, 8, 8, generator=torch.Generator().manual_seed(1)) + 0.1 * i
    return (x, torch.full((2,), 1000 * s), torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))), COMFY


def _lumina(model, i, s):
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1)) + 0.1 * i
    return (x, torch.full((2,), 1 - s), torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2)), 5), COMFY


def _qwen(model, i, s):
    x = torch.randn(2, 4, 1, 8, 8, generator=torch.Generator().manual_seed(1)) + 0.1 * i
    return (x, torch.full((2,), s), torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))), COMFY


def _mmdit(model, i, s):
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1)) + 0.1 * i
    return (x, torch.full((2,), 1000 * s), torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))), COMFY


def _cosmos(model, i, s):
    x = torch.randn(2, 4, 2, 8, 8, generator=torch.Generator().manual_seed(1)) + 0.1 * i
    return (x, torch.full((2,), s), torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(2))), COMFY


CHAINS = {
    "wan": (WanModel, ComfyWan, "blocks", "head", _wan),
    "diffusers-wan": (diffusers_wan, DiffusersWan, "blocks", "norm_out", _diffusers_wan),
    "lumina": (NextDiT, ComfyLumina, "layers", "final_layer", _lumina),
    "qwen": (QwenImageTransformer2DModel, ComfyQwenImage, "transformer_blocks", "norm_out", _qwen),
    "mmdit": (OpenAISignatureMMDITWrapper, ComfyMMDiT, "joint_blocks", "final_layer", _mmdit),
    "cosmos": (MiniTrainDIT, ComfyCosmos, "blocks", "final_layer", _cosmos),
}


@pytest.fixture(params=list(CHAINS), scope="module")
def chain(request):
    build, family, blocks, entry, call = CHAINS[request.param]
    return build(seed=5).eval().requires_grad_(False), family, blocks, entry, call


def _steps(chain, patch=None, sigmas=(0.9, 0.8, 0.7, 0.6, 0.5)):
    model, *_, call = chain
    outs = []
    with torch.no_grad():
        for i, s in enumerate(sigmas):
            if patch is not None:
                patch.set_progress(i / len(sigmas), len(sigmas))
            args, kwargs = call(model, i, s)
            out = model(*args, **kwargs)
            outs.append(out[0] if isinstance(out, tuple) else out)  # diffusers' (sample,)
    return outs


def test_each_chain_family_is_found_caches_and_leaves_the_model_bit_identical(chain):
    model, family, blocks, entry, _ = chain
    layout = layout_for(model, 1)
    assert type(layout) is family and layout.entry is getattr(model, entry)
    assert layout.start is getattr(model, blocks)[0] and layout.skipped == list(getattr(model, blocks)[2:])
    with pytest.raises(SettingsError, match="cache_branch"):
        layout_for(model, len(getattr(model, blocks)) - 1)
    plain = _steps(chain)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    patch = tome_core.apply_settings(model, OFF.replace(cache_interval=3, cache_branch=1))
    entered = []
    handle = getattr(model, entry).register_forward_pre_hook(
        lambda m, a, k: entered.append(a[0].clone()), with_kwargs=True
    )
    left = []
    first = getattr(model, blocks)[1]
    hook = first.register_forward_hook(lambda m, a, k, out: left.append(out), with_kwargs=True)
    try:
        cached = _steps(chain, patch)
        report = patch.report()
    finally:
        handle.remove()
        hook.remove()
        tome_core.remove_patch(model)
    assert [p.to_dict() for p in report.cache.passes] == [{"full": 3, "cached": 2, "skipped": 0}]  # 0, 3, 4
    assert torch.equal(cached[0], plain[0]) and not torch.equal(cached[1], plain[1])
    # a cached step's output layer gets what left its probe plus step 0's residual (DeepCache's reuse: forecast off)

    def stream(out):  # Qwen-Image's blocks return (text, image)
        return out[1] if isinstance(out, tuple) else out

    residual = entered[0] - stream(left[0])
    torch.testing.assert_close(entered[1], stream(left[1]) + residual, rtol=1e-5, atol=1e-5)
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(a, b) for a, b in zip(_steps(chain), plain))


def test_sd3s_controlnet_residuals_of_skipped_blocks_come_from_the_forecast_and_the_probes_stay_live():
    """ComfyUI's MMDiT adds a ControlNet's ``control["output"][i]`` in place after joint block ``i``: at a cached step
    the skipped blocks' residuals are replaced with the forecast, the probe's is added live (as on FLUX)."""
    model = OpenAISignatureMMDITWrapper(seed=5).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(7)
    control = {"output": [0.5 * torch.randn(2, 16, 32, generator=gen) for _ in range(4)]}
    sigmas = (0.9, 0.8, 0.7, 0.6)

    def run(at_step_1=None):
        patch = tome_core.apply_settings(model, OFF)  # N=2 of 4: step 1 cached
        try:
            outs = []
            with torch.no_grad():
                for i, s in enumerate(sigmas):
                    patch.set_progress(i / len(sigmas), len(sigmas))
                    (x, t, ctx), _ = _mmdit(model, i, s)
                    c = at_step_1 if i == 1 and at_step_1 is not None else control
                    outs.append(model(x, t, ctx, control=c, **COMFY))
            assert patch.report().cache.cached == 1
        finally:
            tome_core.remove_patch(model)
        return outs

    base = run()
    later = {"output": [control["output"][0], *(9 * a for a in control["output"][1:])]}
    assert torch.equal(run(later)[1], base[1])  # the skipped blocks' residuals do not reach a cached step
    probe = {"output": [9 * control["output"][0], *control["output"][1:]]}
    assert not torch.equal(run(probe)[1], base[1])  # the probe's does
    assert all("forward" not in m.__dict__ for m in model.modules())
