"""Where the benchmarks' results go: their raw measurements (``benchmarks/runs/<name>.json``) and their sections of
``benchmarks/RESULTS.md``, each between its own markers, rendered from those measurements; and the one skeleton of a
command (:func:`command`, :class:`Section`, :func:`run_command`): the common flags, ``--render`` from the saved run,
measure, print and publish."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.lab.timing import device_and_dtype

ROOT = Path(__file__).resolve().parents[2]
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


class Progress:
    """A long run's finished parts, kept in a file as they finish so that a stopped run continues where it stopped
    (a command's ``--progress PATH``); ``identity`` (what the run measures: model, weights, seeds, …) must match the
    file's, and the wall time of earlier legs is carried on (:meth:`seconds`). ``path`` None keeps nothing."""

    def __init__(self, path: Path | None, identity: dict) -> None:
        self.path, self.identity, self.start = path, identity, time.perf_counter()
        self.rows: dict[str, Any] = {}
        self.before = 0.0
        if path is not None and path.exists():
            saved = json.loads(path.read_text(encoding="utf-8"))
            if saved["identity"] != identity:
                raise ValueError(f"--progress {path}: written for {saved['identity']}, not for {identity}")
            self.rows, self.before = saved["rows"], saved["seconds"]

    def seconds(self) -> float:
        """Wall time of the whole run so far, earlier legs included."""
        return self.before + time.perf_counter() - self.start

    def get(self, key: str) -> Any | None:
        return self.rows.get(key)

    def put(self, key: str, row: Any) -> Any:
        """Keep ``row`` as ``key``'s (written through at once); returns it."""
        self.rows[key] = row
        if self.path is not None:
            saved = {"identity": self.identity, "seconds": self.seconds(), "rows": self.rows}
            partial = self.path.with_name(self.path.name + ".tmp")
            partial.write_text(json.dumps(saved) + "\n", encoding="utf-8")
            partial.replace(self.path)
        return row


def mib(n: int | None, digits: int = 1) -> str:
    """Bytes as MiB for a table cell; — where nothing was measured."""
    return "—" if n is None else f"{n / 2**20:,.{digits}f}"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**NOT met**"


# --- the command skeleton -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    """A command's place in the results: its run (``benchmarks/runs/<run>.json``), its RESULTS.md markers, and its
    section rendered from that run's saved results and meta (``render(results, meta)``)."""

    run: str
    begin: str
    end: str
    render: Callable[[Any, dict], str]

    def rewrite(self) -> None:
        """``--render``: the section again from the saved run, into RESULTS.md."""
        write_section(self.render(*load_run_data(self.run)), self.begin, self.end)

    def publish(self, results: Any, meta: dict, keep: bool, text: str | None = None) -> None:
        """Print the section (``text``, else rendered from ``results``); where ``keep``, save the run and write it."""
        publish(
            self.run, self.render(results, meta) if text is None else text, results, meta, self.begin, self.end, keep
        )


def command(
    doc: str | None,
    *,
    quick: str | None = None,
    rounds: int | None = None,
    threads: int | None = None,
    no_write: str | None = None,
    render: str | None = None,
) -> argparse.ArgumentParser:
    """A benchmark command's parser (``doc``: its module docstring) with the flags the commands share: ``--quick``,
    ``--rounds``, ``--threads`` and ``--no-write`` where given (their help text; the defaults of the numbers) and
    ``--render`` always (its help text, else the usual one). The command adds its own flags."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if quick is not None:
        parser.add_argument("--quick", action="store_true", help=quick or None)
    parser.add_argument("--render", action="store_true", help=render or "re-render the section from the saved run")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds)
    if threads is not None:
        parser.add_argument("--threads", type=int, default=threads, help="torch CPU threads")
    if no_write is not None:
        parser.add_argument("--no-write", action="store_true", help=no_write or "print only")
    return parser


def run_command(
    parser: argparse.ArgumentParser,
    section: Section | Callable[[argparse.Namespace], Section],
    argv: list[str] | None,
    measure: Callable[[argparse.Namespace], tuple[Any, dict]],
    text: Callable[[argparse.Namespace, Any, dict], str] | None = None,
) -> None:
    """The skeleton of a command's ``main``: parse ``argv`` (``section``: the command's, or a function of the
    arguments that picks it); ``--render``: rewrite the section from the saved run and stop; else set torch's threads (``--threads``), ``measure(args)`` (results as saved, meta), print the section
    (``text(args, results, meta)``, else the section rendered) and, unless the run is ``--quick`` or ``--no-write``,
    save the run and write the section into RESULTS.md."""
    args = parser.parse_args(argv)
    if not isinstance(section, Section):
        section = section(args)
    if args.render:
        return section.rewrite()
    if getattr(args, "threads", None) is not None:
        torch.set_num_threads(args.threads)
    results, meta = measure(args)
    keep = not getattr(args, "quick", False) and not getattr(args, "no_write", False)
    section.publish(results, meta, keep, None if text is None else text(args, results, meta))
