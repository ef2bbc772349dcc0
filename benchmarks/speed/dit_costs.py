"""What one step of FLUX.1 costs at its real width, block by block, and what a step cache could save there
(``python -m benchmarks.speed.dit_costs``; issue 26's speed at real width).

    python -m benchmarks.speed.dit_costs            # FLUX.1 at 1024 px on the CPU, one thread (a few minutes)
    python -m benchmarks.speed.dit_costs --quick    # tiny sizes: prints only (CI runs it)
    python -m benchmarks.speed.dit_costs --render   # the section again from benchmarks/runs/dit-costs-cpu.json

The blocks are diffusers' ``FluxTransformerBlock`` (double stream) and ``FluxSingleTransformerBlock`` (single
stream), random weights, built one at a time (FLUX.1's width: hidden 3072 = 24 heads of 128; 4096 image tokens at
1024 px and 512 text tokens). Per round, interleaved (process CPU time, medians):

* ``double``, ``single``: one block's forward;
* ``outside``: everything of the model's forward outside its blocks (embeddings, RoPE, the final norm and
  projection: the model built with no blocks);
* ``forecast`` / ``calibrated``: our linear / calibrated forecast (:class:`tome_core.caching.forecast.Forecast`) of a hidden
  state as large as the joint sequence, and ``calibration``: the calibrated one's update at a full step;
* ``signal``: the relative L1 change of a probe's output (First Block Cache's decision, on every 4th token and
  channel as our adaptive schedule subsamples).

From them: a full step (``outside`` + 19 double + 38 single blocks), a cached step that runs the model's outside
and its first double block as the probe and forecasts the rest, and the 20-step speed-ups of the uniform schedule
at N = 2 … 5 (first and last step full). The same costs at a reduced width are checked against the whole model's
forward at that width (all 57 blocks): the sum of the parts within a few percent of the whole.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

import torch

from benchmarks.lab.dit import (
    CHECK,
    QUICK,
    REAL,
    STEPS,
    BlockCosts,
    Config,
    Device,
    blocks,
    cache_work,
    costs_command,
    costs_table,
    timed,
)
from benchmarks.lab.results import Section

BEGIN, END = "<!-- dit-costs:begin -->", "<!-- dit-costs:end -->"
KINDS = ("double", "single", "outside", "forecast", "calibrated", "calibration", "signal")
INTERVALS = (2, 3, 4, 5)


def measure(
    config: Config, rounds: int, log, whole: bool = False, device: Device = "cpu", dtype: torch.dtype = torch.float32
) -> BlockCosts:
    """Seconds of every kind at ``config``, ``rounds`` interleaved rounds after a warm-up (``whole``: the whole model's
    forward too), on ``device`` in ``dtype`` (CUDA: GPU time from events)."""
    device = torch.device(device)
    inputs = config.inputs(device, dtype)
    outside = config.model().to(device, dtype)
    double, single, block_kwargs = blocks(config, device, dtype, outside, inputs)
    work = {
        "double": lambda: double(**block_kwargs),
        "single": lambda: single(**block_kwargs),
        "outside": lambda: outside(**inputs, return_dict=False),
        **cache_work(config.image_tokens + config.text_tokens, config.hidden, device, dtype),
    }
    model = config.model(config.double, config.single).to(device, dtype) if whole else None
    forward = None if model is None else (lambda: model(**inputs, return_dict=False))
    return timed(BlockCosts(asdict(config)), {k: work[k] for k in KINDS}, rounds, forward, device, log)


def section(results: list[BlockCosts], meta: dict) -> str:
    lines = [
        BEGIN,
        "## FLUX.1 at its real width, block by block (`python -m benchmarks.speed.dit_costs`)",
        "",
        f"CPU, float32, torch {meta['torch']}, {meta['threads']} torch thread(s); {meta['rounds']} interleaved rounds, "
        f"medians; run finished {meta['finished']} and took {meta['seconds'] / 60:.0f} min. diffusers' FLUX blocks with "
        "random weights, one image; seconds of process CPU time, and as a fraction of a full step (the model's outside "
        "and all its double- and single-stream blocks: FLUX.1's 19 and 38).",
        "",
        *tables(results),
        END,
    ]
    return "\n".join(lines)


def tables(results: list[BlockCosts]) -> list[str]:
    """The costs and the speed-ups derived from them (seconds of whatever clock measured them)."""
    lines = costs_table(results, KINDS)
    lines += [
        "",
        "Derived: a cached step (the outside, the first double block as the probe, the calibrated forecast) and the "
        f"{STEPS}-step speed-up of the uniform schedule at N (first and last step full); where the whole model was "
        "timed at that width, the sum of its parts against it.",
        "",
        "| configuration | cached step | " + " | ".join(f"N={n}" for n in INTERVALS) + " | parts / whole |",
        "|---|---:|" + "---:|" * (len(INTERVALS) + 1),
    ]
    for r in results:
        check = f"{r.full_step() / statistics.median(r.whole):.3f}" if r.whole else "—"
        speeds = " | ".join(f"{r.speedup(n):.2f}×" for n in INTERVALS)
        lines.append(f"| {r.blocks.name} | {r.cached_step() / r.full_step():.4f} | {speeds} | {check} |")
    return lines


SECTION = Section("dit-costs-cpu", BEGIN, END, lambda data, meta: section([BlockCosts(**d) for d in data], meta))


def main(argv: list[str] | None = None) -> None:
    costs_command(__doc__, SECTION, argv, measure, QUICK, REAL, CHECK)


if __name__ == "__main__":
    main()
