"""ToMe on diffusers pipelines (``diffusers_tome``, reached through ``tome_core.apply_patch(pipe)``): the seed's
snippet equal to tomesd bit for bit, the pipeline's loop and scheduler driving the step cache, the patch living as long
as the loop. Tiny pipelines of diffusers' own classes (tests/diffusers_pipelines.py)."""

from __future__ import annotations

import copy
import functools

import pytest
import tomesd
import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    FluxImg2ImgPipeline,
    HeunDiscreteScheduler,
    StableDiffusionImg2ImgPipeline,
    StableDiffusionInpaintPipeline,
    UniPCMultistepScheduler,
)
from diffusers.pipelines.pipeline_utils import DiffusionPipeline
from diffusers_pipelines import (
    flux_call,
    flux_pipeline,
    qwen_call,
    qwen_pipeline,
    sd3_call,
    sd3_pipeline,
    sd_call,
    sd_pipeline,
    sdxl_call,
    sdxl_pipeline,
    wan_call,
    wan_pipeline,
)
from diffusers_pipelines import (
    flux_call as _flux_call,
)

import diffusers_tome
import tome_core
from diffusers_tome.schedule import LINEAR
from tome_core import SettingsError


@pytest.fixture(scope="module")
def sd():
    return sd_pipeline()


@pytest.fixture(scope="module")
def flux():
    return flux_pipeline()


def _clean(pipe, *models) -> None:
    """Nothing of ours on the pipeline or in any module of its models: no hooks, no instance forward, no record."""
    assert "progress_bar" not in pipe.__dict__ and diffusers_tome.pipeline.ATTR not in pipe.__dict__
    for model in models:
        for module in model.modules():
            assert not module._forward_pre_hooks and not module._forward_hooks, type(module).__name__
            assert "forward" not in module.__dict__ and tome_core.get_patch(module) is None


def test_the_seeds_snippet_on_a_pipeline_is_tomesd_bit_for_bit_and_removing_it_leaves_the_pipeline(sd):
    plain = sd_call(sd)
    before = dict(sd.__dict__)
    tomesd.apply_patch(sd, ratio=0.5, use_rand=False)
    reference = sd_call(sd)
    tomesd.remove_patch(sd)
    patch = tome_core.apply_patch(sd, ratio=0.5, use_rand=False)
    assert isinstance(patch, diffusers_tome.PipelinePatch) and tome_core.get_patch(sd) is patch
    ours = sd_call(sd)
    assert not torch.equal(reference, plain) and torch.equal(ours, reference)
    assert tome_core.get_patch(sd.unet) is None  # between loops nothing is on the UNet
    assert tome_core.remove_patch(sd) is sd
    assert sd.__dict__ == before and torch.equal(sd_call(sd), plain)
    _clean(sd, sd.unet)


def test_the_unet_given_directly_is_tomesd_too(sd):
    tomesd.apply_patch(sd.unet, ratio=0.5, use_rand=False)
    reference = sd_call(sd)
    tomesd.remove_patch(sd.unet)
    tome_core.apply_patch(sd.unet, ratio=0.5, use_rand=False)
    try:
        assert torch.equal(sd_call(sd), reference)
    finally:
        tome_core.remove_patch(sd.unet)


@pytest.mark.parametrize("guidance, images", [(1.0, 1), (7.0, 2)])
def test_without_guidance_and_with_several_images_per_prompt_it_is_tomesd(sd, guidance, images):
    tomesd.apply_patch(sd, ratio=0.5, use_rand=False)
    reference = sd_call(sd, guidance_scale=guidance, num_images_per_prompt=images)
    tomesd.remove_patch(sd)
    tome_core.apply_patch(sd, ratio=0.5, use_rand=False)
    try:
        assert torch.equal(sd_call(sd, guidance_scale=guidance, num_images_per_prompt=images), reference)
    finally:
        tome_core.remove_patch(sd)


def test_sdxl_and_inpainting_are_tomesd(sd):
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    mask = torch.zeros(1, 1, 32, 32)
    mask[..., 8:24, 8:24] = 1
    inpaint = StableDiffusionInpaintPipeline(**sd.components, requires_safety_checker=False)
    inpaint.set_progress_bar_config(disable=True)
    runs = [
        (sdxl_pipeline(), sdxl_call, {}),
        (inpaint, sd_call, dict(image=image, mask_image=mask, strength=0.9)),
    ]
    for pipe, call, kwargs in runs:
        plain = call(pipe, **kwargs)
        tomesd.apply_patch(pipe, ratio=0.5, use_rand=False)
        reference = call(pipe, **kwargs)
        tomesd.remove_patch(pipe)
        tome_core.apply_patch(pipe, ratio=0.5, use_rand=False)
        try:
            assert torch.equal(call(pipe, **kwargs), reference) and not torch.equal(reference, plain)
        finally:
            tome_core.remove_patch(pipe)
        assert torch.equal(call(pipe, **kwargs), plain)
        _clean(pipe, pipe.unet)


