"""Wan 2.1's real-width costs (``benchmarks.speed.wan_costs``, ``benchmarks.lab.wan21``) and the real libraries on the
Wan-layout model (``benchmarks.lab.libraries``, ``benchmarks.quality.dit_libraries --model wan``; issue 36): what is
measured, how a pass is priced, and that each library runs through its own API on Wan's layout."""

from __future__ import annotations

import math
from dataclasses import asdict

import pytest
import torch

from benchmarks.lab import dit, wan21
from benchmarks.lab import libraries as L
from benchmarks.lab.subjects import SUBJECTS
from benchmarks.quality import dit_libraries
from benchmarks.speed import wan_costs as W

STEPS = 8
WAN = SUBJECTS["wan"]


@pytest.fixture(scope="module")
def costs() -> wan21.ChainCosts:
    seconds = {k: [1.0] for k in W.KINDS} | {"block": [2.0], "signal": [0.1], "calibrated": [0.5]}
    return wan21.ChainCosts(asdict(wan21.REAL), seconds)


def _pass(model, setting: L.Setting | None, executed: L.Executed, seed: int = 0) -> torch.Tensor:
    noise, labels = WAN.noise(range(seed, seed + 1)), WAN.labels(range(3, 4))
    executed.clear()
    if setting is None:
        return dit.guided_euler(model, noise, labels, STEPS)
    with setting.applied(model.transformer, STEPS):
        return dit.guided_euler(model, noise, labels, STEPS)


def test_the_block_runs_on_what_the_model_hands_its_first_block():
    config = wan21.QUICK
    model = config.model(blocks=1)
    seen = []
    model.blocks[0].register_forward_hook(lambda _m, _a, out: seen.append(out))
    with torch.no_grad():
        model(**config.inputs(), return_dict=False)
        one, args = wan21.block(config)
        assert torch.equal(one(*args), seen[0])  # the same weights (seed 0), the same arguments
    assert args[0].shape == (1, config.image_tokens, config.hidden) and config.image_tokens == 2 * 4 * 4
    assert wan21.REAL.image_tokens == 32760  # 21 latent frames of 30 × 52 patches


def test_a_quick_run_times_every_kind_and_the_whole_model_and_renders():
    costs = W.measure(wan21.QUICK, 1, lambda _: None, whole=True)
    assert set(costs.seconds) == set(W.KINDS) and all(len(v) == 1 and v[0] > 0 for v in costs.seconds.values())
    assert len(costs.whole) == 1
    meta = {"torch": "x", "threads": 1, "rounds": 1, "finished": "now", "seconds": 1.0}
    text = W.section([costs], meta)
    assert text.startswith(W.BEGIN) and text.endswith(W.END) and "| tiny |" in text and "N=5" in text


def test_a_pass_is_priced_as_thirty_blocks_with_the_first_as_the_probe(costs):
    full = 1.0 + 30 * 2.0
    assert costs.full_step() == pytest.approx(full)
    assert costs.cached_step() == pytest.approx(1.0 + 2.0 + 0.5)
    expected = 20 * full / (8 * (full + 1.0) + 12 * (1.0 + 2.0 + 0.5))  # N=3: full at 0, 3, …, 18 and the last
    assert costs.speedup(3) == pytest.approx(expected)
    d, n, t, f = 1536, 32760, 512, 8960
    share = (4 * d * d + 2 * n * d) / (4 * d * d + 2 * n * d + 2 * d * d + 2 * t * d + 2 * d * f)
    assert costs.attention_share() == pytest.approx(share) and 0.75 < share < 0.8  # attention dominates at 480p


def test_cache_dit_given_our_schedule_runs_on_wan_and_computes_its_full_steps_and_the_probe(costs):
    model = WAN.random()
    executed = L.Executed(model.transformer)
    plain = _pass(model, None, executed)
    assert executed.blocks == (6,) and [len(ran) for ran in executed.ran] == [6] * STEPS
    mask = L.uniform_mask(3, STEPS)
    setting = L.Setting("cache-dit", "dbcache", (("Fn", 1), ("Bn", 0), ("mask", mask), ("policy", "static")))
    cached = _pass(model, setting, executed)
    assert [sorted(ran) for ran in executed.ran] == [list(range(6)) if m else [0] for m in mask]
    assert not torch.equal(cached, plain)
    full = costs.full_step()
    expected = STEPS * full / (4 * full + 4 * (costs.cost("outside") + costs.cost("block")))
    assert L.priced(executed, costs, setting.overhead) == pytest.approx(expected)
    assert torch.equal(_pass(model, None, executed), plain)


def test_pyramid_attention_broadcast_reads_wans_own_timestep_scale(costs):
    model = WAN.random()
    executed = L.Executed(model.transformer)
    plain = _pass(model, None, executed)
    params = (("spatial_attention_block_skip_range", 2), ("spatial_attention_timestep_skip_range", (100, 800)))
    cached = _pass(model, L.Setting("diffusers", "pab", params), executed)
    sigmas = WAN.module.sigmas(STEPS)[:-1]
    reused = [i for i, attended in enumerate(executed.attended) if not attended]
    inside = [i for i, s in enumerate(sigmas) if 100 < 1000 * s < 800]  # Wan is called with σ × 1000 already
    assert reused and set(reused) <= set(inside) and not torch.equal(cached, plain)
    c, full = costs.blocks, costs.full_step()
    reusing = costs.cost("outside") + c.blocks * 2.0 * (1 - costs.attention_share())
    expected = STEPS * full / ((STEPS - len(reused)) * full + len(reused) * reusing)
    assert L.priced(executed, costs, L.Setting("diffusers", "pab", params).overhead) == pytest.approx(expected)


