"""Wan 2.1 at its real width: its configurations, the costs of its blocks (one chain of 30 alike, measured by
:mod:`benchmarks.speed.wan_costs`) and the prices that turn a pass on the trained Wan-layout model into a speed-up
there. The video side of :mod:`benchmarks.lab.dit` (FLUX.1's): the same kinds of cost, one kind of block.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from benchmarks.lab.dit import BlockCosts, Device, Group


@dataclass(frozen=True)
class WanConfig:
    """A Wan-layout model's width and sequence: ``heads`` × ``head_dim`` hidden, feed-forward ``ffn``, a clip of
    ``frames`` × ``rows`` × ``cols`` latents (16 channels, cut into 1×2×2 patches), ``text_tokens`` of umT5's 4096
    channels, ``blocks`` blocks (Wan 2.1 1.3B: 12 × 128, 8960, 30)."""

    name: str
    heads: int
    head_dim: int
    ffn: int
    frames: int
    rows: int
    cols: int
    text_tokens: int = 512
    blocks: int = 30

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def image_tokens(self) -> int:
        return self.frames * (self.rows // 2) * (self.cols // 2)

    def model(self, blocks: int = 0) -> torch.nn.Module:
        """``WanTransformer3DModel`` at this width with ``blocks`` blocks (random weights)."""
        from diffusers import WanTransformer3DModel

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return WanTransformer3DModel(
                patch_size=(1, 2, 2),
                num_attention_heads=self.heads,
                attention_head_dim=self.head_dim,
                in_channels=16,
                out_channels=16,
                text_dim=4096,
                freq_dim=256,
                ffn_dim=self.ffn,
                num_layers=blocks,
                cross_attn_norm=True,
                qk_norm="rms_norm_across_heads",
            ).eval()

    def inputs(self, device: Device = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """The model's inputs for one clip: latents, umT5 text, the time on Wan's 0–1000 scale; on ``device``."""
        gen = torch.Generator().manual_seed(0)
        inputs = {
            "hidden_states": torch.randn(1, 16, self.frames, self.rows, self.cols, generator=gen),
            "encoder_hidden_states": torch.randn(1, self.text_tokens, 4096, generator=gen),
        }
        return {k: v.to(device, dtype) for k, v in inputs.items()} | {"timestep": torch.tensor([600.0], device=device)}


REAL = WanConfig("Wan 2.1 1.3B, 480p, 81 frames", 12, 128, 8960, 21, 60, 104)
"""Wan 2.1 T2V 1.3B at 832 × 480 and 81 frames: 21 latent frames of 60 × 104, 32,760 tokens."""
CHECK = WanConfig("Wan 2.1 layout, hidden 256, 480p, 17 frames", 2, 128, 1536, 5, 60, 104)
QUICK = WanConfig("tiny", 2, 32, 128, 2, 8, 8, 8, 3)


class ChainCosts(BlockCosts):
    """One Wan configuration's seconds per kind (``block`` for every block; the other kinds as FLUX.1's)."""

    @property
    def blocks(self) -> WanConfig:  # type: ignore[override]
        return WanConfig(**self.config)

    def full_step(self) -> float:
        return self.cost("outside") + self.blocks.blocks * self.cost("block")

    def probe(self) -> float:
        return self.cost("block")

    def groups(self) -> list[Group]:
        return [Group(self.blocks.blocks, self.cost("block"), self.attention_share())]

    def attention_share(self) -> float:
        """Self-attention's share of a block, from its multiply-adds per image token (hidden d, N image and T text
        tokens, feed-forward f): q, k, v, out (4d²) and attention (2Nd) of those, cross-attention's q and out (2d²)
        and its attention (2Td; its k and v run on the text), and the feed-forward (2df)."""
        c = self.blocks
        d, n, t = c.hidden, c.image_tokens, c.text_tokens
        attention = 4 * d * d + 2 * n * d
        return attention / (attention + 2 * d * d + 2 * t * d + 2 * d * c.ffn)


def block(
    config: WanConfig,
    device: Device = "cpu",
    dtype: torch.dtype = torch.float32,
    inputs: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.nn.Module, tuple]:
    """One block at ``config``'s width (random weights) and the arguments the model hands its blocks for
    :meth:`WanConfig.inputs` (the image tokens, the text, the time's modulation, the RoPE), on ``device`` in
    ``dtype``: caught on their way into the first block of a one-block model, which then does not run."""
    inputs = config.inputs(device, dtype) if inputs is None else inputs
    one = config.model(blocks=1).to(device, dtype)
    caught: list[tuple] = []

    class Caught(Exception):
        pass

    def catch(_, args):
        caught.append(args)
        raise Caught

    handle = one.blocks[0].register_forward_pre_hook(catch)
    try:
        with torch.no_grad(), contextlib.suppress(Caught):
            one(**inputs, return_dict=False)
    finally:
        handle.remove()
    return one.blocks[0], caught[0]
