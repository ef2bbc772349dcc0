"""Token merging math (ToMe for SD, Bolya & Hoffman 2023, arXiv 2303.17604), written from the paper.

Tokens of one UNet level form an ``h x w`` grid. The grid is cut into ``sy x sx`` cells and each cell
gives one *destination* token (random or top-left); every other token is a *source*. Each source
finds its most cosine-similar destination; the ``r`` sources with the highest similarity are averaged
into their destinations (merge), the result goes through the layer, and every token then reads the
value of the token it was merged into (unmerge).

All functions are pure torch and device-agnostic (CPU, CUDA, MPS).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Bytes of the similarity matrix computed at once. Chunking bounds the plan's temporary memory to
# O(N x C + chunk) instead of O(sources x destinations) without changing any result. On a CPU a chunk
# that stays in cache between the matmul and the row max is also ~2x faster than the whole matrix;
# on accelerators larger chunks keep the number of kernel launches small.
CPU_CHUNK_BYTES = 4 * 2**20
ACCELERATOR_CHUNK_BYTES = 64 * 2**20
MIN_CHUNK_ROWS = 16


def default_chunk_bytes(device: torch.device | str) -> int:
    """The similarity chunk size used on ``device`` when none is given."""
    return CPU_CHUNK_BYTES if torch.device(device).type == "cpu" else ACCELERATOR_CHUNK_BYTES


@dataclass(frozen=True)
class Partition:
    """Split of an ``h x w`` token grid into source and destination token indices (1-D)."""

    src: torch.Tensor
    dst: torch.Tensor


def make_partition(
    h: int, w: int, sx: int, sy: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
) -> Partition:
    """One destination per full ``sy x sx`` cell: the top-left token, or a random one drawn from ``generator``.

    Tokens in the partial cells at the right and bottom edges are all sources. The draw happens on the
    CPU (so every device gives the same partition for the same generator state).
    """
    hs, ws = h // sy, w // sx
    if generator is None:
        offset = torch.zeros(hs, ws, dtype=torch.long)
    else:
        offset = torch.randint(sy * sx, (hs, ws), generator=generator, dtype=torch.long)
    rows = torch.arange(hs).unsqueeze(1) * sy + offset // sx
    cols = torch.arange(ws).unsqueeze(0) * sx + offset % sx
    marker = torch.zeros(h * w, dtype=torch.long)
    marker[(rows * w + cols).flatten()] = -1
    # Destinations first, in the order a sort of the marker gives on this device: the same token order
    # as tomesd's, so that results are bit-identical to it (attention sums depend on the order).
    order = _upload(marker, torch.device(device)).view(1, -1, 1).argsort(dim=1).flatten()
    return Partition(src=order[hs * ws :], dst=order[: hs * ws])


def _upload(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without stalling the host: a plain host-to-CUDA copy waits for the stream to
    finish its queued work; one from pinned memory is queued behind it (torch keeps the pinned block alive
    until the copy is done)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@dataclass(frozen=True)
class MergePlan:
    """Which tokens merge where, for a batch of ``B`` sequences of ``N`` tokens.

    The merged sequence is ``[kept sources (N - Nd - r), destinations (Nd)]``.
    """

    num_tokens: int
    batch: int
    keep_src: torch.Tensor  # (B, N - Nd - r) token indices of the sources that stay
    merge_src: torch.Tensor  # (B, r) token indices of the sources that are merged
    merge_into: torch.Tensor  # (B, r) destination slot (0..Nd-1) each merged source goes to
    dst: torch.Tensor  # (Nd,) token indices of the destinations
    counts: torch.Tensor  # (B, Nd, 1) how many tokens each destination averages (itself included)
    gather_back: torch.Tensor  # (B, N) row of the merged sequence each original token reads on unmerge

    def merge(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, C) -> (B, N - r, C): drop the merged sources, average them into their destinations."""
        b, _, c = x.shape
        kept = x.gather(1, self.keep_src.unsqueeze(-1).expand(b, -1, c))
        dst = x.index_select(1, self.dst)
        if self.merge_src.shape[1]:
            moved = x.gather(1, self.merge_src.unsqueeze(-1).expand(b, -1, c))
            dst = dst.scatter_add(1, self.merge_into.unsqueeze(-1).expand(b, -1, c), moved)
            dst = dst / self.counts.to(x.dtype)
        return torch.cat([kept, dst], dim=1)

    def unmerge(self, y: torch.Tensor) -> torch.Tensor:
        """(B, N - r, C) -> (B, N, C): every token takes the value of the token it was merged into."""
        b, _, c = y.shape
        return y.gather(1, self.gather_back.unsqueeze(-1).expand(b, -1, c))


