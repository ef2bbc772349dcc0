"""``cache_correction`` (issue 36): the step cache's deferred correction under the Euler sampler
(``tome_core.caching.correction``). On every family it acts on (diffusers' SD3 and Qwen-Image too), the corrected pass moves ``x`` exactly as running
the cached step again with the interpolated residual would have; without gain, or where it cannot act, the pass is
the cache's bit for bit, and a note says why (quietly at the default, 0.75); the model is left bit-identical."""

from __future__ import annotations

import copy

import pytest
import torch
from bfl_flux_double import Flux
from chain_doubles import MiniTrainDIT, NextDiT, OpenAISignatureMMDITWrapper, QwenImageTransformer2DModel
from models import make_unet
from test_cache_chain import diffusers_wan
from wan_double import WanModel

import tome_core
from tome_core.caching import correction as C
from tome_core.caching.cache import CORRECTION_FAMILY_NOTE
from tome_core.caching.forecast import Forecast
from tome_core.families import layout_for
from tome_core.settings import SettingsError, ToMeSettings

SIGMAS = [1.0, 0.85, 0.7, 0.55, 0.4, 0.25, 0.0]  # 6 Euler steps: N=2 runs 0, 2, 4, 5 in full, caches 1 and 3
B = 2


def _noise(*shape: int) -> torch.Tensor:
    return torch.randn(B, *shape, generator=torch.Generator().manual_seed(1))


def _context() -> torch.Tensor:
    return torch.randn(B, 5, 32, generator=torch.Generator().manual_seed(2))


def _comfy(scale: float, *, name: str = "timestep"):
    """A call of a ComfyUI-layout chain: ``model(x, t, context, transformer_options=)`` with ``t`` = ``scale(σ)``."""
    return lambda m, x, s: m(x, torch.full((B,), scale(s)), _context(), transformer_options={})


def _flux(m, x, s):
    y = torch.randn(B, 8, generator=torch.Generator().manual_seed(3))
    return m(x, torch.full((B,), s), context=_context(), y=y, control=None, transformer_options={})


def _lumina(m, x, s):
    return m(x, torch.full((B,), 1 - s), _context(), 5, transformer_options={})


def _sd3():
    from diffusers import SD3Transformer2DModel

    torch.manual_seed(5)
    return SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=4,
        num_layers=3,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        caption_projection_dim=16,
        pooled_projection_dim=8,
        out_channels=4,
        pos_embed_max_size=16,
    )


def _diffusers_sd3(m, x, s):
    pooled = torch.randn(B, 8, generator=torch.Generator().manual_seed(3))
    return m(
        hidden_states=x,
        encoder_hidden_states=_context(),
        pooled_projections=pooled,
        timestep=torch.full((B,), 1000 * s),
        return_dict=False,
    )[0]


def _diffusers_wan(m, x, s):  # its output layer's modulation runs after the entry: the correction scales by it
    return m(x, torch.full((B,), 1000 * s), _context(), return_dict=False)[0]


def _qwen():
    from diffusers import QwenImageTransformer2DModel as DiffusersQwenImage

    torch.manual_seed(5)
    return DiffusersQwenImage(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=3,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(2, 2, 4),
    )


def _diffusers_qwen(m, x, s):
    mask = torch.ones(B, 5, dtype=torch.long)
    return m(
        hidden_states=x,
        encoder_hidden_states=_context(),
        encoder_hidden_states_mask=mask,
        timestep=torch.full((B,), s),
        img_shapes=[(1, 4, 4)] * B,
        return_dict=False,
    )[0]


