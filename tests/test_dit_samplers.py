"""The samplers' benchmark (``benchmarks.quality.dit_samplers``, issue 53): its loop under Euler is the lab's Euler
loop (plain, cached and corrected; to float rounding), under a multistep sampler the default correction acts, and the
early schedule is measured beside the uniform one."""

from __future__ import annotations

import torch

from benchmarks.lab import dit
from benchmarks.lab import libraries as L
from benchmarks.lab import samplers as S
from benchmarks.lab.subjects import SUBJECTS
from benchmarks.quality import dit_samplers


def test_under_euler_the_samplers_loop_is_the_labs_and_under_uni_pc_the_correction_acts():
    subject = SUBJECTS["flux"]
    model = subject.random()
    noise, labels = subject.noise(range(2)), subject.labels(range(2))
    mode = dit.Mode("N2", "linear", "uniform", 2, correction=0.75)
    for m in (None, mode):
        ours, counts = S.sample(model, noise, labels, 6, "euler", S.sample_functions()["euler"], m and m.settings())
        lab, lab_counts = dit.sample(model, noise, labels, 6, m)
        # the same sampling but for rounding (k-diffusion's Euler steps by the denoised image, the lab's by the velocity)
        assert torch.allclose(ours, lab, atol=1e-4) and (m is None or counts == lab_counts)
    rows = dit_samplers.run(2, 8, lambda: model, lambda *_: None, subject, names=("uni_pc",))["ours"]
    off, on = rows["uni_pc/N2/0"], rows["uni_pc/N2/0.75"]
    assert on["counts"] == off["counts"] and on["counts"]["cached"] > 0
    assert on["psnr_per_seed"] != off["psnr_per_seed"]
    # the early schedule: uni_pc's 7 calls at N=4 run full at 0, 3 and 6 (uniform: 0, 4 and 6); at N=3 the uniform
    # grid ends on the last call (0, 3, 6), and below N=3 the schedules are one
    early, uniform = rows["uni_pc/N4/0.75/early"], rows["uni_pc/N4/0.75"]
    assert early["counts"] == uniform["counts"] and early["psnr_per_seed"] != uniform["psnr_per_seed"]
    for n in (2, 3):
        assert rows[f"uni_pc/N{n}/0.75/early"]["psnr_per_seed"] == rows[f"uni_pc/N{n}/0.75"]["psnr_per_seed"]
    meta = {"seeds": 2, "steps": 8, "source": "x", "seconds": 1}
    text = dit_samplers.section(rows, meta)
    assert "| uni_pc | 2 |" in text and "early schedule: steps" in text and "stands aside" not in text
    aside = {k: {**r, "psnr_per_seed": rows[f"uni_pc/N{r['interval']}/0"]["psnr_per_seed"]} for k, r in rows.items()}
    assert "stands aside" in dit_samplers.section(aside, meta)  # every corrected row equal to its uncorrected one


def test_diffusers_schedulers_run_as_samplers_and_end_on_what_the_model_says():
    """diffusers' UniPC and DPM-Solver++ as the lab's samplers on the lab's sigmas: a denoiser that always says ``c``
    (the flow from any noise to ``c``) ends on ``c``; their linear maps read back their own result."""
    from tome_core.caching.samplers import linearize

    sigmas = torch.tensor(SUBJECTS["flux"].random().schedule(10, torch.zeros(1, 16, 64)))
    c, x = torch.randn(2, 16, generator=torch.Generator().manual_seed(1)), torch.randn(2, 16)
    outs = torch.randn(10, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    for name, function in S.diffusers_functions().items():
        assert torch.allclose(function(lambda x, s: c, x.clone(), sigmas), c, atol=1e-5), name
        mapped = linearize(name, function, sigmas)
        calls = iter(range(10))

        def model(x, s, outs=outs, calls=calls):
            return x - s.reshape(-1, 1).to(x.dtype) * outs[next(calls)].to(x.dtype)

        start = torch.randn(1, 3, dtype=torch.float32)
        got = function(model, start.clone(), sigmas)
        predicted = mapped.final @ outs + start.double()
        assert torch.allclose(got.double(), predicted, atol=1e-4), name


def test_the_libraries_run_under_a_sampler_and_the_section_sets_them_beside_ours():
    subject = SUBJECTS["flux"]
    rows = dit_samplers.run(
        2,
        10,
        subject.random,
        lambda *_: None,
        subject,
        names=("uni_pc",),
        settings=lambda calls: [s for s in L.settings(calls) if "mask" in dict(s.params)][:40:8],
    )
    part = rows["libraries"]["uni_pc"]
    assert len(part["sweep"]) == 5 and len(part["ratios"]) == 9  # uni_pc: 10 steps, 9 calls
    assert part["final"] and all(r["speed"] >= dit_samplers.FINAL_FROM for r in part["final"].values())
    meta = {"seeds": 2, "steps": 10, "source": "x", "seconds": 1, "sweep_seeds": 8}
    text = dit_samplers.section(rows, {**meta, "versions": {"cache-dit": "a", "diffusers": "b"}})
    assert "| uni_pc | ≥ 2× |" in text and "- uni_pc (5 swept)" in text
