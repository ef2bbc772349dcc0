"""The merging math on plain tensors: partition, plan, merge, unmerge; against a naive reference and tomesd."""

from __future__ import annotations

import pytest
import tomesd.merge
import torch

from tome_core.merging import merge as tm


def naive_merge(x: torch.Tensor, part: tm.Partition, r: int) -> torch.Tensor:
    """The paper's step, spelled out with a full similarity matrix and Python loops: the unmerged output."""
    out = torch.empty_like(x)
    for b in range(x.shape[0]):
        a = x[b, part.src] / x[b, part.src].norm(dim=-1, keepdim=True)
        d = x[b, part.dst] / x[b, part.dst].norm(dim=-1, keepdim=True)
        best, slot = (a @ d.T).max(dim=-1)
        chosen = best.argsort(descending=True)[:r].tolist()
        groups = {j: [int(part.dst[j])] for j in range(len(part.dst))}
        for i in chosen:
            groups[int(slot[i])].append(int(part.src[i]))
        for i in set(range(len(part.src))) - set(chosen):
            out[b, part.src[i]] = x[b, part.src[i]]
        for members in groups.values():
            out[b, members] = x[b, members].mean(0)
    return out


def test_partition_top_left_one_destination_per_full_cell():
    part = tm.make_partition(5, 7, sx=2, sy=2)
    grid = torch.zeros(5 * 7, dtype=torch.long)
    grid[part.dst] = 1
    grid = grid.view(5, 7)
    assert grid[0:4:2, 0:6:2].all() and grid.sum() == 2 * 3  # only full cells, top-left corner
    assert grid[4].sum() == 0 and grid[:, 6].sum() == 0  # partial edge cells give sources only
    assert sorted(torch.cat([part.src, part.dst]).tolist()) == list(range(35))


@pytest.mark.parametrize("sx,sy", [(2, 2), (3, 1), (1, 2), (4, 4)])
def test_random_partition_one_destination_in_each_cell(sx, sy):
    h, w = 9, 13
    part = tm.make_partition(h, w, sx, sy, torch.Generator().manual_seed(3))
    rows, cols = part.dst // w, part.dst % w
    cells = set(zip((rows // sy).tolist(), (cols // sx).tolist()))
    assert len(cells) == len(part.dst) == (h // sy) * (w // sx)
    assert (rows < (h // sy) * sy).all() and (cols < (w // sx) * sx).all()
    top_left = tm.make_partition(h, w, sx, sy)
    if sx * sy > 1:
        assert not torch.equal(part.dst, top_left.dst)


@pytest.mark.parametrize("r", [0, 1, 17, 40])
def test_merge_unmerge_matches_naive_paper_reference(r):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8 * 6, 16, generator=gen)
    part = tm.make_partition(6, 8, 2, 2, torch.Generator().manual_seed(1))
    plan = tm.plan_merge(x, part, r)
    merged = plan.merge(x)
    assert merged.shape == (2, 48 - min(r, len(part.src)), 16)
    torch.testing.assert_close(plan.unmerge(merged), naive_merge(x, part, min(r, len(part.src))))


def test_chunking_changes_nothing():
    x = torch.randn(3, 40 * 30, 24, generator=torch.Generator().manual_seed(0))
    part = tm.make_partition(30, 40, 2, 2)
    whole = tm.plan_merge(x, part, 500, chunk_bytes=2**40)
    tiny = tm.plan_merge(x, part, 500, chunk_bytes=1)
    assert torch.equal(whole.unmerge(whole.merge(x)), tiny.unmerge(tiny.merge(x)))


@pytest.mark.parametrize(
    "h,w,sx,sy,ratio", [(16, 16, 2, 2, 0.5), (33, 49, 2, 2, 0.3), (9, 31, 3, 1, 0.6), (20, 12, 4, 4, 0.75)]
)
def test_against_tomesd_top_left(h, w, sx, sy, ratio):
    x = torch.randn(2, h * w, 32, generator=torch.Generator().manual_seed(h))
    r = int(h * w * ratio)
    m_ref, u_ref = tomesd.merge.bipartite_soft_matching_random2d(x, w, h, sx, sy, r, no_rand=True)
    plan = tm.plan_merge(x, tm.make_partition(h, w, sx, sy), r)
    ref_merged, ours_merged = m_ref(x), plan.merge(x)
    assert ref_merged.shape == ours_merged.shape
    # same multiset of merged tokens (their order inside the merged sequence is free)
    key = lambda t: t.sum(-1).sort(dim=-1).values  # noqa: E731
    torch.testing.assert_close(key(ours_merged), key(ref_merged))
    y = torch.randn_like(ref_merged)
    torch.testing.assert_close(plan.unmerge(plan.merge(x)), u_ref(m_ref(x)))
    assert plan.unmerge(y).shape == x.shape


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_with_large_activations(dtype):
    # values around 300: squared norms overflow float16 unless computed in float32
    x = (torch.randn(2, 64, 64, generator=torch.Generator().manual_seed(0)) * 300).to(dtype)
    plan = tm.plan_merge(x, tm.make_partition(8, 8, 2, 2), 32)
    out = plan.unmerge(plan.merge(x))
    assert out.dtype == dtype and torch.isfinite(out).all()
    ref = tm.plan_merge(x.float(), tm.make_partition(8, 8, 2, 2), 32)
    for ours, exact in zip(plan.merge_src.tolist(), ref.merge_src.tolist()):
        # the low-precision matmul may swap near-ties, never most of the choice
        assert len(set(ours) & set(exact)) >= 0.9 * len(exact)
