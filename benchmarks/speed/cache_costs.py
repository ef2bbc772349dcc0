"""What the step caches' other kinds of step cost at real width (``python -m benchmarks.speed.cache_costs``), beside the full
and the cached step that ``benchmarks.speed.cache`` measures: the prices the fidelity benchmark puts on its modes' steps.

    python -m benchmarks.speed.cache_costs            # real widths on the CPU, one thread (a few minutes)
    python -m benchmarks.speed.cache_costs --quick    # tiny sizes: prints only (CI runs it)
    python -m benchmarks.speed.cache_costs --render   # the section again from benchmarks/runs/cache-costs-cpu.json

Per configuration (SD1.5 1024 px batch 2 and SDXL 1024 px batch 1: the calls ``benchmarks.speed.cache`` times), in interleaved
rounds (process CPU time, medians):

* ``first``: a First Block Cache skipped step: the time embedding and the UNet's first two blocks (``input_blocks[0]``
  and ``[1]``: at SD1.5's first level a ResBlock and a transformer, at SDXL's a ResBlock), the change of the second's
  residual and the residual added to the input;
* ``skip``: a step that runs no block (TeaCache, EasyCache): the change of the input and the residual added to it;
* ``spectrum``: Spectrum's forecast of the output (a ridge fit of Chebyshev polynomials over 8 computed steps);
* ``forecast``: our linear forecast of the deep features on a cached step (``d + slope * dt`` at branch 0), and
  ``slope``: its update on a full step;
* ``calibrated``: the calibrated forecast on a cached step (the live skip connection subsampled, its position on the
  probe's line per image, ``d + a * change``), and ``calibration``: its update on a full step (the change of the deep
  features and of the subsampled probe);
* ``signal``: our adaptive schedule's decision (the input's relative L1 distance from its forecast, on 1/16 of it).

Only the modules measured are built (the rest of the UNet stays on the meta device): the costs depend on the
architecture, not on the weights.
"""

from __future__ import annotations

import time

import torch

from benchmarks.lab import anchors
from benchmarks.lab.models import Config
from benchmarks.lab.prices import ExtraCosts
from benchmarks.lab.results import Section, command, load_run_data, run_command, run_meta
from benchmarks.lab.timing import Timer
from tome_core.caching import schedule
from tome_core.caching.forecast import Forecast

BEGIN, END = "<!-- cache-costs:begin -->", "<!-- cache-costs:end -->"
REAL = (Config("sd15", 1024, 320, 2, True), Config("sdxl", 1024, 320, 1, True))
QUICK = (Config("sd15", 128, 32, 1), Config("sdxl", 128, 32, 1))
KINDS = ("first", "skip", "spectrum", "forecast", "slope", "calibrated", "calibration", "signal")


def _first_blocks(config: Config) -> torch.nn.Module:
    """The UNet with only its time/label embedding and first two blocks materialised (random weights)."""
    with torch.device("meta"):
        unet = config.build()
    for name in ("time_embed", "label_emb"):
        if getattr(unet, name, None) is not None:
            getattr(unet, name).to_empty(device="cpu")
    for block in unet.input_blocks[:2]:
        block.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module in (unet.time_embed, getattr(unet, "label_emb", None), *unet.input_blocks[:2]):
            for p in module.parameters() if module is not None else ():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    return unet