def test_img2img_built_from_the_same_parts_is_tomesd(sd):
    pipe = StableDiffusionImg2ImgPipeline(**sd.components, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    tomesd.apply_patch(pipe, ratio=0.5, use_rand=False)
    reference = sd_call(pipe, strength=0.6, image=image, height=None, width=None)
    tomesd.remove_patch(pipe)
    tome_core.apply_patch(pipe, ratio=0.5, use_rand=False)
    try:
        assert torch.equal(sd_call(pipe, strength=0.6, image=image, height=None, width=None), reference)
    finally:
        tome_core.remove_patch(pipe)
    _clean(pipe, pipe.unet)


@pytest.mark.parametrize("nets", [1, 2])
def test_controlnet_models_merge_as_in_the_webui_and_without_them_it_is_tomesd(nets):
    pipe = sd_pipeline(controlnets=nets)
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    kwargs = dict(image=[image] * nets if nets > 1 else image)
    tomesd.apply_patch(pipe, ratio=0.5, use_rand=False)  # tomesd merges in the UNet only
    reference = sd_call(pipe, steps=3, **kwargs)
    tomesd.remove_patch(pipe)
    tome_core.apply_patch(pipe, ratio=0.5, use_rand=False, merge_controlnet=False)
    assert torch.equal(sd_call(pipe, steps=3, **kwargs), reference)
    merged = []
    controls = list(pipe.controlnet.nets) if nets > 1 else [pipe.controlnet]
    hooks = [net.register_forward_pre_hook(lambda m, a: merged.append(tome_core.get_patch(m))) for net in controls]
    tome_core.apply_patch(pipe, ratio=0.5, use_rand=False)  # merge_controlnet: on by default
    try:
        inside = sd_call(pipe, steps=3, **kwargs)
    finally:
        for hook in hooks:
            hook.remove()
        tome_core.remove_patch(pipe)
    assert len(merged) == 3 * nets and all(p is not None and p.merger is not None and p.cache is None for p in merged)
    assert not torch.equal(inside, reference)
    _clean(pipe, pipe.unet, pipe.controlnet)


def test_a_second_apply_patch_reconfigures_and_never_stacks(sd):
    tome_core.apply_patch(sd, ratio=0.5, use_rand=False)
    once = sd_call(sd)
    tome_core.apply_patch(sd, ratio=0.3, use_rand=False)
    patch = tome_core.apply_patch(sd, ratio=0.5, use_rand=False)
    try:
        assert patch.settings.ratio == 0.5 and torch.equal(sd_call(sd), once)
    finally:
        tome_core.remove_patch(sd)
    _clean(sd, sd.unet)


def test_a_bad_setting_names_field_value_and_range_and_leaves_the_pipeline_untouched(sd, flux):
    for pipe, kwargs, field in (
        (sd, dict(ratio=0.9), "ratio"),
        (flux, dict(ratio=0, cache=True, cache_branch=9), "cache_branch"),
    ):
        before = dict(pipe.__dict__)
        with pytest.raises(SettingsError, match=field) as error:
            tome_core.apply_patch(pipe, **kwargs)
        assert str(kwargs[field]) in str(error.value) and "allowed" in str(error.value)
        assert pipe.__dict__ == before
        _clean(pipe, *(m for _, m in diffusers_tome.denoisers(pipe)))
    tome_core.apply_patch(sd, ratio=0.5, use_rand=False)
    try:  # a bad re-configuration keeps the patch it had
        with pytest.raises(SettingsError, match="ratio"):
            tome_core.apply_patch(sd, ratio=0.9)
        assert tome_core.get_patch(sd).settings.ratio == 0.5
    finally:
        tome_core.remove_patch(sd)


def test_a_pipeline_with_neither_a_unet_nor_a_transformer_names_what_was_looked_for():
    class Empty(DiffusionPipeline):
        def __init__(self, scheduler):
            super().__init__()
            self.register_modules(scheduler=scheduler)

    with pytest.raises(
        TypeError, match=r"no UNet or transformer in Empty \(looked for \.unet, \.transformer, \.transformer_2\)"
    ):
        tome_core.apply_patch(Empty(DDIMScheduler()))
    with pytest.raises(TypeError, match=r"no UNet module in object \(looked for \.forge_objects"):
        tome_core.apply_patch(object())


def test_an_exception_inside_the_loop_leaves_nothing_behind_and_the_next_loop_is_fresh(flux):
    tome_core.apply_patch(flux, ratio=0, cache=True, cache_interval=2)
    try:
        fresh = flux_call(flux)

        def fail(pipe, i, t, kwargs):
            if i == 4:
                raise RuntimeError("stop")
            return kwargs

        with pytest.raises(RuntimeError, match="stop"):
            flux_call(flux, callback_on_step_end=fail)
        for module in flux.transformer.modules():  # the patch is still on the pipeline, nothing on its model
            assert not module._forward_pre_hooks and "forward" not in module.__dict__
        assert tome_core.get_patch(flux.transformer) is None
        assert torch.equal(flux_call(flux), fresh)
    finally:
        tome_core.remove_patch(flux)
    _clean(flux, flux.transformer)


def _by_hand(pipe, steps: int, call=flux_call, denoiser: str = "transformer", **settings):
    """The same loop with the session on the denoiser driven by hand: progress from the step callback, and on a
    transformer the Euler sigmas the scheduler set (what the adapter reads for itself)."""
    if denoiser == "transformer":
        call(pipe, steps=steps)  # the plain loop, to read its schedule
    model = getattr(pipe, denoiser)
    session = tome_core.apply_patch(model, **{"ratio": 0, "cache": True, **settings})
    session.set_progress(0.0, steps)
    if denoiser == "transformer":
        session.set_euler([float(s) for s in pipe.scheduler.sigmas])

    def report(p, i, t, kwargs):
        session.set_progress((i + 1) / steps, steps)
        return kwargs

    try:
        return call(pipe, steps=steps, callback_on_step_end=report), tome_core.cache_stats(model)
    finally:
        tome_core.remove_patch(model)


def test_the_pipeline_drives_the_cache_and_its_correction_as_a_session_driven_by_hand(flux):
    reference, stats = _by_hand(flux, 8)
    tome_core.apply_patch(flux, ratio=0, cache=True)
    try:
        ours = flux_call(flux, steps=8)
        assert tome_core.cache_stats(flux) == stats and stats[0]["cached"] > 0
        assert torch.equal(ours, reference)
        tome_core.apply_patch(flux, ratio=0, cache=True, cache_correction=0)
        assert not torch.equal(flux_call(flux, steps=8), ours)  # the default correction acts under flow-matching Euler
    finally:
        tome_core.remove_patch(flux)


MULTISTEP = [
    lambda: UniPCMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0),
    lambda: DPMSolverMultistepScheduler(
        use_flow_sigmas=True,
        prediction_type="flow_prediction",
        use_dynamic_shifting=True,
        time_shift_type="exponential",
    ),
]


