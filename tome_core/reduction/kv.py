"""Keys and values merged with their nearest neighbour, every query kept: attention over fewer keys and values.

A transformer's self-attention over a clip (or an image) of tokens in (frame, row, column) order runs
``softmax(q kᵀ / √d) v`` over every key. Here the keys and values of the odd frames (the *sources*) each find the
nearest key (per head, by the distance between the two keys, which bounds the change of every query's logit) among
the even frames' tokens (the *destinations*) next to them in time: the two neighbouring even frames, within
``(2 radius + 1)²`` positions around their own. The ``share`` of sources nearest to their destination are merged
into it (the size-weighted mean of keys and of values); the others stay as they are.
Attention then runs on the destinations and the sources kept, each merged key with the log of its size added to its
logits (proportional attention, ToMe's): where the merged keys are equal, it is the same attention as over all of
them. An image (one frame) pairs rows instead: odd rows into the even rows above and below.

At ``share`` 1 every source is merged and attention runs on half the keys and values (the even frames, or rows).
Text keys in front of the image's (``prefix``: FLUX's joint attention) are kept as they are.

Why by nearness and not a fixed pooling (ToDo's): on the trained Wan-layout model, merging every frame pair's keys
and values by their mean kept 23 dB, and this merge, with the same count of keys, 31 dB (8 steps, 8 seeds,
512 tokens); what moves is matched where it went, what stands still merges with itself. By the keys' distance rather
than their cosine: 30.8 against 29.7 dB there at half the keys, 38.1 against 38.4 at three quarters. Merging the keys
before the rotary embedding and placing the merged key at its destination's position kept less (25.7 dB).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _neighbours(keys: torch.Tensor, radius: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For keys (B, H, f, h, w, D) on a grid of f ≥ 2 frames: each source's (odd frame) nearness to its nearest
    destination (even frame: the one before, the one after, within ``radius`` rows and columns), the negated squared
    distance between the two keys, and that destination's index among the destinations in (frame, row, column) order;
    both (B, H, sources)."""
    dst, src = keys[:, :, 0::2], keys[:, :, 1::2]
    frames, rows, cols = dst.shape[2], dst.shape[3], dst.shape[4]
    padded = F.pad(dst, (0, 0, radius, radius, radius, radius, 0, 1))  # a frame of zeros after the last
    f = torch.arange(src.shape[2], device=keys.device).view(-1, 1, 1)
    r = torch.arange(rows, device=keys.device).view(1, -1, 1)
    c = torch.arange(cols, device=keys.device).view(1, 1, -1)
    best = torch.full(src.shape[:-1], -torch.inf, device=keys.device, dtype=keys.dtype)
    index = torch.zeros(src.shape[:-1], device=keys.device, dtype=torch.long)
    for df in (0, 1):  # source frame 2i + 1: destination frames 2i and 2i + 2
        for dr in range(-radius, radius + 1):
            for dc in range(-radius, radius + 1):
                near = padded[:, :, df : df + src.shape[2], radius + dr : radius + dr + rows]
                near = near[:, :, :, :, radius + dc : radius + dc + cols]
                inside = (f + df < frames) & (r + dr >= 0) & (r + dr < rows) & (c + dc >= 0) & (c + dc < cols)
                nearness = (near - src).square().sum(-1).neg().masked_fill(~inside, -torch.inf)
                where = ((f + df).clamp(max=frames - 1) * rows + (r + dr).clamp(0, rows - 1)) * cols
                where = where + (c + dc).clamp(0, cols - 1)
                better = nearness > best
                best = torch.where(better, nearness, best)
                index = torch.where(better, where.expand_as(index), index)
    return best.flatten(2), index.flatten(2)


def merge(
    k: torch.Tensor, v: torch.Tensor, grid: tuple[int, int, int], share: float, radius: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys and values (B, H, N, D), N = frames × rows × columns of ``grid`` in that order, with ``share`` of the
    sources merged into their nearest destination (see the module): the keys and values kept (B, H, M, D) and each
    one's log size (B, H, M: 0 for a key that stands for itself)."""
    frames, rows, cols = grid
    if frames == 1:  # an image: rows take the frames' part
        frames, rows = rows, 1
    b, h, n, d = k.shape
    if n != frames * rows * cols:
        raise ValueError(f"{n} keys do not fill a grid of {grid}")
    keys, values = k.view(b, h, frames, rows, cols, d), v.view(b, h, frames, rows, cols, d)
    best, index = _neighbours(keys, radius)
    sources = best.shape[-1]
    merged = round(share * sources)
    order = best.argsort(dim=-1, descending=True, stable=True)
    into, kept = order[..., :merged], order[..., merged:]
    target = index.gather(-1, into)
    src_k, src_v = keys[:, :, 1::2].reshape(b, h, sources, d), values[:, :, 1::2].reshape(b, h, sources, d)
    dst_k, dst_v = keys[:, :, 0::2].reshape(b, h, -1, d), values[:, :, 0::2].reshape(b, h, -1, d)

    def rows_of(t: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        return t.gather(2, at[..., None].expand(*at.shape, d))

    spread = target[..., None].expand(*target.shape, d)
    size = torch.ones(dst_k.shape[:-1], device=k.device, dtype=k.dtype).scatter_add(
        2, target, torch.ones(target.shape, device=k.device, dtype=k.dtype)
    )
    mean_k = dst_k.scatter_add(2, spread, rows_of(src_k, into)) / size[..., None]
    mean_v = dst_v.scatter_add(2, spread, rows_of(src_v, into)) / size[..., None]
    keys_out = torch.cat([mean_k, rows_of(src_k, kept)], 2)
    values_out = torch.cat([mean_v, rows_of(src_v, kept)], 2)
    log_size = torch.cat([size.log(), torch.zeros(kept.shape, device=k.device, dtype=k.dtype)], 2)
    return keys_out, values_out, log_size


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grid: tuple[int, int, int],
    share: float,
    prefix: int = 0,
    radius: int = 1,
) -> torch.Tensor:
    """``scaled_dot_product_attention(q, k, v)`` (all (B, H, N, D)) with the image's keys and values merged (see the
    module): the first ``prefix`` keys (text) as they are, the rest on ``grid``. ``share`` 0: plain SDPA, bit for bit."""
    if share <= 0:
        return F.scaled_dot_product_attention(q, k, v)
    image_k, image_v, log_size = merge(k[:, :, prefix:], v[:, :, prefix:], grid, share, radius)
    if prefix:
        image_k = torch.cat([k[:, :, :prefix], image_k], 2)
        image_v = torch.cat([v[:, :, :prefix], image_v], 2)
        log_size = torch.cat([log_size.new_zeros(*log_size.shape[:2], prefix), log_size], 2)
    return F.scaled_dot_product_attention(q, image_k, image_v, attn_mask=log_size[:, :, None, :].to(q.dtype))
