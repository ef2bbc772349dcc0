"""The fidelity benchmark's section of RESULTS.md, its sample grid and its speed-vs-fidelity plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.lab import frontier as F
from benchmarks.lab import modes as modes_
from benchmarks.lab import sampling as S
from benchmarks.lab.fidelity import BEGIN, CFG, END, LAYOUT_NAMES, Case, ModeResult
from benchmarks.lab.prices import speedups
from benchmarks.lab.trained import architectures as A
from benchmarks.lab.trained.data import to_uint8
from benchmarks.lab.trained.metrics import IDENTICAL_PSNR, Estimate

SAMPLES_PNG = Path(__file__).resolve().parent / "samples.png"
FRONTIER_PNG = Path(__file__).resolve().parent / "frontier.png"


def load(data: dict) -> list[tuple[Case, dict[str, ModeResult]]]:
    return [(Case(**c["case"]), {r["mode"]: ModeResult.from_json(r) for r in c["results"]}) for c in data["cases"]]


def case_table(case: Case, results: dict[str, ModeResult]) -> str:
    fixed = speedups(case.layout)
    lines = [
        f"#### {case.name}",
        "",
        "| mode | PSNR dB vs plain | SSIM vs plain | ε rel. error (mean over steps) | class accuracy | KID ×10³ | speed-up at 1024 px, real width |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        mode = modes_.MODES[name]
        s = (1.0, 1.0, 1.0) if name == "plain" else F.speed_of(case, name, r, fixed)
        speed = "—" if s is None else f"{s[0]:.2f}×" + (f" [{s[1]:.2f}, {s[2]:.2f}]" if s[1] != s[2] else "")
        lines.append(
            f"| {mode.label} | {'—' if r.psnr is None else _psnr(r.psnr, r.psnr.cell())} | {'—' if r.ssim is None else r.ssim.cell('.3f')} | "
            f"{np.mean(r.eps_error):.3f} | {_pct(r.accuracy)} | "
            f"{r.kid.cell('.1f', 1e3)} | {speed} |"
        )
    return "\n".join(lines)


def summary_table(runs: list[tuple[Case, dict[str, ModeResult]]], sampler: str = "euler") -> str:
    """Per mode: PSNR vs plain and class accuracy in every ``sampler`` case (layout, side), and the speed-up at
    1024 px real width per layout."""
    cases = [(c, r) for c, r in runs if c.sampler == sampler]
    layouts = [layout for layout in A.ARCHITECTURES if any(c.layout == layout for c, _ in cases)]
    if not cases:
        return ""
    short = {layout: LAYOUT_NAMES[layout].removesuffix(" layout") for layout in layouts}
    title = "quality: mode" if sampler == "euler" else f"quality, {S.LABELS[sampler]}: mode"
    header = [title, *(f"{short[c.layout]} {c.side} px: PSNR dB, accuracy" for c, _ in cases)]
    header += [f"{short[layout]} speed-up (1024 px, real width)" for layout in layouts]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    speed = {layout: layout_speeds(runs, layout, sampler) for layout in layouts}
    for name in dict.fromkeys(n for _, r in cases for n in r):
        cells = [modes_.MODES[name].label]
        for _, results in cases:
            r = results.get(name)
            psnr = "—" if r is None or r.psnr is None else _psnr(r.psnr, f"{r.psnr.mean:.1f}")
            cells.append("" if r is None else f"{psnr}, {r.accuracy.mean:.0%}")
        cells += ["—" if speed[layout].get(name) is None else f"{speed[layout][name]:.2f}×" for layout in layouts]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def layout_speeds(
    runs: list[tuple[Case, dict[str, ModeResult]]], layout: str, sampler: str = "euler"
) -> dict[str, float]:
    """Mode → speed-up on ``layout``: the real-width runs' figure, or what its steps cost in the layout's first case
    with ``sampler`` that ran it (the trained side: a data-dependent schedule's speed there), else in another case."""
    out = dict(speedups(layout))
    ordered = sorted(runs, key=lambda run: run[0].sampler != sampler)  # stable: the sampler's cases first
    for case, results in ordered:
        if case.layout == layout:
            for p in F.points(case, results):
                out.setdefault(p.name, p.speed)
    return out


def _identical(e: Estimate) -> bool:
    """Every sample equals plain's (its PSNR is counted as ``IDENTICAL_PSNR``)."""
    return e.low >= IDENTICAL_PSNR


def _psnr(e: Estimate, cell: str) -> str:
    """``cell``, or "identical" where every sample equals plain's."""
    return "identical" if _identical(e) else cell


def _pct(e: Estimate) -> str:
    return f"{e.mean:.0%} [{e.low:.0%}, {e.high:.0%}]"


def section(data: dict, meta: dict, command: str) -> str:
    runs = load(data)
    plain = {(c.layout, c.side, c.sampler): r["plain"].accuracy for c, r in runs}
    learned = []
    for layout, arch in A.ARCHITECTURES.items():
        trained = plain.get((layout, arch.size, "euler"))
        if trained is None:
            continue
        untrained = Estimate.from_json(data["untrained"][layout])
        learned.append(
            f"- {LAYOUT_NAMES[layout]} (`{layout}`): plain CFG samples at {arch.size} px are recognised as their class in "
            f"{_pct(trained)} of seeds (chance 10 %); the same architecture untrained: {_pct(untrained)}."
        )
    parts = [
        BEGIN,
        f"## Fidelity on trained models (`{command}`)",
        "",
        f"{meta['device']}, torch {meta['torch']}, {meta['threads']} torch thread(s); run finished {meta['finished']} "
        f"and took {meta['seconds'] / 60:.0f} min of wall time"
        + (f" in {meta['parts']} parts, some side by side on the shared machine" if meta.get("parts", 1) > 1 else "")
        + ". The two models of `benchmarks/quality/fidelity/` (model cards: "
        "[sd15](fidelity/weights/sd15.md), [sdxl](fidelity/weights/sdxl.md)): the real ldm `UNetModel` in SD1.5's and "
        "SDXL's layouts at reduced width, trained here on digit glyphs over photo crops (10 classes, the class is "
        f"the prompt). {meta['seeds']} seeds per case, each conditioned on class `seed % 10`; CFG {CFG:g}, "
        f"{meta['steps']} steps, the WebUI's sigmas (discrete for Euler, Karras for DPM++ 2M), progress reported "
        "every step. Every mode samples the same noise. Intervals: bootstrap 95 % over seeds. ε error: the guided ε "
        f"at each input of plain's trajectory against plain's, first {meta['eps_seeds']} seeds. Class accuracy and "
        "KID (×10³, cubic kernel, against 1,000 training draws) in the shipped classifier's feature space "
        "([card](fidelity/weights/classifier.md)). Speed-up: from the real-width CPU runs (SD1.5 / SDXL at 1024 px), "
        "not from these small models; — where no run measured the mode.",
        "",
        "### The models learned",
        "",
        *learned,
        "",
        "![plain samples, both models, trained side and 2x](quality/fidelity/samples.png)",
        "",
        "![speed vs fidelity](quality/fidelity/frontier.png)",
        "",
        "### Summary: Euler, every case (empty: the mode was not run there)",
        "",
        summary_table(runs),
        "",
        "### Summary: DPM++ 2M (Karras), the cache from the start and from 20 %",
        "",
        summary_table(runs, "dpmpp_2m"),
        "",
        "### The step caches at matched speeds",
        "",
        "Per case and target speed (of a 20-step run at 1024 px, real width; ±5 %): our most faithful mode there, "
        "and every other family's PSNR at that speed: its best mode within ±5 %, or the value of its frontier (the "
        "line between its two modes around the target) where that is higher; — where the family has no mode that "
        "fast. Margin: ours minus the best other. Speeds of data-dependent modes are means over seeds (their spread "
        "below).",
        "",
        F.matched_table(runs),
        "",
        "At DeepCache N=3's fidelity: each family's fastest mode at least as faithful as DeepCache N=3 (the cache "
        "alone, uniform) in that case, and how much faster than N=3 it is.",
        "",
        F.at_fidelity_table(runs),
        "",
        "The data-dependent modes, seed by seed: their steps by kind (mean [min, max] over the seeds) and the spread "
        "of their speed (each seed's steps priced at real width: `benchmarks.speed.cache` and `benchmarks.speed.cache_costs`).",
        "",
        F.per_seed_table(runs),
        "",
        "### Every case",
        "",
        *[case_table(c, r) + "\n" for c, r in runs],
        END,
    ]
    return "\n".join(parts)


def sample_grid(grids: dict[str, torch.Tensor], path=SAMPLES_PNG, per_class: int = 4) -> None:
    """Plain samples: one panel per model and side, ``per_class`` rows of the ten classes (seed = row·10 + class)."""
    panels = []
    for title, images in grids.items():
        n = min(len(images), 10 * per_class)
        rows = n // 10
        if rows == 0:
            continue
        u = to_uint8(images[: rows * 10])
        side = u.shape[1]
        grid = u.reshape(rows, 10, side, side, 3).transpose(0, 2, 1, 3, 4).reshape(rows * side, 10 * side, 3)
        scale = max(1, 64 // side)
        panels.append((title, Image.fromarray(grid).resize((grid.shape[1] * scale, grid.shape[0] * scale))))
    if not panels:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3.6 * len(panels)))
    for ax, (title, img) in zip(np.atleast_1d(axes), panels):
        ax.imshow(img)
        ax.set_title(f"{title}: plain CFG samples, columns = classes 0–9")
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def frontier_plot(data: dict, path=FRONTIER_PNG) -> None:
    """Speed-up (real width, 1024 px) against PSNR vs plain, one panel per case, every family of modes in its own colour
    (token merging alone, DeepCache, ours, each other UI's cache); ours labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load(data)
    cols = 3
    fig, axes = plt.subplots(
        (len(runs) + cols - 1) // cols, cols, figsize=(18, 5.5 * ((len(runs) + cols - 1) // cols)), squeeze=False
    )
    names = {"": "token merging alone", **F.FAMILIES}
    for ax, (case, results) in zip(axes.flat, runs):
        pts = [p for p in F.points(case, results) if p.psnr is not None and p.psnr < IDENTICAL_PSNR]
        for family, colour in F.COLOURS.items():
            mine = [p for p in pts if p.family == family]
            if mine:
                ax.scatter([p.speed for p in mine], [p.psnr for p in mine], color=colour, s=18, label=names[family])
        for p in pts:
            if p.family == "ours":
                ax.annotate(modes_.MODES[p.name].label.removeprefix("ours: "), (p.speed, p.psnr), fontsize=6)
        frontier = sorted(
            (p for p in pts if not any(o.speed >= p.speed and o.psnr > p.psnr for o in pts)), key=lambda p: p.speed
        )
        ax.plot([p.speed for p in frontier], [p.psnr for p in frontier], color="gray", lw=0.8, ls="--")
        ax.set_title(f"{case.name}; speed at 1024 px real width", fontsize=9)
        ax.set_xlabel("speed-up over plain (real width, CPU)")
        ax.set_ylabel("PSNR vs plain (dB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower left")
    for ax in axes.flat[len(runs) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
