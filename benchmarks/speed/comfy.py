"""The nodes in a real ComfyUI on the CPU: the server's CPU seconds for one txt2img prompt per mode, side by side.

    python -m benchmarks.speed.comfy --pid PID [--url http://127.0.0.1:8288] [--rounds 2] [--size 512] [--steps 6]
                               [--sd15 CKPT] [--sdxl CKPT] [--no-write]

A ComfyUI server must be running on this machine with this repository in ``custom_nodes/`` and the checkpoints in
``models/checkpoints`` (random weights are enough: a fixed schedule's cost does not depend on them); ``--pid`` is its
process, whose CPU time (user + system, from ``/proc``) is read before and after each prompt: on a shared machine
steadier than the wall clock. Each layout runs plain once to load its checkpoint and encode the prompts (not counted),
then ``--rounds`` rounds of every mode, the order rotated each round: plain, ComfyUI's ``TomePatchModel`` 0.5, ours
``ToMe`` (defaults), ``ToMeStepCache`` (defaults: N=3) and both. The sampler node gets an undeclared input that
changes each time, so ComfyUI runs the sampling again while the checkpoint and the prompts stay cached. Medians per
mode; each mode's image against plain's (max abs pixel difference). Writes ``benchmarks/runs/comfy-cpu.json`` and its
section of ``benchmarks/RESULTS.md``. Only HTTP calls of ComfyUI's API (``/prompt``, ``/history``, ``/view``,
``/system_stats``).
"""

from __future__ import annotations

import io
import json
import os
import statistics
import time
import urllib.parse
import urllib.request
import uuid
from typing import Any

import numpy as np

from benchmarks.lab.results import Section, command, run_command

BEGIN, END = "<!-- comfy-cpu:begin -->", "<!-- comfy-cpu:end -->"
RUN = "comfy-cpu"
MODES: dict[str, list[tuple[str, dict]]] = {
    "plain": [],
    "TomePatchModel 0.5": [("TomePatchModel", {"ratio": 0.5})],
    "ours: ToMe": [("ToMe", {})],
    "ours: ToMeStepCache": [("ToMeStepCache", {})],
    "ours: ToMe + ToMeStepCache": [("ToMe", {}), ("ToMeStepCache", {})],
}
LAYOUTS = {"sd15": "SD1.5", "sdxl": "SDXL"}


# --- ComfyUI's HTTP API ------------------------------------------------------------------------------------------


def _get(url: str, path: str, raw: bool = False) -> Any:
    with urllib.request.urlopen(url + path, timeout=60) as response:
        data = response.read()
    return data if raw else json.loads(data)


def _post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def run_prompt(url: str, workflow: dict, timeout: float = 3600) -> np.ndarray:
    """Queue ``workflow``, wait until it is done, return the first image it saved (H x W x 3, uint8)."""
    from PIL import Image

    prompt_id = _post(url, "/prompt", {"prompt": workflow, "client_id": uuid.uuid4().hex})["prompt_id"]
    deadline = time.monotonic() + timeout
    while True:
        entry = _get(url, f"/history/{prompt_id}").get(prompt_id)
        status = (entry or {}).get("status", {})
        if status.get("completed") or status.get("status_str") == "error":
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"prompt {prompt_id} not done after {timeout} s")
        time.sleep(0.5)
    if status.get("status_str") != "success":
        raise RuntimeError(f"prompt {prompt_id} failed: {json.dumps(status)[:2000]}")
    image = next(im for out in entry["outputs"].values() for im in out.get("images", []))
    query = urllib.parse.urlencode({k: image.get(k, "") for k in ("filename", "subfolder", "type")})
    return np.asarray(Image.open(io.BytesIO(_get(url, f"/view?{query}", raw=True))).convert("RGB"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def workflow(ckpt: str, size: int, steps: int, patches: list[tuple[str, dict]], seed: int = 1234) -> dict:
    """CheckpointLoaderSimple -> (patches, MODEL -> MODEL) -> KSampler (euler, normal, CFG 7) -> VAEDecode -> SaveImage."""
    wf: dict[str, dict] = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse on a cliff at dusk", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
    }
    model = ["1", 0]
    for i, (class_type, inputs) in enumerate(patches):
        wf[str(10 + i)] = {"class_type": class_type, "inputs": {**inputs, "model": model}}
        model = [str(10 + i), 0]
    wf["5"] = {
        "class_type": "KSampler",
        "inputs": {
            "model": model,
            "seed": seed,
            "steps": steps,
            "cfg": 7.0,
            "sampler_name": "euler",
            "scheduler": "normal",
            "positive": ["2", 0],
            "negative": ["3", 0],
            "latent_image": ["4", 0],
            "denoise": 1.0,
            "benchmark_nonce": uuid.uuid4().hex,  # undeclared: part of ComfyUI's cache key, never passed on
        },
    }
    wf["6"] = {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}}
    wf["7"] = {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "tome-benchmark"}}
    return wf


