"""The samplers' benchmark (``benchmarks.quality.dit_samplers``, issue 53): its loop under Euler is the lab's Euler
loop (plain, cached and corrected; to float rounding), and under a multistep sampler the default correction acts."""

from __future__ import annotations

import torch

from benchmarks.lab import dit
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
    rows = dit_samplers.run(2, 8, model, lambda *_: None, subject, names=("uni_pc",))
    off, on = rows["uni_pc/N2/0"], rows["uni_pc/N2/0.75"]
    assert on["counts"] == off["counts"] and on["counts"]["cached"] > 0
    assert on["psnr_per_seed"] != off["psnr_per_seed"]
    assert "| uni_pc | 2 |" in dit_samplers.section(rows, {"seeds": 2, "steps": 8, "source": "x", "seconds": 1})
