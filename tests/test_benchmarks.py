"""The benchmarks do not rot: the GPU command runs end to end (``--dry-run``, tiny sizes) and writes its section in
the agreed format without touching benchmarks/RESULTS.md; the sampling loop is the WebUI's (Euler on SD's
schedule, progress reported every step, nothing read back from the device)."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from models import make_unet
from test_host_reads import host_reads

import tome_core
from benchmarks import gpu
from benchmarks.lab import sampling as sampler
from benchmarks.lab import timing
from benchmarks.lab.models import Config
from benchmarks.lab.prices import ExtraCosts
from benchmarks.lab.results import load_run_data, write_section
from benchmarks.quality import dit_merge
from benchmarks.speed import cache, cache_costs, forge, suite
from benchmarks.speed import webui_its as sampling

ROOT = Path(__file__).resolve().parents[1]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu")
    before = digest(suite.RESULTS)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--dry-run", "--results", str(tmp / "R.md"), "--runs", str(tmp)],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert digest(suite.RESULTS) == before  # the real RESULTS.md is left alone
    return out.stdout, (tmp / "R.md").read_text(encoding="utf-8"), json.loads((tmp / "gpu.json").read_text())


def test_gpu_command_dry_run_prints_peak_memory_of_every_variant(dry_run):
    stdout, _, _ = dry_run
    for label in [*(sampling.LABELS[v] for v in sampling.VARIANTS), *(suite.LABELS[v] for v in suite.REAL_VARIANTS)]:
        assert any(line.startswith(f"  {label}: ") and "peak GPU memory" in line for line in stdout.splitlines()), label
    assert stdout.count("peak GPU memory") == len(gpu.DRY_SIZES) * len(sampling.VARIANTS) + len(gpu.DRY_SUITE) * len(
        suite.REAL_VARIANTS
    )


def test_gpu_command_dry_run_writes_its_section(dry_run):
    _, text, data = dry_run
    assert text.count(gpu.BEGIN) == 1 and text.count(gpu.END) == 1
    meta = data["meta"]
    assert f"Device: {meta['device']}. torch {torch.__version__}, CUDA {torch.version.cuda}" in text
    assert "Attention: scaled_dot_product_attention" in text and "DRY RUN" in text
    # the sampling table: one row per size, plain it/s then every variant's speed-up
    columns, rows = _table(text, "| sampling: size |")
    assert columns == ["plain it/s", *(sampling.LABELS[v] for v in sampling.VARIANTS[1:])]
    assert list(rows) == [f"{px} px" for px in gpu.DRY_SIZES]
    assert all(cell.endswith("×") for row in rows.values() for cell in row[1:])
    # one forward table per suite configuration, every variant with its peak memory column
    for config in gpu.DRY_SUITE:
        columns, rows = _table(text, f"#### {config.name} ({config.width}, batch {config.batch})\n\n|")
        assert columns[-1] == "peak MiB" and list(rows) == [suite.LABELS[v] for v in suite.REAL_VARIANTS]
    assert len(data["results"]["suite"]) == len(gpu.DRY_SUITE)
    # the step cache's rows: one table per configuration, every mode with a full and (ours) a cached step
    for config in gpu.DRY_CACHE:
        columns, rows = _table(text, f"#### {config.name} ({config.width}, batch {config.batch})\n\n| mode |")
        unit = "ms" if torch.cuda.is_available() else "s"  # the dry run on a CPU times in CPU seconds
        assert columns[:2] == [f"full step {unit}", f"cached step {unit}"] and len(rows) == 2 + len(cache.TOME)
    assert len(data["results"]["cache"]) == len(gpu.DRY_CACHE)
    assert [s["px"] for s in data["results"]["sampling"]] == list(gpu.DRY_SIZES)
    # FLUX.1's blocks: the step cache's costs and token merging's, every merge with the speed-up of a step
    columns, rows = _table(text, "| configuration | full step |")
    assert list(rows) == [gpu.DRY_FLUX.name] and columns[1:3] == ["double", "single"]
    columns, rows = _table(text, "| merging |")
    assert next(iter(rows)) == "plain" and len(rows) == 1 + len(dit_merge.WHERE) * len(dit_merge.RATIOS)
    assert all(row[-1].endswith("×") for row in rows.values())
    assert set(data["results"]["flux"]) == {"dtype", "costs", "merge"}


def _table(text: str, header: str) -> tuple[list[str], dict[str, list[str]]]:
    start = text.index(header) + header.index("|")
    rows = []
    for line in text[start:].splitlines():
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows[0][1:], {row[0]: row[1:] for row in rows[2:]}


def test_euler_schedule_is_sds_discrete_sigmas():
    sig = sampler.discrete_sigmas(20)
    assert len(sig) == 21 and sig[-1] == 0.0
    assert sig[0] == pytest.approx(14.6146, abs=1e-4) and sig[-2] == pytest.approx(0.0292, abs=1e-4)
    assert all(a > b for a, b in itertools.pairwise(sig))
    assert sampler.sigma_to_t(sig[0]) == pytest.approx(999) and sampler.sigma_to_t(sig[-2]) == pytest.approx(0)


def test_sampling_loop_reports_progress_every_step_and_reads_nothing_back():
    unet = make_unet("sd15")
    patch = sampling.switch(unet, "ours")
    seen = []
    report = patch.set_progress
    patch.set_progress = lambda f: (seen.append(f), report(f))
    noise = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    conditioning = {"context": torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(1))}
    sigmas = sampler.discrete_sigmas(3)
    with host_reads() as counts:
        out = sampling.sample(unet, noise, conditioning, sigmas, patch)
    assert seen == [0, 1 / 3, 2 / 3] and not counts and patch.merger.planner.plans_computed > 0
    sampling.switch(unet, "plain")
    assert tome_core.get_patch(unet) is None
    plain = sampling.sample(unet, noise, conditioning, sigmas, None)
    assert out.shape == plain.shape and 0 < ((out - plain).norm() / plain.norm()).item() < 0.2


def test_real_widths_are_the_shipped_architectures():
    """Parameter counts of the shipped UNets (SD1.5: 859,520,964; SDXL base: 2,567,463,684), built on meta tensors."""
    from ldm.modules.attention import SpatialTransformer
    from models import make_real_unet

    with torch.device("meta"):
        sd15, sdxl = make_real_unet("sd15"), make_real_unet("sdxl")
    assert sum(p.numel() for p in sd15.parameters()) == 859_520_964
    assert sum(p.numel() for p in sdxl.parameters()) == 2_567_463_684
    depths = sorted(
        {(m.in_channels, len(m.transformer_blocks)) for m in sdxl.modules() if isinstance(m, SpatialTransformer)}
    )
    assert depths == [(640, 2), (1280, 10)]
    block = sdxl.output_blocks[0][1].transformer_blocks[0]
    assert block.attn1.heads == 20 and block.attn2.to_k.in_features == 2048  # 64-dim heads, context 2048
    assert sdxl.label_emb[0].in_features == 2816


def test_half_precision_unet_runs_every_group_norm_in_one_dtype(monkeypatch):
    """``timing.prepare`` in float16 (the CUDA path): CUDA's group norm kernel takes input and weights of one dtype
    only, so no call may mix them; the half model's output stays that of the float32 one."""
    calls = []
    group_norm = torch.nn.functional.group_norm

    def recording(x, groups, weight=None, bias=None, eps=1e-5):
        calls.append((x.dtype, weight.dtype))
        return group_norm(x, groups, weight, bias, eps)

    unet = make_unet("sd15")
    x = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(0))
    t, ctx = torch.full((2,), 601.0), torch.randn(2, 77, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = unet(x, t, ctx)
        half = timing.prepare(unet, torch.device("cpu"), torch.float16)
        monkeypatch.setattr(torch.nn.functional, "group_norm", recording)
        out = half(x.half(), t, ctx.half())
    assert {torch.float16, torch.float32} == {w for _, w in calls}  # both kinds of GroupNorm were run
    assert all(x_dtype == w_dtype for x_dtype, w_dtype in calls), sorted(set(calls))
    assert out.dtype == torch.float16 and ((out.float() - full).norm() / full.norm()).item() < 1e-2


def test_forge_benchmark_runs_every_variant_on_both_layouts_with_the_same_outputs():
    config = Config("sd15", 64, 32, 1)
    stats = forge.run_config(config, 1)
    assert set(stats) == {(v, layout) for v in forge.VARIANTS for layout in forge.LAYOUTS}
    assert all(s["same"] for s in stats.values())  # each variant's output is the same on the ldm and Forge UNets
    assert all((s["error"] == 0) == (variant == "baseline") for (variant, _), s in stats.items())
    assert "bit-identical" in forge.table(config, stats) and "DIFFERENT" not in forge.table(config, stats)


def test_step_cache_benchmark_derives_the_speed_up_from_its_own_schedule(caplog):
    with caplog.at_level("WARNING", logger="tome_core"):
        costs = cache.measure_steps(Config("sd15", 64, 32, 1), 1, lambda s: None)
    assert not caplog.records  # each mode ran alone (no leftover tomesd merging before ours)
    assert set(costs.cached) == {"plain", *cache.TOME} and set(costs.full) == {
        "plain",
        "plain+cache",
        "tomesd",
        *cache.TOME,
    }
    assert costs.speedup("plain", None) == 1.0
    full, cached = costs.cost("full", "plain"), costs.cost("cached", "plain")
    assert costs.speedup("plain", 3) == pytest.approx(20 * full / (8 * full + 12 * cached))  # N=3: 8 full, 12 cached
    assert costs.held_bytes == 1 * 32 * 8 * 8 * 4  # branch 0: output_blocks[10]'s 32 channels at 8 x 8, float32
    cache.measure_sampling(Config("sd15", 64, 32, 1), 1, 3, lambda s: None, costs)
    assert set(costs.sampling) == {"plain", *(name for name, _ in cache.E2E)} and costs.sampling_steps == 3
    text = cache.section(
        [costs],
        {
            "device": "CPU",
            "dtype": "float32",
            "torch": "x",
            "threads": 1,
            "rounds": 1,
            "finished": "now",
            "seconds": 1.0,
        },
    )
    assert text.startswith(cache.BEGIN) and "derived vs measured, 3 steps" in text and "(no real-width" in text


def test_controlnet_benchmark_measures_the_cached_step_with_and_without_shortening_the_control_model():
    from benchmarks.speed import controlnet

    rows = {name: share for name, _, share in controlnet.measure_cached(64, 1, 32, 2)}
    assert set(rows) == {
        "full step (plain)",
        "cached step, control model in full",
        "cached step, control model shortened",
    }
    assert rows["full step (plain)"] == 1.0 and all(share > 0 for share in rows.values())


def test_cache_memory_measures_every_variant_and_the_exact_features_held():
    from benchmarks.speed import cache_memory

    config = Config("sd15", 128, 32, 1)
    r = {v: cache_memory.child(v, config) for v in cache_memory.VARIANTS}
    chunk = 32 * 16 * 16 * 4  # branch 0: model_channels at the latent size, float32
    assert r["plain"]["held"] == 0 and r["cache"]["held"] == chunk and r["linear"]["held"] == 2 * chunk  # + slope
    probe = 32 * 4 * 4 * 4  # the skip connection on every 4th pixel per side
    assert r["calibrated"]["held"] == 2 * chunk + 2 * probe  # + the probe and its change
    assert all(v["peak_rss"] > 0 for v in r.values())
    text = cache_memory.section([(config, r)], {"torch": "x", "finished": "now"})
    assert "| SD1.5 128 px, batch 1 |" in text and text.startswith(cache_memory.BEGIN)


def test_cache_costs_section_replaces_itself_in_results(tmp_path):
    """The section carries its markers, so writing it again replaces it instead of appending a copy."""
    data, meta = load_run_data("cache-costs-cpu")
    text = cache_costs.section([ExtraCosts(**d) for d in data], meta, {})
    assert text.startswith(cache_costs.BEGIN) and text.endswith(cache_costs.END)
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n", encoding="utf-8")
    for _ in range(2):
        write_section(text, cache_costs.BEGIN, cache_costs.END, path)
    written = path.read_text(encoding="utf-8")
    assert written.count(cache_costs.BEGIN) == 1 and "| SD1.5 1024 px, batch 2 |" in written


def test_diffusers_home_quick_runs_every_kind_of_method_in_its_pipeline_and_writes_nothing():
    """``python -m benchmarks.quality.diffusers_home --quick``: ours, DeepCache, cache-dit and diffusers' cache on the
    real diffusers pipelines (the SD1.5-layout UNet, the FLUX-layout transformer), and the tomesd-vs-ours width
    check, under a minute; the section is printed, RESULTS.md and the run file are left alone."""
    from benchmarks.quality import diffusers_home

    before = digest(suite.RESULTS)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.quality.diffusers_home", "--quick", "--workers", "1"],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert digest(suite.RESULTS) == before
    text = out[out.index(diffusers_home.BEGIN) : out.index(diffusers_home.END)]
    for row in ("`ours`", "`deepcache-N3`", "`cache-dit default`", "`diffusers fbcache`", "tomesd against ours"):
        assert row in text, row
    assert "| SD1.5 layout, Euler |" in text  # the bar's row


def test_diffusers_home_prices_merging_where_it_acts():
    """``apply_patch``'s ``max_downsample`` 1 merges at the UNet's first level only; the lab's SDXL-layout diffusers
    UNet has no transformer there (its pipeline's merged samples equal plain), so merging is priced as nothing there
    (1×; the cache's steps at the plain costs), and priced where it acts (SD1.5)."""
    from benchmarks.lab import diffusers_unets, home, prices
    from benchmarks.lab.trained.loading import load_model

    first = {name: diffusers_unets.diffusers_unet(load_model(name)).down_blocks[0] for name in ("sd15", "sdxl")}
    assert not hasattr(first["sdxl"], "attentions") and hasattr(first["sd15"], "attentions")
    assert sorted(prices.FIRST_LEVEL_EMPTY) == ["sdxl"]
    counts = {"full": 8, "cached": 12}
    assert home.unet_priced("sdxl", "ours-merge", counts) == 1.0
    assert home.unet_priced("sdxl", "ours-merge+cache", counts) == home.unet_priced("sdxl", "ours", counts)
    assert home.unet_priced("sd15", "ours-merge", counts) > 1.05
    assert home.unet_priced("sd15", "ours-merge+cache", counts) > home.unet_priced("sd15", "ours", counts)
