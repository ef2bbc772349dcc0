"""Keys and values merged with their nearest neighbour (tome_core.reduction.kv): the attention it runs is plain SDPA's
where it merges nothing, and where the keys and values it merges are equal; otherwise the proportional attention over
the merged keys (each merged key counted as many times as the keys it stands for)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tome_core.reduction import kv


def _qkv(b: int, h: int, n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=gen, dtype=torch.float64) for _ in range(3))


def _pairs(x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
    """``x`` (B, H, N, D) on ``grid`` with every odd frame a copy of the even frame before it."""
    b, h, _, d = x.shape
    frames = x.view(b, h, *grid, d).clone()
    frames[:, :, 1::2] = frames[:, :, 0::2][:, :, : frames[:, :, 1::2].shape[2]]
    return frames.reshape(b, h, -1, d)


def test_merging_nothing_is_plain_sdpa_bit_for_bit() -> None:
    q, k, v = _qkv(2, 3, 5 * 4 * 6, 8)
    assert torch.equal(kv.attention(q, k, v, (5, 4, 6), 0.0), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("grid", [(5, 4, 6), (4, 3, 3), (1, 6, 5)])
def test_equal_neighbours_merge_into_the_same_attention(grid: tuple[int, int, int]) -> None:
    """A clip whose odd frames repeat the even ones (an image whose odd rows repeat the even ones): every source finds
    its copy, and attention over half the keys, each counted twice, is plain attention."""
    n = grid[0] * grid[1] * grid[2]
    q, k, v = _qkv(2, 3, n, 8, seed=1)
    pair_grid = grid if grid[0] > 1 else (grid[1], 1, grid[2])
    k, v = _pairs(k, pair_grid), _pairs(v, pair_grid)
    keys, _, log_size = kv.merge(k, v, grid, 1.0)
    assert keys.shape[2] == -(-pair_grid[0] // 2) * pair_grid[1] * pair_grid[2]
    out = kv.attention(q, k, v, grid, 1.0)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-12)
    assert torch.allclose(log_size.exp().sum(-1), torch.full(log_size.shape[:2], float(n), dtype=torch.float64))


def test_merged_keys_count_as_many_as_they_stand_for() -> None:
    """Proportional attention: the same as attention over each kept key repeated its size times."""
    q, k, v = _qkv(1, 2, 6 * 4 * 4, 8, seed=2)
    keys, values, log_size = kv.merge(k, v, (6, 4, 4), 0.7)
    assert keys.shape[2] == 6 * 16 - round(0.7 * 3 * 16)
    out = kv.attention(q, k, v, (6, 4, 4), 0.7)
    for head in range(2):
        times = log_size[0, head].exp().round().long()
        reference = F.scaled_dot_product_attention(
            q[0, head], keys[0, head].repeat_interleave(times, 0), values[0, head].repeat_interleave(times, 0)
        )
        assert torch.allclose(out[0, head], reference, atol=1e-12)


def test_the_nearest_sources_merge_first() -> None:
    """With half the sources merged, those that have an equal key next to them are the ones merged."""
    _, k, v = _qkv(1, 1, 4 * 3 * 3, 4, seed=3)
    grid = (4, 3, 3)
    copied = _pairs(k, grid).view(1, 1, *grid, 4)
    own = k.view(1, 1, *grid, 4)
    mixed = own.clone()
    mixed[:, :, 1] = copied[:, :, 1]  # frame 1 copies frame 0; frame 3 is its own
    keys, _, log_size = kv.merge(mixed.reshape(1, 1, -1, 4), v, grid, 0.5)
    assert (log_size[0, 0, :9].exp().round() == 2).all()  # frame 0's tokens took frame 1's
    kept = keys[0, 0, 18:]  # the sources not merged: frame 3's, each itself
    assert keys.shape[2] == 27 and (torch.cdist(kept, own[0, 0, 3].reshape(9, 4)).min(1).values < 1e-12).all()


def test_text_keys_in_front_are_kept() -> None:
    q, k, v = _qkv(1, 2, 7 + 4 * 4 * 2, 8, seed=4)
    k = torch.cat([k[:, :, :7], _pairs(k[:, :, 7:], (4, 4, 2))], 2)
    v = torch.cat([v[:, :, :7], _pairs(v[:, :, 7:], (4, 4, 2))], 2)
    out = kv.attention(q, k, v, (4, 4, 2), 1.0, prefix=7)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-12)


def test_deterministic_and_the_inputs_left_alone() -> None:
    q, k, v = _qkv(2, 2, 6 * 4 * 4, 8, seed=5)
    before = k.clone(), v.clone()
    first = kv.attention(q, k, v, (6, 4, 4), 0.8)
    assert torch.equal(first, kv.attention(q, k, v, (6, 4, 4), 0.8))
    assert torch.equal(k, before[0]) and torch.equal(v, before[1])


def test_a_grid_the_keys_do_not_fill_is_refused() -> None:
    q, k, v = _qkv(1, 1, 30, 4)
    with pytest.raises(ValueError, match=r"30 keys do not fill a grid of \(2, 4, 4\)"):
        kv.attention(q, k, v, (2, 4, 4), 0.5)