@pytest.mark.parametrize("scheduler", MULTISTEP)
def test_under_a_multistep_scheduler_the_correction_acts_through_the_schedulers_own_linear_map(scheduler, console):
    """UniPC and DPM-Solver++ (flow sigmas): the part's sampler is the scheduler's own loop, read as its linear map,
    which is exact (it predicts the scheduler's result for any outputs), and the default correction acts under it."""
    pipe = flux_pipeline(scheduler())
    name = type(pipe.scheduler).__name__
    tome_core.apply_patch(pipe, ratio=0, cache=True, cache_correction=0)
    try:
        uncorrected = flux_call(pipe)
        assert tome_core.cache_stats(pipe)[0]["cached"] > 0
        tome_core.apply_patch(pipe, ratio=0, cache=True)
        corrected = flux_call(pipe)
        assert not torch.equal(corrected, uncorrected)
        assert list(tome_core.get_patch(pipe).last.notes) == [f"cache correction under {name}"]
        assert f"ToMe note: cache correction under {name}" in console()
        assert torch.equal(flux_call(pipe), corrected)  # deterministic
    finally:
        tome_core.remove_patch(pipe)
    from diffusers_tome.schedule import parts
    from tome_core.caching.samplers import linearize

    pipe.scheduler.set_timesteps(6)
    (part,) = parts(pipe, ["transformer"], 6).values()
    linear = linearize(part.name, part.sample, part.sigmas)
    gen = torch.Generator().manual_seed(0)
    x0, outs = (
        torch.randn(1, 3, generator=gen, dtype=torch.float64),
        torch.randn(6, 1, 3, generator=gen, dtype=torch.float64),
    )

    def weighed(weights: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
        return torch.einsum("j,jbc->bc", weights, outputs)

    run = copy.deepcopy(pipe.scheduler)
    x, seen = x0.clone(), []
    for i, t in enumerate(pipe.scheduler.timesteps):
        seen.append(x)
        x = run.step(outs[i], t, x, return_dict=False)[0]
    base = [
        s - weighed(linear.seen[k], outs) for k, s in enumerate(seen)
    ]  # what x0 alone gives: the same for any outputs
    others = torch.randn(6, 1, 3, generator=gen, dtype=torch.float64)
    run, y = copy.deepcopy(pipe.scheduler), x0.clone()
    for i, t in enumerate(pipe.scheduler.timesteps):
        assert torch.allclose(y, base[i] + weighed(linear.seen[i], others), atol=1e-5)
        y = run.step(others[i], t, y, return_dict=False)[0]
    assert torch.allclose(y - weighed(linear.final, others), x - weighed(linear.final, outs), atol=1e-5)


def test_under_a_scheduler_it_does_not_know_the_correction_stands_aside_quietly_and_a_gain_set_by_hand_says_why(
    console,
):
    pipe = flux_pipeline(FlowMatchEulerDiscreteScheduler(stochastic_sampling=True))  # noise at every step

    def flux_call(pipe):  # its noise from the global generator: seeded alike for each call
        torch.manual_seed(0)
        return _flux_call(pipe)

    name = type(pipe.scheduler).__name__
    tome_core.apply_patch(pipe, ratio=0, cache=True, cache_correction=0)
    try:
        uncorrected = flux_call(pipe)
        tome_core.apply_patch(pipe, ratio=0, cache=True)
        assert torch.equal(flux_call(pipe), uncorrected) and not tome_core.get_patch(pipe).last.notes
        tome_core.apply_patch(pipe, ratio=0, cache=True, cache_correction=0.5)
        assert torch.equal(flux_call(pipe), uncorrected)
        (note,) = tome_core.get_patch(pipe).last.notes
        assert note == f"cache correction off: the scheduler is {name}; the correction acts under {', '.join(LINEAR)}"
        assert f"ToMe note: {note}" in console()
    finally:
        tome_core.remove_patch(pipe)


def test_a_second_order_scheduler_counts_its_two_calls_as_one_step():
    pipe = sd_pipeline(HeunDiscreteScheduler())
    calls = []
    tome_core.apply_patch(pipe, ratio=0.5, use_rand=False)
    hook = pipe.unet.register_forward_pre_hook(lambda m, a: calls.append(tome_core.get_patch(m).progress))
    try:
        sd_call(pipe, steps=4)
    finally:
        hook.remove()
        tome_core.remove_patch(pipe)
    assert calls == [0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.75]  # Heun: the last step is one Euler call


def test_flux_img2img_caches_the_tail_it_runs(flux):
    pipe = FluxImg2ImgPipeline(**flux.components)
    pipe.set_progress_bar_config(disable=True)
    image = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    tome_core.apply_patch(pipe, ratio=0, cache=True)
    try:
        flux_call(pipe, steps=10, image=image, strength=0.8, height=None, width=None)
        (count,) = tome_core.cache_stats(pipe)
        assert count["full"] + count["cached"] == 8 and count["cached"] > 0
        assert not tome_core.get_patch(pipe).last.notes
    finally:
        tome_core.remove_patch(pipe)


def test_wan_22s_two_experts_each_run_their_own_part_as_a_pass_of_their_own():
    pipe = wan_pipeline(experts=2, scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0))
    tome_core.apply_patch(pipe, ratio=0, cache=True, cache_interval=2)
    try:
        wan_call(pipe, steps=12)
        high = sum(1 for t in pipe.scheduler.timesteps if t >= 500)
        first, second = tome_core.cache_stats(pipe)
        assert first["full"] + first["cached"] == high and second["full"] + second["cached"] == 12 - high
        assert first["cached"] > 0 and second["cached"] > 0
    finally:
        tome_core.remove_patch(pipe)
    _clean(pipe, pipe.transformer, pipe.transformer_2)


