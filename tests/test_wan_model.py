"""The Wan-layout video model (``benchmarks.lab.trained.wan``, issue 36): its clips, diffusers' Wan blocks at reduced
width conditioned on the label by cross-attention, Wan's shifted schedule, and the step cache on it through the
``DiffusersWan`` family."""

from __future__ import annotations

import itertools

import pytest
import torch

import tome_core
from benchmarks.lab.trained import architectures as A
from benchmarks.lab.trained import data, flux, wan
from benchmarks.lab.trained.loading import load_classifier
from tome_core.families import DiffusersWan, layout_for
from tome_core.settings import ToMeSettings


def test_clips_are_the_image_distribution_in_motion_and_the_judge_reads_every_frame():
    x, labels = data.draw_clips(16, 32, 8, seed=7)
    again, same = data.draw_clips(16, 32, 8, seed=7)
    assert x.shape == (16, 3, 8, 32, 32) and torch.equal(x, again) and torch.equal(labels, same)
    assert x.min() >= -1 and x.max() <= 1
    step = (x[:, :, 1:] - x[:, :, :-1]).abs().mean()
    across = (x[:, :, -1] - x[:, :, 0]).abs().mean()
    assert 0 < step < across / 2  # it moves, and smoothly: a frame is closer to the next than to the clip's end
    with torch.no_grad():
        guess = load_classifier()(x.transpose(1, 2).reshape(-1, 3, 32, 32)).argmax(1).view(16, 8)
    assert (guess == labels[:, None]).float().mean() > 0.9  # the class of a generated clip can be judged per frame


def test_the_model_is_wans_blocks_at_reduced_width_conditioned_on_the_label_and_trained_from_zero():
    model = wan.build(10).eval()
    t = model.transformer
    assert type(t).__name__ == "WanTransformer3DModel" and len(t.blocks) == 6
    assert t.config.num_attention_heads * t.config.attention_head_dim == 96
    assert t.config.patch_size == (1, 4, 4) and 0.5e6 < sum(p.numel() for p in model.parameters()) < 1.5e6
    x = data.draw_clips(2, 32, 8, seed=1)[0]
    sigma = torch.tensor([0.5, 0.5])
    with torch.no_grad():
        a = model(x, sigma, torch.tensor([3, -1]))
        b = model(x, sigma, torch.tensor([4, -1]))
        assert torch.equal(wan.zero_start(model)(x, sigma, torch.tensor([3, -1])), torch.zeros_like(x))  # adaLN-Zero
    assert a.shape == x.shape and not torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert model.inputs(x, sigma, torch.tensor([3, -1]))["timestep"].tolist() == [500.0, 500.0]  # sigma × 1000


def test_the_schedule_is_wans_shift():
    s = wan.sigmas(20)
    assert s[0] == 1 and s[-1] == 0 and len(s) == 21 and all(a > b for a, b in itertools.pairwise(s))
    assert wan.sigmas(2)[1] == pytest.approx(3 * 0.5 / (1 + 2 * 0.5))  # shift 3 keeps it at high noise longer
    x0, noise = torch.randn(2, 3, 8, 4, 4), torch.randn(2, 3, 8, 4, 4)
    torch.testing.assert_close(flux.euler(lambda x, sigma: noise - x0, noise.clone(), wan.sigmas(7)), x0)


def test_the_step_cache_acts_on_the_lab_model_through_its_family_and_leaves_it_bit_identical():
    model = wan.build(10, seed=2).eval().requires_grad_(False)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    layout = layout_for(model.transformer, 0)
    assert isinstance(layout, DiffusersWan) and layout.skipped == list(model.transformer.blocks[1:])
    noise = torch.randn(2, 3, 8, 32, 32, generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([3, 7])

    def sample(patch=None):
        def velocity(x, sigma):
            if patch is not None:
                patch.set_progress(velocity.step / 6, 6)
            velocity.step += 1
            with torch.no_grad():
                out = model(torch.cat([x, x]), sigma.expand(4), torch.cat([labels, torch.full_like(labels, -1)]))
            c, u = out.chunk(2)
            return u + 4 * (c - u)

        velocity.step = 0
        return flux.euler(velocity, noise.clone(), wan.sigmas(6))

    plain = sample()
    patch = tome_core.apply_settings(model.transformer, ToMeSettings(ratio=0.0, cache=True, cache_interval=2))
    try:
        cached = sample(patch)
        report = patch.report()
    finally:
        tome_core.remove_patch(model.transformer)
    assert report.cache.cached == 2 and report.cache.full == 4  # steps 1 and 3 of 6 (the last is always full)
    psnr = 10 * torch.log10(4 / (cached - plain).pow(2).mean())
    assert not torch.equal(cached, plain) and psnr > 20
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items()) and torch.equal(sample(), plain)


@pytest.mark.skipif(not A.weights_path(wan.NAME).exists(), reason="the Wan-layout model is not trained yet")
def test_the_shipped_weights_load_strictly_and_have_a_model_card():
    from benchmarks.lab.trained.loading import load_wan

    model = load_wan()  # strict
    assert not model.training and all(not p.requires_grad for p in model.parameters())
    card = A.weights_path(wan.NAME).with_suffix(".md").read_text(encoding="utf-8")
    assert "WanTransformer3DModel" in card and "rectified flow" in card and "final loss" in card
