"""The step cache's extra memory on the CPU: the peak RSS of a process that runs a full and a cached step with the
cache on, against one that runs plain full steps (``python -m benchmarks.speed.cache_memory``).

Each variant runs in a fresh process (peak RSS only grows), builds the same real-width UNet, warms it up with one
plain forward and then runs: plain, two unpatched steps; cache (DeepCache), the cache's first (full) step, which
stores the deep features, and the cached step after it; linear and calibrated (the forecasts), five steps each, the last
cached one forecast from the two full ones. The difference of the peaks is what the cache adds per cond/uncond chunk, next to
the exact bytes of what it holds. On CUDA, ``benchmarks.speed.cache`` reports the peak
allocated memory per variant instead.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch

import tome_core
from benchmarks.lab.models import Config, step_inputs
from benchmarks.lab.prices import STEPS
from benchmarks.lab.results import mib, run_meta, write_section

BEGIN, END = "<!-- cache-memory:begin -->", "<!-- cache-memory:end -->"
CONFIGS = (Config("sd15", 512, 320, 2, True),)
"""At 512 px a forward costs 15 s of CPU; each variant runs three (the 1024 px variants would take ten minutes)."""


VARIANTS = ("plain", "cache", "linear", "calibrated")
"""plain: three unpatched forwards; cache (DeepCache, ``cache_forecast`` off): its full step and a cached one; linear
and calibrated (the forecasts): five steps, full at 0 and 3: the last cached one forecasts from both."""


def child(variant: str, config: Config) -> dict:
    """Run ``variant`` (:data:`VARIANTS`) on ``config`` in this process; its peak RSS and the features held."""
    torch.set_num_threads(1)
    unet = config.build().eval()
    x, t, cond = step_inputs(config, torch.device("cpu"), torch.float32)
    held = 0
    with torch.no_grad():
        unet(x, t, **cond)  # warm-up: the same in both variants
        if variant == "plain":
            unet(x, t, **cond)
            unet(x, t, **cond)
        else:
            forecast = "off" if variant == "cache" else variant
            settings = tome_core.ToMeSettings(
                enabled=True, ratio=0.0, cache=True, cache_interval=3, cache_forecast=forecast, cache_schedule="uniform"
            )
            patch = tome_core.apply_settings(unet, settings)
            try:
                # the full step that fills the cache and a cached one; the forecasts: full, two cached, full, then a
                # cached one that forecasts from both full steps
                steps = 2 if variant == "cache" else 5
                for step in range(steps):
                    patch.set_progress(step / STEPS, STEPS)
                    unet(x, t * (1 - step / STEPS), **cond)
                assert patch.report().cache.cached == steps - 1 - (variant != "cache")
                held = patch.cache.cached_bytes()
            finally:
                patch.remove()
    return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "held": held}


def measure(config: Config) -> dict:
    out = {}
    for variant in VARIANTS:
        args = [sys.executable, "-m", "benchmarks.speed.cache_memory", "--child", variant, json.dumps(vars(config))]
        out[variant] = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return out


def section(rows: list[tuple[Config, dict]], meta: dict) -> str:
    lines = [
        BEGIN,
        "## Step cache memory on the CPU (`python -m benchmarks.speed.cache_memory`)",
        "",
        f"CPU, float32, torch {meta['torch']}; run finished {meta['finished']}. Peak RSS of a fresh process that "
        "builds the real-width UNet, warms it up and runs two plain steps, against one that runs the cache's full "
        "step and the cached step after it (cache alone, N=3, branch 0, `cache_forecast` off: DeepCache), and one "
        "with the linear and with the calibrated forecast, each running two full steps and a cached step forecast "
        "from both. The difference is what the cache adds for one cond/uncond chunk; *held* is the exact size of what "
        "it keeps between steps (the deep features; with a forecast also their change; calibrated: the subsampled "
        "skip connection and its change as well).",
        "",
        "| configuration | peak RSS, plain MiB | DeepCache: peak, difference, held MiB | linear forecast: peak, "
        "difference, held MiB | calibrated forecast: peak, difference, held MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for config, r in rows:
        plain = r["plain"]["peak_rss"]
        cells = [
            f"{mib(r[v]['peak_rss'])}, {mib(r[v]['peak_rss'] - plain)}, {mib(r[v]['held'])}"
            for v in VARIANTS[1:]
            if v in r
        ]
        lines.append(f"| {config.name}, batch {config.batch} | {mib(plain)} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, END])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "CONFIG"), help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], Config(**json.loads(args.child[1])))))
        return
    start = time.perf_counter()
    rows = [(config, measure(config)) for config in CONFIGS]
    args.threads = 1
    text = section(rows, run_meta(args, 1, time.perf_counter() - start))
    print(text)
    if not args.no_write:
        write_section(text, BEGIN, END)


if __name__ == "__main__":
    main()
