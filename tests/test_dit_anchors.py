"""The DiT anchors (``benchmarks.lab.dit_anchors``, issue 26): the model's forward taken apart gives its output bit for
bit; First Block Cache, TeaCache, TaylorSeer, FoCa, MagCache, EasyCache and LazyCache skip as their descriptions say; TeaCache's
polynomial and MagCache's ratios are fitted as their authors fit them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.lab import dit_anchors as A
from benchmarks.lab.trained import flux


@pytest.fixture(scope="module")
def model():
    return flux.build(10, seed=4).eval().requires_grad_(False)


def _sample(model, rule=None, steps=6):
    x = torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    labels = torch.tensor([3, -1])
    if rule is not None:
        rule.apply(model.transformer)
    try:
        with torch.no_grad():
            return flux.euler(
                lambda x, s: model(torch.cat([x, x]), s.expand(2), labels)[:1],
                x,
                flux.sigmas(steps, 64),
                None if rule is None else rule.at_step,
            )
    finally:
        if rule is not None:
            rule.remove()


def test_the_forward_taken_apart_is_the_models_own_and_is_put_back(model):
    plain = _sample(model)
    rule = A.DiTRule()
    assert torch.equal(_sample(model, rule), plain) and rule.counts() == {"full": 6, "first": 0, "skip": 0}
    assert "forward" not in model.transformer.__dict__ and torch.equal(_sample(model), plain)


@pytest.mark.parametrize("make", [A.FirstBlockCache, A.TeaCache])
def test_at_threshold_zero_every_step_is_computed_and_at_a_high_one_only_the_first_and_last(model, make):
    plain = _sample(model)
    exact = make(0.0)
    assert torch.equal(_sample(model, exact), plain) and exact.counts()["full"] == 6
    loose = make(1e9)
    out = _sample(model, loose)
    kind = "first" if make is A.FirstBlockCache else "skip"
    assert loose.counts() == {"full": 2, "first": 0, "skip": 0} | {kind: 4}  # steps 0 and 5 computed
    assert not torch.equal(out, plain)


def test_teacaches_polynomial_is_fitted_to_the_output_change_against_the_input_change():
    truth = np.poly1d([0.5, 2.0, 0.1])  # the output's relative change as a function of the input's
    recorders = []
    for seed in range(3):
        gen = torch.Generator().manual_seed(seed)
        r = A.Recorder()
        r.modulated, r.outputs = [torch.ones(8)], [torch.ones(8)]
        for _ in range(6):
            change = float(torch.rand((), generator=gen)) * 0.5
            r.modulated.append(r.modulated[-1] * (1 + change))  # relative L1 change: ``change``
            r.outputs.append(r.outputs[-1] * (1 + truth(change)))
        recorders.append(r)
    fitted = np.poly1d(A.fit_teacache(recorders, degree=2))
    xs = np.linspace(0.05, 0.45, 5)
    assert fitted(xs) == pytest.approx(truth(xs), rel=1e-4)


def test_taylorseer_computes_its_first_steps_and_every_interval_and_forecasts_between(model):
    plain = _sample(model)
    rule = A.TaylorSeer(interval=2, order=1, first=2)
    out = _sample(model, rule)
    assert rule.kinds == ["full", "full", "skip", "full", "skip", "full"]  # 0, 1 (first), 3 (interval), 5 (last)
    assert not torch.equal(out, plain)
    every = A.TaylorSeer(interval=1)
    assert torch.equal(_sample(model, every), plain) and every.counts()["full"] == 6


def test_taylorseers_derivatives_are_the_finite_differences_of_the_computed_residuals():
    rule = A.TaylorSeer(interval=2, order=2, first=0)
    for step in (0, 2, 4):  # a quadratic in the step: 1 + s + s**2 / 2
        rule.update(torch.tensor(1.0 + step + step**2 / 2), step)
    assert [float(d) for d in rule.derivatives] == [13.0, 4.0, 1.0]  # (13 - 5) / 2, ((13 - 5) / 2 - (5 - 1) / 2) / 2
    assert float(rule.forecast(2)) == 13.0 + 4.0 * 2 + 1.0 * 4 / 2


def test_foca_runs_taylorseers_schedule_and_steps_its_forecasts_on_from_the_last_two_values(model):
    plain = _sample(model)
    rule = A.FoCa(interval=2, first=2)
    assert not torch.equal(_sample(model, rule), plain)
    assert rule.kinds == ["full", "full", "skip", "full", "skip", "full"]
    every = A.FoCa(interval=1)
    assert torch.equal(_sample(model, every), plain) and every.counts()["full"] == 6
    foca = A.FoCa(interval=3, first=0)
    for step, value in ((0, 0.0), (2, 4.0)):  # computed steps 0 and 2 of s²: the full steps' slope 2 per step
        foca.update(torch.tensor(value), step)
        foca.last = step
    assert float(foca.forecast(1)) == 4.0 + 0.5 * (4.0 + 2.0)  # local (4 - 0) between the last two values, anchor 2
    assert float(foca.forecast(2)) == 7.0 + 0.5 * (3.0 + 2.0)  # the forecast feeds the next


@pytest.mark.parametrize(
    "make",
    [lambda t: A.MagCache(t, [1.0] * 6, retain=0.0), A.EasyCache, lambda t: A.LazyCache(t, cfg=1.0, side=16)],
    ids=["magcache", "easycache", "lazycache"],
)
def test_magcache_easycache_and_lazycache_compute_every_step_at_threshold_zero_and_skip_at_a_high_one(model, make):
    plain = _sample(model)
    exact = make(0.0)
    assert torch.equal(_sample(model, exact), plain) and exact.counts()["full"] == 6
    loose = make(1e9)
    out = _sample(model, loose)
    assert loose.counts()["skip"] >= 1 and loose.kinds[0] == loose.kinds[-1] == "full"
    assert not torch.equal(out, plain)


def test_magcache_skips_at_most_k_steps_in_a_row_and_its_ratios_are_calibrated_per_step():
    r = A.Recorder()
    r.magnitudes = [2.0, 2.0, 1.0, 0.5]
    assert A.magnitude_ratios([r, r]) == [1.0, 1.0, 0.5, 0.5]


def test_a_lazycache_skipped_step_repeats_the_last_denoised_change(model):
    """With guidance 1 (the sampler above takes the cond branch) the guided prediction is the cond one; a skipped step
    returns, in both branches, the velocity whose denoised image is its input plus the last computed step's
    denoised-minus-input."""
    plain = _sample(model)
    loose = A.LazyCache(1e9, cfg=1.0, side=16)
    seen = []
    original = A.LazyCache._forward

    def spy(self, return_dict=False, **kw):
        out = original(self, **kw)
        seen.append((self.kinds[-1], kw["hidden_states"], kw["timestep"], out[0], self.diff))
        return out

    A.LazyCache._forward = spy
    try:
        out = _sample(model, loose)
    finally:
        A.LazyCache._forward = original
    assert loose.kinds[:2] == ["full", "full"] and loose.kinds[-1] == "full" and loose.counts()["skip"] >= 1
    _, x, sigma, velocity, diff = next(s for s in seen if s[0] == "skip")
    torch.testing.assert_close(x[:1] - sigma[0] * velocity[:1], x[:1] + diff)
    assert torch.equal(velocity[0], velocity[1]) and not torch.equal(out, plain)
