"""The benchmark suite: seconds per UNet forward, speed-up, fidelity and plan memory of every ToMe variant.

    python -m benchmarks.speed.suite            # full run (< 30 min on a 2-core CPU)
    python -m benchmarks.speed.suite --quick    # 512/1024 px subset (< 5 min), printed only

Real ldm UNets (SD1.5 layout, and ldm configured like SDXL: attention at downsample 2 and 4 only),
random weights with the zero-initialised output layers re-initialised (benchmarks/lab/models.py), natural-image
latents. Variants are interleaved round by round in one process (A, B, C, … then again), and the table
holds medians over rounds. Timing: process CPU time (stable on a shared machine) and wall time; the
speed-up is from CPU time. On CUDA the suite runs in float16 and times with CUDA events (the host
synchronises only around each timed region), after a warm-up round of every variant.

Variants (ratio 0.5, top-left destinations so that outputs are comparable with tomesd's):
  baseline, tomesd 0.1.3 (max_downsample = ours resolved), ours exact (the default), share_plan,
  plan_interval=2, share_plan + plan_interval=2, downsample (ToDo, factor 2), and the limit: exact
  merging whose plans were computed in an untimed forward beforehand (``Planner.freeze_plans``) — the
  same token counts and merge/unmerge gathers, the plan free.

Writes its section of benchmarks/RESULTS.md (between markers; other sections are kept) and
benchmarks/speedup.png.

    python -m benchmarks.speed.suite --real --rounds 2 --deadline 06:15   # the shipped widths (73 min on the CPU)

``--real`` (the default on CUDA) runs the shipped SD1.5 and SDXL architectures at 1024 px (and SD1.5 at
512 px) with baseline, tomesd, ours exact, share_plan + plan_interval 2, ToDo and the limit, and writes
its own section (rendered from benchmarks/runs/real-<device>.json; ``--render`` renders it again).
The GPU command with the sampling table is ``python -m benchmarks.gpu``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import tomesd
import tomesd.merge
import torch

import tome_core
from benchmarks.lab.alloc import AllocationTracker
from benchmarks.lab.models import RATIO, REAL, Config, Holder, ours, photo_latents
from benchmarks.lab.results import (
    RESULTS,
    command,
    load_run_data,
    mib,
    run_meta,
    save_run_data,
    verdict,
    write_section,
)
from benchmarks.lab.timing import Timer, device_and_dtype, prepare
from tome_core.merging import merge as tm

ROOT = Path(__file__).resolve().parents[2]
PLOT = ROOT / "benchmarks" / "speedup.png"
BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"
INTERVAL = 2
REUSE = ("interval", "share+interval")  # timed over two steps: one computes the plan, one reuses it
VARIANTS = ("baseline", "tomesd", "exact", "share", "interval", "share+interval", "downsample", "limit")
LABELS = {
    "baseline": "baseline",
    "tomesd": "tomesd 0.1.3",
    "exact": "ours: exact (default)",
    "share": "ours: share_plan",
    "interval": f"ours: plan_interval={INTERVAL}",
    "share+interval": f"ours: share_plan + plan_interval={INTERVAL}",
    "downsample": "ours: downsample (ToDo, factor 2)",
    "limit": "limit (plan free)",
}


REAL_VARIANTS = ("baseline", "tomesd", "exact", "share+interval", "downsample", "limit")


FULL = (
    Config("sd15", 512, 64, 2),
    Config("sd15", 1024, 64, 2),
    Config("sd15", 1536, 32, 1),
    Config("sd15", 2048, 32, 1),
    Config("sdxl", 1024, 32, 2),
    Config("sdxl", 1536, 32, 1),
    Config("sdxl", 2048, 32, 1),
)
BIG_PX = 1024  # above this, one round fewer (the largest sizes dominate the run time)
QUICK = (Config("sd15", 512, 64, 2), Config("sd15", 1024, 32, 1), Config("sdxl", 1024, 32, 1))
# --real: SD1.5 1024 px first, so that a run cut short by --deadline keeps its rounds (the targets read it)
REAL_CONFIGS = (
    Config("sd15", 1024, 320, 2, True),
    Config("sdxl", 1024, 320, 1, True),
    Config("sd15", 512, 320, 2, True),
)


@dataclass
class Row:
    variant: str
    cpu: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    error: float = 0.0
    plan_bytes: int | None = None
    peak_bytes: int | None = None  # CUDA: peak memory allocated during the variant's timed forwards

    @property
    def cpu_s(self) -> float:
        return statistics.median(self.cpu)

    @property
    def wall_s(self) -> float:
        return statistics.median(self.wall)


@dataclass
class Result:
    config: Config
    rows: dict[str, Row]
    tomesd_equal: float  # relative difference exact vs tomesd

    def speedup(self, variant: str) -> float:
        return self.rows["baseline"].cpu_s / self.rows[variant].cpu_s

    def to_json(self) -> dict:
        return {
            "config": vars(self.config),
            "rows": {v: vars(r) for v, r in self.rows.items()},
            "tomesd_equal": self.tomesd_equal,
        }

    @classmethod
    def from_json(cls, data: dict) -> Result:
        rows = {v: Row(**r) for v, r in data["rows"].items()}
        return cls(Config(**data["config"]), rows, data["tomesd_equal"])


def save_run(name: str, results: list[Result], meta: dict) -> Path:
    return save_run_data(name, [r.to_json() for r in results], meta)


def load_run(name: str) -> tuple[list[Result], dict]:
    data, meta = load_run_data(name)
    return [Result.from_json(r) for r in data], meta


# --- variants -------------------------------------------------------------------------------------


def level_downsample(layout: str) -> int:
    return 1 if layout == "sd15" else 2


def switch(unet: torch.nn.Module, variant: str, layout: str) -> tome_core.Session | None:
    """Leave ``unet`` patched as ``variant`` wants (the limit's plans are filled by the caller)."""
    tome_core.remove_patch(unet)
    tomesd.remove_patch(Holder(unet))
    if variant == "baseline":
        return None
    if variant == "tomesd":
        tomesd.apply_patch(Holder(unet), ratio=RATIO, max_downsample=level_downsample(layout), use_rand=False)
        return None
    extra = {
        "exact": {},
        "limit": {},
        "share": {"share_plan": True},
        "interval": {"plan_interval": INTERVAL},
        "share+interval": {"share_plan": True, "plan_interval": INTERVAL},
        "downsample": {"method": "downsample", "downsample_factor": 2},
    }[variant]
    return ours(unet, **extra)


class Stepper:
    """Reports a new sampling step before every forward, as the WebUI script does."""

    def __init__(self) -> None:
        self.step = 0

    def __call__(self, patch: tome_core.Session | None) -> None:
        self.step += 1
        if patch is not None:
            patch.set_progress(self.step / 1e6)


def plan_memory(config: Config, variant: str, metric: torch.Tensor, h: int, w: int) -> int | None:
    """Peak bytes the variant's merge plan allocates for one first-level block (None: it has no plan)."""
    if variant in ("baseline", "downsample", "limit"):
        return None
    r = int(metric.shape[1] * RATIO)
    with torch.no_grad(), AllocationTracker() as tracker:
        if variant == "tomesd":
            tomesd.merge.bipartite_soft_matching_random2d(metric, w, h, 2, 2, r, no_rand=True)
        else:
            tm.plan_merge(metric, tm.make_partition(h, w, 2, 2, device=metric.device), r)
    return tracker.peak_bytes


def run_config(
    config: Config,
    rounds: int,
    log: Callable[[str], None],
    variants: tuple[str, ...] = VARIANTS,
    warmup_round: bool = False,
    unet: torch.nn.Module | None = None,
) -> Result:
    """Time ``variants`` on ``config``, interleaved round by round, after an untimed baseline forward (and,
    with ``warmup_round``, an untimed round of every variant: kernel selection and the allocator on a GPU).
    ``unet``: the configuration's model, already built and prepared (else it is built here)."""
    device, dtype = device_and_dtype()
    unet = unet if unet is not None else prepare(config.build(), device, dtype)
    side = config.px // 8
    x = photo_latents(config.batch, side, side).to(device, dtype)
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    t = torch.full((config.batch,), 601.0, device=device)
    ctx, extra = config.conditioning()
    ctx = ctx.to(device, dtype)
    extra = {k: v.to(device, dtype) for k, v in extra.items()}
    rows = {v: Row(v) for v in variants}
    step = Stepper()

    def forward(xx: torch.Tensor, tt: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return unet(xx, tt, ctx, **extra)

    # fidelity comes from the first timed round's outputs (every variant on the same input); the plan
    # reuse variants are timed over two steps, the second at a latent moved by a little noise and a
    # timestep 20 lower, reusing the first step's plan: their error is that second step's. This
    # untimed forward is also the configuration's warm-up.
    x2, t2 = x + 0.05 * noise, t - 20
    base2 = forward(x2, t2).float()
    outputs: dict[str, torch.Tensor] = {}

    # plan memory on the first level's token count and width
    level = level_downsample(config.layout)
    hl, wl = math.ceil(side / level), math.ceil(side / level)
    metric = torch.randn(config.batch, hl * wl, config.channels * level, device=device, dtype=dtype)
    for variant in variants:
        rows[variant].plan_bytes = plan_memory(config, variant, metric, hl, wl)
    del metric

    # timing: interleaved rounds (round -1: the warm-up round, untimed)
    for r in range(-1 if warmup_round else 0, rounds):
        for variant in variants:
            patch = switch(unet, variant, config.layout)
            if variant == "limit":
                assert patch is not None
                patch.merger.planner.freeze_plans = True
                forward(x, t)  # untimed: computes and keeps every block's plan, which are then reused
            inputs = [(x, t), (x2, t2)] if variant in REUSE else [(x, t)]
            with Timer(device) as timer:
                for xx, tt in inputs:
                    step(patch)
                    out = forward(xx, tt)
            if r < 0:
                continue
            rows[variant].cpu.append(timer.cpu / len(inputs))
            rows[variant].wall.append(timer.wall / len(inputs))
            rows[variant].peak_bytes = timer.peak_bytes
            if r == 0:
                outputs[variant] = out.float()
                ref = base2 if variant in REUSE else outputs["baseline"]
                rows[variant].error = ((outputs[variant] - ref).norm() / ref.norm()).item()
        log(f"  {config.name}: {'warm-up round' if r < 0 else f'round {r + 1}/{rounds}'} done")
    switch(unet, "baseline", config.layout)
    tomesd_equal = ((outputs["exact"] - outputs["tomesd"]).norm() / outputs["tomesd"].norm()).item()
    return Result(config, rows, tomesd_equal)


# --- report ---------------------------------------------------------------------------------------


def table(result: Result) -> str:
    c = result.config
    limit_gain = result.speedup("limit") - 1
    lines = [
        f"### {c.name} ({c.width}, batch {c.batch})",
        "",
        "| variant | CPU s / forward | wall s / forward | speed-up | share of limit's gain | rel. error vs baseline | plan peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for v, row in result.rows.items():
        gain = (result.speedup(v) - 1) / limit_gain if limit_gain > 0 and v != "baseline" else float("nan")
        lines.append(
            f"| {LABELS[v]} | {row.cpu_s:.2f} | {row.wall_s:.2f} | {result.speedup(v):.2f}× | "
            f"{'' if math.isnan(gain) else f'{100 * gain:.0f}%'} | {row.error:.2e} | {mib(row.plan_bytes)} |"
        )
    lines.append("")
    lines.append(f"ours exact vs tomesd: relative difference {result.tomesd_equal:.1e}.")
    return "\n".join(lines)


def issue2_table(results: list[Result]) -> str:
    lines = [
        "| size | model_channels, batch | baseline CPU s | tomesd CPU s | ours CPU s | ours / tomesd | outputs identical (rel. diff) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for res in results:
        if res.config.layout != "sd15" or res.config.px > 1536:
            continue
        rows = res.rows
        ratio = rows["exact"].cpu_s / rows["tomesd"].cpu_s
        same = "yes" if res.tomesd_equal < 1e-5 else "NO"
        lines.append(
            f"| {res.config.px} px | {res.config.channels}, {res.config.batch} | {rows['baseline'].cpu_s:.2f} | "
            f"{rows['tomesd'].cpu_s:.2f} | {rows['exact'].cpu_s:.2f} | {ratio:.2f} | {same} ({res.tomesd_equal:.0e}) |"
        )
    return "\n".join(lines)


def expect_table(results: list[Result]) -> str:
    cols = ("tomesd", "exact", "share", "share+interval", "downsample")
    lines = [
        "| model, size | " + " | ".join(LABELS[v] for v in cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for res in results:
        lines.append(f"| {res.config.name} | " + " | ".join(f"{res.speedup(v):.2f}×" for v in cols) + " |")
    return "\n".join(lines)


def plot(results: list[Result]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, layout in zip(axes, ("sd15", "sdxl")):
        subset = [r for r in results if r.config.layout == layout]
        for v in VARIANTS[1:]:
            ax.plot([r.config.px for r in subset], [r.speedup(v) for r in subset], marker="o", label=LABELS[v])
        ax.set_title("SD1.5 layout" if layout == "sd15" else "SDXL layout")
        ax.set_xlabel("image size (px)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speed-up vs baseline (CPU time)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def _span(values: list[float]) -> str:
    return f"{min(values):.0%}–{max(values):.0%}" if values else "n/a"


def reuse_of_limit(results: list[Result]) -> tuple[list[float], list[float]]:
    """share_plan + plan_interval at >= 1024 px: its speed-up as a share of the limit's, and its share of the
    limit's gain over the baseline."""
    big = [r for r in results if r.config.px >= 1024 and r.speedup("limit") > 1]
    speed = [r.speedup("share+interval") / r.speedup("limit") for r in big]
    gain = [(r.speedup("share+interval") - 1) / (r.speedup("limit") - 1) for r in big]
    return speed, gain


def targets(results: list[Result]) -> str:
    """The issue's measurable targets, judged from this run's numbers."""
    lines = []
    diff = max(r.tomesd_equal for r in results)
    lines.append(
        f"- Exact mode gives tomesd's outputs: largest relative difference over the {len(results)} configurations "
        f"{diff:.1e} (target < 1e-5): {verdict(diff < 1e-5)}."
    )
    ratios = {r.config.name: r.rows["exact"].cpu_s / r.rows["tomesd"].cpu_s for r in results}
    worst = max(ratios.values())
    lines.append(
        f"- Exact mode never slower than tomesd: ours / tomesd CPU time at most {worst:.2f} ("
        + ", ".join(f"{name} {v:.2f}" for name, v in ratios.items())
        + f"): {verdict(worst <= 1.0)}."
    )
    for r in results:
        if r.config.layout == "sd15" and r.config.px == 2048:
            ours, theirs = r.rows["exact"].plan_bytes or 0, r.rows["tomesd"].plan_bytes or 1
            lines.append(
                f"- Plan memory at SD1.5 2048 px (batch {r.config.batch}, model_channels {r.config.channels}): ours peaked at "
                f"{mib(ours)} MiB, tomesd's at {mib(theirs)} MiB (1/{theirs / max(ours, 1):.0f}; target ≤ 1/10): "
                f"{verdict(ours * 10 <= theirs)}. `tests/test_plan_memory.py` asserts it at batch 2 with the real width (320)."
            )
    speed, gain = reuse_of_limit(results)
    lines.append(
        f"- Plan reuse (share_plan + plan_interval {INTERVAL}) at ≥ 1024 px: speed-up {_span(speed)} of the limit's "
        f"({_span(gain)} of the limit's gain over the baseline; target ≥ 95% of the limit's speed-up): "
        f"{verdict(bool(speed) and min(speed) >= 0.95)}."
    )
    sdxl = [r for r in results if r.config.layout == "sdxl" and r.config.px >= 1536]
    if sdxl:
        lines.append(
            "- SDXL with default settings (exact merge, max_downsample auto): "
            + ", ".join(f"{r.speedup('exact'):.2f}× at {r.config.px} px" for r in sdxl)
            + f": {verdict(all(r.speedup('exact') > 1.05 for r in sdxl))} (a real speed-up at ≥ 1536 px)."
        )
    return "\n".join(lines)


def report(results: list[Result], args: argparse.Namespace, seconds: float) -> str:
    device, _ = device_and_dtype()
    where = f"CUDA ({torch.cuda.get_device_name()}), float16" if device.type == "cuda" else "CPU, float32"
    parts = [
        BEGIN,
        "## Benchmark suite (`python -m benchmarks.speed.suite" + (" --quick" if args.quick else "") + "`)",
        "",
        f"{where}; torch {torch.__version__}, {args.threads} torch thread(s), {args.rounds} interleaved rounds up to {BIG_PX} px and {max(1, args.rounds - 1)} above, "
        f"medians; ratio {RATIO}, strides 2×2, top-left destinations, max_downsample auto "
        f"(1 on SD1.5, 2 on SDXL; tomesd given the same level). Run took {seconds / 60:.1f} min.",
        "",
        "Speed-up = baseline CPU time / variant CPU time. *Share of limit's gain* = (speed-up − 1) / "
        "(limit speed-up − 1). Relative error = ‖out − baseline‖ / ‖baseline‖ on natural-image latents "
        "(t = 601); for plan_interval it is measured at the step that reuses the previous step's plan "
        "(latent moved by 0.05·noise, t by 20). Plan peak = peak bytes the plan of one first-level block "
        "allocates (counted with `benchmarks.lab.alloc.AllocationTracker`); — = no plan in the timed forward.",
        "",
        "**Widths are reduced** (labelled per table: SD1.5 has model_channels 320, SDXL 320 with 640/1280 at its "
        "attention levels). With narrow channels attention is a larger share of the work than in the real models, "
        "so these speed-ups are upper bounds for the real ones; the ordering of the variants carries over.",
        "",
        "### Targets (issue 4), judged from this run",
        "",
        targets(results),
        "",
        "### Speed-up to expect (from this run)",
        "",
        expect_table(results),
        "",
        "### Which mode to pick",
        "",
        "- **Default (exact merge)**: the paper's ToMe, same images as tomesd (outputs identical, checked "
        "below), never slower than it, and its plan needs a few MiB where tomesd's needs the whole "
        "similarity matrix (hundreds of MiB at 1024 px, ~6 GB at 2048 px with batch 2). Pick it when you want "
        "ToMe exactly as published.",
        "- **share_plan** (+ **plan_interval** 2): one plan per level instead of one per block; with "
        f"plan_interval 2 on top its speed-up was {_span(reuse_of_limit(results)[0])} of the plan-free limit's at "
        "≥ 1024 px in this run, for a somewhat larger error than exact merging. The fastest merge setting for the hires-fix "
        "pass and large images.",
        "- **method = downsample (ToDo)**: no plan at all, every query kept; here the fastest *and* the most "
        "faithful variant at equal settings (an order of magnitude lower error than merging at ratio 0.5). "
        "Recommended for SDXL and for ≥ 1024 px.",
        "- **start / end**: e.g. end 0.7 leaves the last 30% of the steps unpatched (fine detail comes from "
        "those); the speed-up scales with the active fraction.",
        "- Around 512 px the gain is small on a real GPU with fused attention; use ToMe for the hires pass.",
        "",
        "Threads: one torch thread. This machine is shared; with two threads an OpenMP team that loses a core "
        "to another process spin-waits, and one test here ran 20× slower that way, in wall *and* CPU time. "
        "A single thread makes process CPU time equal the work done whatever else runs (wall time is shown "
        "too). Two threads halve the wall time on an idle machine for about the same CPU time (baseline SD1.5, "
        "model_channels 64, batch 2: 1.20 vs 1.29 CPU s at 512 px, 13.7 vs 14.4 at 1024 px; `--threads 2`).",
        "",
        "### Baseline vs tomesd vs ours at ratio 0.5 (issue 2, item 7)",
        "",
        issue2_table(results),
        "",
        "![speed-up vs resolution](speedup.png)",
        "",
        *[table(r) + "\n" for r in results],
        END,
    ]
    return "\n".join(parts)


def real_markers(device: str) -> tuple[str, str]:
    """The RESULTS.md markers of the real-width section of a device type ("cpu", "cuda")."""
    return f"<!-- real-{device}:begin -->", f"<!-- real-{device}:end -->"


def real_targets(results: list[Result]) -> str:
    """Issue 10's targets, judged from a real-width run."""
    by_name = {r.config.name: r for r in results}
    lines = []
    sd = by_name.get("SD1.5 1024 px")
    if sd is not None:
        ours, theirs = sd.rows["exact"].cpu_s, sd.rows["tomesd"].cpu_s
        noise = statistics.median([s for s, _ in spreads(results)] or [0.0])
        close = (
            f" The difference is within this run's noise (median spread {noise:.1%})."
            if abs(1 - ours / theirs) < noise
            else ""
        )
        lines.append(
            f"- SD1.5 1024 px, ours exact ≤ tomesd time: {ours:.2f} s vs {theirs:.2f} s per forward "
            f"(ours / tomesd {ours / theirs:.3f}): {verdict(ours <= theirs)}.{close}"
        )
        share = sd.speedup("share+interval") / sd.speedup("limit")
        lines.append(
            f"- SD1.5 1024 px, ours' fastest merge mode (share_plan + plan_interval {INTERVAL}) ≥ 95% of the plan-free "
            f"limit's speed-up: {sd.speedup('share+interval'):.2f}× vs {sd.speedup('limit'):.2f}× ({share:.0%}): "
            f"{verdict(share >= 0.95)}. ToDo, which has no plan at all: {sd.speedup('downsample'):.2f}×."
        )
    xl = by_name.get("SDXL 1024 px")
    if xl is not None:
        lines.append(
            f"- SDXL 1024 px with the defaults (exact merge, max_downsample auto = 2) > 1.05×: "
            f"{xl.speedup('exact'):.2f}×: {verdict(xl.speedup('exact') > 1.05)}. tomesd at its default level "
            "(max_downsample 1) merges nothing on SDXL, which has no transformer blocks there: it runs as the "
            f"baseline. Given level 2 by hand, tomesd gives {xl.speedup('tomesd'):.2f}×."
        )
    diff = max(r.tomesd_equal for r in results)
    lines.append(
        f"- Exact mode gives tomesd's outputs: largest relative difference {diff:.1e}: {verdict(diff < 1e-5)}."
    )
    return "\n".join(lines)


REAL_COLUMNS = ("tomesd", "exact", "share+interval", "downsample", "limit")


def spreads(results: list[Result]) -> list[tuple[float, str]]:
    """Each variant's round-to-round spread of CPU time, (max − min) / median, with its name (variants timed
    more than once): the noise floor of a run's comparisons."""
    return [
        ((max(row.cpu) - min(row.cpu)) / row.cpu_s, f"{r.config.name} {LABELS[v]}")
        for r in results
        for v, row in r.rows.items()
        if len(row.cpu) > 1
    ]


def spread_note(results: list[Result]) -> str:
    named = spreads(results)
    if not named:
        return "One round only: there is no round-to-round spread to show how noisy these times are."
    worst, where = max(named)
    typical = statistics.median(s for s, _ in named)
    return (
        f"Round-to-round spread of a variant's CPU time (max − min over median): median {typical:.1%}, at most "
        f"{worst:.1%} ({where}). Differences smaller than that are within this machine's noise."
    )


def real_expect_table(results: list[Result]) -> str:
    lines = [
        "| real width: model, size | " + " | ".join(LABELS[v] for v in REAL_COLUMNS) + " |",
        "|---|" + "---:|" * len(REAL_COLUMNS),
    ]
    for res in sorted(results, key=lambda r: (r.config.layout, r.config.px)):
        cells = " | ".join(f"{res.speedup(v):.2f}×" for v in REAL_COLUMNS)
        lines.append(f"| {res.config.name}, batch {res.config.batch} | {cells} |")
    return "\n".join(lines)


def real_report(results: list[Result], meta: dict) -> str:
    """The real-width section of RESULTS.md, rendered from a run's raw measurements."""
    cpu = meta["device"] == "CPU"
    begin, end = real_markers("cpu" if cpu else "cuda")
    rounds = sorted({len(r.rows["baseline"].cpu) for r in results})
    cut = meta.get("cut") or []
    where = (
        f"CPU, float32, {meta['threads']} torch thread(s)"
        if cpu
        else f"{meta['device']}, {meta['dtype']}, CUDA {meta['cuda']}"
    )
    sd, xl = (REAL[layout] for layout in ("sd15", "sdxl"))
    return "\n".join(
        [
            begin,
            f"## Real widths{' on the CPU' if cpu else ''} (`python -m benchmarks.speed.suite --real`)",
            "",
            f"{where}; torch {meta['torch']}; attention through `scaled_dot_product_attention`, as the WebUI's "
            f"default *sdp* optimisation runs it. The shipped architectures with random weights (`benchmarks/lab/models.py`, "
            f"`make_real_unet`): SD1.5 — model_channels {sd['model_channels']}, {sd['num_heads']} heads, context "
            f"{sd['context_dim']}, one transformer block at downsample 1/2/4 (859.5 M parameters); SDXL — "
            f"320/640/1280 channels, transformer depth 0/{xl['depths'][0]}/{xl['depths'][1]}, 64-dim heads, context "
            f"{xl['context_dim']}, adm {xl['adm_in_channels']} (2,567.5 M parameters; ldm configured like SDXL). "
            "Natural-image latents, t = 601; ratio 0.5, strides 2×2, top-left destinations, max_downsample auto "
            "(tomesd given the same level).",
            "",
            f"Rounds: {' or '.join(map(str, rounds))} interleaved round(s) per configuration"
            + (f" ({', '.join(cut)} cut by the run's deadline)" if cut else "")
            + ", medians. Each round builds the model, warms it up with one untimed baseline forward (which is "
            "also the plan-reuse variants' reference)"
            + (
                ", then times every variant once. Speed-up from process CPU time (one thread)"
                if cpu
                else " and an untimed round of every variant, then times every variant once. Speed-up from GPU time "
                "(CUDA events)"
            )
            + f". Run finished {meta['finished']} and took {meta['seconds'] / 60:.0f} min of wall time "
            + ("on the shared 2-core machine." if cpu else f"on the {meta['device']}."),
            "",
            spread_note(results),
            "",
            "### Targets (issue 10), judged from this run",
            "",
            real_targets(results),
            "",
            "### Speed-up at real width (from this run)",
            "",
            real_expect_table(results),
            "",
            *[table(r) + "\n" for r in results],
            end,
        ]
    )


def add_rounds(first: Result | None, more: Result) -> Result:
    """``first`` with the timings of ``more`` (the same configuration, later rounds) appended; fidelity and
    plan memory stay those of the first round."""
    if first is None:
        return more
    for variant, row in first.rows.items():
        row.cpu += more.rows[variant].cpu
        row.wall += more.rows[variant].wall
    return first


def utc_deadline(hhmm: str | None) -> float | None:
    """Seconds since the epoch of today's ``HH:MM`` UTC."""
    if not hhmm:
        return None
    hours, minutes = (int(v) for v in hhmm.split(":"))
    now = time.time()
    return now - now % 86400 + hours * 3600 + minutes * 60


def run_real(args: argparse.Namespace) -> None:
    """The shipped widths (``--real``; the default on CUDA), in passes: each pass builds every configuration's UNet,
    warms it up and times one interleaved round of every variant, so that a run cut short by ``--deadline``
    loses rounds of the last configurations, never a configuration. Raw measurements are saved after every
    configuration (benchmarks/runs/real-cpu.json)."""
    start = time.perf_counter()
    deadline = utc_deadline(args.deadline)
    results: dict[Config, Result] = {}
    took: dict[Config, float] = {}
    cut: list[str] = []
    meta: dict = {}
    for rnd in range(args.rounds):
        for config in REAL_CONFIGS:
            if rnd and deadline is not None and time.time() + took[config] > deadline:
                print(f"{config.name}: round {rnd + 1} would end after {args.deadline} UTC: cut", flush=True)
                cut.append(f"{config.name} round {rnd + 1}")
                continue
            print(f"{config.name}: {config.width}, batch {config.batch}, round {rnd + 1}/{args.rounds}", flush=True)
            t0 = time.time()
            gpu = torch.cuda.is_available()
            one = run_config(config, 1, lambda s: print(s, flush=True), REAL_VARIANTS, warmup_round=gpu)
            took[config] = time.time() - t0
            results[config] = add_rounds(results.get(config), one)
            print(table(results[config]) + "\n", flush=True)
            meta = run_meta(args, args.rounds, time.perf_counter() - start) | {"cut": cut}
            save_run(f"real-{device_and_dtype()[0].type}", list(results.values()), meta)
    if not args.no_write and not args.quick:
        write_real(list(results.values()), meta)


def write_real(results: list[Result], meta: dict) -> None:
    write_section(real_report(results, meta), *real_markers("cpu" if meta["device"] == "CPU" else "cuda"))


def main(argv: list[str] | None = None) -> None:
    parser = command(
        __doc__,
        quick="print only; at reduced widths also a 512/1024 px subset (< 5 min)",
        rounds=3,
        threads=1,
        no_write="",
        render="--real: re-render its section from the last run's JSON",
    )
    parser.add_argument("--real", action="store_true", help="the shipped widths (SD1.5 and SDXL); default on CUDA")
    parser.add_argument("--reduced", action="store_true", help="reduced widths on CUDA too")
    parser.add_argument("--deadline", help="--real: skip a later round that would end after this HH:MM (UTC)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.render:
        return write_real(*load_run(f"real-{device_and_dtype()[0].type}"))
    if args.real or (torch.cuda.is_available() and not args.reduced):
        return run_real(args)
    start = time.perf_counter()
    results = []
    for config in QUICK if args.quick else FULL:
        print(f"{config.name}: model_channels {config.channels}, batch {config.batch}", flush=True)
        rounds = args.rounds if config.px <= BIG_PX else max(1, args.rounds - 1)  # keeps the full run < 30 min
        results.append(run_config(config, rounds, lambda s: print(s, flush=True)))
        print(table(results[-1]) + "\n", flush=True)
    section = report(results, args, time.perf_counter() - start)
    print(issue2_table(results))
    if not args.no_write and not args.quick:  # the quick subset only prints: RESULTS.md holds the full run
        write_section(section, BEGIN, END)
        plot(results)
        print(f"wrote {RESULTS.relative_to(ROOT)} and {PLOT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
