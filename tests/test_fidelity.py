"""The trained models ship and behave: the weights load into the documented architectures, ToMe and the step cache
patch and unpatch them bit-identically, the training script and a quick fidelity run work end to end. No test asserts
a quality number: the benchmark reports them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import tome_core
from benchmarks.lab import fidelity as B
from benchmarks.lab import sampling as S
from benchmarks.lab.trained import architectures as A
from benchmarks.lab.trained import data, load_classifier, load_model, training_data
from benchmarks.quality.fidelity import report as R

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["sd15", "sdxl"])
def test_shipped_weights_are_the_documented_architecture(name):
    m = load_model(name)  # strict loads of the UNet and the conditioner
    assert type(m.unet).__name__ == "UNetModel" and not m.unet.training
    assert m.classes == tuple("0123456789") and m.size == 32 and m.channels == 3
    levels = {}
    for module in m.unet.modules():
        if hasattr(module, "transformer_blocks"):
            levels.setdefault(module.in_channels, set()).add(len(module.transformer_blocks))
    mc = A.ARCHITECTURES[name].unet["model_channels"]
    if name == "sd15":  # transformers at downsample 1, 2 and 4 (channels 32, 64, 64), none at 8
        assert set(m.unet.attention_resolutions) == {1, 2, 4} and levels == {mc: {1}, 2 * mc: {1}}
    else:  # none at downsample 1, depth 2 at 2, 3 at 4
        assert set(m.unet.attention_resolutions) == {2, 4} and levels == {2 * mc: {2}, 3 * mc: {3}}
    kwargs = m.condition(torch.tensor([3, -1]))
    assert kwargs["context"].shape == (2, 4, 64) and ("y" in kwargs) == (name == "sdxl")
    assert sum(v.numel() for v in load_file(str(A.weights_path(name))).values()) == sum(
        p.numel() for p in [*m.unet.parameters(), *m.conditioner.parameters()]
    )


def test_shipped_files_are_small_and_have_model_cards():
    files = [A.weights_path(n) for n in ("sd15", "sdxl", "flux", "classifier")]
    assert sum(f.stat().st_size for f in files) <= 20 * 2**20
    for f in files:
        card = f.with_suffix(".md").read_text(encoding="utf-8")
        assert "Data:" in card and "Architecture:" in card and "Steps:" in card and "final loss" in card


@pytest.mark.parametrize("name", ["sd15", "sdxl"])
def test_tome_and_the_cache_patch_and_unpatch_the_trained_models_bit_identically(name):
    m = load_model(name)
    labels = torch.tensor([1, 7])
    x = data.draw(2, 2 * m.size, seed=5)[0]
    conditioning = S.batched(m.condition(labels), m.condition(torch.full_like(labels, -1)))

    def step(i: int, patch=None) -> torch.Tensor:
        if patch is not None:
            patch.set_progress(i / 4, 4)
        t = torch.full((4,), 900.0 - 200 * i)
        with torch.no_grad():
            return m.unet(torch.cat([x, x]), t, **conditioning)

    before = [step(i) for i in range(4)]
    patch = tome_core.apply_patch(m.unet, ratio=0.5, max_downsample="auto", seed=1, cache=True, cache_interval=2)
    patched = [step(i, patch) for i in range(4)]
    tome_core.remove_patch(m.unet)
    after = [step(i) for i in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    assert all(not torch.equal(a, b) for a, b in zip(patched, before))  # both changed something at every step


def test_training_data_is_seeded_and_in_the_unets_input_space():
    a, la = training_data("sd15", 8, seed=3)
    b, lb = training_data("sd15", 8, seed=3)
    c, _ = training_data("sdxl", 8, seed=4, size=64)
    assert torch.equal(a, b) and torch.equal(la, lb) and a.shape == (8, 3, 32, 32) and c.shape == (8, 3, 64, 64)
    assert a.min() >= -1 and a.max() <= 1 and set(la.tolist()) <= set(range(10))


def test_the_classifier_recognises_the_training_distribution():
    x, labels = training_data("sd15", 200, seed=123)
    with torch.no_grad():
        accuracy = (load_classifier()(x).argmax(1) == labels).float().mean().item()
    assert accuracy > 0.9  # the judge must be able to judge; the benchmark reports the samples' accuracy


@pytest.mark.parametrize("model", ["sd15", "sdxl", "flux", "wan", "classifier"])
def test_training_script_runs_a_few_steps(model, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.lab.trained.train",
            "--model",
            model,
            "--steps",
            "2",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    weights = load_file(str(tmp_path / f"{model}.safetensors"))
    assert weights and all(v.dtype == torch.float16 for v in weights.values())
    assert "Steps: 2" in (tmp_path / f"{model}.md").read_text(encoding="utf-8")


def test_a_training_stopped_and_resumed_from_its_state_ends_with_the_weights_of_one_never_stopped(
    tmp_path, monkeypatch
):
    from benchmarks.lab.trained import train as T

    run = {"model": "flux", "steps": 4, "seed": 0}
    straight, _ = T.train_flux(4, 0, lambda _: None)
    draw, drawn = data.draw, []

    def interrupted(*args):
        drawn.append(args)
        if len(drawn) == 4:  # the fourth step's batch: steps 1-2 are in the state (saved every 2), step 3 is lost
            raise KeyboardInterrupt
        return draw(*args)

    state = T.Resumable(tmp_path / "flux.state", run, every=2)
    monkeypatch.setattr(data, "draw", interrupted)
    with pytest.raises(KeyboardInterrupt):
        T.train_flux(4, 0, lambda _: None, state=state)
    monkeypatch.setattr(data, "draw", draw)
    said: list[str] = []
    resumed, stats = T.train_flux(4, 0, said.append, state=state)
    assert said[0] == f"continuing from {state.path} at step 2/4"
    assert resumed.keys() == straight.keys() and all(torch.equal(resumed[k], straight[k]) for k in straight)
    assert stats["steps"] == 4 and torch.load(state.path, weights_only=False)["step"] == 4
    other = T.Resumable(state.path, {**run, "seed": 1})
    with pytest.raises(ValueError, match=r"--state .*flux.state: seed 0 in the saved run, 1 asked for"):
        T.train_flux(4, 1, lambda _: None, state=other)


def test_the_training_command_keeps_its_state_and_continues_from_it(tmp_path):
    command = [sys.executable, "-m", "benchmarks.lab.trained.train", "--model", "flux", "--out", str(tmp_path)]
    command += ["--state", str(tmp_path / "flux.state"), "--save-every", "1"]
    run = lambda *extra: subprocess.run(  # noqa: E731
        [*command, *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    first = run("--steps", "2")
    assert first.returncode == 0, first.stderr[-2000:]
    again = run("--steps", "2")  # nothing left to do: the saved run's weights again
    assert again.returncode == 0 and f"continuing from {tmp_path / 'flux.state'} at step 2/2" in again.stdout
    other = run("--steps", "3")
    assert (
        other.returncode != 0 and "--state" in other.stderr and "steps 2 in the saved run, 3 asked for" in other.stderr
    )


def test_the_full_plan_covers_every_merging_mode_at_both_sides_on_both_layouts_and_both_samplers():
    assert B.FULL.seeds >= 64 and B.FULL.steps == 20
    cases = {(c.layout, c.side, c.sampler): set(names or B.modes_.MODES) for c, names in B.cases(B.FULL)}
    assert set(cases) == {
        (layout, side, sampler)
        for layout in A.ARCHITECTURES
        for side, sampler in ((32, "euler"), (64, "euler"), (32, "dpmpp_2m"))
    }
    every_tome = {m.name for m in B.modes_.TOME} | {"plain", "tomesd"}
    every_cache = {m.name for m in B.modes_.CACHE if "-from-" not in m.name}
    for layout in A.ARCHITECTURES:
        meaningful = {m.name for m in B.modes_.for_layout(layout)}  # max downsample 2 is SDXL's default already
        for side in (32, 64):  # every merging mode at the trained side and at 2x, on both layouts
            assert every_tome & meaningful <= cases[(layout, side, "euler")]
        assert every_cache & meaningful <= cases[(layout, 32, "euler")]  # every cache interval at the trained side
        assert "cache-3+exact-0.5" in cases[(layout, 64, "euler")]
        assert {"plain", "cache-3", "cache-3-from-0.2"} <= cases[(layout, 32, "dpmpp_2m")] <= set(B.modes_.MODES)
    assert "exact-0.5-md2" not in {m.name for m in B.modes_.for_layout("sdxl")}


def test_the_full_plan_puts_every_cache_family_side_by_side_in_every_case():
    """Issue 23: every family of step caches (DeepCache's two schedules, ours, the other UIs') under Euler and DPM++
    on both layouts and at SD1.5's 2x; every mode of the frontier at the trained side under Euler; ComfyUI's built-in
    beside ours there."""
    cases = {(c.layout, c.side, c.sampler): set(names or B.modes_.MODES) for c, names in B.cases(B.FULL)}
    frontier = {m.name for m in B.modes_.FRONTIER}
    families = {m.family for m in B.modes_.FRONTIER}
    assert families == {"deepcache", "deepcache-nonuniform", "ours", "fbcache", "teacache", "easycache", "spectrum"}

    def families_in(names: set[str]) -> set[str]:
        return {B.modes_.MODES[n].family for n in names if B.modes_.MODES[n].family}

    for layout in A.ARCHITECTURES:
        assert frontier | {"comfy-tome"} <= cases[(layout, 32, "euler")]
        assert families_in(cases[(layout, 32, "dpmpp_2m")]) == families
    assert families_in(cases[("sd15", 64, "euler")]) >= {"deepcache", "ours", "fbcache", "spectrum"}


def test_an_interrupted_run_resumes_with_the_modes_it_saved_and_one_scale_runs_alone():
    plan = B.Plan(2, 1, 2, {"euler": (("plain", "cache-3"), (1, 2))}, data_features=8)
    saves = []
    full = B.run(plan, lambda _: None, ("sd15",), lambda out, grids: saves.append(len(out["cases"][-1]["results"])))
    assert saves[:2] == [1, 2]  # saved after every mode
    grids = full.pop("grids")
    interrupted = {"cases": [{**full["cases"][0], "results": full["cases"][0]["results"][:1]}]}
    logged: list[str] = []
    again = B.run(plan, logged.append, ("sd15",), None, interrupted | {"untrained": full["untrained"]}, grids)
    assert again["cases"] == full["cases"]  # the same numbers: plain again, then the missing modes
    assert not any("untrained" in line for line in logged[1:]) and len(logged) == 1 + 2 + 2
    wide = B.run(plan, lambda _: None, ("sd15",), scale=2)
    assert [c["case"]["side"] for c in wide["cases"]] == [64] and not wide["untrained"]
    assert wide["cases"][0] == full["cases"][1]


def test_quick_fidelity_run_reports_its_modes_on_both_layouts():
    logged = []
    data_ = B.run(B.QUICK, logged.append)
    grids = data_.pop("grids")
    cases = R.load(data_)
    assert {(c.layout, c.side, c.sampler) for c, _ in cases} == {
        *((layout, side, "euler") for layout in ("sd15", "sdxl") for side in (32, 64)),
        ("sd15", 32, "dpmpp_2m"),
        ("sdxl", 32, "dpmpp_2m"),
    }
    for case, results in cases:
        assert next(iter(results)) == "plain" and results["plain"].psnr is None
        names = B.QUICK.samplers[case.sampler][0]
        assert [m.name for m in B.modes_.for_layout(case.layout, names)] == list(results)
        for name, r in results.items():
            assert len(r.eps_error) == B.QUICK.steps and (r.psnr is None) == (name == "plain")
            assert 0 <= r.accuracy.low <= r.accuracy.mean <= r.accuracy.high <= 1
    assert all(r.eps_error == [0.0] * B.QUICK.steps for _, rs in cases for n, r in rs.items() if n == "plain")
    meta = {
        "device": "CPU",
        "torch": "x",
        "threads": 1,
        "finished": "now",
        "seconds": 1.0,
        "seeds": 4,
        "eps_seeds": 2,
        "steps": 3,
    }
    text = R.section(data_, meta, "python -m benchmarks.quality.fidelity --quick")
    assert text.startswith(B.BEGIN) and text.endswith(B.END) and text.count("#### ") == len(cases)
    assert "| quality: mode |" in text and len(grids) == 4


def test_matched_speeds_judge_every_family_by_the_same_rule():
    """A family's PSNR at a target speed: its best mode within ±5 %, or the line between its two frontier modes
    around the target where that is higher; ours too (issue 23's matched-speed table)."""
    from benchmarks.lab import frontier as F

    def pt(name, family, speed, psnr):
        return F.Point(name, family, speed, speed, speed, psnr, 0.9)

    pts = [
        pt("cache-2-linear", "ours", 1.8, 42.0),
        pt("cache-3-linear", "ours", 2.4, 36.0),
        pt("cache-adaptive-0.04-10-linear", "ours", 2.05, 33.0),  # within ±5 % of 2x but under the line
        pt("cache-2", "deepcache", 1.6, 37.0),
        pt("cache-3", "deepcache", 2.0, 32.0),
        pt("fbcache-0.05", "fbcache", 3.0, 18.0),
    ]
    (value, source), others = F.matched(pts, 2.0)
    assert value == pytest.approx(42.0 - 6.0 / 3) and source.startswith("frontier of ")
    assert others["deepcache"] == 32.0 and others["fbcache"] == 18.0 and others["spectrum"] is None
    (value, source), _ = F.matched(pts, 2.4)
    assert value == 36.0 and "2.40×" in source and "N=3" in source
    assert F.matched(pts, 4.0)[0] == (None, "")
    (value, source), _ = F.matched(pts[:2], 1.5)  # every mode faster than the target: the best of them, said so
    assert value == 42.0 and source.endswith("1.80×, faster")


@pytest.mark.parametrize("name", ["sd15", "sdxl"])
def test_the_trained_models_as_diffusers_pipelines_are_the_same_models(name):
    """benchmarks.lab.diffusers_unets: diffusers' converter gives the same UNet (SDXL's time ids add nothing)."""
    from benchmarks.lab import diffusers_unets

    pipe = diffusers_unets.pipeline(name)
    labels = torch.tensor([0, 3])
    cond = pipe.model.condition(labels)
    x, t = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0)), torch.tensor([500.0, 120.0])
    more = {"added_cond_kwargs": {"text_embeds": cond["y"], "time_ids": torch.rand(2, 6) * 1024}} if "y" in cond else {}
    with torch.no_grad():
        ours = pipe.model.unet(x, t, **cond)
        theirs = pipe.pipe.unet(x, t, encoder_hidden_states=cond["context"], **more).sample
    assert (theirs - ours).norm() / ours.norm() < 1e-6
