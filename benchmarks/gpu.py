"""One command for a GPU: the real-width suite and the sampling it/s table at 512–2048 px, as a "GPU" section.

    python -m benchmarks.gpu              # one CUDA GPU; H100/H200 class: about 5 min (see --estimate)
    python -m benchmarks.gpu --estimate   # the run's FLOPs (counted on meta tensors) and the time they imply
    python -m benchmarks.gpu --dry-run    # the whole command at tiny sizes on any device (CI runs it)

Real widths (benchmarks.lab.models.REAL), float16, attention through torch's scaled_dot_product_attention (the
WebUI's "sdp" optimisation). Timing with CUDA events after a warm-up round of every variant; the host
synchronises only at the start and end of each timed region; peak memory per variant from
``torch.cuda.max_memory_allocated``. Each model is built once (on the CPU, then moved) and reused.

Part 1, the suite (seconds per UNet forward, every variant of ``suite.REAL_VARIANTS``) on SD1.5 at 512,
1024 and 2048 px and SDXL at 1024 and 2048 px, cond + uncond batched. Part 2, the sampling table
(benchmarks/speed/webui_its.py: Euler, CFG, 20 steps) on SD1.5 at 512, 1024, 1536 and 2048 px. Part 3, the step cache
(benchmarks/speed/cache.py: a full and a cached step of every mode, and the 20-step speed-up they give) on SD1.5 at 512 and
1024 px and SDXL at 1024 px. Part 4, FLUX.1 at its real width (1024 px) in bfloat16, block by block: what the step cache
saves there (benchmarks/speed/dit_costs.py) and what token merging of the image tokens saves (benchmarks/quality/dit_merge.py).
Writes the GPU section of benchmarks/RESULTS.md (``--results`` for another file) from
benchmarks/runs/gpu.json.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch

from benchmarks.lab import dit
from benchmarks.lab import results as R
from benchmarks.lab import timing as T
from benchmarks.lab.models import Config

# The commands whose measurements this one runs on the GPU (their measuring and table functions). Commands never
# import one another; this orchestrator alone reaches into them, by name, through importlib.
S = importlib.import_module("benchmarks.speed.suite")
sampling = importlib.import_module("benchmarks.speed.webui_its")
C = importlib.import_module("benchmarks.speed.cache")
dit_costs = importlib.import_module("benchmarks.speed.dit_costs")
dit_merge = importlib.import_module("benchmarks.quality.dit_merge")

BEGIN, END = "<!-- gpu:begin -->", "<!-- gpu:end -->"
SUITE = (
    Config("sd15", 512, 320, 2, True),
    Config("sd15", 1024, 320, 2, True),
    Config("sd15", 2048, 320, 2, True),
    Config("sdxl", 1024, 320, 2, True),
    Config("sdxl", 2048, 320, 2, True),
)
CACHE_SUITE = (SUITE[0], SUITE[1], SUITE[3])  # the step cache's targets: SD1.5 512 / 1024 px, SDXL 1024 px
CACHE_ROUNDS = 2
SIZES = sampling.GPU_SIZES
STEPS, ROUNDS, SAMPLING_ROUNDS, WARMUP_STEPS = 20, 3, 2, 2
# --dry-run: the same code paths at sizes a CPU runs in seconds (reduced width, tiny latents)
DRY_SUITE = (Config("sd15", 64, 32, 2), Config("sdxl", 64, 32, 2))
DRY_SIZES, DRY_STEPS, DRY_ROUNDS = (64, 96, 128, 160), 2, 1
DRY_CACHE = DRY_SUITE
FLUX, DRY_FLUX = dit.REAL, dit.QUICK
FLUX_DTYPE = torch.bfloat16  # FLUX's own weights and the dtype its users run it in
# --estimate: sustained float16 throughput assumed for a UNet forward on an H100/H200 (about 20% of the
# dense tensor-core peak, ~990 TFLOP/s), a floor per forward for kernel launches at small sizes, and the
# time to build and move the two models
ASSUMED_FLOPS, FORWARD_FLOOR_S, BUILD_S = 200e12, 0.03, 120.0
PUBLISHED = {512: 1.01, 1024: 1.22, 1536: 1.44, 2048: 1.65}  # A1111 + xFormers, tomesd ratio 0.5 (tomesd's README)


def attention_backend(device: torch.device) -> str:
    """The scaled_dot_product_attention kernels usable on this device for an SD1.5 first-level shape (float16)."""
    if device.type != "cuda":
        return "scaled_dot_product_attention (CPU kernel)"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 8, 4096, 40, device=device, dtype=torch.float16)
    usable = []
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        try:
            with sdpa_kernel([backend]):
                torch.nn.functional.scaled_dot_product_attention(q, q, q)
            usable.append(backend.name)
        except RuntimeError:
            continue
    return f"scaled_dot_product_attention; fused kernels usable here: {', '.join(usable) or 'none (math fallback)'}"


def forwards_per_config(rounds: int) -> int:
    """UNet forwards one suite configuration runs: warm-up forward, warm-up round and timed rounds (the plan
    reuse variant runs two steps, the limit one untimed forward to fill its plans)."""
    per_round = len(S.REAL_VARIANTS) + 2
    return 1 + per_round * (rounds + 1)


def estimate(rounds: int = ROUNDS, sampling_rounds: int = SAMPLING_ROUNDS, steps: int = STEPS) -> str:
    """The run's floating-point work, counted by torch's FlopCounterMode on meta tensors (no memory, no
    compute), every variant counted as a baseline forward (an upper bound), and the time it implies."""
    from torch.utils.flop_counter import FlopCounterMode

    def flops(config: Config, batch: int) -> float:
        with torch.device("meta"):
            unet = config.build()
            side = config.px // 8
            x, t = torch.empty(batch, 4, side, side), torch.empty(batch)
            ctx = torch.empty(batch, 77, config.context_dim)
            extra = {"y": torch.empty(batch, config.adm_channels)} if config.adm_channels else {}
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            unet(x, t, ctx, **extra)
        return float(counter.get_total_flops())

    lines, work = [], []  # work: (forwards, FLOPs per forward)
    for config in SUITE:
        work.append((forwards_per_config(rounds), flops(config, config.batch)))
        lines.append(
            f"suite {config.name} batch {config.batch}: {work[-1][1] / 1e12:.1f} TFLOP/forward x {work[-1][0]}"
        )
    for px in SIZES:
        work.append(
            (
                len(sampling.VARIANTS) * (WARMUP_STEPS + sampling_rounds * steps),
                flops(Config("sd15", px, 320, 1, True), 2),
            )
        )
        lines.append(f"sampling SD1.5 {px} px: {work[-1][1] / 1e12:.1f} TFLOP/step x {work[-1][0]}")
    for config in CACHE_SUITE:  # every cached step counted as a full one: an upper bound
        work.append((1 + C.forwards_per_round() * CACHE_ROUNDS, flops(config, config.batch)))
        lines.append(
            f"step cache {config.name} batch {config.batch}: {work[-1][1] / 1e12:.1f} TFLOP/forward x {work[-1][0]}"
        )

    with torch.device("meta"):
        double, single, kwargs = dit.blocks(FLUX, "meta", FLUX_DTYPE)
    for block in (double, single):  # dit_costs and each of dit_merge's 7 (plain too): a warm-up and the rounds
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            block(**kwargs)
        work.append((8 * (rounds + 1), float(counter.get_total_flops())))
        lines.append(f"FLUX.1 {type(block).__name__}: {work[-1][1] / 1e12:.1f} TFLOP/forward x {work[-1][0]}")

    def minutes(rate: float) -> float:
        return (BUILD_S + sum(n * max(f / rate, FORWARD_FLOOR_S) for n, f in work)) / 60

    low, high = 1e12, 1e16  # the sustained rate at which the run takes 8 min
    for _ in range(60):
        mid = (low * high) ** 0.5
        low, high = (mid, high) if minutes(mid) > 8 else (low, mid)
    lines.append(
        f"total {sum(n * f for n, f in work) / 1e15:.0f} PFLOP; at {ASSUMED_FLOPS / 1e12:.0f} TFLOP/s sustained, at "
        f"least {FORWARD_FLOOR_S * 1000:.0f} ms per forward, plus {BUILD_S:.0f} s to build and move the models: about "
        f"{minutes(ASSUMED_FLOPS):.1f} min; 8 min at {high / 1e12:.0f} TFLOP/s sustained"
    )
    return "\n".join(lines)


def mib(n: int | None) -> str:
    return "— (no CUDA)" if n is None else f"{n / 2**20:,.0f} MiB"


def suite_table(result: S.Result, clock: str) -> str:
    c = result.config
    lines = [
        f"#### {c.name} ({c.width}, batch {c.batch})",
        "",
        f"| variant | ms / forward ({clock}) | speed-up | rel. error vs baseline | peak MiB |",
        "|---|---:|---:|---:|---:|",
    ]
    for v, row in result.rows.items():
        lines.append(
            f"| {S.LABELS[v]} | {1000 * row.cpu_s:.1f} | {result.speedup(v):.2f}× | {row.error:.2e} | "
            f"{R.mib(row.peak_bytes, 0)} |"
        )
    return "\n".join(lines)


def section(
    results: list[S.Result],
    samples: list[sampling.SamplingResult],
    meta: dict,
    caches: list[C.StepCosts] = (),
    flux: dict | None = None,
) -> str:
    clock = "CUDA events" if meta["device"] != "CPU" else "CPU time"
    anchor = ", ".join(f"{v:.2f}× at {px} px" for px, v in PUBLISHED.items())
    return "\n".join(
        [
            BEGIN,
            f"## GPU (`{meta['command']}`)",
            "",
            f"Device: {meta['device']}. torch {meta['torch']}, CUDA {meta['cuda']}, {meta['dtype']}. "
            f"Attention: {meta['attention']}. Run finished {meta['finished']} and took {meta['seconds'] / 60:.1f} min.",
            "",
            f"{meta['note']}Medians of {meta['rounds']} (sampling: {meta['sampling_rounds']}) interleaved rounds after a warm-up round of every variant; "
            f"times from {clock} around each timed region (on CUDA the host synchronises only there); peak = "
            "`torch.cuda.max_memory_allocated` during the variant's timed region.",
            "",
            "### Sampling it/s (the seed's table, our way)",
            "",
            f"The published anchor (tomesd's README: A1111 + xFormers, ratio 0.5, speed-up over plain): {anchor}.",
            "",
            sampling.table(samples),
            "",
            sampling.details(samples),
            "### One UNet forward",
            "",
            *[suite_table(r, clock) + "\n" for r in results],
            "### Step cache: a full and a cached step, and the 20-step speed-up they give",
            "",
            C.targets(caches) or "- (no real-width configuration in this run)",
            "",
            *[C.costs_table(c, clock=clock) + "\n" for c in caches],
            *(flux_tables(flux, clock) if flux else []),
            END,
        ]
    )


def flux_tables(flux: dict, clock: str) -> list[str]:
    """Part 4: FLUX.1's blocks, the step cache's costs and speed-ups, token merging's block costs."""
    costs = dit.BlockCosts(**flux["costs"])
    return [
        f"### FLUX.1 at its real width ({flux['dtype']}): the step cache and token merging",
        "",
        f"diffusers' FLUX blocks with random weights, one image ({costs.blocks.image_tokens} image + "
        f"{costs.blocks.text_tokens} text tokens); seconds from {clock}, as a fraction of a full step. As "
        "`benchmarks.speed.dit_costs` and `benchmarks.quality.dit_merge` measure them on the CPU.",
        "",
        *dit_costs.tables([costs]),
        "",
        *dit_merge.speed_table(dit.Prices(**flux["merge"])),
        "",
    ]


