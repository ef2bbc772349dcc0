"""Token merging on a diffusion transformer (``benchmarks.quality.dit_merge``, issue 26 item 3) and the cache at few steps
(``benchmarks.quality.dit_steps``): what they merge, that RoPE positions follow the tokens, and that their runs render."""

from __future__ import annotations

import pytest
import torch

from benchmarks.lab import dit
from benchmarks.lab.trained import data, flux
from benchmarks.quality import dit_merge, dit_steps


@pytest.fixture(scope="module")
def model() -> flux.FluxLayout:
    return flux.build(len(data.CLASSES), seed=1).eval()


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(2, 3, 32, 32, generator=gen), torch.tensor([0.7, 0.4]), torch.tensor([1, -1])


@pytest.mark.parametrize("where", dit_merge.WHERE)
def test_merging_nothing_keeps_the_output_so_every_token_keeps_its_rope_position(model, where):
    x, sigma, labels = _inputs()
    with torch.no_grad():
        plain = model(x, sigma, labels)
        with dit_merge.Merging(dit.Merge(where, 0.0), model.transformer):
            same = model(x, sigma, labels)  # tokens reordered (kept sources, then destinations), positions with them
        with dit_merge.Merging(dit.Merge(where, 0.5), model.transformer):
            merged = model(x, sigma, labels)
        after = model(x, sigma, labels)
    torch.testing.assert_close(same, plain, rtol=0, atol=1e-5)
    assert (merged - plain).abs().max() > 1e-3
    assert torch.equal(after, plain) and "forward" not in vars(model.transformer.transformer_blocks[0])
    assert "forward" not in vars(model.transformer.single_transformer_blocks[0].attn)


@pytest.mark.parametrize("where, merged_in", [("attention", {"attn.to_q"}), ("block", {"attn.to_q", "ff"})])
def test_merging_shortens_the_image_tokens_where_it_acts(model, where, merged_in):
    x, sigma, labels = _inputs()
    block = model.transformer.transformer_blocks[1]
    seen: dict[str, int] = {}
    hooks = [
        block.get_submodule(name).register_forward_pre_hook(
            lambda m, args, kwargs, name=name: seen.__setitem__(
                name, (args or [kwargs.get("hidden_states")])[0].shape[1]
            ),
            with_kwargs=True,
        )
        for name in ("attn.to_q", "ff")  # the image stream's queries, its MLP
    ]
    try:
        with torch.no_grad(), dit_merge.Merging(dit.Merge(where, 0.5), model.transformer):
            model(x[:1], sigma[:1], labels[:1])
    finally:
        for h in hooks:
            h.remove()
    tokens = (flux.SIZE // flux.PATCH) ** 2  # 64: half of them merged away where merging acts
    assert seen == {name: tokens // 2 if name in merged_in else tokens for name in ("attn.to_q", "ff")}


def test_merged_tokens_take_the_positions_of_the_tokens_they_stand_for():
    x = torch.randn(1, 16, 8)
    merging = dit_merge.Merging(dit.Merge("block", 0.5), _Empty())
    plan = merging.plan(x)
    ids = torch.arange(3 + 16, dtype=torch.float32).unsqueeze(1)  # a "rope" that is each token's index
    cos, sin = dit_merge.positions((ids, -ids), 3, plan)
    expected = torch.cat([torch.arange(3), 3 + plan.keep_src[0], 3 + plan.dst]).float()
    assert torch.equal(cos[:, 0], expected) and torch.equal(sin[:, 0], -expected) and len(expected) == 3 + 8


class _Empty(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.transformer_blocks, self.single_transformer_blocks = torch.nn.ModuleList(), torch.nn.ModuleList()


def test_a_quick_run_measures_every_merge_prices_and_renders(model):
    seconds = dit_merge.measure(dit.QUICK, 1, lambda _: None)
    names = ["plain", *(dit.Merge(w, r).name for w in dit_merge.WHERE for r in dit_merge.RATIOS)]
    assert set(seconds) == {f"{k}/{m}" for k in ("double", "single") for m in names}
    prices = dit.prices(seconds, dit.QUICK)
    assert prices.outside == 0.0  # the real-width run's outside is not mixed into tiny blocks
    fidelity = dit_merge.fidelity(2, 5, model, lambda _: None)
    assert list(fidelity) == ["plain", *(name for name, _, _ in dit_merge.modes())]
    assert fidelity["cache-2"]["counts"]["cached"] == 2 and fidelity["block-0.5"]["counts"]["cached"] == 0
    assert fidelity["cache-3"]["counts"]["cached"] == 0  # 5 steps at N=3: too short for a forecast, all full
    results = {"config": vars(dit.QUICK), "prices": vars(prices), "seconds": seconds, "fidelity": fidelity}
    meta = {"torch": "x", "threads": 1, "rounds": 1, "finished": "now", "seconds": 1.0, "seeds": 2, "steps": 5}
    text = dit_merge.section(results, meta)
    assert text.startswith(dit_merge.BEGIN) and "| cache N=3 + merge block 0.5 |" in text and "| block-0.75 |" in text


def test_a_pass_is_priced_with_merged_blocks_and_cached_steps():
    blocks = {"double/plain": 2.0, "single/plain": 1.0, "double/block-0.5": 1.0, "single/block-0.5": 0.5}
    prices = dit.Prices(blocks, outside=0.5, forecast=0.1)
    full, merged = 0.5 + 19 * 2.0 + 38 * 1.0, 0.5 + 19 * 1.0 + 38 * 0.5
    assert prices.speedup({"full": 20}, "block-0.5") == pytest.approx(full / merged)
    expected = 20 * full / (8 * merged + 12 * (0.5 + 1.0 + 0.1))  # a cached step runs the merged probe
    assert prices.speedup({"full": 8, "cached": 12}, "block-0.5") == pytest.approx(expected)


def test_the_few_steps_run_compares_the_cache_with_fewer_plain_steps(model):
    results = dit_steps.run(2, (4,), model, lambda _: None)
    assert list(results) == ["4-2", "4-3"]
    assert results["4-2"]["full"] == 3 and results["4-3"]["full"] == 2  # steps 0, 2, 3 and 0, 3 of 4
    text = dit_steps.section(results, {"seeds": 2, "seconds": 1.0})
    assert text.startswith(dit_steps.BEGIN) and "| 4 | 3 | 2 |" in text and "corrected (0.75)" in text
    assert dit_steps.loses({"gain": [-1.0, -1.5, -0.2]}) and not dit_steps.loses({"gain": [-1.0, -2.0, 0.1]})


def test_the_few_steps_run_takes_the_wan_model_into_its_own_section():
    from benchmarks.lab.subjects import SUBJECTS

    wan = SUBJECTS["wan"]
    results = dit_steps.run(2, (5,), wan.random(), lambda _: None, wan)
    assert list(results) == ["5-2", "5-3"] and results["5-2"]["full"] == 3  # steps 0, 2 and 4 (the last) of 5
    assert results["5-2"]["cache"]["psnr"][0] < 100  # steps 1 and 3 were cached on the clips
    text = dit_steps.section(results, {"seeds": 2, "seconds": 1.0, "model": "wan"})
    assert text.startswith("<!-- dit-steps-wan:begin -->") and "dit_steps --model wan" in text
    assert "on Wan 2.1's schedule (shift 3)" in text and "| 5 | 2 | 3 |" in text
