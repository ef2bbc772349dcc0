"""``benchmarks.speed.comfy`` (the nodes in a real ComfyUI over its HTTP API): its workflow is one the ComfyUI double runs for
every mode, and its RESULTS.md section is rendered from the measurements."""

from __future__ import annotations

from pathlib import Path

import comfy_harness as ch
import torch

from benchmarks.speed import comfy

ROOT = Path(__file__).resolve().parents[1]


def test_every_modes_workflow_runs_in_the_comfy_double_up_to_the_sampler():
    ch.start(str(ROOT))
    latents = {}
    for name, patches in comfy.MODES.items():
        wf = comfy.workflow("sd15", 64, 4, patches)
        for node in ("6", "7"):  # the double has no VAE
            wf.pop(node)
        latents[name] = ch.samples(ch.run(wf))
    plain = latents.pop("plain")
    assert all(not torch.equal(latent, plain) for latent in latents.values())


def test_the_section_gives_each_modes_median_speed_up_over_plain_and_the_pixel_differences():
    cpu = {
        "plain": [100.0, 110.0],
        "TomePatchModel 0.5": [95.0, 105.0],
        "ours: ToMe": [80.0, 90.0],
        "ours: ToMeStepCache": [50.0, 60.0],
        "ours: ToMe + ToMeStepCache": [45.0, 45.0],
    }
    diff = dict.fromkeys(cpu, 7) | {"plain": 0}
    results = {"sd15": {"ckpt": "sd15.safetensors", "size": 512, "steps": 6, "cpu": cpu, "max_diff": diff}}
    meta = {
        "comfyui": "0.8.0",
        "torch": "2.13",
        "attention": comfy.attention(["main.py", "--cpu"]),
        "server": "nice 10, 2 threads",
        "rounds": 2,
        "seconds": 10.0,
        "finished": "now",
    }
    text = comfy.section(results, meta)
    assert text.startswith(comfy.BEGIN) and text.endswith(comfy.END)
    assert "| SD1.5 512 px, 6 steps | 1.00× | 1.05× | 1.24× | 1.91× | 2.33× |" in text
    assert "| SD1.5 512 px | ours: ToMe | 85 | 80, 90 | 7 |" in text
    assert "sub-quadratic (ComfyUI's CPU default)" in text
    assert comfy.attention(["main.py", "--use-pytorch-cross-attention"]).startswith("PyTorch SDPA")