FAMILIES = {  # model, its latent, a call at sigma s
    "bfl-flux": (lambda: Flux(seed=3), (4, 8, 8), _flux),
    "wan": (lambda: WanModel(seed=5), (4, 3, 8, 8), _comfy(lambda s: 1000 * s)),
    "lumina": (lambda: NextDiT(seed=5), (4, 8, 8), _lumina),
    "qwen": (lambda: QwenImageTransformer2DModel(seed=5), (4, 1, 8, 8), _comfy(lambda s: s)),
    "mmdit": (lambda: OpenAISignatureMMDITWrapper(seed=5), (4, 8, 8), _comfy(lambda s: 1000 * s)),
    "cosmos": (lambda: MiniTrainDIT(seed=5), (4, 2, 8, 8), _comfy(lambda s: s)),
    "diffusers-sd3": (_sd3, (4, 8, 8), _diffusers_sd3),
    "diffusers-qwen": (_qwen, (16, 16), _diffusers_qwen),
    "diffusers-wan": (lambda: diffusers_wan(5), (4, 3, 8, 8), _diffusers_wan),
}


def settings(gain: float) -> ToMeSettings:
    return ToMeSettings(ratio=0.0, cache=True, cache_interval=2, cache_correction=gain)


def euler(model, latent, call, patch=None, last: int | None = None, sigmas=SIGMAS) -> tuple[list, list]:
    """The Euler sampler over ``sigmas`` (up to step ``last``): every step's input and the model's output."""
    x, xs, outs = _noise(*latent), [], []
    steps = len(sigmas) - 1
    with torch.no_grad():
        for i in range(steps if last is None else last + 1):
            if patch is not None:
                patch.set_progress(i / steps, steps)
            out = call(model, x, sigmas[i])
            xs.append(x)
            outs.append(out)
            x = x + (sigmas[i + 1] - sigmas[i]) * out
    xs.append(x)
    return xs, outs


def sampled(model, latent, call, gain: float, euler_given: bool = True, **kw):
    patch = tome_core.apply_settings(model, settings(gain))
    if euler_given:
        patch.set_euler(SIGMAS)
    try:
        xs, outs = euler(model, latent, call, patch, **kw)
        report = patch.report()
    finally:
        tome_core.remove_patch(model)
    return xs, outs, report


@pytest.fixture(params=list(FAMILIES), scope="module")
def family(request):
    build, latent, call = FAMILIES[request.param]
    return build().eval().requires_grad_(False), latent, call


def test_interpolation_is_exact_on_a_parabola_and_on_the_line_while_two_are_known():
    r = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))

    def at(s: float) -> torch.Tensor:
        return r[0] + s * r[1] + s * s * r[2]

    fulls = [(s, at(s)) for s in (1.0, 0.8, 0.5)]
    torch.testing.assert_close(C.interpolate(fulls, 0.6), at(0.6))
    line = [(0.8, r[0] + 0.8 * r[1]), (0.5, r[0] + 0.5 * r[1])]
    torch.testing.assert_close(C.interpolate(line, 0.7), r[0] + 0.7 * r[1])


