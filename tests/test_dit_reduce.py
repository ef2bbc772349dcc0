"""The lab's token reduction on diffusers' Wan transformer (benchmarks.lab.reduction) and its benchmark
(benchmarks.quality.dit_reduce): the processors it installs leave plain's output where they reduce nothing and are
gone after, the step is the call's index, and the price follows the multiply-adds."""

from __future__ import annotations

import pytest
import torch

from benchmarks.lab import dit
from benchmarks.lab.reduction import Reducing, Reduction, block_shares, speedup
from benchmarks.lab.subjects import SUBJECTS
from benchmarks.lab.trained import architectures as A
from benchmarks.lab.trained import wan
from benchmarks.lab.wan21 import REAL


@pytest.fixture(scope="module")
def model():
    return SUBJECTS["wan"].random()


def _sample(model, steps: int = 3, reduction: Reduction | None = None) -> torch.Tensor:
    subject = SUBJECTS["wan"]
    noise, labels = subject.noise(range(2)), subject.labels(range(2))
    with Reducing(reduction, model.transformer, steps):
        return dit.sample(model, noise, labels, steps)[0]


def test_reducing_nothing_keeps_plain_and_leaves_the_processors_as_they_were(model) -> None:
    before = [block.attn1.processor for block in model.transformer.blocks]
    plain = _sample(model)
    assert torch.allclose(_sample(model, reduction=Reduction(share=0.0)), plain, atol=1e-5)
    reduced = _sample(model, reduction=Reduction(share=1.0))
    assert (reduced - plain).abs().max() > 1e-4  # it acts
    assert [block.attn1.processor for block in model.transformer.blocks] == before
    assert not model.transformer._forward_pre_hooks
    assert torch.equal(_sample(model), plain)


def test_the_steps_outside_the_window_and_the_blocks_before_first_run_whole(model) -> None:
    plain = _sample(model, 4)
    late = _sample(model, 4, Reduction(share=1.0, start=0.5))
    early = _sample(model, 4, Reduction(share=1.0, end=0.5))
    assert not torch.equal(late, plain) and not torch.equal(early, plain) and not torch.equal(late, early)
    blocks = len(model.transformer.blocks)
    assert torch.allclose(_sample(model, 4, Reduction(share=1.0, first=blocks)), plain, atol=1e-5)


def test_the_price_follows_the_multiply_adds() -> None:
    scores, rest = block_shares(REAL)
    assert scores + rest == pytest.approx(1) and 0.65 < scores < 0.75  # 32,760 tokens, hidden 1536, FFN 8960
    half = 1 - 10 / 21  # the 10 odd latent frames of 21 merged
    assert speedup(Reduction(share=1.0), 8) == pytest.approx(1 / (rest + scores * half))
    assert speedup(Reduction("frames"), 8) == pytest.approx(1 / (rest + scores / 2))
    assert speedup(Reduction("cells"), 8) == pytest.approx(1 / (rest + scores / 4))
    assert speedup(Reduction(share=1.0, start=0.5), 8) == pytest.approx(8 / (4 + 4 / speedup(Reduction(share=1.0), 8)))
    assert speedup(Reduction(share=1.0, first=1), 8) < speedup(Reduction(share=1.0), 8)
    assert speedup(Reduction(share=0.0), 8) == pytest.approx(1)


def test_the_quick_run_prints_every_row(capsys) -> None:
    from benchmarks.quality import dit_reduce

    dit_reduce.main(["--quick"])
    text = capsys.readouterr().out
    assert "| 4 | nearest 1, blocks 1+ | 1.48× |" in text and "| 6 | cache N=3 + nearest 1, blocks 1+ |" in text


@pytest.mark.skipif(not A.weights_path(wan.LONG_NAME).exists(), reason="the long-clip model is not trained yet")
def test_the_long_clip_weights_load_strictly_and_have_a_model_card() -> None:
    model = SUBJECTS[wan.LONG_NAME].load()  # strict
    assert not model.training
    card = A.weights_path(wan.LONG_NAME).with_suffix(".md").read_text(encoding="utf-8")
    assert "4096 tokens a clip" in card and "fine-tuned" in card and "final loss" in card
    assert SUBJECTS[wan.LONG_NAME].noise(range(1)).shape == (1, 3, 16, 64, 64)
    rope = model.transformer.rope
    assert torch.equal(rope.freqs_cos[2], wan.build(10).transformer.rope.freqs_cos[1])  # positions read at half steps


def test_interpolated_positions_are_diffusers_tables_at_fractional_positions() -> None:
    plain = wan.build(10).transformer.rope
    same = wan.interpolate_positions(wan.build(10), 1.0).transformer.rope
    assert torch.equal(same.freqs_cos, plain.freqs_cos) and torch.equal(same.freqs_sin, plain.freqs_sin)
    half = wan.build_long(10).transformer.rope
    for k in (0, 1, 5, 100):  # position 2k at half steps is diffusers' position k, on every axis
        assert torch.allclose(half.freqs_cos[2 * k], plain.freqs_cos[k], atol=1e-6)
        assert torch.allclose(half.freqs_sin[2 * k], plain.freqs_sin[k], atol=1e-6)
    assert not torch.allclose(half.freqs_cos[1], plain.freqs_cos[1])
    assert "rope.freqs_cos" not in wan.build_long(10).transformer.state_dict()  # loading weights keeps them as built


def test_keys_and_values_alone_cannot_reach_a_quarter_faster_on_flux() -> None:
    from benchmarks.lab.reduction import flux_bound

    assert flux_bound(1.0) == pytest.approx(1)
    assert 1.05 < flux_bound(0.5) < flux_bound(0.25) < flux_bound(0.0) < 1.25


def test_one_block_is_timed_plain_and_reduced_and_left_as_it_was() -> None:
    from benchmarks.lab import wan21
    from benchmarks.quality import dit_reduce

    seconds = dit_reduce.block_seconds(wan21.QUICK, 2, lambda _: None)
    assert set(seconds) == {"plain", "nearest 1"} and all(len(v) == 2 and min(v) > 0 for v in seconds.values())
    text = dit_reduce._block_text({"seconds": seconds, "finished": "now"})
    assert "2 interleaved rounds" in text and "priced 1.50×" in text
