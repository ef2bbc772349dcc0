"""Where the benchmarks' results go: their raw measurements (``benchmarks/runs/<name>.json``) and their sections of
``benchmarks/RESULTS.md``, each between its own markers, rendered from those measurements."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.timing import device_and_dtype

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
RUNS = ROOT / "benchmarks" / "runs"  # each section's raw measurements (JSON), from which it is rendered


def save_run_data(name: str, results: list[dict] | dict, meta: dict, runs: Path | None = None) -> Path:
    """Keep a run's raw measurements (benchmarks/runs/<name>.json): its RESULTS.md section is rendered from them."""
    runs = runs or RUNS
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / f"{name}.json"
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n", encoding="utf-8")
    return path


def load_run_data(name: str, runs: Path | None = None) -> tuple[Any, dict]:
    data = json.loads(((runs or RUNS) / f"{name}.json").read_text(encoding="utf-8"))
    return data["results"], data["meta"]


def write_section(section: str, begin: str, end: str, path: Path = RESULTS) -> None:
    """Put ``section`` (from ``begin`` to ``end``, markers included) into ``path`` (RESULTS.md) in place of the
    one there, or append it; the file's other sections are kept."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + section + rest.split(end, 1)[1]
    else:
        new = old.rstrip() + "\n\n" + section + "\n"
    path.write_text(new, encoding="utf-8")


def publish(name: str, text: str, results: list[dict] | dict, meta: dict, begin: str, end: str, keep: bool) -> None:
    """Print a run's section (``text``); where the run is ``keep``'s (not a quick one), keep its raw measurements
    (:func:`save_run_data` under ``name``) and put the section into RESULTS.md between ``begin`` and ``end``."""
    print(text)
    if keep:
        save_run_data(name, results, meta)
        write_section(text, begin, end)


def run_meta(args: argparse.Namespace, rounds: int, seconds: float) -> dict:
    """Where and when a run ran: device, dtype, torch/CUDA versions, threads, rounds, duration, finish time."""
    device, dtype = device_and_dtype()
    return {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "CPU",
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "threads": args.threads,
        "rounds": rounds,
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def mib(n: int | None, digits: int = 1) -> str:
    """Bytes as MiB for a table cell; — where nothing was measured."""
    return "—" if n is None else f"{n / 2**20:,.{digits}f}"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**NOT met**"
