"""What one step of Wan 2.1 costs at its real width, block by block, and what a step cache could save there
(``python -m benchmarks.speed.wan_costs``; issue 36's price of a pass on the Wan-layout model).

    python -m benchmarks.speed.wan_costs            # Wan 2.1 1.3B at 480p, 81 frames, on the CPU, one thread
    python -m benchmarks.speed.wan_costs --quick    # tiny sizes: prints only (CI runs it)
    python -m benchmarks.speed.wan_costs --render   # the section again from benchmarks/runs/wan-costs-cpu.json

The block is diffusers' ``WanTransformerBlock`` (self-attention over the clip's tokens with 3-axis RoPE,
cross-attention to the text, feed-forward, each modulated by the time), random weights (Wan 2.1 1.3B: hidden 1536 = 12
heads of 128, feed-forward 8960, 30 blocks; 832 × 480 and 81 frames: 32,760 tokens; 512 text tokens). Per round,
interleaved (process CPU time, medians): ``block`` (one block's forward), ``outside`` (everything of the model's
forward outside its blocks: the model built with none), and the caches' own work as
:mod:`benchmarks.speed.dit_costs` measures it on FLUX.1 (``forecast``, ``calibrated``, ``calibration``, ``signal``:
:func:`benchmarks.lab.dit.cache_work`, on a state of the clip's tokens).

From them: a full step (``outside`` + 30 blocks), a cached step (the outside, the first block as the probe, the
calibrated forecast) and the 20-step speed-ups of the uniform schedule at N = 2 … 5. The same costs at a reduced width
and a shorter clip are checked against the whole model's forward there.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

import torch

from benchmarks.lab.dit import STEPS, Device, cache_work, costs_command, costs_table, timed
from benchmarks.lab.results import Section
from benchmarks.lab.wan21 import CHECK, QUICK, REAL, ChainCosts, WanConfig, block

BEGIN, END = "<!-- wan-costs:begin -->", "<!-- wan-costs:end -->"
KINDS = ("block", "outside", "forecast", "calibrated", "calibration", "signal")
INTERVALS = (2, 3, 4, 5)


def measure(
    config: WanConfig, rounds: int, log, whole: bool = False, device: Device = "cpu", dtype=torch.float32
) -> ChainCosts:
    """Seconds of every kind at ``config``, ``rounds`` interleaved rounds after a warm-up (``whole``: the whole model's
    forward too)."""
    device = torch.device(device)
    inputs = config.inputs(device, dtype)
    outside = config.model().to(device, dtype)
    one, args = block(config, device, dtype, inputs)
    work = {
        "block": lambda: one(*args),
        "outside": lambda: outside(**inputs, return_dict=False),
        **cache_work(config.image_tokens, config.hidden, device, dtype),
    }
    model = config.model(config.blocks).to(device, dtype) if whole else None
    forward = None if model is None else (lambda: model(**inputs, return_dict=False))
    return timed(ChainCosts(asdict(config)), {k: work[k] for k in KINDS}, rounds, forward, device, log)


def section(results: list[ChainCosts], meta: dict) -> str:
    lines = [
        BEGIN,
        "## Wan 2.1 at its real width, block by block (`python -m benchmarks.speed.wan_costs`)",
        "",
        f"CPU, float32, torch {meta['torch']}, {meta['threads']} torch thread(s); {meta['rounds']} interleaved rounds, "
        f"medians; run finished {meta['finished']} and took {meta['seconds'] / 60:.0f} min. diffusers' Wan blocks with "
        "random weights, one clip; seconds of process CPU time, and as a fraction of a full step (the model's outside "
        "and all its blocks: Wan 2.1's 30).",
        "",
        *costs_table(results, KINDS),
    ]
    lines += [
        "",
        "Derived: a cached step (the outside, the first block as the probe, the calibrated forecast), the "
        f"{STEPS}-step speed-up of the uniform schedule at N (first and last step full), self-attention's share of a "
        "block (from its multiply-adds: what Pyramid Attention Broadcast saves), and where the whole model was timed, "
        "the sum of its parts against it.",
        "",
        "| configuration | cached step | "
        + " | ".join(f"N={n}" for n in INTERVALS)
        + " | attention's share | parts / whole |",
        "|---|---:|" + "---:|" * (len(INTERVALS) + 2),
    ]
    for r in results:
        check = f"{r.full_step() / statistics.median(r.whole):.3f}" if r.whole else "—"
        speeds = " | ".join(f"{r.speedup(n):.2f}×" for n in INTERVALS)
        lines.append(
            f"| {r.blocks.name} | {r.cached_step() / r.full_step():.4f} | {speeds} | {r.attention_share():.3f} "
            f"| {check} |"
        )
    return "\n".join([*lines, END])


SECTION = Section("wan-costs-cpu", BEGIN, END, lambda data, meta: section([ChainCosts(**d) for d in data], meta))


def main(argv: list[str] | None = None) -> None:
    costs_command(__doc__, SECTION, argv, measure, QUICK, REAL, CHECK)


if __name__ == "__main__":
    main()