def test_the_correction_moves_x_as_the_cached_step_rerun_with_the_interpolated_residual_would(family, monkeypatch):
    """At step 2 the correction re-estimates step 1's residual on the line through steps 0 and 2, so ``x`` entering
    step 3 differs from the uncorrected pass's by exactly ``(σ2 − σ1)`` times the change in step 1's output when it
    runs again with that residual in place of its forecast."""
    model, latent, call = family
    before = call(model, _noise(*latent), 0.5)
    plain_xs, plain_outs, report = sampled(model, latent, call, 0.0)
    assert (report.cache.full, report.cache.cached) == (4, 2) and not report.cache.notes

    fulls, forecasts = [], []
    monkeypatch.setattr(C.Correction, "full", lambda self, s, r, f=C.Correction.full: (fulls.append(r), f(self, s, r)))
    predict = Forecast.predict
    monkeypatch.setattr(Forecast, "predict", lambda self, *a: forecasts.append(predict(self, *a)) or forecasts[-1])
    xs, _, report = sampled(model, latent, call, 1.0)
    assert not report.cache.notes
    assert torch.equal(xs[2], plain_xs[2])  # the same pass up to the first correction
    r0, r2 = fulls[0], fulls[1]
    moved = r0 + (SIGMAS[1] - SIGMAS[0]) / (SIGMAS[2] - SIGMAS[0]) * (r2 - r0) - forecasts[0]

    # the reference: the uncorrected pass's step 1 again, the output layer's image stream moved by ``moved``
    layout = layout_for(model, 0)
    patch = tome_core.apply_settings(model, settings(0.0))
    steps = {"n": 0}

    def shift(module, args, kwargs):
        steps["n"] += 1
        if steps["n"] == 2:  # the entry's call at step 1
            return layout.with_entry_image(args, kwargs, layout.entry_image(args, kwargs) + moved)
        return None

    hook = layout.entry.register_forward_pre_hook(shift, with_kwargs=True)  # after the cache's own
    try:
        _, rerun = euler(model, latent, call, patch, last=1)
    finally:
        hook.remove()
        tome_core.remove_patch(model)
    expected = plain_xs[3] + (SIGMAS[2] - SIGMAS[1]) * (rerun[1] - plain_outs[1])
    moved_x, off = (xs[3] - plain_xs[3]).abs().max(), (xs[3] - expected).abs().max()
    assert moved_x > 1e-5 and off < 5e-3 * moved_x, (moved_x, off)  # it moved x, and exactly so
    assert not torch.equal(xs[-1], plain_xs[-1])
    assert not layout.entry._forward_hooks and not layout.entry._forward_pre_hooks  # every hook removed
    assert torch.equal(call(model, _noise(*latent), 0.5), before)  # the model left bit-identical


def test_without_gain_or_without_the_euler_schedule_the_pass_is_the_caches_bit_for_bit(family):
    model, latent, call = family
    plain, _, _ = sampled(model, latent, call, 0.0, euler_given=False)
    for gain, given in ((0.0, True), (0.5, False)):
        xs, _, report = sampled(model, latent, call, gain, euler_given=given)
        assert torch.equal(xs[-1], plain[-1])
        says = [n for n in report.cache.notes if n.startswith("cache correction off")]
        assert says == (
            [] if given else ["cache correction off: the host gives no sampler's schedule (Session.set_sampler)"]
        )


def test_a_schedule_of_another_length_or_the_hosts_reason_is_said_and_nothing_is_corrected():
    model, latent, call = FAMILIES["bfl-flux"][0]().eval(), *FAMILIES["bfl-flux"][1:]
    plain, _, _ = sampled(model, latent, call, 0.0)
    patch = tome_core.apply_settings(model, settings(0.5))
    patch.set_euler(SIGMAS[:-1])
    try:
        xs, _ = euler(model, latent, call, patch)
        notes = patch.report().cache.notes
    finally:
        tome_core.remove_patch(model)
    assert torch.equal(xs[-1], plain[-1]) and any("no sampler's schedule" in n for n in notes)
    patch = tome_core.apply_settings(model, settings(0.5))
    patch.set_euler(None, "the sampler is heun; the correction is exact under euler only")
    try:
        xs, _ = euler(model, latent, call, patch)
        notes = patch.report().cache.notes
    finally:
        tome_core.remove_patch(model)
    assert torch.equal(xs[-1], plain[-1])
    assert "cache correction off: the sampler is heun; the correction is exact under euler only" in notes


def test_on_a_unet_it_stands_aside_and_says_so():
    model = make_unet("sd15")
    x, context = torch.randn(B, 4, 16, 16, generator=torch.Generator().manual_seed(1)), torch.randn(B, 77, 64)

    def call(m, s):
        return m(x, torch.full((B,), 999.0 * s), context=context)

    outs = {}
    for gain in (0.0, 0.5):
        patch = tome_core.apply_settings(model, settings(gain))
        patch.set_euler(SIGMAS)
        try:
            with torch.no_grad():
                outs[gain] = []
                for i, s in enumerate(SIGMAS[:-1]):
                    patch.set_progress(i / 6, 6)
                    outs[gain].append(call(model, s))
            notes = patch.report().cache.notes
        finally:
            tome_core.remove_patch(model)
        assert (CORRECTION_FAMILY_NOTE in notes) == (gain > 0)
    assert all(torch.equal(a, b) for a, b in zip(outs[0.0], outs[0.5]))


