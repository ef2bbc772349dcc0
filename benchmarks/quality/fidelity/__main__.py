"""``python -m benchmarks.quality.fidelity`` (see :mod:`benchmarks.lab.fidelity`).

python -m benchmarks.quality.fidelity             # the full run; writes its RESULTS.md section, samples.png, frontier.png
python -m benchmarks.quality.fidelity --quick     # 4 seeds, 3 steps: prints only (CI runs it)
python -m benchmarks.quality.fidelity --render    # the section again from benchmarks/runs/fidelity.json
"""

from __future__ import annotations

import contextlib
import time

import torch

from benchmarks.lab import fidelity as B
from benchmarks.lab.results import RUNS, command, load_run_data, run_meta, save_run_data, write_section
from benchmarks.lab.trained import architectures as A

from . import report


def render(command: str) -> None:
    """The section, the sample grid and the plot from every model's saved run."""
    data: dict = {"cases": [], "untrained": {}}
    grids: dict = {}
    metas = []
    for layout in A.ARCHITECTURES:
        # the layout's run, then runs of one scale (``--scale``), whose cases replace the same ones of the first
        paths = sorted(RUNS.glob(f"fidelity-{layout}*.json"), key=lambda p: (p.stem != f"fidelity-{layout}", p.stem))
        for path in paths:
            part, meta = load_run_data(path.stem)
            ran = {tuple(c["case"].values()) for c in part["cases"]}
            data["cases"] = [c for c in data["cases"] if tuple(c["case"].values()) not in ran] + part["cases"]
            data["untrained"].update(part["untrained"])
            grids.update(torch.load(RUNS / f"{path.stem}-samples.pt"))
            metas.append(meta)
    if not metas:
        raise SystemExit("no saved fidelity run to render")
    seconds = sum(m["seconds"] for m in metas)  # a resumed run counts its interrupted part too
    meta = {**metas[0], "seconds": seconds, "finished": max(m["finished"] for m in metas), "parts": len(metas)}
    write_section(report.section(data, meta, command), B.BEGIN, B.END)
    report.sample_grid(grids)
    report.frontier_plot(data)


def main(argv: list[str] | None = None) -> None:
    parser = command(
        __doc__,
        quick="4 seeds, 3 steps; print only",
        threads=1,
        no_write="",
        render="re-render the section from the saved runs",
    )
    parser.add_argument("--layout", choices=list(A.ARCHITECTURES), action="append", help="only this model (repeatable)")
    parser.add_argument("--resume", action="store_true", help="keep the modes an interrupted run saved")
    parser.add_argument(
        "--scale",
        type=int,
        help="only the cases at this multiple of the trained side, saved as a run of their own (1: the trained side, saved as the layout's run)",
    )
    args = parser.parse_args(argv)
    invocation = "python -m benchmarks.quality.fidelity"
    if args.render:
        return render(invocation)
    torch.set_num_threads(args.threads)
    plan = B.QUICK if args.quick else B.FULL
    layouts = tuple(args.layout or A.ARCHITECTURES)
    write = not args.no_write and not args.quick
    for layout in layouts:
        name = f"fidelity-{layout}" + (f"-x{args.scale}" if args.scale and args.scale != 1 else "")
        previous, earlier_grids, start = None, None, time.perf_counter()
        if args.resume:
            with contextlib.suppress(FileNotFoundError):  # nothing saved yet: a fresh run
                previous, earlier_meta = load_run_data(name)
                earlier_grids = torch.load(RUNS / f"{name}-samples.pt")
                start -= earlier_meta["seconds"]  # the wall time counts the interrupted part too

        def meta(start: float = start) -> dict:
            return run_meta(args, 1, time.perf_counter() - start) | {
                "seeds": plan.seeds,
                "eps_seeds": plan.eps_seeds,
                "steps": plan.steps,
            }

        def save(data: dict, grids: dict, name: str = name) -> None:
            save_run_data(name, data, meta())
            torch.save(grids, RUNS / f"{name}-samples.pt")

        log = lambda s: print(s, flush=True)  # noqa: E731
        data = B.run(plan, log, (layout,), save if write else None, previous, earlier_grids, args.scale)
        data.pop("grids")
        print(report.section(data, meta(), invocation))
    if write:
        render(invocation)


if __name__ == "__main__":
    main()
