"""Where the step cache keeps its features (``cache_device``), at real sizes: what it holds on the model's device with
``model`` and ``cpu``, what ``cpu`` copies per step, and how long a copy of that size takes on this CPU
(``python -m benchmarks.speed.cache_device``; issue 37).

    python -m benchmarks.speed.cache_device            # FLUX.1 at 1024 px, Wan 2.1 14B at 720p x 81 frames
    python -m benchmarks.speed.cache_device --quick    # tiny sizes: prints only (CI runs it)
    python -m benchmarks.speed.cache_device --render   # the section again from benchmarks/runs/cache-device-cpu.json

What the cache holds is derived from the tensors' sizes, as the cache keeps them (:func:`held_bytes`: per stream,
the skipped blocks' result and, with a forecast, its change — the same count ``StepCache.cached_bytes`` gives, checked
by the tests on the small models): FLUX.1 1024 px keeps the image stream's residual, 4096 tokens × 3072 in bfloat16;
Wan 2.1 14B at 1280 × 720 × 81 frames keeps 21 latent frames × 45 × 80 patches = 75,600 tokens × 5120. With ``cpu``
nothing of it stays on the model's device between steps: a full step copies what it keeps to the CPU, a cached step
copies it back as it begins. The time is the median of a copy of that many bytes from one CPU tensor into another
(``--rounds``): this machine's memory bandwidth, not a GPU's link (PCIe or NVLink time is the bytes over that link's
rate; no GPU ran here).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from benchmarks.lab.results import Section, command, mib, run_command, run_meta

BEGIN, END = "<!-- cache-device:begin -->", "<!-- cache-device:end -->"


@dataclass(frozen=True)
class Case:
    name: str
    tokens: int  # of the kept stream
    width: int
    itemsize: int  # bytes per element (bfloat16: 2)
    streams: int  # streams the cache keeps apart (cond and uncond called separately: 2; batched: 1 of batch 2)
    batch: int  # images per stream


CASES = (
    Case("FLUX.1 dev, 1024 px (guidance distilled: one stream)", 4096, 3072, 2, 1, 1),
    Case("FLUX.1 / Chroma with CFG, 1024 px (cond and uncond batched)", 4096, 3072, 2, 1, 2),
    Case("Wan 2.1 14B, 720p x 81 frames, CFG (cond and uncond batched)", 21 * 45 * 80, 5120, 2, 1, 2),
)
QUICK = (Case("tiny", 256, 64, 2, 1, 2),)
FORECASTS = {"off": 1, "linear": 2}
"""Tensors as large as the features that a forecast keeps per stream: the last full step's (DeepCache) and, to
extrapolate, their change (linear; calibrated adds only a subsampled probe)."""


def held_bytes(case: Case, tensors: int) -> int:
    """What the cache keeps between steps for ``case`` with ``tensors`` feature-sized tensors per stream."""
    return case.streams * tensors * case.batch * case.tokens * case.width * case.itemsize


def copy_seconds(nbytes: int, rounds: int) -> float:
    """The median time of copying ``nbytes`` from one CPU tensor into another (after one warm-up copy)."""
    source, target = torch.empty(nbytes, dtype=torch.uint8).fill_(1), torch.empty(nbytes, dtype=torch.uint8)
    target.copy_(source)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        target.copy_(source)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(case: Case, rounds: int) -> dict:
    out = {"case": asdict(case)}
    for forecast, tensors in FORECASTS.items():
        held = held_bytes(case, tensors)
        out[forecast] = {"held": held, "copy_seconds": copy_seconds(held, rounds)}
    return out


def section(results: list[dict], meta: dict) -> str:
    lines = [
        BEGIN,
        "## Where the cache keeps its features (`python -m benchmarks.speed.cache_device`)",
        "",
        f"CPU, torch {meta['torch']}, {meta['rounds']} rounds, medians; run finished {meta['finished']}. What the step "
        "cache keeps between steps on the model's device with `cache_device: model` (with `cpu`: nothing), derived "
        "from the tensors' sizes (per stream the skipped blocks' result, and with the linear forecast its change; "
        "bfloat16), and the time of one copy of that many bytes between two tensors on this CPU: what `cpu` moves at "
        "every full step (to the CPU) and every cached step (back). On a GPU the copy runs at its link's rate "
        "instead (no GPU ran here).",
        "",
        "| case | DeepCache (`off`): held, copy on this CPU | linear forecast: held, copy on this CPU |",
        "|---|---:|---:|",
    ]
    for r in results:
        cells = [f"{mib(r[f]['held'])} MiB, {r[f]['copy_seconds'] * 1000:.1f} ms" for f in FORECASTS]
        lines.append(f"| {r['case']['name']} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, END])


SECTION = Section("cache-device-cpu", BEGIN, END, section)


def main(argv: list[str] | None = None) -> None:
    def measure_all(args) -> tuple[list[dict], dict]:
        start = time.perf_counter()
        results = [measure(case, args.rounds) for case in (QUICK if args.quick else CASES)]
        return results, run_meta(args, args.rounds, time.perf_counter() - start)

    run_command(command(__doc__, quick="", rounds=5, threads=1), SECTION, argv, measure_all)


if __name__ == "__main__":
    main()
