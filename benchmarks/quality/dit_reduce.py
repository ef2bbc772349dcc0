"""Token reduction inside attention (``python -m benchmarks.quality.dit_reduce``; issue 52): what merging or pooling the
keys and values of the video model's self-attention keeps of plain's clip, at the few steps of distilled models and
with the step cache at 20, and what it saves at Wan 2.1's real width.

On the trained long-clip Wan-layout model (``wan-long``: 16 frames × 16 × 16 = 4,096 tokens a clip), flow-matching
Euler with CFG 4 at 4 and 8 steps (the base model: no few-step student was distilled here) and at 20; each reduction
of :mod:`benchmarks.lab.reduction` against plain at the same count, PSNR per seed (mean and worst seed) and class
accuracy over every frame. At 20 steps, our cache at its defaults (N = 3, 4) alone and with a reduction on its full
steps.

Speed: the pass priced at Wan 2.1 1.3B's width (480p, 81 frames: 21 latent frames, 32,760 tokens) from the multiply-adds
of each block (:func:`benchmarks.lab.reduction.speedup`; the reduced keys and values of 21 frames: the 10 odd frames
merged into the 11 even), the cache's steps priced as :mod:`benchmarks.speed.wan_costs`' run prices them; confirmed
(``--block``) by the process CPU time of one block at that width, plain and with ours at share 1 (interleaved rounds,
medians, one thread). At FLUX.1's width, the bound of any reduction of keys and values alone
(:func:`benchmarks.lab.reduction.flux_bound`).

    python -m benchmarks.quality.dit_reduce             # 64 seeds; writes its RESULTS.md section
    python -m benchmarks.quality.dit_reduce --seeds 16  # fewer seeds
    python -m benchmarks.quality.dit_reduce --quick     # 2 seeds, random weights, tiny clips: prints only
    python -m benchmarks.quality.dit_reduce --block 2   # one real-width block timed (2 rounds, ~7 min), into the saved run
    python -m benchmarks.quality.dit_reduce --render    # the section again from benchmarks/runs/dit-reduce.json
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import torch

from benchmarks.lab import dit, wan21
from benchmarks.lab.reduction import Reducing, Reduction, flux_bound, speedup
from benchmarks.lab.results import Section, command, load_run_data, run_command
from benchmarks.lab.subjects import SUBJECTS
from benchmarks.lab.timing import Timer
from benchmarks.lab.trained import wan
from benchmarks.lab.trained.metrics import Estimate, bootstrap, psnr_ssim

BEGIN, END = "<!-- dit-reduce:begin -->", "<!-- dit-reduce:end -->"
FEW = (4, 8)
MANY = 20
REDUCTIONS = (
    Reduction("frames"),
    Reduction("cells"),
    Reduction(share=0.5),
    Reduction(share=0.75),
    Reduction(share=1.0),
    Reduction(share=0.75, first=1),
    Reduction(share=1.0, first=1),
)
WITH_CACHE = (Reduction(share=0.5, first=1), Reduction(share=1.0, first=1))
INTERVALS = (3, 4)


def _row(samples: torch.Tensor, plain: torch.Tensor, labels: torch.Tensor, speed: float) -> dict:
    psnr, _ = psnr_ssim(samples, plain)
    return {
        "psnr": bootstrap(psnr).to_json(),
        "worst": float(psnr.min()),
        "accuracy": dit.accuracy(samples, labels).to_json(),
        "speedup": round(speed, 3),
    }


def _cached_speedup(reduction: Reduction | None, counts: dict[str, int], steps: int) -> float:
    """A cached pass at Wan 2.1's width: its full steps at the reduction's price, each cached step at the cached
    step's share of a full one (:mod:`benchmarks.speed.wan_costs`' run)."""
    costs = SUBJECTS["wan"].costs()
    full = 1 / speedup(reduction, steps) if reduction is not None else 1.0
    return steps / (counts["full"] * full + counts["cached"] * costs.cached_step() / costs.full_step())


def run(seeds: int, model, log, subject=SUBJECTS[wan.LONG_NAME], few=FEW, many=MANY) -> dict:
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    out: dict[str, dict] = {}
    for steps in (*few, many):
        plain, _ = dit.sample(model, noise, labels, steps)
        out[f"{steps}/plain"] = {"accuracy": dit.accuracy(plain, labels).to_json()}
        for reduction in REDUCTIONS if steps in few else ():
            with Reducing(reduction, model.transformer, steps):
                samples, _ = dit.sample(model, noise, labels, steps)
            out[f"{steps}/{reduction.name}"] = _row(samples, plain, labels, speedup(reduction, steps))
            log(f"{steps} steps, {reduction.name}: {out[f'{steps}/{reduction.name}']['psnr'][0]:.1f} dB")
        if steps != many:
            continue
        for n in INTERVALS:
            mode = dit.Mode(f"auto-{n}", "auto", "auto", n)
            for reduction in (None, *WITH_CACHE):
                with Reducing(reduction, model.transformer, steps):
                    samples, counts = dit.sample(model, noise, labels, steps, mode)
                name = f"{steps}/cache N={n}" + (f" + {reduction.name}" if reduction else "")
                out[name] = _row(samples, plain, labels, _cached_speedup(reduction, counts, steps))
                log(f"{name}: {out[name]['psnr'][0]:.1f} dB at {out[name]['speedup']:.2f}x")
    return out


def block_seconds(config: wan21.WanConfig, rounds: int, log) -> dict[str, list[float]]:
    """Process CPU seconds of one block at ``config``'s width (random weights), plain and with ours at share 1, in
    interleaved rounds after a warm-up."""
    block, args = wan21.block(config)
    holder = torch.nn.Module()
    holder.blocks = torch.nn.ModuleList([block])
    holder.config = SimpleNamespace(patch_size=(1, 2, 2))
    grid = (config.frames, config.rows // 2, config.cols // 2)
    seconds: dict[str, list[float]] = {"plain": [], "nearest 1": []}
    for r in range(rounds + 1):
        for name in seconds:
            with Reducing(Reduction(share=1.0) if name != "plain" else None, holder, 1) as reducing:
                reducing.grid, reducing.step = grid, 0  # the block called alone: no call of a model to read them
                with torch.no_grad(), Timer(torch.device("cpu")) as timer:
                    block(*args)
            if r:
                seconds[name].append(timer.cpu)
            log(f"block, {name}: {timer.cpu:.1f} s")
    return seconds


def section(data: dict, meta: dict) -> str:
    lines = [
        BEGIN,
        "## Token reduction inside attention (`python -m benchmarks.quality.dit_reduce`)",
        "",
        f"The trained long-clip Wan-layout video model (`benchmarks/lab/trained/weights/{wan.LONG_NAME}.md`: 16 frames × "
        f"16 × 16 = 4,096 tokens a clip), {meta['seeds']} seeds, flow-matching Euler on Wan 2.1's schedule, CFG "
        f"{dit.CFG:g}, at 4 and 8 steps (the base model: no few-step student) and at 20; {meta['seconds'] / 60:.0f} min "
        f"({meta.get('threads', 1)} torch threads). PSNR (dB) per seed against plain at the same step count: mean [bootstrap 95 %] and the worst "
        "seed; class accuracy over every frame; the pass's speed-up at Wan 2.1 1.3B's width (480p, 81 frames) from each "
        "block's multiply-adds (cached steps as `wan_costs` prices them). *nearest s*: ours "
        "(`tome_core.reduction.kv`: the share s of the odd frames' keys and values merged into their nearest "
        "neighbour in the even frames); *frames*: every two frames' keys and values pooled; *cells*: every 2 × 2 "
        "cell's (ToDo); *blocks 1+*: the first block whole.",
        "",
        "| steps | reduction | speed-up | PSNR | worst seed | accuracy |",
        "|---:|---|---:|---|---:|---|",
    ]
    for key, row in data.items():
        if key == "block":
            continue
        steps, name = key.split("/", 1)
        if name == "plain":
            accuracy = Estimate.from_json(row["accuracy"]).cell(".0%", 1)
            lines.append(f"| {steps} | plain | 1.00× | — | — | {accuracy} |")
            continue
        lines.append(
            f"| {steps} | {name} | {row['speedup']:.2f}× | {Estimate.from_json(row['psnr']).cell('.1f')} | "
            f"{row['worst']:.1f} | {Estimate.from_json(row['accuracy']).cell('.0%', 1)} |"
        )
    lines += ["", _block_text(data.get("block")), ""]
    lines.append(
        "At FLUX.1's width (1024 px: 4,096 image and 512 text tokens, hidden 3072) attention is a smaller part of each "
        f"block: with half the image's keys and values a step is {flux_bound(0.5):.2f}× faster, with a quarter "
        f"{flux_bound(0.25):.2f}×, and with none at all {flux_bound(0.0):.2f}× — reducing keys and values alone cannot "
        "reach 1.25× there."
    )
    return "\n".join([*lines, END])


def _block_text(block: dict | None) -> str:
    if block is None:
        return "One real-width block not timed in this run (`--block`)."
    plain, ours = (statistics.median(block["seconds"][k]) for k in ("plain", "nearest 1"))
    priced = speedup(Reduction(share=1.0), 1)
    return (
        f"One Wan 2.1 1.3B block at 480p × 81 frames (random weights, process CPU time, 1 thread, "
        f"{len(block['seconds']['plain'])} interleaved rounds, medians; {block['finished']}): plain {plain:.1f} s, ours at "
        f"share 1 {ours:.1f} s: {plain / ours:.2f}× (priced {priced:.2f}×)."
    )


def main(argv: list[str] | None = None) -> None:
    def measure(args) -> tuple[dict, dict]:
        start = time.perf_counter()
        subject = SUBJECTS[wan.LONG_NAME]
        if args.block:
            results, meta = load_run_data("dit-reduce")
            seconds = block_seconds(wan21.REAL, args.block, print)
            finished = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            return {**results, "block": {"seconds": seconds, "finished": finished}}, meta
        if args.quick:
            results = run(2, subject.random(), print, SUBJECTS["wan"], few=(4,), many=6)
            seeds = 2
        else:
            seeds = args.seeds
            results = run(seeds, subject.load(), print)
        return results, {"seeds": seeds, "seconds": round(time.perf_counter() - start, 1), "threads": args.threads}

    parser = command(__doc__, quick="", threads=1)
    parser.add_argument("--seeds", type=int, default=dit.SEEDS, help=f"seeds (default {dit.SEEDS})")
    parser.add_argument(
        "--block", type=int, default=0, help="time one real-width block in ROUNDS rounds, into the saved run"
    )
    run_command(parser, Section("dit-reduce", BEGIN, END, section), argv, measure)


if __name__ == "__main__":
    main()
