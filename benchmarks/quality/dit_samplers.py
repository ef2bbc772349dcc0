"""Our cache under the samplers people run beside Euler (``python -m benchmarks.quality.dit_samplers``; issue 53): on
the trained FLUX-layout model (or the Wan-layout video model, ``--model wan``), under ComfyUI's ``euler``, ``dpmpp_2m``,
``deis``, ``res_multistep``, ``uni_pc`` and ``uni_pc_bh2`` (its own functions where a checkout is named,
``TOME_COMFYUI``; else the core's own, :mod:`benchmarks.lab.samplers`), each at 20 steps: plain under that sampler is
the reference, and our cache (the transformers' default: linear forecast, uniform schedule) at N = 2 … 5 with the
correction at its default (0.75, told the sampler as a host tells it) and without it (0), per-seed PSNR (mean and
worst seed) and the pass's speed priced at the real model's width.

    python -m benchmarks.quality.dit_samplers            # 64 seeds; writes its RESULTS.md section
    python -m benchmarks.quality.dit_samplers --quick    # 2 seeds, untrained weights: prints only
    python -m benchmarks.quality.dit_samplers --render   # the section again from benchmarks/runs/dit-samplers.json
    python -m benchmarks.quality.dit_samplers --model wan   # the Wan-layout model (run dit-samplers-wan)

The real libraries under these samplers are not in this run yet (issue 53, item 1).
"""

from __future__ import annotations

import time

from benchmarks.lab import dit
from benchmarks.lab import samplers as S
from benchmarks.lab.results import command, run_command
from benchmarks.lab.subjects import SUBJECTS, Subject, add_model_option, of_run, section_of
from benchmarks.lab.trained.metrics import psnr_ssim
from tome_core.settings import DEFAULTS, ToMeSettings

COMMAND = "dit-samplers"
STEPS = 20
INTERVALS = (2, 3, 4, 5)
GAINS = (0.0, DEFAULTS.cache_correction)


def run(seeds: int, steps: int, model, log, subject: Subject = SUBJECTS["flux"], names=S.NAMES) -> dict:
    """Per sampler of ``names``, per N of :data:`INTERVALS` and gain of :data:`GAINS`: per-seed PSNR against plain
    under that sampler, the pass's steps and its priced speed."""
    noise, labels = subject.noise(range(seeds)), subject.labels(range(seeds))
    functions, _ = S.functions()
    out: dict[str, dict] = {}
    for name in names:
        plain, _ = S.sample(model, noise, labels, steps, name, functions[name])
        for n in INTERVALS:
            for gain in GAINS:
                settings = ToMeSettings(ratio=0.0, cache=True, cache_interval=n, cache_correction=gain)
                samples, counts = S.sample(model, noise, labels, steps, name, functions[name], settings)
                psnr, _ = psnr_ssim(samples, plain)
                row = {"sampler": name, "interval": n, "gain": gain, "counts": counts, "psnr_per_seed": psnr.tolist()}
                row["speed"] = subject.priced(counts)
                out[f"{name}/N{n}/{gain:g}"] = row
                log(
                    f"{name} N={n} gain {gain:g}: {counts}, {float(psnr.mean()):.2f} dB (worst {float(psnr.min()):.1f})"
                )
    return out


def section(data_: dict, meta: dict) -> str:
    subject = of_run(meta)
    _, begin, end = subject.markers(COMMAND)
    lines = [
        begin,
        f"## The cache under other samplers (`python -m benchmarks.quality.dit_samplers{subject.option}`)",
        "",
        f"{subject.heading}, {meta['seeds']} seeds, {meta['steps']} steps on {subject.schedule}, CFG {dit.CFG:g}, "
        f"under {meta['source']}; {meta['seconds'] / 60:.0f} min (1 torch thread). PSNR (dB) against plain under the "
        "same sampler, per-seed mean (worst seed), of our cache (linear forecast, uniform schedule) at N with "
        "`cache_correction` 0 and at its default (0.75), which acts under each of these samplers through its linear "
        "map (`tome_core.caching.samplers`); speed priced at "
        f"{subject.width}. `uni_pc` and `uni_pc_bh2` run one step fewer (ComfyUI drops their next-to-last sigma).",
        "",
        *(
            [
                f"On this model ({subject.transformer}, whose output layer is not one module) the correction stands "
                "aside, as it says: both columns are the uncorrected cache.",
                "",
            ]
            if all(
                r["gain"] == 0 or r["psnr_per_seed"] == data_[key.rsplit("/", 1)[0] + "/0"]["psnr_per_seed"]
                for key, r in data_.items()
            )
            else []
        ),
        "| sampler | N | steps (full + cached) | speed | uncorrected | corrected (default) | gain |",
        "|---|---:|---|---:|---|---|---:|",
    ]
    rows: dict[tuple[str, int], dict[float, dict]] = {}
    for row in data_.values():
        rows.setdefault((row["sampler"], row["interval"]), {})[row["gain"]] = row
    for (name, n), by_gain in rows.items():
        off, on = by_gain[0.0], by_gain[DEFAULTS.cache_correction]

        def cell(row: dict) -> str:
            values = row["psnr_per_seed"]
            return f"{sum(values) / len(values):.1f} ({min(values):.1f})"

        gain = (sum(on["psnr_per_seed"]) - sum(off["psnr_per_seed"])) / len(on["psnr_per_seed"])
        counts = on["counts"] or {}
        speed = "" if on["speed"] is None else f"{on['speed']:.2f}×"
        steps = f"{counts.get('full', '?')} + {counts.get('cached', '?')}"
        lines.append(f"| {name} | {n} | {steps} | {speed} | {cell(off)} | {cell(on)} | {gain:+.1f} |")
    return "\n".join([*lines, end])


def main(argv: list[str] | None = None) -> None:
    def measure(args) -> tuple[dict, dict]:
        start = time.perf_counter()
        subject = SUBJECTS[args.model]
        seeds, steps = (2, 8) if args.quick else (dit.SEEDS, STEPS)
        model = subject.random() if args.quick else subject.load()
        results = run(seeds, steps, model, print, subject)
        _, source = S.functions()
        meta = {"seeds": seeds, "steps": steps, "source": source, "seconds": round(time.perf_counter() - start, 1)}
        return results, subject.stamped(meta)

    parser = command(__doc__, quick="", threads=1)
    add_model_option(parser)
    run_command(parser, section_of(COMMAND, section), argv, measure)


if __name__ == "__main__":
    main()