@pytest.mark.parametrize("experts", [1, 2])
def test_on_wan_under_unipc_the_correction_acts_through_the_output_layers_modulation(experts, console):
    """diffusers' Wan example runs UniPC: the default correction acts on its transformer (each of Wan 2.2's experts),
    whose output layer's scale runs after ``norm_out``; deterministic, and nothing left after."""
    pipe = wan_pipeline(experts, UniPCMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction"))
    models = [pipe.transformer] if experts == 1 else [pipe.transformer, pipe.transformer_2]
    plain = wan_call(pipe, steps=16)
    tome_core.apply_patch(pipe, ratio=0, cache=True, cache_correction=0)
    try:
        uncorrected = wan_call(pipe, steps=16)
        assert all(stats["cached"] > 0 for stats in tome_core.cache_stats(pipe))
        tome_core.apply_patch(pipe, ratio=0, cache=True)
        corrected = wan_call(pipe, steps=16)
        assert not torch.equal(corrected, uncorrected) and torch.equal(wan_call(pipe, steps=16), corrected)
        assert "ToMe note: cache correction under UniPCMultistepScheduler" in console()
    finally:
        tome_core.remove_patch(pipe)
    _clean(pipe, *models)
    assert torch.equal(wan_call(pipe, steps=16), plain)


SCHEDULERS = {
    "euler": lambda: EulerDiscreteScheduler(steps_offset=1),
    "ddim": lambda: DDIMScheduler(steps_offset=1),
    "dpmpp_2m": lambda: DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2, steps_offset=1),
}