def test_a_gain_out_of_range_is_named():
    with pytest.raises(SettingsError, match=r"cache_correction.*from 0 to 1"):
        tome_core.from_dict({"cache_correction": 1.5})
    assert ToMeSettings().cache_correction == 0.75


def _default_pass(model, latent, call, sigmas, why_not=None, **changes):
    """A pass with the cache at its defaults (``cache_correction`` not given) and ``changes``: its last ``x`` and
    what the cache said of the correction."""
    patch = tome_core.apply_settings(model, ToMeSettings(ratio=0.0, cache=True, cache_interval=2, **changes))
    patch.set_euler(sigmas, why_not)
    try:
        xs, _ = euler(model, latent, call, patch)
        notes = [n for n in patch.report().cache.notes if "correction" in n]
    finally:
        tome_core.remove_patch(model)
    return xs[-1], notes


def test_at_its_default_it_corrects_under_euler_and_stands_aside_quietly_elsewhere():
    """The default (0.75) is the setting's 0.75 under Euler; where it cannot act (no schedule, another sampler, a
    UNet) the pass is the uncorrected cache's bit for bit and nothing is said, while a gain set by hand says why."""
    model, latent, call = FAMILIES["bfl-flux"][0]().eval(), *FAMILIES["bfl-flux"][1:]
    off, _ = _default_pass(model, latent, call, SIGMAS, cache_correction=0.0)
    corrected, notes = _default_pass(model, latent, call, SIGMAS)
    assert notes == [] and not torch.equal(corrected, off)
    assert torch.equal(corrected, _default_pass(model, latent, call, SIGMAS, cache_correction=0.75)[0])
    heun = "the sampler is heun; the correction acts under linear samplers"
    for sigmas, why_not in ((None, None), (None, heun), (SIGMAS[:-1], None)):
        quiet, notes = _default_pass(model, latent, call, sigmas, why_not)
        said = _default_pass(model, latent, call, sigmas, why_not, cache_correction=0.5)[1]
        assert torch.equal(quiet, off) and notes == [] and len(said) == 1 and said[0].startswith("cache correction off")
    unet = make_unet("sd15")
    x, context = torch.randn(B, 4, 16, 16, generator=torch.Generator().manual_seed(1)), torch.randn(B, 77, 64)
    for changes, says in (({}, []), ({"cache_correction": 0.5}, [CORRECTION_FAMILY_NOTE])):
        patch = tome_core.apply_settings(unet, ToMeSettings(ratio=0.0, cache=True, **changes))
        try:
            with torch.no_grad():
                unet(x, torch.full((B,), 999.0), context=context)
            assert [n for n in patch.report().cache.notes if "correction" in n] == says
        finally:
            tome_core.remove_patch(unet)


def _denoiser_call(sigma: float, step: int, steps: int, sampler: str = "sample_euler", sigmas=None, churn=0.0):
    """A WebUI denoiser call (``CFGDenoiserParams``) as Forge Neo makes it: the sampler's ``func``, the predictor,
    and (Neo) all of the sampler's sigmas in the model's ``transformer_options``."""
    from types import SimpleNamespace as NS

    def func():
        pass

    func.__name__ = sampler

    class Eps:
        def calculate_denoised(self, sigma, model_output, model_input):
            return model_input - model_output * sigma.view(sigma.shape[:1] + (1,) * (model_output.ndim - 1))

    options = {} if sigmas is None else {"sampling_sigmas": torch.tensor(sigmas, dtype=torch.float64)}
    unet = NS(model_options={"transformer_options": options})
    p = NS(
        sampler_name=sampler.removeprefix("sample_").title(), s_churn=churn, sd_model=NS(forge_objects=NS(unet=unet))
    )
    sampler_ = NS(func=func, model_wrap=NS(predictor=Eps()))
    return NS(
        sigma=torch.tensor([sigma]), denoiser=NS(step=step, steps=steps, total_steps=steps, sampler=sampler_, p=p)
    )


