"""``python -m benchmarks.fidelity`` (see :mod:`benchmarks.fidelity.benchmark`).

python -m benchmarks.fidelity             # the full run; writes its RESULTS.md section, samples.png, frontier.png
python -m benchmarks.fidelity --quick     # 4 seeds, 3 steps: prints only (CI runs it)
python -m benchmarks.fidelity --render    # the section again from benchmarks/runs/fidelity.json
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from benchmarks.results import RUNS, load_run_data, run_meta, save_run_data, write_section

from . import architectures as A
from . import benchmark as B
from . import report


def render(command: str) -> None:
    """The section, the sample grid and the plot from every model's saved run."""
    data: dict = {"cases": [], "untrained": {}}
    grids: dict = {}
    metas = []
    for layout in A.ARCHITECTURES:
        try:
            part, meta = load_run_data(f"fidelity-{layout}")
        except FileNotFoundError:
            continue
        data["cases"] += part["cases"]
        data["untrained"].update(part["untrained"])
        grids.update(torch.load(RUNS / f"fidelity-{layout}-samples.pt"))
        metas.append(meta)
    if not metas:
        raise SystemExit("no saved fidelity run to render")
    meta = {**metas[0], "seconds": max(m["seconds"] for m in metas), "finished": max(m["finished"] for m in metas)}
    write_section(report.section(data, meta, command), B.BEGIN, B.END)
    report.sample_grid(grids)
    report.frontier_plot(data)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 seeds, 3 steps; print only")
    parser.add_argument("--layout", choices=list(A.ARCHITECTURES), action="append", help="only this model (repeatable)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--render", action="store_true", help="re-render the section from the saved runs")
    parser.add_argument("--resume", action="store_true", help="keep the modes an interrupted run saved")
    args = parser.parse_args(argv)
    command = "python -m benchmarks.fidelity"
    if args.render:
        return render(command)
    torch.set_num_threads(args.threads)
    plan = B.QUICK if args.quick else B.FULL
    layouts = tuple(args.layout or A.ARCHITECTURES)
    write = not args.no_write and not args.quick
    for layout in layouts:
        start = time.perf_counter()

        def meta(start: float = start) -> dict:
            return run_meta(args, 1, time.perf_counter() - start) | {
                "seeds": plan.seeds,
                "eps_seeds": plan.eps_seeds,
                "steps": plan.steps,
            }

        def save(data: dict, grids: dict, layout: str = layout) -> None:
            save_run_data(f"fidelity-{layout}", data, meta())
            torch.save(grids, RUNS / f"fidelity-{layout}-samples.pt")

        previous, earlier_grids = None, None
        if args.resume:
            with contextlib.suppress(FileNotFoundError):  # nothing saved yet: a fresh run
                previous = load_run_data(f"fidelity-{layout}")[0]
                earlier_grids = torch.load(RUNS / f"fidelity-{layout}-samples.pt")
        log = lambda s: print(s, flush=True)  # noqa: E731
        data = B.run(plan, log, (layout,), save if write else None, previous, earlier_grids)
        data.pop("grids")
        print(report.section(data, meta(), command))
    if write:
        render(command)


if __name__ == "__main__":
    main()
