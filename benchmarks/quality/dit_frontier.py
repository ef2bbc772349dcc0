"""Speed against fidelity on the trained FLUX-layout model (``python -m benchmarks.quality.dit_frontier``; issue 26's frontier
plot): every mode of :mod:`benchmarks.quality.dit_fidelity`'s run (our cache, each other cache by family) and of
:mod:`benchmarks.quality.dit_merge`'s (token merging, alone and with the cache), PSNR against plain's sample over the speed-up
priced at FLUX.1's real width; our cache at its defaults under Euler (:mod:`benchmarks.quality.dit_correction`'s
run: the setting ``cache_correction`` at its default) and the real libraries' best runs
(:mod:`benchmarks.quality.dit_libraries`' final runs, above 1.05×); the frontier (no other mode both faster and
closer) dashed. Reads the runs only.

    python -m benchmarks.quality.dit_frontier         # writes benchmarks/dit-frontier.png
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.lab import dit
from benchmarks.lab.correction import DEFAULT
from benchmarks.lab.results import load_run_data

PNG = Path(__file__).resolve().parents[1] / "dit-frontier.png"
FAMILIES = {
    "ours-default": ("ours at its defaults, under Euler (+ cache correction 0.75)", "darkred"),
    "ours": ("ours without the correction (other samplers; A1111, Forge)", "tab:red"),
    "ours-other": ("ours: other forecasts, schedules and starts (and FoCa's rule, a study)", "salmon"),
    "fbcache": ("First Block Cache", "tab:purple"),
    "teacache": ("TeaCache", "tab:pink"),
    "taylorseer": ("TaylorSeer", "tab:green"),
    "foca": ("FoCa", "tab:orange"),
    "magcache": ("MagCache", "tab:brown"),
    "easycache": ("EasyCache", "tab:olive"),
    "lazycache": ("LazyCache", "tab:cyan"),
    "merge": ("token merging (± the cache)", "tab:blue"),
    "libraries": ("the real libraries (cache-dit, diffusers): each one's best runs", "black"),
}


def points() -> list[tuple[str, str, float, float]]:
    """``(family, label, speed-up, PSNR)`` of every mode the two runs measured (32 px)."""
    out = []
    fidelity, _ = load_run_data("dit-fidelity")
    for name, row in fidelity.items():
        if not isinstance(row, dict) or "psnr" not in row:
            continue
        if "mode" in row:
            mode = row["mode"]
            auto = (mode["forecast"], mode["schedule"]) == ("linear", "uniform") and not mode.get("start")
            family = "ours" if auto and not mode.get("study") else "ours-other"
            label, speed = f"N={mode['interval']}", dit.priced(row["counts"])
        else:
            family, label = name.split("-")[0], ""
            speed = sum(row["speeds"]) / len(row["speeds"])
        out.append((family, label, speed, row["psnr"][0]))
    corrected, _ = load_run_data("dit-correction")
    for row in corrected["runs"].values():
        psnr = row[DEFAULT]
        out.append(("ours-default", f"N={row['interval']}", row["speed"], sum(psnr) / len(psnr)))
    libraries, _ = load_run_data("dit-libraries")
    out += [("libraries", "", row["speed"], row["psnr"]) for row in libraries["final"].values() if row["speed"] > 1.05]
    merged, _ = load_run_data("dit-merge")
    prices = dit.Prices(**merged["prices"])
    for row in merged["fidelity"].values():
        if "psnr" in row and row["merge"]:
            merge = dit.Merge(**row["merge"])
            out.append(("merge", merge.name, prices.speedup(row["counts"], merge.name), row["psnr"][0]))
    return out


def plot(path: Path = PNG) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = points()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for family, (label, colour) in FAMILIES.items():
        mine = [p for p in pts if p[0] == family]
        if mine:
            ax.scatter([p[2] for p in mine], [p[3] for p in mine], color=colour, s=20, label=label)
    for family, label, speed, psnr in pts:
        if label and family in ("ours-default", "ours", "merge"):
            ax.annotate(label, (speed, psnr), fontsize=6)
    front = sorted((p for p in pts if not any(o[2] >= p[2] and o[3] > p[3] for o in pts)), key=lambda p: p[2])
    ax.plot([p[2] for p in front], [p[3] for p in front], color="gray", lw=0.8, ls="--")
    ax.set_title("Trained FLUX-layout model, 64 seeds, 20 steps; speed priced at FLUX.1's real width", fontsize=9)
    ax.set_xlabel("speed-up over plain (FLUX.1 1024 px, CPU)")
    ax.set_ylabel("PSNR vs plain (dB)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    plot()
