"""The step cache's speed: the cost of a full step and of a cached step, with and without token merging, and the
20-step speed-up they give (``python -m benchmarks.speed.cache``).

    python -m benchmarks.speed.cache                # real widths on the CPU (~70 min) + the end-to-end check (~15 min)
    python -m benchmarks.speed.cache --quick        # tiny sizes, 3 steps: prints only (CI runs it)
    python -m benchmarks.speed.cache --render       # the section again from benchmarks/runs/cache-cpu.json

Part 1, real widths (the shipped SD1.5 and SDXL architectures, random weights: a fixed schedule's cost does not
depend on them): SD1.5 at 512 and 1024 px (batch 2: cond + uncond) and SDXL at 1024 px (batch 1). Per mode, in
interleaved rounds (medians): one full step (the unpatched UNet for plain; ours with the cache on, at its first
step) and one cached step (branch 0: the step after it). The speed-up of a 20-step Euler + CFG run is derived from
them with the cache's own schedule (``tome_core.caching.schedule.uniform_plan``: the first and the last step full, a full step
every N). Part 2, reduced width: the same per-step costs *and* whole 20-step sampling runs (the shared sampling
loop, progress reported every step), interleaved, so that the derived figure can be checked against the measured
one within the run's spread. Memory: the deep features the cache holds per cond/uncond chunk (exact bytes), and on
CUDA the peak allocated per variant. One torch thread (CPU time).
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

import tome_core
from benchmarks.lab import modes as M
from benchmarks.lab import sampling as S
from benchmarks.lab.models import Config, step_inputs
from benchmarks.lab.prices import STEPS, StepCosts
from benchmarks.lab.results import Section, command, mib, run_meta, save_run_data, verdict, write_section
from benchmarks.lab.timing import Timer, device_and_dtype, prepare
from tome_core.caching.schedule import uniform_plan

BEGIN, END = "<!-- cache:begin -->", "<!-- cache:end -->"
INTERVALS = (2, 3, 5)
TOME = ("exact-0.3", "exact-0.5", "exact-0.7", "todo-2")
"""Our token-merging modes measured with and without the cache (plain and the built-in tomesd are measured too): the
ratios and ToDo that the cache modes combine with (share_plan and ToDo 3 are the suite's; the CPU cannot afford all)."""
REAL = (Config("sd15", 1024, 320, 2, True), Config("sdxl", 1024, 320, 1, True), Config("sd15", 512, 320, 2, True))
REDUCED = (Config("sd15", 1024, 32, 1),)
"""Part 2's configuration: whole 20-step runs are affordable on the CPU at model_channels 32 only."""
QUICK = (Config("sd15", 128, 32, 1), Config("sdxl", 128, 32, 1))
E2E = (("cache-3", "plain"), ("cache-3+exact-0.5", "exact-0.5"), ("cache-3+todo-2", "todo-2"))
"""The sampling runs of part 2 besides plain: the cache (N=3) alone, with ToMe's default and with ToDo; each with
the mode whose step costs derive it."""


def _settings(mode: str, interval: int = 3) -> tome_core.ToMeSettings:
    """Our mode ``mode`` (plain: ratio 0, the cache alone) with the cache on at ``interval``."""
    base = M.MODES[mode].settings if mode != "plain" else {"ratio": 0.0}
    return tome_core.ToMeSettings(
        enabled=True, seed=M.SEED, **base, cache=True, cache_interval=interval, cache_forecast="off"
    )


def measure_steps(config: Config, rounds: int, log, unet: torch.nn.Module | None = None) -> StepCosts:
    """Part 1 for one configuration: full and cached step costs of every mode, interleaved round by round."""
    device, dtype = device_and_dtype()
    unet = unet if unet is not None else prepare(config.build(), device, dtype)
    x, t, cond = step_inputs(config, device, dtype)
    out = StepCosts(vars(config))

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return unet(x, t, **cond)

    forward()  # warm-up
    for r in range(rounds):
        for mode in ("plain", "tomesd", *TOME):
            if mode in ("plain", "tomesd"):  # the unpatched UNet; the built-in, which has no cache
                M.MODES[mode].apply(unet)
                with Timer(device) as timer:
                    forward()
                out.full.setdefault(mode, []).append(timer.cpu)
                out.peak_bytes[mode] = timer.peak_bytes
                if mode == "tomesd":
                    continue
            M.PLAIN.apply(unet)  # nothing else on the UNet (the built-in's tomesd was the last mode)
            patch = tome_core.apply_settings(unet, _settings(mode))
            patch.set_progress(0.0, STEPS)  # a full step that fills the cache: ours' full step
            with Timer(device) as full:
                forward()
            out.full.setdefault(mode if mode != "plain" else "plain+cache", []).append(full.cpu)
            patch.set_progress(1 / STEPS, STEPS)  # the cached step after it
            with Timer(device) as timer:
                forward()
            assert patch.report().cache.cached == 1, "the second step must be a cached one"
            out.cached.setdefault(mode, []).append(timer.cpu)
            out.peak_bytes[f"{mode}+cache"] = timer.peak_bytes
            out.held_bytes = patch.cache.cached_bytes()
            M.PLAIN.apply(unet)
        log(f"  {out.name}: round {r + 1}/{rounds} done")
    return out


def measure_sampling(config: Config, rounds: int, steps: int, log, costs: StepCosts) -> None:
    """Part 2: whole ``steps``-step Euler + CFG runs of :data:`E2E`, interleaved, into ``costs.sampling``."""
    device, dtype = device_and_dtype()
    unet = prepare(config.build(), device, dtype)
    side = config.px // 8
    noise = torch.randn(config.batch, 4, side, side, generator=torch.Generator().manual_seed(M.SEED)).to(device, dtype)
    ctx, extra = replace(config, batch=2 * config.batch).conditioning()
    conditioning = {k: v.to(device, dtype) for k, v in {"context": ctx, **extra}.items()}
    sigmas = S.discrete_sigmas(steps)
    costs.sampling_steps = steps
    for r in range(rounds):
        for name in ("plain", *(n for n, _ in E2E)):
            patch = M.MODES[name].apply(unet)
            progress = None if patch is None else (lambda i, n, patch=patch: patch.set_progress(i / n, n))
            with Timer(device) as timer:
                S.sample(S.CFGDenoiser(unet, conditioning, 7.0), noise, sigmas, "euler", progress)
            costs.sampling.setdefault(name, []).append(timer.cpu)
            M.PLAIN.apply(unet)
        log(f"  {costs.name}: sampling round {r + 1}/{rounds} done")


# --- report -----------------------------------------------------------------------------------------------


def _label(mode: str) -> str:
    return M.MODES[mode].label


def forwards_per_round() -> int:
    """UNet forwards :func:`measure_steps` runs per round: plain and tomesd once, each of ours full and cached, and the
    cache alone full and cached."""
    return 2 + 2 * (1 + len(TOME))


def costs_table(c: StepCosts, clock: str = "CPU time") -> str:
    """One configuration's full and cached step costs per mode and the 20-step speed-ups they give."""
    plain = c.cost("full", "plain")
    scale, unit = (1, "s") if clock == "CPU time" else (1000, "ms")
    lines = [
        f"#### {c.name}",
        "",
        f"| mode | full step {unit} | cached step {unit} | cached / plain full | "
        + " | ".join(f"20 steps, cache N={n}" for n in INTERVALS)
        + " | 20 steps, no cache |",
        "|---|---:|---:|---:|" + "---:|" * (len(INTERVALS) + 1),
    ]
    for mode in ("plain", "tomesd", *TOME):
        if mode not in c.full:
            continue
        if mode in c.cached:
            cells = [f"{scale * c.cost('cached', mode):.2f}", f"{c.cost('cached', mode) / plain:.3f}"]
            cells += [f"{c.speedup(mode, n):.2f}×" for n in INTERVALS]
        else:
            cells = ["—", "—", *("—" for _ in INTERVALS)]
        lines.append(
            f"| {_label(mode)} | {scale * c.cost('full', mode):.2f} | "
            + " | ".join(cells)
            + f" | {c.speedup(mode, None):.2f}× |"
        )
    peak = c.peak_bytes.get("plain")
    lines += [
        "",
        f"The cache alone's full step: {scale * c.cost('full', 'plain+cache'):.2f} {unit} (plain's: {scale * plain:.2f} "
        f"{unit}). The cache holds {mib(c.held_bytes)} MiB of deep features for this batch of {c.config['batch']} "
        "(one chunk)"
        + (
            f"; peak GPU memory of a full / cached step, plain: {mib(peak)} / {mib(c.peak_bytes.get('plain+cache'))} MiB."
            if peak is not None
            else "."
        ),
    ]
    return "\n".join(lines)


def e2e_table(c: StepCosts) -> str:
    lines = [
        f"#### {c.name}: derived vs measured, {c.sampling_steps} steps",
        "",
        "| mode | derived from the step costs | measured (whole runs) | difference |",
        "|---|---:|---:|---:|",
    ]
    for name, tome in E2E:
        mode = M.MODES[name]
        derived = c.speedup(tome, mode.settings["cache_interval"], c.sampling_steps)
        measured = c.measured(name)
        lines.append(f"| {mode.label} | {derived:.2f}× | {measured:.2f}× | {measured / derived - 1:+.1%} |")
    lines += ["", f"Largest round-to-round spread of the whole runs: {c.spread():.1%}."]
    return "\n".join(lines)


def targets(results: list[StepCosts]) -> str:
    by = {(r.config["layout"], r.config["px"]): r for r in results if r.config.get("real")}
    lines = []
    sd = by.get(("sd15", 1024))
    if sd is not None:
        both, alone = sd.speedup("exact-0.5", 3), sd.speedup("plain", 3)
        lines.append(
            f"- SD1.5 1024 px, cache N=3 (branch 0) + ToMe defaults ≥ 2.5× over plain: {both:.2f}×: {verdict(both >= 2.5)}."
        )
        lines.append(
            f"- SD1.5 1024 px, the same ≥ 1.3× over the cache alone ({alone:.2f}×): {both / alone:.2f}×: "
            f"{verdict(both / alone >= 1.3)}."
        )
    xl = by.get(("sdxl", 1024))
    if xl is not None:
        both = xl.speedup("exact-0.5", 3)
        lines.append(
            f"- SDXL 1024 px, cache N=3 + ToMe defaults ≥ 2.2× over plain: {both:.2f}×: {verdict(both >= 2.2)}."
        )
    return "\n".join(lines)


SUMMARY = (
    ("exact-0.5", None, "ToMe default, no cache"),
    ("plain", 3, "cache N=3 alone (DeepCache)"),
    ("exact-0.5", 3, "cache N=3 + ToMe default"),
    ("todo-2", 3, "cache N=3 + ToDo"),
    ("plain", 5, "cache N=5 alone"),
    ("exact-0.5", 5, "cache N=5 + ToMe default"),
)
"""The summary table's columns: (token-merging mode, cache interval or None, title)."""


def summary_table(results: list[StepCosts]) -> str:
    """Derived 20-step speed-ups over plain at real width, one row per configuration."""
    lines = [
        "| step cache: model, size | " + " | ".join(title for *_, title in SUMMARY) + " |",
        "|---|" + "---:|" * len(SUMMARY),
    ]
    for r in results:
        if r.config.get("real"):
            cells = " | ".join(f"{r.speedup(mode, n):.2f}×" for mode, n, _ in SUMMARY)
            lines.append(f"| {Config(**r.config).name}, batch {r.config['batch']} | {cells} |")
    return "\n".join(lines)


def section(results: list[StepCosts], meta: dict) -> str:
    real = [r for r in results if r.config.get("real")]
    reduced = [r for r in results if not r.config.get("real")]
    return "\n".join(
        [
            BEGIN,
            "## Step cache (`python -m benchmarks.speed.cache`)",
            "",
            f"{meta['device']}, {meta['dtype']}, torch {meta['torch']}, {meta['threads']} torch thread(s); "
            f"{meta['rounds']} interleaved rounds, medians; run finished {meta['finished']} and took "
            f"{meta['seconds'] / 60:.0f} min. Seconds per UNet forward ({'GPU time' if meta['device'] != 'CPU' else 'process CPU time'}). "
            "A full step of our modes is timed with the cache on (its first step); a cached step is the one after "
            "it (branch 0). Plain's full step is the unpatched UNet; the built-in (tomesd) has no cache. "
            f"Derived speed-up of a {STEPS}-step run = {STEPS} plain full steps over the mode's full and cached "
            f"steps in the cache's schedule (N=3: {uniform_plan(_settings('plain'), STEPS).count(False)} full, "
            f"{uniform_plan(_settings('plain'), STEPS).count(True)} cached).",
            "",
            "### Targets (issue 14), judged from this run",
            "",
            targets(results) or "- (no real-width configuration in this run)",
            "",
            "### Speed-up of a 20-step run at real width (from this run)",
            "",
            summary_table(results),
            "",
            "### Real widths",
            "",
            *[costs_table(r) + "\n" for r in real],
            "### Reduced width: the derived speed-up against whole sampling runs",
            "",
            *[costs_table(r) + "\n\n" + e2e_table(r) + "\n" for r in reduced],
            END,
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = command(__doc__, quick="tiny sizes, 3 sampling steps; print only", rounds=2, threads=1, no_write="")
    args = parser.parse_args(argv)
    name = f"cache-{device_and_dtype()[0].type}"
    if args.render:
        return Section(name, BEGIN, END, lambda data, meta: section([StepCosts(**d) for d in data], meta)).rewrite()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    results = []

    def log(text: str) -> None:
        print(text, flush=True)

    for config in QUICK if args.quick else (*REAL, *REDUCED):
        log(f"{config.name}: {config.width}, batch {config.batch}")
        costs = measure_steps(config, args.rounds, log)
        if not config.real:
            measure_sampling(config, args.rounds, 3 if args.quick else STEPS, log, costs)
        results.append(costs)
        print(costs_table(costs) + "\n", flush=True)
        meta = run_meta(args, args.rounds, time.perf_counter() - start)
        if not args.quick and not args.no_write:
            save_run_data(name, [vars(r) for r in results], meta)
    text = section(results, run_meta(args, args.rounds, time.perf_counter() - start))
    print(text)
    if not args.quick and not args.no_write:
        write_section(text, BEGIN, END)


if __name__ == "__main__":
    main()
