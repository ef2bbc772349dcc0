"""Token reduction inside the Wan-layout model's self-attention (issue 52), for the lab: every query kept, attention
over fewer keys and values, and its price at Wan 2.1's real width.

Methods (:class:`Reduction`), each on every block's self-attention from block ``first`` on, at the steps between
``start`` and ``end`` (fractions of the pass):

* ``nearest``: ours, :func:`tome_core.reduction.kv.attention` (each odd frame's key merged into its most similar
  neighbour in the even frames next to it; ``share`` of them);
* ``frames``: every two frames' keys and values pooled by their mean (key/value sharing between neighbouring frames);
* ``cells``: every 2 × 2 cell's keys and values pooled by their mean (ToDo's downsampling).

Applied to diffusers' ``WanTransformer3DModel`` by an attention processor on each block's ``attn1`` (its own
``WanAttnProcessor`` steps, with the reduction between the rotary embedding and SDPA), restored on exit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.lab import dit
from benchmarks.lab.wan21 import REAL, WanConfig
from tome_core.reduction import kv

METHODS = ("nearest", "frames", "cells")


@dataclass(frozen=True)
class Reduction:
    """One reduction: ``method`` (:data:`METHODS`), ``share`` of the odd frames' keys merged (``nearest``), from block
    ``first`` on, at the steps in [``start``, ``end``) of the pass (fractions)."""

    method: str = "nearest"
    share: float = 1.0
    first: int = 0
    start: float = 0.0
    end: float = 1.0

    @property
    def name(self) -> str:
        what = f"nearest {self.share:g}" if self.method == "nearest" else self.method
        where = f", blocks {self.first}+" if self.first else ""
        when = f", steps {self.start:g}–{self.end:g}" if (self.start, self.end) != (0.0, 1.0) else ""
        return what + where + when

    def kept(self, frames: int) -> float:
        """The share of the keys and values attention runs on, for clips of ``frames`` frames."""
        if self.method == "cells":
            return 0.25
        if self.method == "frames":
            return 0.5
        sources = frames // 2
        return 1 - round(self.share * sources) / frames if frames > 1 else 1 - self.share / 2

    def active(self, step: int, steps: int) -> bool:
        return self.start * steps <= step < self.end * steps


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """diffusers' Wan rotary embedding (``WanAttnProcessor``'s ``apply_rotary_emb``)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos[..., 0::2] - x2 * sin[..., 1::2]
    out[..., 1::2] = x1 * sin[..., 1::2] + x2 * cos[..., 0::2]
    return out.type_as(x)


def _pooled(t: torch.Tensor, grid: tuple[int, int, int], frames: int, side: int) -> torch.Tensor:
    b, h, _, d = t.shape
    f, r, c = grid
    return t.view(b, h, f // frames, frames, r // side, side, c // side, side, d).mean((3, 5, 7)).flatten(2, 4)


class Reducing:
    """A :class:`Reduction` on a diffusers Wan transformer for a ``with`` block over one sampling pass of ``steps``
    steps, each one call of the transformer (both guidance streams in its batch): the call's index is its step, and its
    input's token grid the clip's."""

    def __init__(self, reduction: Reduction | None, transformer: torch.nn.Module, steps: int) -> None:
        self.reduction, self.transformer, self.steps = reduction, transformer, steps
        self.step, self.grid = -1, (1, 1, 1)

    def __enter__(self) -> Reducing:
        if self.reduction is None:
            return self
        patch = self.transformer.config.patch_size
        self._saved = [block.attn1.processor for block in self.transformer.blocks]

        def read_grid(_, args, kwargs):
            x = kwargs.get("hidden_states", args[0] if args else None)
            self.grid = (x.shape[2] // patch[0], x.shape[3] // patch[1], x.shape[4] // patch[2])
            self.step += 1

        self._hook = self.transformer.register_forward_pre_hook(read_grid, with_kwargs=True)
        for index, block in enumerate(self.transformer.blocks):
            block.attn1.set_processor(self._processor(index))
        return self

    def __exit__(self, *exc) -> None:
        if self.reduction is None:
            return
        self._hook.remove()
        for block, processor in zip(self.transformer.blocks, self._saved):
            block.attn1.set_processor(processor)

    def _processor(self, index: int):
        reducing = self

        def attend(attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
            q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
            k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
            v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
            q, k = _rope(q, *rotary_emb), _rope(k, *rotary_emb)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            out = reducing.attention(index, q, k, v)
            out = out.transpose(1, 2).flatten(2, 3).type_as(q)
            return attn.to_out[1](attn.to_out[0](out))

        return attend

    def attention(self, index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        r = self.reduction
        if index < r.first or not r.active(self.step, self.steps):
            return F.scaled_dot_product_attention(q, k, v)
        if r.method == "nearest":
            return kv.attention(q, k, v, self.grid, r.share)
        frames, side = (2, 1) if r.method == "frames" else (1, 2)
        return F.scaled_dot_product_attention(
            q, _pooled(k, self.grid, frames, side), _pooled(v, self.grid, frames, side)
        )


def block_shares(config: WanConfig = REAL) -> tuple[float, float]:
    """Self-attention's scores and weighted sum (2 N d multiply-adds per token) and the rest of a block (projections,
    cross-attention, feed-forward: 6 d² + 2 T d + 2 d f) as shares of a block's work per token."""
    d, n, t = config.hidden, config.image_tokens, config.text_tokens
    scores, rest = 2 * n * d, 6 * d * d + 2 * t * d + 2 * d * config.ffn
    return scores / (scores + rest), rest / (scores + rest)


def speedup(reduction: Reduction, steps: int, config: WanConfig = REAL) -> float:
    """A pass's speed-up at ``config``'s width from the multiply-adds each block runs: plain's blocks over the
    reduction's (the model's outside, under a thousandth of a step there, left out)."""
    scores, rest = block_shares(config)
    kept = reduction.kept(config.frames)
    reduced = sum(
        (config.blocks - reduction.first) * (scores * kept + rest) + reduction.first
        if reduction.active(step, steps)
        else config.blocks
        for step in range(steps)
    )
    return steps * config.blocks / reduced


def flux_bound(kept: float, config: dit.Config = dit.REAL) -> float:
    """The speed-up of a FLUX.1 step (every block the same per token: 12 d² and attention's 2 N d over image and text
    keys) with only ``kept`` of the image's keys and values left and the text's whole: what reducing keys and values
    alone can give there (at ``kept`` 0, its ceiling)."""
    d, image, text = config.hidden, config.image_tokens, config.text_tokens
    block = 12 * d * d + 2 * (image + text) * d
    return block / (12 * d * d + 2 * (kept * image + text) * d)