def measure(config: Config, rounds: int, log) -> ExtraCosts:
    unet = _first_blocks(config)
    side = config.px // 8
    gen = torch.Generator().manual_seed(0)
    batch = config.batch  # the batch of the calls benchmarks.speed.cache times
    x, previous = (torch.randn(batch, 4, side, side, generator=gen) for _ in range(2))
    t = torch.full((batch,), 601.0)
    ctx, extra = config.conditioning()
    rule = anchors.FirstBlockCache(0.1)
    rule.unet, rule.step, rule.steps = unet, 5, 20
    rule.reference, rule.residual = None, torch.randn_like(x)
    deep = [torch.randn(batch, config.channels, side, side, generator=gen) for _ in range(3)]
    skips = [torch.randn_like(d) for d in deep]  # branch 0: input block 0's output, as wide as the deep features
    track, inputs, calibrated = Forecast("linear"), Forecast("linear"), Forecast("calibrated")
    for i, d in enumerate(deep[:2]):
        track.add(torch.tensor(900.0 - 100 * i), d)
        calibrated.add(torch.tensor(900.0 - 100 * i), d, skips[i])
        inputs.add(torch.tensor(900.0 - 100 * i), x[..., :: schedule.SUBSAMPLE, :: schedule.SUBSAMPLE].clone())
    spectrum = anchors.Spectrum()
    spectrum.steps = 20
    spectrum.history = [(s, torch.randn_like(x)) for s in range(8)]
    y = extra.get("y")

    def first() -> None:
        with torch.no_grad():
            emb = anchors.embedding(unet, t, y)
            h0 = unet.input_blocks[0](x, emb, ctx)
            h1 = unet.input_blocks[1](h0, emb, ctx)
            anchors.rel_l1(h1 - h0, h0)
            _ = x + rule.residual

    def skip() -> None:
        anchors.rel_l1(x, previous)
        _ = x + rule.residual

    def slope() -> None:
        fresh = Forecast("linear")
        fresh.time, fresh.deep = torch.tensor(800.0), deep[0]
        fresh.add(torch.tensor(700.0), deep[2])  # what a full step adds: the slope from the one before

    def calibration() -> None:
        fresh = Forecast("calibrated")
        fresh.time, fresh.deep, fresh.probe = torch.tensor(800.0), deep[0], calibrated.probe
        fresh.add(torch.tensor(700.0), deep[2], skips[2])  # the changes of the features and of the probe

    work = {
        "first": first,
        "skip": skip,
        "spectrum": lambda: spectrum._forecast(9),
        "forecast": lambda: track.predict(torch.tensor(700.0)),
        "slope": slope,
        "calibrated": lambda: calibrated.predict(torch.tensor(700.0), skips[2]),
        "calibration": calibration,
        "signal": lambda: schedule._relative_l1(
            x[..., :: schedule.SUBSAMPLE, :: schedule.SUBSAMPLE].float(), inputs.predict(torch.tensor(700.0))
        ),
    }
    for fn in work.values():
        fn()  # warm-up
    out = ExtraCosts(vars(config))
    for r in range(rounds):
        for kind in KINDS:
            with Timer(torch.device("cpu")) as timer:
                work[kind]()
            out.seconds.setdefault(kind, []).append(timer.cpu)
        log(f"  {config.name}: round {r + 1}/{rounds} done")
    return out


def section(results: list[ExtraCosts], meta: dict, full: dict[str, float]) -> str:
    """The RESULTS.md section; ``full``: plain's full step per configuration name (``benchmarks.speed.cache``'s run)."""
    lines = [
        BEGIN,
        "## What the caches' other steps cost (`python -m benchmarks.speed.cache_costs`)",
        "",
        f"CPU, float32, torch {meta['torch']}, {meta['threads']} torch thread(s); {meta['rounds']} interleaved rounds, "
        f"medians; run finished {meta['finished']} and took {meta['seconds'] / 60:.0f} min. Seconds of process CPU "
        "time per step (one UNet call of that batch), and as a fraction of plain's full step from `benchmarks.speed.cache`'s "
        "run (where it has the configuration). These price the fidelity benchmark's modes.",
        "",
        "| configuration | " + " | ".join(KINDS) + " |",
        "|---|" + "---:|" * len(KINDS),
    ]
    for r in results:
        name = Config(**r.config).name
        base = full.get(name)
        cells = [
            "—" if r.cost(k) is None else f"{r.cost(k):.4f} s" + (f" ({r.cost(k) / base:.4f})" if base else "")
            for k in KINDS
        ]
        lines.append(f"| {name}, batch {r.config['batch']} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, END])


def plain_full_steps() -> dict[str, float]:
    """Plain's full step per configuration name from the step-cache benchmark's CPU run (empty without one)."""
    from benchmarks.lab.prices import StepCosts

    try:
        data, _ = load_run_data("cache-cpu")
    except FileNotFoundError:
        return {}
    out = {}
    for d in data:
        costs = StepCosts(**d)
        if costs.config.get("real"):
            out[Config(**costs.config).name] = costs.cost("full", "plain")
    return out


SECTION = Section(
    "cache-costs-cpu", BEGIN, END, lambda data, meta: section([ExtraCosts(**d) for d in data], meta, plain_full_steps())
)


def main(argv: list[str] | None = None) -> None:
    def measure_all(args) -> tuple[list[dict], dict]:
        start, rounds = time.perf_counter(), 2 if args.quick else args.rounds
        results = [measure(c, rounds, print) for c in (QUICK if args.quick else REAL)]
        return [vars(r) for r in results], run_meta(args, rounds, time.perf_counter() - start)

    def text(args, results: list[dict], meta: dict) -> str:
        return section([ExtraCosts(**d) for d in results], meta, {} if args.quick else plain_full_steps())

    run_command(command(__doc__, quick="", rounds=5, threads=1), SECTION, argv, measure_all, text)


if __name__ == "__main__":
    main()
