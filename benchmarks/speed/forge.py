"""ToMe on Forge's UNet layout next to the ldm UNet with the same weights, on the CPU.

    python -m benchmarks.speed.forge [--rounds 3] [--threads 1] [--no-write]

Forge's blocks (tests/forge_double/unet.py, from Forge's backend/nn/unet.py) add into their input in place
and call attention with keywords; the weights are those of the suite's ldm UNets (benchmarks/lab/models.py, reduced
width), loaded into the Forge layout. Each configuration times baseline, ours exact (the default, attn only),
ours exact with attn + crossattn + mlp (the plan is then made in the block's pre-hook, before Forge's in-place
adds) and ToDo, on both layouts; every (variant, layout) pair is interleaved round by round in one process,
alternating which layout goes first; medians of process CPU time (and wall time), one torch thread. It checks
that each variant's output is the same on both layouts. Writes its own section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

import tome_core
from benchmarks.lab.models import RATIO, Config, make_unet, module_from_file, ours, photo_latents
from benchmarks.lab.results import write_section
from benchmarks.lab.timing import Timer

ROOT = Path(__file__).resolve().parents[2]
# The Forge-layout UNet is the tests' double (tests/forge_double/unet.py, torch only), named here by its file: the
# tests own it, and neither tests/ nor the lab goes on sys.path for it.
unet_from_ldm = module_from_file("forge_double.unet", ROOT / "tests" / "forge_double" / "unet.py").unet_from_ldm

BEGIN, END = "<!-- forge:begin -->", "<!-- forge:end -->"
CONFIGS = (Config("sd15", 512, 64, 2), Config("sd15", 1024, 32, 1), Config("sdxl", 1024, 32, 2))
LAYOUTS = ("ldm", "Forge")
VARIANTS = {
    "baseline": None,
    "ours: exact (default)": {},
    "ours: exact, attn + crossattn + mlp": {"merge_crossattn": True, "merge_mlp": True},
    "ours: downsample (ToDo, factor 2)": {"method": "downsample", "downsample_factor": 2},
}


def build(config: Config) -> tuple[dict[str, torch.nn.Module], tuple]:
    ldm = make_unet(config.layout, model_channels=config.channels)
    latent, b = config.px // 8, config.batch
    x = photo_latents(b, latent, latent)
    t = torch.full((b,), 601.0)
    ctx = torch.randn(b, 77, 64, generator=torch.Generator().manual_seed(1))
    return {"ldm": ldm, "Forge": unet_from_ldm(ldm)}, (x, t, ctx)


def forward(layout: str, unet: torch.nn.Module, x, t, ctx) -> torch.Tensor:
    if layout == "Forge":  # as KModel.apply_model calls it (backend/modules/k_model.py:45)
        return unet(x, t, context=ctx, control=None, transformer_options={})
    return unet(x, t, ctx)


def switch(unet: torch.nn.Module, variant: str) -> None:
    tome_core.remove_patch(unet)
    if VARIANTS[variant] is not None:
        ours(unet, **VARIANTS[variant])


def run_config(config: Config, rounds: int) -> dict[tuple[str, str], dict]:
    unets, inputs = build(config)
    cpu: dict[tuple[str, str], list[float]] = {(v, lay): [] for v in VARIANTS for lay in LAYOUTS}
    wall = {key: [] for key in cpu}
    out: dict[tuple[str, str], torch.Tensor] = {}
    with torch.no_grad():
        for r in range(rounds + 1):  # round 0 warms up
            for variant in VARIANTS:
                for layout in LAYOUTS if r % 2 else LAYOUTS[::-1]:
                    switch(unets[layout], variant)
                    with Timer(torch.device("cpu")) as timer:
                        out[variant, layout] = forward(layout, unets[layout], *inputs)
                    if r:
                        cpu[variant, layout].append(timer.cpu)
                        wall[variant, layout].append(timer.wall)
    for unet in unets.values():
        tome_core.remove_patch(unet)
    stats = {}
    for variant, layout in cpu:
        base = out["baseline", layout]
        stats[variant, layout] = {
            "cpu": statistics.median(cpu[variant, layout]),
            "wall": statistics.median(wall[variant, layout]),
            "error": ((out[variant, layout] - base).norm() / base.norm()).item(),
            "same": torch.equal(out[variant, "ldm"], out[variant, "Forge"]),
        }
    return stats


def table(config: Config, stats: dict) -> str:
    base = {lay: stats["baseline", lay]["cpu"] for lay in LAYOUTS}
    lines = [
        f"### {config.name} ({config.width}, batch {config.batch})",
        "",
        "| variant | ldm CPU s | Forge CPU s | ldm wall s | Forge wall s | ldm speed-up | Forge speed-up "
        "| Forge / ldm time | rel. error vs baseline | Forge output = ldm output |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for variant in VARIANTS:
        ldm, forge = stats[variant, "ldm"], stats[variant, "Forge"]
        lines.append(
            f"| {variant} | {ldm['cpu']:.2f} | {forge['cpu']:.2f} | {ldm['wall']:.2f} | {forge['wall']:.2f} "
            f"| {base['ldm'] / ldm['cpu']:.2f}× | {base['Forge'] / forge['cpu']:.2f}× | {forge['cpu'] / ldm['cpu']:.2f} "
            f"| {forge['error']:.2e} | {'bit-identical' if ldm['same'] and forge['same'] else 'DIFFERENT'} |"
        )
    return "\n".join(lines)


def report(tables: list[str], rounds: int, seconds: float, load: tuple[float, float]) -> str:
    return "\n".join(
        [
            BEGIN,
            "## ToMe on Forge's UNet layout (`python -m benchmarks.speed.forge`)",
            "",
            f"CPU, float32; torch {torch.__version__}, {torch.get_num_threads()} torch thread(s), {rounds} interleaved "
            f"rounds, medians; ratio {RATIO}, strides 2×2, top-left destinations, max_downsample auto. The Forge-layout "
            "UNet (`tests/forge_double/unet.py`, from Forge's `backend/nn/unet.py` at dfdcbab; in-place block adds, "
            "keyword attention calls, SDP attention as `--attention-pytorch`) holds the ldm UNet's weights; widths "
            "are reduced as in the suite, so speed-ups are upper bounds for the real models. Speed-up = the layout's "
            "baseline CPU time / variant CPU time; *Forge / ldm time* compares the layouts at equal settings; the "
            f"last column checks the variant's outputs on the two layouts. Run took {seconds / 60:.1f} min; 1-minute "
            f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end, on {os.cpu_count()} CPUs (other "
            "processes on a loaded machine inflate CPU times; interleaving gives every variant the same conditions).",
            "",
            *[t + "\n" for t in tables],
            END,
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1, as the suite)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    start, load = time.perf_counter(), os.getloadavg()[0]
    tables = []
    for config in CONFIGS:
        tables.append(table(config, run_config(config, args.rounds)))
        print(tables[-1] + "\n", flush=True)
    if not args.no_write:
        seconds = time.perf_counter() - start
        write_section(report(tables, args.rounds, seconds, (load, os.getloadavg()[0])), BEGIN, END)
        print("wrote benchmarks/RESULTS.md")


if __name__ == "__main__":
    main()