def test_diffusers_taylorseer_standard_mode_is_a_no_op_on_wan_so_the_sweep_runs_its_lite_mode_only():
    model = WAN.random()
    executed = L.Executed(model.transformer)
    plain = _pass(model, None, executed)
    standard = (("cache_interval", 2), ("disable_cache_before_step", 1), ("max_order", 1), ("use_lite_mode", False))
    assert torch.equal(_pass(model, L.Setting("diffusers", "taylorseer", standard), executed), plain)
    lite = (*standard[:3], ("use_lite_mode", True))
    assert not torch.equal(_pass(model, L.Setting("diffusers", "taylorseer", lite), executed), plain)
    assert any(len(ran) == 0 for ran in executed.ran)  # lite: every block skipped at a predicted step
    names = [s.name for s in L.settings(20, WAN.transformer)]
    assert not any("use_lite_mode=False" in n for n in names) and any("use_lite_mode=True" in n for n in names)
    shared = [n for n in names if "fastercache" not in n]  # FasterCache runs on Wan alone
    assert len(shared) == len(L.settings(20)) - 20  # the 20 standard-mode settings, and nothing else, left out


def test_a_quick_wan_run_sweeps_runs_each_frontier_and_ours_and_renders_its_own_section(costs):
    wanted = {"diffusers fbcache threshold=0.4", "cache-dit dbcache Fn=1 Bn=0 mask=1001 policy=static calibrator=none"}
    settings = [s for s in L.settings(4, WAN.transformer) if s.name in wanted]
    results = dit_libraries.run(WAN, 2, 2, 4, WAN.random, settings, costs, lambda _: None)
    assert {r["library"] for r in results["final"].values()} == {"cache-dit", "diffusers", "ours"}
    meta = {"seeds": 2, "sweep_seeds": 2, "steps": 4, "seconds": 1.0, "model": "wan"}
    text = dit_libraries.section(results, meta | {"versions": {"cache-dit": "x", "diffusers": "y"}})
    assert text.startswith("<!-- dit-libraries-wan:begin -->") and text.endswith("<!-- dit-libraries-wan:end -->")
    assert "--model wan" in text and "clip by clip" in text and "Wan 2.1 1.3B's real width" in text


def test_a_clip_is_judged_frame_by_frame_and_compared_over_all_its_frames():
    from benchmarks.lab.trained import data
    from benchmarks.lab.trained.metrics import psnr_ssim

    clips, labels = data.draw_clips(2, WAN.module.SIZE, WAN.module.FRAMES, seed=0)
    frames = clips.transpose(1, 2).flatten(0, 1)
    by_frame = dit.accuracy(frames, labels.repeat_interleave(WAN.module.FRAMES))
    assert dit.accuracy(clips, labels) == by_frame and by_frame.mean > 0.9  # the judge reads real clips' frames
    noisy = clips.clone()
    noisy[0, :, 3] += 0.1  # one frame of the first clip changed
    psnr, ssim = psnr_ssim(noisy, clips)
    frame_psnr, frame_ssim = psnr_ssim(noisy[0].transpose(0, 1), clips[0].transpose(0, 1))
    assert psnr[1] == 100.0 and psnr[0] == pytest.approx(frame_psnr[3] + 10 * math.log10(WAN.module.FRAMES))
    assert ssim[0] == pytest.approx(frame_ssim.mean())  # SSIM: the mean of the frames'


def test_fastercache_runs_on_wan_in_diffusers_batch_order_and_a_call_on_cond_alone_costs_half(costs):
    model = WAN.random()
    executed = L.Executed(model.transformer)
    noise, labels = WAN.noise(range(1)), WAN.labels(range(3, 4))
    plain = dit.guided_euler(model, noise, labels, STEPS)
    assert torch.equal(dit.guided_euler(model, noise, labels, STEPS, uncond_first=True), plain)  # the same samples
    params = (
        ("spatial_attention_block_skip_range", 2),
        ("spatial_attention_timestep_skip_range", (-1, 901)),
        ("unconditional_batch_skip_range", 2),
        ("unconditional_batch_timestep_skip_range", (-1, 901)),
    )
    setting = L.Setting("diffusers", "fastercache", params)
    assert setting.uncond_first and setting in L.settings(20, WAN.transformer) and setting not in L.settings(20)
    executed.clear()
    with setting.applied(model.transformer, STEPS):
        cached = dit.guided_euler(model, noise, labels, STEPS, uncond_first=True)
    halves = [i for i, b in enumerate(executed.batch) if b == 1]
    assert halves and all(b in (1, 2) for b in executed.batch) and not torch.equal(cached, plain)
    reused = [i for i, attended in enumerate(executed.attended) if not attended]
    assert reused and all(len(ran) == 6 for ran in executed.ran)
    full, share = costs.full_step(), costs.attention_share()
    calls = []
    for i in range(STEPS):
        step = full if i not in reused else costs.cost("outside") + 30 * 2.0 * (1 - share)
        calls.append(step / 2 if i in halves else step)
    assert L.priced(executed, costs, setting.overhead) == pytest.approx(STEPS * full / sum(calls))
    executed.clear()
    assert torch.equal(dit.guided_euler(model, noise, labels, STEPS), plain)  # FasterCache removed
