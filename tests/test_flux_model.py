"""The FLUX-layout model (``benchmarks.lab.trained.flux``, issue 26): FLUX's packing, positions and schedule, its
flow-matching Euler sampler, and the shipped weights in the documented architecture."""

from __future__ import annotations

import itertools

import pytest
import torch

from benchmarks.lab.trained import architectures as A
from benchmarks.lab.trained import data, flux


def test_packing_makes_4x4_patches_row_by_row_tokens_and_unpacks_exactly():
    assert flux.PATCH == 4
    x = torch.arange(2 * 3 * 8 * 12, dtype=torch.float32).reshape(2, 3, 8, 12)
    tokens = flux.pack(x)
    assert tokens.shape == (2, 6, 48)
    # token 1 is the patch at rows 0-3, columns 4-7: channel by channel, its 4x4 pixels row by row
    assert tokens[0, 1].tolist() == x[0, :, 0:4, 4:8].reshape(-1).tolist()
    assert torch.equal(flux.unpack(tokens, 8, 12), x)
    ids = flux.image_ids(8, 12)
    assert ids.shape == (6, 3) and ids[1].tolist() == [0, 0, 1] and ids[3].tolist() == [0, 1, 0]


def test_the_schedule_is_fluxs_shift_for_the_token_count():
    s = flux.sigmas(20, 256)
    assert s[0] == 1 and s[-1] == 0 and all(a > b for a, b in itertools.pairwise(s))
    assert len(s) == 21
    t = 0.5  # mu 0.5 at 256 tokens, 1.15 at 4096: a larger image spends longer at high noise
    assert flux.sigmas(2, 256)[1] == pytest.approx(1 / (1 + torch.e**-0.5 * (1 / t - 1)))
    assert flux.sigmas(2, 4096)[1] > flux.sigmas(2, 256)[1]


def test_euler_follows_a_straight_flow_to_its_end_exactly():
    x0, noise = torch.randn(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    out = flux.euler(lambda x, sigma: noise - x0, noise.clone(), flux.sigmas(7, 256))
    torch.testing.assert_close(out, x0)


def test_the_model_is_fluxs_blocks_at_reduced_width_conditioned_on_the_label_and_trained_from_zero():
    model = flux.build(10).eval()
    t = model.transformer
    assert type(t).__name__ == "FluxTransformer2DModel"
    assert len(t.transformer_blocks) == 3 and len(t.single_transformer_blocks) == 6
    assert t.config.num_attention_heads * t.config.attention_head_dim == 96
    x = data.draw(2, 32, seed=1)[0]
    with torch.no_grad():
        a = model(x, torch.tensor([0.5, 0.5]), torch.tensor([3, -1]))
        b = model(x, torch.tensor([0.5, 0.5]), torch.tensor([4, -1]))
        zero = flux.zero_start(model)(x, torch.tensor([0.5, 0.5]), torch.tensor([3, -1]))
    assert torch.equal(zero, torch.zeros_like(x))  # adaLN-Zero: every block the identity, the output zero
    assert a.shape == x.shape and not torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert 1.5e6 < sum(p.numel() for p in model.parameters()) < 2.5e6


@pytest.mark.skipif(not A.weights_path(flux.NAME).exists(), reason="the FLUX-layout model is not trained yet")
def test_the_shipped_weights_load_strictly_and_have_a_model_card():
    from benchmarks.lab.trained.loading import load_flux

    model = load_flux()  # strict
    assert not model.training and all(not p.requires_grad for p in model.parameters())
    card = A.weights_path(flux.NAME).with_suffix(".md").read_text(encoding="utf-8")
    assert "FluxTransformer2DModel" in card and "rectified flow" in card and "final loss" in card
