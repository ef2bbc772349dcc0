"""One ControlNet unit at 1024 px on the CPU: baseline vs ToMe in the UNet only vs ToMe in UNet and control model.

    python -m benchmarks.speed.controlnet [--size 1024] [--rounds 3] [--channels 64] [--write]

A "step" is one guided UNet evaluation (cond and uncond batched, batch 2) with the control model run by the
ControlNet double's hook, exactly as sd-webui-controlnet runs it. Variants are interleaved round by round in
one process; medians of wall and process CPU time. ``--write`` replaces the ControlNet section of
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

import tome_core
from benchmarks.lab.models import make_unet, module_from_file, photo_latents
from benchmarks.lab.results import write_section
from benchmarks.lab.timing import Timer

ROOT = Path(__file__).resolve().parents[2]
# sd-webui-controlnet's hook is the tests' double (tests/controlnet_double.py), named here by its file: the tests own
# it, and neither tests/ nor the lab goes on sys.path for it.
cnd = module_from_file("controlnet_double", ROOT / "tests" / "controlnet_double.py")

BEGIN, END = "<!-- controlnet:begin -->", "<!-- controlnet:end -->"


def build(size: int, channels: int, heads: int, context_dim: int = 64):
    unet = make_unet("sd15", model_channels=channels, context_dim=context_dim, num_heads=heads)
    control = cnd.make_control_net(context_dim=context_dim, model_channels=channels, num_heads=heads, seed=7)
    latent = size // 8
    hint = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    hook = cnd.UnetHook()
    param = cnd.ControlParams(control_model=control, hint_cond=hint, weight=1.0)
    hook.hook(model=unet, sd_ldm=cnd.FakeSDModel(unet), control_params=[param])
    x = photo_latents(2, latent, latent)
    t = torch.tensor([500.0, 500.0])
    ctx = torch.randn(2, 77, context_dim, generator=torch.Generator().manual_seed(1))
    return unet, control.control_model, (x, t, ctx)


def variants(unet, net):
    def baseline():
        tome_core.remove_patch(unet)
        tome_core.remove_patch(net)

    def unet_only():
        baseline()
        tome_core.apply_patch(unet, ratio=0.5, max_downsample="auto", use_rand=True, seed=1)

    def unet_and_control():
        unet_only()
        tome_core.apply_patch(net, ratio=0.5, max_downsample="auto", use_rand=True, seed=1)

    return {"baseline": baseline, "ToMe UNet only": unet_only, "ToMe UNet + ControlNet": unet_and_control}


def measure(size: int, rounds: int, channels: int, heads: int) -> list[tuple[str, float, float, float]]:
    unet, net, inputs = build(size, channels, heads)
    setups = variants(unet, net)
    wall: dict[str, list[float]] = {k: [] for k in setups}
    cpu: dict[str, list[float]] = {k: [] for k in setups}
    outputs: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for setup in setups.values():  # warm-up
            setup()
            unet(*inputs)
        for _ in range(rounds):
            for name, setup in setups.items():
                setup()
                with Timer(torch.device("cpu")) as timer:
                    outputs[name] = unet(*inputs)
                wall[name].append(timer.wall)
                cpu[name].append(timer.cpu)
    setups["baseline"]()
    base_c = statistics.median(cpu["baseline"])
    ref = outputs["baseline"]
    rows = []
    for name in setups:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        err = ((outputs[name] - ref).norm() / ref.norm()).item()
        rows.append((name, w, c, base_c / c, err))
    return rows


def measure_cached(size: int, rounds: int, channels: int, heads: int) -> list[tuple[str, float, float]]:
    """The step cache beside one ControlNet unit: a plain full step, and a cached step (N=3, branch 0, after an
    untimed full step) with the control model run in full and shortened (its blocks nobody reads skipped)."""
    unet, net, inputs = build(size, channels, heads)
    x, t, ctx = inputs
    cpu: dict[str, list[float]] = {
        "full step (plain)": [],
        "cached step, control model in full": [],
        "cached step, control model shortened": [],
    }
    for _ in range(rounds):
        for name in cpu:
            tome_core.remove_patch(net)
            tome_core.remove_patch(unet)
            patch = None
            if name != "full step (plain)":
                patch = tome_core.apply_patch(unet, ratio=0.0, cache=True, cache_interval=3)
                if name.endswith("shortened"):
                    tome_core.apply_settings(net, tome_core.ToMeSettings(ratio=0.0), leader=patch.cache)
                patch.set_progress(0.0, 20)
                with torch.no_grad():
                    unet(x, t, ctx)  # the full step the cached one reads
                patch.set_progress(1 / 20, 20)
            with torch.no_grad(), Timer(torch.device("cpu")) as timer:
                unet(x, t, ctx)
            assert patch is None or patch.report().cache.cached == 1
            cpu[name].append(timer.cpu)
    tome_core.remove_patch(net)
    tome_core.remove_patch(unet)
    base = statistics.median(cpu["full step (plain)"])
    return [(name, statistics.median(v), statistics.median(v) / base) for name, v in cpu.items()]


def cached_table(rows) -> str:
    lines = [
        "With the step cache (cache alone, N=3, branch 0): a cached step still needs the control residual of the skip "
        "branch it runs; the control model's deeper blocks, whose residuals a cached step never reads, are skipped "
        "on Mikubill's ControlNet (which runs the control model inside the UNet's call). Same model, size and inputs:",
        "",
        "| step | s (CPU) | share of a plain full step |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {c:.2f} | {share:.0%} |" for name, c, share in rows]
    return "\n".join(lines)


def table(rows, size: int, channels: int, rounds: int) -> str:
    lines = [
        f"One ControlNet unit, SD1.5-layout UNet at reduced width (model_channels={channels}, real ldm blocks), "
        f"{size} px, batch 2 (cond+uncond), ratio 0.5, max downsample auto, CPU float32, "
        f"{torch.get_num_threads()} torch thread(s), median of {rounds} interleaved rounds.",
        "",
        "| variant | s/step (wall) | s/step (CPU) | speed-up (CPU) | rel. error vs baseline |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {w:.2f} | {c:.2f} | {s:.2f}x | {e:.4f} |" for n, w, c, s, e in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (1, as the suite: see RESULTS.md)")
    ap.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    text = table(measure(args.size, args.rounds, args.channels, args.heads), args.size, args.channels, args.rounds)
    text += "\n\n" + cached_table(measure_cached(args.size, args.rounds, args.channels, args.heads))
    print(text)
    if args.write:
        write_section(f"{BEGIN}\n## ToMe and ControlNet\n\n{text}\n{END}", BEGIN, END)


if __name__ == "__main__":
    main()