def test_the_webui_reads_the_passs_sampler_and_schedule_from_neos_sigmas():
    from tome_core.caching.samplers import ACTS_UNDER
    from webui_tome.extension import sampler_schedule

    def read(*args):
        name, sigmas, _, why = sampler_schedule(_denoiser_call(*args))
        return name, sigmas, why

    txt = [1.0, 0.8, 0.6, 0.3, 0.0]
    assert read(0.6, 2, 4, "sample_euler", txt) == ("euler", txt, None)
    for function, name in (
        ("sample_dpmpp_2m", "dpmpp_2m"),
        ("sample_unipc", "uni_pc"),
        ("sample_res_multistep", "res_multistep"),
    ):
        assert read(0.6, 2, 4, function, txt) == (name, txt, None)
    full = [1.0, 0.9, 0.8, 0.6, 0.4, 0.2, 0.0]  # img2img runs the tail from 0.6: 3 steps
    assert read(0.4, 1, 3, "sample_euler", full) == ("euler", [0.6, 0.4, 0.2, 0.0], None)
    assert read(0.5, 1, 3, "sample_euler", full)[2] == "the sampler's sigmas do not match this pass's steps"
    assert read(0.6, 2, 4) == (None, None, "this host gives no sampler's schedule (ComfyUI and Forge Neo do)")
    for sampler, churn, name in (
        ("sample_heun", 0.0, "Heun"),
        ("sample_euler", 0.5, "Euler"),
        ("sample_euler_ancestral", 0.0, "Euler_Ancestral"),
    ):
        assert read(0.6, 2, 4, sampler, txt, churn) == (
            None,
            None,
            f"the sampler is {name}; {ACTS_UNDER}",
        )


def test_a_loop_that_only_names_its_sampler_is_placed_on_its_schedule_by_the_timestep():
    """A sampling loop of its own (diffusers' UniPC, whose timesteps are integers cut from 1000 σ) that tells the session
    ``set_sampler(name, sigmas)`` and never its progress gets the pass it would with progress reported: the last step
    full and the correction acting; without the schedule the last step is cached and nothing is corrected."""
    from diffusers import UniPCMultistepScheduler

    model = WanModel(seed=5).eval().requires_grad_(False)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    scheduler.set_timesteps(8)
    sigmas, steps = [float(s) for s in scheduler.sigmas], len(scheduler.timesteps)
    assert scheduler.timesteps.dtype == torch.int64 and float(scheduler.timesteps[1]) != 1000 * sigmas[1]

    def run(tell: str) -> tuple[torch.Tensor, dict, tuple]:
        loop = copy.deepcopy(scheduler)
        patch = tome_core.apply_settings(model, ToMeSettings(ratio=0.0, cache=True, cache_interval=3))
        if tell != "nothing":
            patch.set_sampler("uni_pc_bh2", sigmas)
        x = _noise(4, 3, 8, 8)
        try:
            with torch.no_grad():
                for i, t in enumerate(loop.timesteps):
                    if tell == "progress":
                        patch.set_progress(i / steps, steps)
                    out = model(x, torch.full((B,), float(t)), _context(), transformer_options={})
                    x = loop.step(out, t, x, return_dict=False)[0]
            report = patch.report().cache
        finally:
            tome_core.remove_patch(model)
        return x, report.passes[0].to_dict(), report.notes

    reported, named, unplaced = run("progress"), run("sampler"), run("nothing")
    assert torch.equal(named[0], reported[0]) and named[1:] == reported[1:]
    assert named[1] == {"full": 4, "cached": 4, "skipped": 0}  # 0, 3, 6 and the last, 7
    assert any("cache correction under uni_pc_bh2" in note for note in named[2])
    assert unplaced[1] != named[1] and not torch.equal(unplaced[0], named[0])