@pytest.mark.parametrize(
    "kind, scheduler", [("sd", name) for name in SCHEDULERS] + [("sdxl", "dpmpp_2m"), ("controlnet", "ddim")]
)
def test_the_unet_pipelines_drive_the_step_cache_as_a_session_driven_by_hand(kind, scheduler):
    pipe = sdxl_pipeline() if kind == "sdxl" else sd_pipeline(controlnets=int(kind == "controlnet"))
    pipe.scheduler = SCHEDULERS[scheduler]()
    call = sdxl_call if kind == "sdxl" else sd_call
    if kind == "controlnet":
        image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3))
        call = functools.partial(sd_call, image=image)
    settings = dict(ratio=0.5, use_rand=False, cache=True, merge_controlnet=False)
    plain = call(pipe, steps=8)
    reference, stats = _by_hand(pipe, 8, call, "unet", **settings)
    tome_core.apply_patch(pipe, **settings)
    try:
        ours = call(pipe, steps=8)
        assert tome_core.cache_stats(pipe) == stats and stats[0]["cached"] >= 4
        assert torch.equal(ours, reference) and not torch.equal(ours, plain)
        assert not tome_core.get_patch(pipe).last.notes
    finally:
        tome_core.remove_patch(pipe)
    _clean(pipe, *(m for m in (pipe.unet, getattr(pipe, "controlnet", None)) if m is not None))
    assert torch.equal(call(pipe, steps=8), plain)


def test_the_stochastic_flow_matching_euler_is_no_euler_for_the_correction():
    pipe = flux_pipeline(FlowMatchEulerDiscreteScheduler(stochastic_sampling=True))
    pipe.scheduler.set_timesteps(4)
    part = diffusers_tome.schedule.parts(pipe, ["transformer"], 4)["transformer"]
    assert part.sigmas is None and part.why_not.startswith("the scheduler is FlowMatchEulerDiscreteScheduler;")
    euler = flux_pipeline()
    euler.scheduler.set_timesteps(4)
    part = diffusers_tome.schedule.parts(euler, ["transformer"], 4)["transformer"]
    assert part.why_not is None and part.sigmas == [float(s) for s in euler.scheduler.sigmas]


@pytest.mark.parametrize("family", ["sd3", "qwen"])
def test_sd3_and_qwen_image_are_cached_by_their_pipelines_and_corrected_under_flow_matching_euler(family):
    pipe, call = (sd3_pipeline(), sd3_call) if family == "sd3" else (qwen_pipeline(), qwen_call)
    plain = call(pipe)
    tome_core.apply_patch(pipe, ratio=0, cache=True, cache_correction=0)
    try:
        uncorrected = call(pipe)
        (count,) = tome_core.cache_stats(pipe)
        assert count["cached"] > 0 and not tome_core.get_patch(pipe).last.notes
        tome_core.apply_patch(pipe, ratio=0, cache=True)
        corrected = call(pipe)
    finally:
        tome_core.remove_patch(pipe)
    assert not torch.equal(corrected, uncorrected) and not torch.equal(uncorrected, plain)
    assert torch.equal(call(pipe), plain)
    _clean(pipe, pipe.transformer)


