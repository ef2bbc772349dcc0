"""The other UIs' caches as the fidelity benchmark runs them (benchmarks/lab/anchors.py): each rule decides as its
description says on synthetic trajectories, per seed inside a batch as if each seed were sampled alone, with its guard
rails (first and last step computed); DeepCache's non-uniform schedule is dense around its centre."""

from __future__ import annotations

import itertools

import pytest
import torch
from models import make_unet

import tome_core
from benchmarks.lab import anchors
from benchmarks.lab import modes as M


class Linear(torch.nn.Module):
    """A stand-in UNet whose output is ``gain * x`` (what EasyCache and TeaCache need: an output of the input)."""

    def __init__(self, gain: float = 2.0):
        super().__init__()
        self.gain = gain
        self.calls = 0

    def forward(self, x, timesteps=None, context=None, y=None):
        self.calls += 1
        return self.gain * x


def _run(rule: anchors.StepRule, unet: torch.nn.Module, xs: list[torch.Tensor], start: float = 999.0):
    rule.install(unet)
    outs = []
    try:
        for i, x in enumerate(xs):
            rule.set_progress(i / len(xs), len(xs))
            t = torch.full((x.shape[0],), start * (1 - i / len(xs)))
            outs.append(unet(x, t, None))
    finally:
        rule.remove()
    assert "forward" not in unet.__dict__
    return outs


def _trajectory(steps: int, rates: list[float], seeds: int = 1) -> list[torch.Tensor]:
    """Inputs (cond and uncond rows per seed) whose relative L1 change from step to step is ``rates[seed]``."""
    base = torch.ones(2 * seeds, 4, 4, 4)
    scale = torch.tensor(rates).repeat(2).reshape(-1, 1, 1, 1)
    return [base * (1 + scale) ** i for i in range(steps)]


def test_teacache_skips_while_the_accumulated_input_change_stays_below_its_threshold_per_seed():
    xs = _trajectory(10, [0.01, 0.04], seeds=2)  # seed 0 moves slowly, seed 1 fast
    rule = anchors.TeaCacheInput(0.05)
    _run(rule, Linear(), xs)
    kinds = ["".join(k[s][0] for k in rule.kinds) for s in range(2)]
    # seed 0: changes of 0.99 % a step pass 5 % at the sixth; seed 1: 3.8 % a step, a full step every other one
    assert kinds[0] == "fsssssfssf" and kinds[1] == "fsfsfsfsff"
    assert rule.counts()[0] == {"full": 3, "partial": 0, "first": 0, "skip": 7}


def test_a_seed_sampled_in_a_batch_decides_as_it_would_alone():
    together = anchors.TeaCacheInput(0.05)
    outs = _run(together, Linear(), _trajectory(8, [0.01, 0.04], seeds=2))
    alone = anchors.TeaCacheInput(0.05)
    single = _run(alone, Linear(), [x[[1, 3]] for x in _trajectory(8, [0.01, 0.04], seeds=2)])
    assert [k[1] for k in together.kinds] == [k[0] for k in alone.kinds]
    assert all(torch.equal(a[[1, 3]], b) for a, b in zip(outs, single))


def test_a_skipped_step_adds_the_last_computed_residual_to_its_input():
    xs = _trajectory(5, [0.01])
    outs = _run(anchors.TeaCacheInput(0.5), Linear(gain=3.0), xs)
    residual = 3.0 * xs[0] - xs[0]
    for i in (1, 2, 3):
        assert torch.equal(outs[i], xs[i] + residual)
    assert torch.equal(outs[4], 3.0 * xs[4])  # the last step is computed


def test_easycache_predicts_the_output_change_from_the_input_change_and_the_transformation_rate():
    # output = 2 x: the rate is 2, and the predicted relative output change is 2 |dx| / |2 x_last| = |dx| / |x_last|
    xs = _trajectory(20, [0.02])
    rule = anchors.EasyCache(0.05)
    _run(rule, Linear(), xs)
    kinds = "".join(k[0][0] for k in rule.kinds)
    assert kinds[:3] == "fff"  # before 15 % of the timesteps, and until the rate is known: computed
    assert kinds[-1] == "f" and "s" in kinds
    runs = [len(r) for r in kinds.strip("f").split("f") if r]
    assert max(runs) <= 3  # ~2 % a step against a 5 % budget: at most two or three skips in a row


def test_first_block_cache_reuses_while_the_first_blocks_residual_is_unchanged():
    unet = make_unet("sd15")
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    ctx = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(1))
    rule = anchors.FirstBlockCache(0.01).install(unet)
    outs = []
    try:
        with torch.no_grad():
            for i in range(6):
                rule.set_progress(i / 6, 6)
                x_i = x * (1.5 if i >= 2 else 1.0)  # from step 2 on, the input (and its first block) changes
                outs.append(unet(x_i, torch.tensor([500.0, 500.0]), ctx))
    finally:
        rule.remove()
    # an unchanged first-block residual against the last computed step's skips the rest; step 2's changed one
    # computes, and is the reference after; the first and last steps always compute
    assert [k[0] for k in rule.kinds] == ["full", "first", "full", "first", "first", "full"]
    assert torch.equal(outs[1], x + (outs[0] - x))


def test_spectrum_runs_neos_schedule_and_extrapolates_a_linear_output_exactly_without_its_fit():
    rule = anchors.Spectrum(w=0.0)  # the Taylor part alone
    xs = [torch.full((2, 4, 2, 2), float(i)) for i in range(20)]
    outs = _run(rule, Linear(gain=1.0), xs)
    kinds = "".join(k[0][0] for k in rule.kinds)
    # warmup 6 computed, one computed step every 2 (window 2) up to 90 % of 20 steps, then computed
    assert kinds == "ffffff" + "sf" * 6 + "ff"
    assert all(torch.allclose(o, x) for o, x in zip(outs, xs))  # the output is linear in the step: exact


def test_deepcache_non_uniform_steps_are_densest_around_the_centre():
    steps = anchors.quadratic_full_steps(50, 10, 15)
    assert len(steps) == len(set(steps)) == 10 and steps[0] == 0 and steps == sorted(steps)
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    centre = min(range(len(steps)), key=lambda i: abs(steps[i] - 15))
    assert gaps[max(centre - 1, 0)] <= min(gaps[0], gaps[-1])


def test_our_cache_on_a_fixed_schedule_runs_exactly_those_full_steps():
    unet = make_unet("sd15")
    mode = M.MODES["deepcache-nonuniform-3"]
    patch = mode.apply(unet, 10)
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    ctx = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(1))
    try:
        for i in range(10):
            patch.set_progress(i / 10, 10)
            with torch.no_grad():
                unet(x, torch.full((2,), 999.0 * (1 - i / 10)), ctx)
        stats = tome_core.cache_stats(unet)
    finally:
        M.PLAIN.apply(unet)
    expected = set(mode.full_steps(10)) | {9}
    assert stats == [{"full": len(expected), "cached": 10 - len(expected), "skipped": 0}]


@pytest.mark.parametrize("name", [m.name for m in M.FRONTIER if m.rule is not None])
def test_every_rule_leaves_the_unet_as_it_was(name):
    unet = Linear()
    rule = M.MODES[name].apply(unet, 4)
    assert isinstance(rule, anchors.StepRule) and "forward" in unet.__dict__
    M.PLAIN.apply(unet)
    assert "forward" not in unet.__dict__