def measure_flux(config: dit.Config, rounds: int, log, device: torch.device, dtype: torch.dtype) -> dict:
    """Part 4's measurements (see :func:`flux_tables`)."""
    costs = dit_costs.measure(config, rounds, log, device=device, dtype=dtype)
    seconds = dit_merge.measure(config, rounds, log, device, dtype)
    for kind in dit_costs.KINDS[:2]:
        log(f"  FLUX.1 {kind} block: {1000 * costs.cost(kind):.1f} ms")
    prices = dit.prices(seconds, config, costs)
    return {"dtype": str(dtype).removeprefix("torch."), "costs": vars(costs), "merge": vars(prices)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, any device: proves the command works")
    parser.add_argument("--estimate", action="store_true", help="print the FLOP-based time estimate and stop")
    parser.add_argument("--results", type=Path, default=R.RESULTS, help="the markdown file to write the section to")
    parser.add_argument("--runs", type=Path, default=R.RUNS, help="where the raw measurements (gpu.json) go")
    args = parser.parse_args(argv)
    if args.estimate:
        return print(estimate())
    device, dtype = T.device_and_dtype()
    if device.type != "cuda" and not args.dry_run:
        sys.exit("no CUDA device: run this on a GPU, or use --dry-run")
    suite_configs, sizes = (DRY_SUITE, DRY_SIZES) if args.dry_run else (SUITE, SIZES)
    steps, rounds, sampling_rounds = (
        (DRY_STEPS, DRY_ROUNDS, DRY_ROUNDS) if args.dry_run else (STEPS, ROUNDS, SAMPLING_ROUNDS)
    )
    torch.set_num_threads(1 if args.dry_run else torch.get_num_threads())
    start = time.perf_counter()

    def log(message: str) -> None:
        print(message, flush=True)

    models: dict[tuple[str, bool], torch.nn.Module] = {}

    def model(config: Config) -> torch.nn.Module:
        key = (config.layout, config.real)
        if key not in models:
            models.clear()  # one model on the device at a time
            if device.type == "cuda":
                torch.cuda.empty_cache()
            models[key] = T.prepare(config.build(), device, dtype)
        return models[key]

    # sampling first (SD1.5), then the suite's SD1.5 sizes on the same model, then SDXL
    samples = []
    for px in sizes:
        config = Config("sd15", px, suite_configs[0].channels, 1, suite_configs[0].real)
        log(f"sampling {px} px, {steps} steps")
        warmup_steps = 1 if args.dry_run else WARMUP_STEPS
        samples.append(sampling.run_size(config, steps, sampling_rounds, warmup_steps, log, unet=model(config)))
        for v in sampling.VARIANTS:
            log(
                f"  {sampling.LABELS[v]}: {samples[-1].its(v):.2f} it/s, peak GPU memory {mib(samples[-1].peak_bytes[v])}"
            )
    results = []
    for config in suite_configs:
        log(f"suite {config.name}: {config.width}, batch {config.batch}")
        results.append(S.run_config(config, rounds, log, S.REAL_VARIANTS, warmup_round=True, unet=model(config)))
        for v, row in results[-1].rows.items():
            log(f"  {S.LABELS[v]}: {1000 * row.cpu_s:.1f} ms / forward, peak GPU memory {mib(row.peak_bytes)}")
    caches = []
    for config in DRY_CACHE if args.dry_run else CACHE_SUITE:
        log(f"step cache {config.name}: {config.width}, batch {config.batch}")
        caches.append(C.measure_steps(config, rounds if args.dry_run else CACHE_ROUNDS, log, unet=model(config)))
    models.clear()
    log(f"FLUX.1 blocks: {(DRY_FLUX if args.dry_run else FLUX).name}")
    flux_dtype = dtype if args.dry_run else FLUX_DTYPE
    flux = measure_flux(DRY_FLUX if args.dry_run else FLUX, rounds, log, device, flux_dtype)
    meta = R.run_meta(argparse.Namespace(threads=torch.get_num_threads()), rounds, time.perf_counter() - start)
    meta |= {
        "attention": attention_backend(device),
        "sampling_rounds": sampling_rounds,
        "command": "python -m benchmarks.gpu" + (" --dry-run" if args.dry_run else ""),
        "note": "DRY RUN: tiny sizes, reduced width; the numbers mean nothing. " if args.dry_run else "",
    }
    R.save_run_data(
        "gpu",
        {
            "suite": [r.to_json() for r in results],
            "sampling": [sampling.to_json(s) for s in samples],
            "cache": [vars(c) for c in caches],
            "flux": flux,
        },
        meta,
        args.runs,
    )
    text = section(results, samples, meta, caches, flux)
    print(text)
    R.write_section(text, BEGIN, END, args.results)
    log(f"wrote the GPU section of {args.results}")


if __name__ == "__main__":
    main()