def attention(argv: list[str]) -> str:
    """The attention ComfyUI runs on the CPU, from its command line."""
    if "--use-pytorch-cross-attention" in argv:
        return "PyTorch SDPA (--use-pytorch-cross-attention)"
    if "--use-split-cross-attention" in argv:
        return "split (--use-split-cross-attention)"
    return "sub-quadratic (ComfyUI's CPU default)"


# --- the run -------------------------------------------------------------------------------------------------------


def measure(url: str, pid: int, ckpt: str, size: int, steps: int, rounds: int, say=print) -> dict:
    """One layout: every mode ``rounds`` times, interleaved; CPU seconds per round and the max pixel difference."""
    run_prompt(url, workflow(ckpt, size, steps, []))  # load the checkpoint, encode the prompts
    names = list(MODES)
    cpu: dict[str, list[float]] = {name: [] for name in names}
    images: dict[str, np.ndarray] = {}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            before = cpu_seconds(pid)
            images[name] = run_prompt(url, workflow(ckpt, size, steps, MODES[name]))
            cpu[name].append(cpu_seconds(pid) - before)
            say(f"  round {r + 1}: {name}: {cpu[name][-1]:.1f} CPU s")
    plain = images["plain"].astype(int)
    return {
        "ckpt": ckpt,
        "size": size,
        "steps": steps,
        "cpu": cpu,
        "max_diff": {name: int(np.abs(images[name].astype(int) - plain).max()) for name in names},
    }


def section(results: dict[str, dict], meta: dict) -> str:
    """The RESULTS.md section: per layout, each mode's median server CPU seconds and speed-up over plain."""
    header = "| ComfyUI (CPU): model, size | " + " | ".join(MODES) + " |"
    lines = [
        BEGIN,
        "## ToMe in the real ComfyUI (`python -m benchmarks.speed.comfy`)",
        "",
        f"ComfyUI {meta['comfyui']} (torch {meta['torch']}) on the CPU, {meta['attention']} attention, the server at "
        f"{meta['server']}; random-weight checkpoints ({', '.join(r['ckpt'] for r in results.values())}). One txt2img "
        f"prompt per cell (euler, normal, CFG 7, batch 1, VAE decode included): the median of {meta['rounds']} "
        "interleaved rounds of the server process's CPU seconds (user + system; the shared machine's wall clock is "
        f"not used), as speed-up over plain. Finished {meta['finished']}, {meta['seconds']:.0f} s.",
        "",
        header,
        "|---|" + "---:|" * len(MODES),
    ]
    for layout, r in results.items():
        base = statistics.median(r["cpu"]["plain"])
        cells = [f"{base / statistics.median(r['cpu'][name]):.2f}×" for name in MODES]
        lines.append(f"| {LAYOUTS[layout]} {r['size']} px, {r['steps']} steps | " + " | ".join(cells) + " |")
    lines += ["", "Server CPU seconds (median; each round) and the image's max abs pixel difference from plain's:", ""]
    lines += ["| model, size | mode | CPU s | rounds | max pixel diff |", "|---|---|---:|---|---:|"]
    for layout, r in results.items():
        for name in MODES:
            rounds = ", ".join(f"{s:.0f}" for s in r["cpu"][name])
            lines.append(
                f"| {LAYOUTS[layout]} {r['size']} px | {name} | {statistics.median(r['cpu'][name]):.0f} | {rounds} "
                f"| {r['max_diff'][name]} |"
            )
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = command(
        __doc__.split("\n\n")[0], rounds=2, no_write="", render="only rewrite the section from the last run's data"
    )
    parser.add_argument("--url", default="http://127.0.0.1:8288")
    parser.add_argument("--pid", type=int, required=True, help="the ComfyUI server's process id (its CPU time)")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--sd15", default="sd15-random.safetensors")
    parser.add_argument("--sdxl", default="sdxl-vega-random.safetensors", help="'' leaves SDXL out")
    parser.add_argument("--server", default="nice 10, 2 threads", help="how the server was started, for the text")

    def measure_all(args) -> tuple[dict, dict]:
        stats = _get(args.url, "/system_stats")
        started = time.time()
        results = {}
        for layout, ckpt in (("sd15", args.sd15), ("sdxl", args.sdxl)):
            if ckpt:
                print(f"{LAYOUTS[layout]} ({ckpt}), {args.size} px, {args.steps} steps")
                results[layout] = measure(args.url, args.pid, ckpt, args.size, args.steps, args.rounds)
        meta = {
            "comfyui": stats["system"].get("comfyui_version"),
            "torch": stats["system"].get("pytorch_version"),
            "attention": attention(stats["system"].get("argv", [])),
            "server": args.server,
            "rounds": args.rounds,
            "seconds": round(time.time() - started, 1),
            "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        }
        return results, meta

    run_command(parser, Section(RUN, BEGIN, END, section), argv, measure_all)


if __name__ == "__main__":
    main()