@pytest.mark.parametrize("library", ["diffusers' FirstBlockCache", "cache-dit"])
def test_beside_another_cache_ours_steps_aside_and_says_so(library, console):
    pipe = flux_pipeline()
    if library == "cache-dit":
        import cache_dit
        from cache_dit import DBCacheConfig

        cache_dit.enable_cache(pipe, cache_config=DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0))
    else:
        from diffusers import FirstBlockCacheConfig

        pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.2))
    theirs = flux_call(pipe)
    tome_core.apply_patch(pipe, ratio=0, cache=True)
    try:
        assert torch.equal(flux_call(pipe), theirs) and tome_core.cache_stats(pipe) == []
        note = f"step cache off: {library} already caches transformer (two caches never both run)"
        assert tome_core.get_patch(pipe).last.notes == [note] and f"ToMe note: {note}" in console()
    finally:
        tome_core.remove_patch(pipe)


def _sd_schedulers() -> list:
    """Every scheduler diffusers lists as compatible with the SD pipeline (those whose package is absent: skipped)."""
    return sorted(sd_pipeline().scheduler.compatibles, key=lambda c: c.__name__)


@pytest.mark.parametrize("scheduler", _sd_schedulers(), ids=lambda c: c.__name__)
def test_under_every_scheduler_diffusers_ships_for_sd_the_loop_drives_the_cache_by_itself(sd, scheduler):
    original = sd.scheduler
    try:
        sd.scheduler = scheduler.from_config(original.config)
    except ImportError as missing:  # DPMSolverSDEScheduler without torchsde
        pytest.skip(str(missing).strip().splitlines()[0])
    tome_core.apply_patch(sd, ratio=0, cache=True)
    try:
        out = sd_call(sd, steps=8)
        ((stats),) = tome_core.cache_stats(sd)
        assert stats["full"] + stats["cached"] == 8 and stats["cached"] >= 3 and torch.isfinite(out).all()
        two_calls = "cache schedule uniform: the sampler calls the UNet at two times a step"
        assert set(tome_core.get_patch(sd).last.notes) <= {two_calls}
    finally:
        tome_core.remove_patch(sd)
        sd.scheduler = original
    _clean(sd, sd.unet)


def test_a_loop_of_ones_own_over_a_diffusers_scheduler_tells_the_transformer_by_one_call(console):
    """``diffusers_tome.set_scheduler(patch, scheduler)`` on a patched transformer sampled by hand under UniPC: the
    correction acts through the scheduler's own map (no ``set_progress``), the same as told the name and that map by
    hand with progress reported; a name whose map is not the loop's gives another image."""
    from diffusers_tome.schedule import part_of

    pipe = flux_pipeline(UniPCMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction"))
    transformer = pipe.transformer
    scheduler = copy.deepcopy(pipe.scheduler)
    scheduler.set_timesteps(8)
    hidden = torch.randn(1, 16, 16, generator=torch.Generator().manual_seed(3))
    text = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(4))
    pooled, ids = torch.randn(1, 32, generator=torch.Generator().manual_seed(5)), torch.zeros(5, 3)
    image_ids = torch.zeros(16, 3)

    def loop(tell) -> torch.Tensor:
        run, x = copy.deepcopy(scheduler), hidden.clone()
        patch = tome_core.apply_patch(transformer, ratio=0, cache=True)
        tell(patch)
        try:
            with torch.no_grad():
                for i, t in enumerate(run.timesteps):
                    if tell is by_hand:
                        patch.set_progress(i / 8, 8)
                    out = transformer(x, text, pooled, t.reshape(1) / 1000, image_ids, ids, return_dict=False)[0]
                    x = run.step(out, t, x, return_dict=False)[0]
            notes = patch.report().cache.notes
        finally:
            tome_core.remove_patch(transformer)
        assert any(note.startswith("cache correction under") for note in notes), notes
        return x

    def by_hand(patch):
        part = part_of(scheduler)
        patch.set_sampler(part.name, part.sigmas, part.sample)

    def named(patch):
        patch.set_sampler("uni_pc", [float(s) for s in scheduler.sigmas])

    ours = loop(lambda patch: diffusers_tome.set_scheduler(patch, scheduler))
    assert torch.equal(ours, loop(by_hand))
    assert not torch.equal(ours, loop(named))