def _normalized(x: torch.Tensor) -> torch.Tensor:
    """Unit-length rows, computed in float32 so that half-precision norms cannot overflow."""
    x32 = x.float()
    return (x32 / x32.norm(dim=-1, keepdim=True)).to(x.dtype)


def best_destinations(
    metric: torch.Tensor, part: Partition, chunk_bytes: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each source: the highest cosine similarity to any destination and that destination's slot.

    Works through the sources in chunks of about ``chunk_bytes`` of scores (at least
    :data:`MIN_CHUNK_ROWS` rows), so the similarity matrix never exists whole: the extra memory is the
    normalised tokens (N x C) plus one chunk. Returns ``(best, slot)``, both (B, Ns).
    """
    b = metric.shape[0]
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(metric.device)
    unit = _normalized(metric)
    dst = unit.index_select(1, part.dst).transpose(1, 2)  # (B, C, Nd)
    src = unit.index_select(1, part.src)  # (B, Ns, C)
    del unit
    num_dst, num_src = part.dst.numel(), part.src.numel()
    rows = min(num_src, max(MIN_CHUNK_ROWS, chunk_bytes // max(1, b * num_dst * metric.element_size())))
    best = metric.new_empty(b, num_src)
    slot = torch.empty(b, num_src, dtype=torch.long, device=metric.device)
    scores = metric.new_empty(b, rows, num_dst)
    for start in range(0, num_src, rows):
        stop = min(start + rows, num_src)
        chunk = torch.bmm(src[:, start:stop], dst, out=scores[:, : stop - start])
        best[:, start:stop], slot[:, start:stop] = chunk.max(dim=-1)
    return best, slot


def plan_merge(metric: torch.Tensor, part: Partition, r: int, chunk_bytes: int | None = None) -> MergePlan:
    """Bipartite soft matching: merge the ``r`` sources most similar to their best destination.

    The merged token order is the one a descending argsort of the best similarities gives (tomesd's),
    so that attention sums, and with them the outputs, are bit-identical to tomesd's.
    """
    b, n, _ = metric.shape
    num_dst = part.dst.numel()
    r = max(0, min(r, part.src.numel()))
    with torch.no_grad():
        best, slot = best_destinations(metric, part, chunk_bytes)
        order = best.argsort(dim=-1, descending=True)
        src = part.src.unsqueeze(0).expand(b, -1)
        chosen, rest = order[:, :r], order[:, r:]
        keep_src = src.gather(1, rest)
        merge_src = src.gather(1, chosen)
        merge_into = slot.gather(1, chosen)
        counts = torch.ones(b, num_dst, dtype=torch.long, device=metric.device)
        counts.scatter_add_(1, merge_into, torch.ones_like(merge_into))
        # Row of the merged sequence [kept sources, destinations] that each original token reads back.
        num_keep = keep_src.shape[1]
        gather_back = torch.empty(b, n, dtype=torch.long, device=metric.device)
        gather_back.scatter_(1, keep_src, torch.arange(num_keep, device=metric.device).expand(b, -1))
        gather_back[:, part.dst] = torch.arange(num_keep, num_keep + num_dst, device=metric.device)
        gather_back.scatter_(1, merge_src, merge_into + num_keep)
    return MergePlan(n, b, keep_src, merge_src, merge_into, part.dst, counts.unsqueeze(-1), gather_back)


def downsample_tokens(x: torch.Tensor, h: int, w: int, factor: int) -> torch.Tensor:
    """(B, h*w, C) -> (B, ceil(h/f)*ceil(w/f), C): keep every ``factor``-th token per side (ToDo's strided,
    nearest-neighbour subsampling of the token grid, arXiv 2402.13573)."""
    if factor <= 1:
        return x
    b, _, c = x.shape
    return x.view(b, h, w, c)[:, ::factor, ::factor].reshape(b, -1, c)
