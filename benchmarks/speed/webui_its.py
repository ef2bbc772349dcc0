"""Sampling speed as the WebUI reports it: it/s of an Euler loop with classifier-free guidance.

    python -m benchmarks.speed.webui_its              # CPU: reduced width, 512/1024 px, 4 steps (~15 min of CPU)
    python -m benchmarks.speed.webui_its --no-write   # print only

One iteration is one sampling step: one UNet call on the cond and uncond halves batched together
(batch 2), the guidance mix (scale 7) and the Euler update, on the discrete sigmas of SD's DDPM schedule
(k-diffusion's ``get_sigmas`` for a ``DiscreteEpsDDPMDenoiser``: timesteps evenly spaced from 999 to 0).
Like the WebUI script, the loop reports progress to our patch before every step (``Session.set_progress``),
so plan reuse and the path that reads nothing back from the device are what the WebUI gets.

Variants (as speed-up over plain it/s):
  plain; built-in = what A1111's "Token merging ratio" does (tomesd 0.1.3, ratio 0.5, ``use_rand=False``,
  merge_attn only, max_downsample 1); ours at the defaults (ratio 0.5, max_downsample auto, random
  partition from the seed); ours share_plan + plan_interval 2; ours ToDo (method downsample, factor 2).

Variants are interleaved round by round after a warm-up (one short sampling run of every variant); the
table holds medians. On a CPU the time is process CPU time with one torch thread; on CUDA, GPU time
from events around each sampling run (float16, real width, SDP attention), with its peak memory.
Writes its section of benchmarks/RESULTS.md, rendered from benchmarks/runs/sampling-cpu.json.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import tomesd
import torch

import tome_core
from benchmarks.lab import sampling as S
from benchmarks.lab.models import Config, Holder
from benchmarks.lab.results import Section, command, mib, run_meta, save_run_data
from benchmarks.lab.results import write_section as _write_section
from benchmarks.lab.timing import Timer, device_and_dtype, prepare

BEGIN, END = "<!-- sampling:begin -->", "<!-- sampling:end -->"
CFG_SCALE = 7.0
SEED = 1234  # the "image seed" ours derives its partition from
VARIANTS = ("plain", "built-in", "ours", "fastest", "todo")
LABELS = {
    "plain": "plain",
    "built-in": "built-in (A1111: tomesd 0.5)",
    "ours": "ours: defaults",
    "fastest": "ours: share_plan + plan_interval 2",
    "todo": "ours: ToDo",
}
CPU_SIZES = (512, 1024)
GPU_SIZES = (512, 1024, 1536, 2048)


@dataclass
class SamplingResult:
    px: int
    steps: int
    width: str
    seconds: dict[str, list[float]] = field(default_factory=dict)  # per variant, one entry per round
    error: dict[str, float] = field(default_factory=dict)  # final latent vs plain's, relative
    peak_bytes: dict[str, int | None] = field(default_factory=dict)

    def its(self, variant: str) -> float:
        return self.steps / statistics.median(self.seconds[variant])

    def speedup(self, variant: str) -> float:
        return self.its(variant) / self.its("plain")


def switch(unet: torch.nn.Module, variant: str) -> tome_core.Session | None:
    """Leave ``unet`` as ``variant`` wants it; returns our patch, if any."""
    tome_core.remove_patch(unet)
    tomesd.remove_patch(Holder(unet))
    if variant == "plain":
        return None
    if variant == "built-in":
        tomesd.apply_patch(
            Holder(unet), ratio=0.5, use_rand=False, merge_attn=True, merge_crossattn=False, merge_mlp=False
        )
        return None
    settings = tome_core.ToMeSettings(seed=SEED)  # the extension's defaults, seeded like an image
    more = {
        "ours": {},
        "fastest": {"share_plan": True, "plan_interval": 2},
        "todo": {"method": "downsample"},
    }[variant]
    return tome_core.apply_settings(unet, settings.replace(**more))


def sample(
    unet: torch.nn.Module,
    noise: torch.Tensor,
    conditioning: dict[str, torch.Tensor],
    sigmas: list[float],
    patch: tome_core.Session | None,
) -> torch.Tensor:
    """Euler with classifier-free guidance (``benchmarks.lab.sampling``'s loop); ``conditioning`` holds the cond then the
    uncond rows; progress is reported to ``patch`` before every step, as the WebUI script does."""
    progress = None if patch is None else (lambda i, steps: patch.set_progress(i / steps))
    return S.sample(S.CFGDenoiser(unet, conditioning, CFG_SCALE), noise, sigmas, "euler", progress)


def run_size(
    config: Config,
    steps: int,
    rounds: int,
    warmup_steps: int,
    log: Callable[[str], None],
    unet: torch.nn.Module | None = None,
) -> SamplingResult:
    """Interleaved sampling runs of every variant at one size (``config.batch`` images, each cond + uncond).
    ``unet``: the model, already built and prepared (else it is built here)."""
    device, dtype = device_and_dtype()
    unet = unet if unet is not None else prepare(config.build(), device, dtype)
    side = config.px // 8
    gen = torch.Generator().manual_seed(SEED)
    noise = torch.randn(config.batch, 4, side, side, generator=gen).to(device, dtype)
    ctx, extra = replace(config, batch=2 * config.batch).conditioning()  # cond + uncond
    conditioning = {k: v.to(device, dtype) for k, v in {"context": ctx, **extra}.items()}
    result = SamplingResult(config.px, steps, config.width)
    finals: dict[str, torch.Tensor] = {}
    schedules = {n: S.discrete_sigmas(n) for n in (warmup_steps, steps)}
    for r in range(-1, rounds):  # round -1: the warm-up, a short run of each variant
        for variant in VARIANTS:
            patch = switch(unet, variant)
            with Timer(device) as timer:
                out = sample(unet, noise, conditioning, schedules[warmup_steps if r < 0 else steps], patch)
            if r < 0:
                continue
            result.seconds.setdefault(variant, []).append(timer.cpu)
            result.peak_bytes[variant] = timer.peak_bytes
            if r == 0:
                finals[variant] = out.float()
                ref = finals["plain"]
                result.error[variant] = ((finals[variant] - ref).norm() / ref.norm()).item()
        log(f"  {config.px} px: {'warm-up' if r < 0 else f'round {r + 1}/{rounds}'} done")
    switch(unet, "plain")
    return result


def to_json(result: SamplingResult) -> dict:
    return vars(result)


def from_json(data: dict) -> SamplingResult:
    return SamplingResult(**data)


def table(results: list[SamplingResult]) -> str:
    """it/s of plain, then each variant's speed-up over plain (the seed's table, our way)."""
    lines = [
        "| sampling: size | plain it/s | " + " | ".join(LABELS[v] for v in VARIANTS[1:]) + " |",
        "|---|---:|" + "---:|" * (len(VARIANTS) - 1),
    ]
    for res in results:
        cells = [f"{res.speedup(v):.2f}×" for v in VARIANTS[1:]]
        lines.append(f"| {res.px} px | {res.its('plain'):.3g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def details(results: list[SamplingResult]) -> str:
    """Per size: it/s, speed-up, final-latent deviation from plain and (CUDA) peak memory of every variant."""
    out = []
    for res in results:
        out += [
            f"#### {res.px} px ({res.width}, {res.steps} steps)",
            "",
            "| variant | it/s | speed-up | final latent: rel. diff. vs plain | peak GPU MiB |",
            "|---|---:|---:|---:|---:|",
        ]
        for v in VARIANTS:
            peak = mib(res.peak_bytes.get(v), 0)
            out.append(f"| {LABELS[v]} | {res.its(v):.3g} | {res.speedup(v):.2f}× | {res.error[v]:.2e} | {peak} |")
        out.append("")
    return "\n".join(out)


def section(results: list[SamplingResult], meta: dict, begin: str = BEGIN, end: str = END) -> str:
    where = (
        f"{meta['device']}, {meta['dtype']}, torch {meta['torch']}"
        + (f", CUDA {meta['cuda']}" if meta.get("cuda") and meta["device"] != "CPU" else "")
        + f", {meta['threads']} torch thread(s)"
    )
    clock = "GPU time (CUDA events)" if meta["device"] != "CPU" else "process CPU time"
    return "\n".join(
        [
            begin,
            f"## Sampling speed, as the WebUI reports it (`{meta['command']}`)",
            "",
            f"{where}; {meta['note']} Euler, classifier-free guidance (cond + uncond batched), "
            f"it/s = steps / {clock} of the sampling loop, median of {meta['rounds']} interleaved rounds after a "
            f"warm-up run of every variant; progress reported to our patch every step, as the WebUI script does. "
            f"Run finished {meta['finished']} and took {meta['seconds'] / 60:.1f} min of wall time.",
            "",
            "Built-in = A1111's own *Token merging ratio* 0.5 (tomesd, `use_rand=False`, merge_attn only, "
            "max_downsample 1). Ours at defaults: ratio 0.5, max_downsample auto, random partition from the seed.",
            "",
            table(results),
            "",
            details(results),
            end,
        ]
    )


def write_section(results: list[SamplingResult], meta: dict) -> None:
    _write_section(section(results, meta), BEGIN, END)


def main(argv: list[str] | None = None) -> None:
    parser = command(__doc__, rounds=2, threads=1, no_write="")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--channels", type=int, default=32, help="reduced model width on the CPU")
    args = parser.parse_args(argv)
    if args.render:
        return Section(
            "sampling-cpu", BEGIN, END, lambda data, meta: section([from_json(d) for d in data], meta)
        ).rewrite()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    results = []
    for px in CPU_SIZES:
        config = Config("sd15", px, args.channels, 1)
        results.append(run_size(config, args.steps, args.rounds, 1, lambda s: print(s, flush=True)))
    meta = run_meta(args, args.rounds, time.perf_counter() - start) | {
        "command": "python -m benchmarks.speed.webui_its",
        "note": (
            f"SD1.5 layout at reduced width (model_channels {args.channels}; real ldm blocks), {args.steps} steps: "
            "the CPU run is the loop's test and the shape of the curve, not the GPU numbers. 1536 and 2048 px "
            "would not fit the CPU budget (about 15 min for this run); the GPU run has them."
        ),
    }
    print(table(results))
    if not args.no_write:
        save_run_data("sampling-cpu", [to_json(r) for r in results], meta)
        write_section(results, meta)


if __name__ == "__main__":
    main()
