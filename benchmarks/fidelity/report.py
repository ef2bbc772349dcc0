"""The fidelity benchmark's section of RESULTS.md, its sample grid and its speed-vs-fidelity plot."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from benchmarks import modes as modes_
from benchmarks import sampler as S

from . import architectures as A
from .benchmark import BEGIN, CFG, END, LAYOUT_NAMES, Case, ModeResult
from .data import to_uint8
from .metrics import IDENTICAL_PSNR, Estimate
from .speed import speedups

SAMPLES_PNG = A.WEIGHTS.parent / "samples.png"
FRONTIER_PNG = A.WEIGHTS.parent / "frontier.png"


def load(data: dict) -> list[tuple[Case, dict[str, ModeResult]]]:
    return [(Case(**c["case"]), {r["mode"]: ModeResult.from_json(r) for r in c["results"]}) for c in data["cases"]]


def case_table(case: Case, results: dict[str, ModeResult]) -> str:
    speed = speedups(case.layout)
    lines = [
        f"#### {case.name}",
        "",
        "| mode | PSNR dB vs plain | SSIM vs plain | ε rel. error (mean over steps) | class accuracy | KID ×10³ | speed-up at 1024 px, real width |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        mode = modes_.MODES[name]
        s = speed.get(name)
        lines.append(
            f"| {mode.label} | {'—' if r.psnr is None else _psnr(r.psnr, r.psnr.cell())} | {'—' if r.ssim is None else r.ssim.cell('.3f')} | "
            f"{np.mean(r.eps_error):.3f} | {_pct(r.accuracy)} | "
            f"{r.kid.cell('.1f', 1e3)} | {'—' if s is None else f'{s:.2f}×'} |"
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
    speed = {layout: speedups(layout) for layout in layouts}
    for name in dict.fromkeys(n for _, r in cases for n in r):
        cells = [modes_.MODES[name].label]
        for _, results in cases:
            r = results.get(name)
            psnr = "—" if r is None or r.psnr is None else _psnr(r.psnr, f"{r.psnr.mean:.1f}")
            cells.append("" if r is None else f"{psnr}, {r.accuracy.mean:.0%}")
        cells += ["—" if speed[layout].get(name) is None else f"{speed[layout][name]:.2f}×" for layout in layouts]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
        + ". The two models of `benchmarks/fidelity/` (model cards: "
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
        "![plain samples, both models, trained side and 2x](fidelity/samples.png)",
        "",
        "![speed vs fidelity](fidelity/frontier.png)",
        "",
        "### Summary: Euler, every case (empty: the mode was not run there)",
        "",
        summary_table(runs),
        "",
        "### Summary: DPM++ 2M (Karras), the cache from the start and from 20 %",
        "",
        summary_table(runs, "dpmpp_2m"),
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
    """Speed-up (real width, 1024 px) against PSNR vs plain, Euler, one panel per layout and side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(c, r) for c, r in load(data) if c.sampler == "euler"]
    fig, axes = plt.subplots(2, 2, figsize=(12, 9), squeeze=False)
    for ax, (case, results) in zip(axes.flat, runs):
        speed = speedups(case.layout)
        points = sorted(
            (speed[name], r.psnr.mean, name)
            for name, r in results.items()
            if r.psnr is not None and not _identical(r.psnr) and name in speed  # identical to plain: no point to draw
        )
        for x, y, name in points:
            ax.scatter(x, y, color="tab:orange" if (modes_.MODES[name].settings or {}).get("cache") else "tab:blue")
            ax.annotate(modes_.MODES[name].label.removeprefix("ours: "), (x, y), fontsize=7)
        frontier = [pt for pt in points if not any(o[0] >= pt[0] and o[1] > pt[1] for o in points)]
        ax.plot([x for x, *_ in frontier], [y for _, y, _ in frontier], color="gray", lw=0.8, ls="--")
        ax.set_title(f"{case.name}; speed at 1024 px real width", fontsize=9)
        ax.set_xlabel("speed-up over plain (real width, CPU; orange: step cache)")
        ax.set_ylabel("PSNR vs plain (dB)")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(runs) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
