"""How far a forecast or a correction can go (``benchmarks.lab.emulated``, ``benchmarks.quality.correction_ceiling``;
issue 53): the emulated cache gives the cache's own samples, uncorrected and corrected, on the FLUX and Wan layouts;
with every step full each idea is plain's pass bit for bit; the hooks leave nothing behind; the pricing; the section."""

from __future__ import annotations

import pytest
import torch

from benchmarks.lab import dit
from benchmarks.lab import emulated as E
from benchmarks.lab.subjects import SUBJECTS
from benchmarks.quality import correction_ceiling as C


def _hooks(module: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


def _pass(name: str, seeds: int, steps: int):
    """An untrained ``name`` model, its noise and labels for ``seeds``, its schedule of ``steps`` and guided calls."""
    subject = SUBJECTS[name]
    model = subject.random()
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    return model, noise, labels, model.schedule(steps, noise), E.Guided(model, labels)


@pytest.mark.parametrize("name", ["flux", "wan"])
@pytest.mark.parametrize("gain", [0.0, 0.75])
def test_the_emulated_cache_gives_the_caches_own_samples(name, gain):
    model, noise, labels, schedule, guided = _pass(name, 2, 8)
    variant = E.Variant("v", correction="linear" if gain else None, gain=gain)
    with guided.hooks.on(model.transformer):
        emulated, counts = E.sample(guided, noise, schedule, 3, variant)
    assert _hooks(model.transformer) == 0
    mode = dit.Mode("linear-3", "linear", "uniform", 3, correction=gain)
    own, own_counts = dit.sample(model, noise, labels, 8, mode, short_passes=True)
    assert (counts["full"], counts["cached"]) == (own_counts["full"], own_counts["cached"]) == (4, 4)
    torch.testing.assert_close(emulated, own, rtol=1e-4, atol=1e-5)
    uncorrected = dit.sample(model, noise, labels, 8, dit.Mode("linear-3", "linear", "uniform", 3), short_passes=True)
    assert gain == 0 or not torch.allclose(own, uncorrected[0], rtol=1e-4, atol=1e-5)  # the correction acted


def test_with_every_step_full_each_idea_is_plains_pass_bit_for_bit():
    model, noise, labels, schedule, guided = _pass("flux", 2, 6)
    with guided.hooks.on(model.transformer):
        plain, residuals = E.plain(guided, noise, schedule)
        for variant in C.VARIANTS:
            out, counts = E.sample(guided, noise, schedule, 1, variant, residuals)
            assert torch.equal(out, plain), variant.name
            assert counts == {"full": 6, "cached": 0, "again": 0, "probes": 0}
    assert torch.equal(plain, dit.sample(model, noise, labels, 6)[0])  # the hooks change nothing by themselves


def test_the_ideas_differ_and_count_what_they_run_again():
    model, noise, _, schedule, guided = _pass("flux", 1, 12)
    outs, counts = {}, {}
    with guided.hooks.on(model.transformer):
        _, residuals = E.plain(guided, noise, schedule)
        for variant in C.VARIANTS:
            outs[variant.name], counts[variant.name] = E.sample(guided, noise, schedule, 3, variant, residuals)
    names = [v.name for v in C.VARIANTS]
    assert all(not torch.equal(outs[a], outs[b]) for a in names for b in names if a < b)
    assert counts["replay"] == {"full": 5, "cached": 7, "again": 0, "probes": 7}  # full 0, 3, 6, 9, 11
    assert counts["replay, full step again"] == {"full": 5, "cached": 7, "again": 4, "probes": 7}


def test_pricing_counts_what_runs_again():
    subject = SUBJECTS["flux"]
    base = {"full": 6, "cached": 14, "again": 0, "probes": 0}
    assert C.priced(subject, base) == pytest.approx(subject.priced({"full": 6, "cached": 14}))
    replay = C.priced(subject, {**base, "probes": 14})
    again = C.priced(subject, {**base, "probes": 14, "again": 5})
    costs = subject.costs()
    slower = 20 * costs.full_step() / (6 * costs.full_step() + 28 * costs.cached_step())
    assert again < replay < C.priced(subject, base)
    assert replay == pytest.approx(slower, rel=1e-3)


def test_the_section_names_each_idea_and_the_check():
    subject = SUBJECTS["wan"]
    rows = C.run(2, 6, subject.random(), lambda _: None, subject, (2,))
    assert set(rows["N2"]["variants"]) == {v.name for v in C.VARIANTS}
    assert min(rows["N2"]["check"].values()) > 60
    text = C.section({"rows": rows}, subject.stamped({"seeds": 2, "steps": 6, "seconds": 1.0}))
    assert text.startswith("<!-- correction-ceiling-wan:begin -->") and "correction_ceiling --model wan" in text
    assert all(v.name in text for v in C.VARIANTS)
