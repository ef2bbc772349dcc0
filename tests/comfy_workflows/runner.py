"""Runs the example workflows (ComfyUI's UI format) in a real ComfyUI through its HTTP API.

``to_api`` converts a UI-format workflow to the API format the way the frontend does ("Save (API)"): every node that
runs (not a Note, MarkdownNote, Reroute or PrimitiveNode, not muted or bypassed) with its links resolved through
reroutes and bypassed nodes (a bypassed node passes on its input of the output's type), and its ``widgets_values``
named from the server's ``/object_info``: the widget inputs in their order, required then optional, where a seed
with ``control_after_generate`` carries one more value (the "randomize"/"fixed" control, not an input).

``shrink`` makes a workflow small enough for a CPU: every empty latent made ``size`` px square (and video ``frames``
long); the samplers, steps, CFG, models and ToMe settings stay as they are (they decide what the ToMe nodes do).

Used by ``tests/test_example_workflows.py`` (the harness test) and by hand:
    python tests/comfy_workflows/runner.py --port 8288 example_workflows/tome_flux1_dev.json [...]
with a ComfyUI already started by the harness's ``start_comfy.sh`` (``COMFY_HARNESS`` = its folder).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

NOT_RUN = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}
MUTED, BYPASSED = 2, 4
WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
LATENTS = {"EmptyLatentImage", "EmptySD3LatentImage", "EmptyHunyuanLatentVideo"}


def _is_widget(spec: Any) -> bool:
    kind = spec[0]
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    return (isinstance(kind, list) or kind in WIDGET_TYPES) and not options.get("forceInput")


def _control(name: str, spec: Any) -> bool:
    options = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    return bool(options.get("control_after_generate", name in ("seed", "noise_seed") and spec[0] == "INT"))


def to_api(workflow: dict[str, Any], object_info: dict[str, Any]) -> dict[str, Any]:
    """The API-format prompt of a UI-format workflow (see the module's docstring)."""
    nodes = {n["id"]: n for n in workflow["nodes"]}
    links = {link[0]: link for link in workflow["links"]}

    def source(link_id: int) -> list[Any] | None:
        link = links[link_id]
        origin, slot = nodes[link[1]], link[2]
        if origin["type"] == "Reroute":
            return source(origin["inputs"][0]["link"])
        if origin.get("mode", 0) == BYPASSED:
            kind = origin["outputs"][slot]["type"]
            through = next(
                (x for x in origin.get("inputs", []) if x["type"] == kind and x.get("link") is not None), None
            )
            return source(through["link"]) if through is not None else None
        if origin.get("mode", 0) == MUTED:
            return None
        return [str(origin["id"]), slot]

    prompt: dict[str, Any] = {}
    for node in workflow["nodes"]:
        if node["type"] in NOT_RUN or node.get("mode", 0) in (MUTED, BYPASSED):
            continue
        assert node["type"] in object_info, f"node {node['id']}: ComfyUI has no node {node['type']}"
        spec = object_info[node["type"]]["input"]
        named = [*spec.get("required", {}).items(), *spec.get("optional", {}).items()]
        values = list(node.get("widgets_values") or [])
        if isinstance(node.get("widgets_values"), dict):  # a few nodes keep them by name
            values, by_name = [], node["widgets_values"]
        else:
            by_name = {}
        inputs: dict[str, Any] = {}
        i = 0
        for name, input_spec in named:
            if not _is_widget(input_spec):
                continue
            if name in by_name:
                inputs[name] = by_name[name]
            elif i < len(values):
                inputs[name] = values[i]
                i += 1
                if _control(name, input_spec):
                    i += 1
        for x in node.get("inputs", []):
            if x.get("link") is not None:
                found = source(x["link"])
                if found is not None:
                    inputs[x["name"]] = found
                elif x["name"] in inputs and not _is_widget_name(named, x["name"]):
                    del inputs[x["name"]]
        prompt[str(node["id"])] = {
            "class_type": node["type"],
            "inputs": inputs,
            "_meta": {"title": node.get("title", node["type"])},
        }
    return prompt


def _is_widget_name(named: list, name: str) -> bool:
    return any(n == name and _is_widget(s) for n, s in named)


def shrink(prompt: dict[str, Any], size: int = 256, frames: int = 5) -> dict[str, Any]:
    """Every empty latent ``size`` px square and ``frames`` long (video); nothing else changed."""
    for node in prompt.values():
        if node["class_type"] in LATENTS:
            node["inputs"]["width"] = node["inputs"]["height"] = size
            if "length" in node["inputs"]:
                node["inputs"]["length"] = frames
    return prompt


def run(path: str, port: int, log: str, size: int, frames: int, timeout: float = 3600) -> dict[str, Any]:
    """Run one workflow file in the ComfyUI at ``port`` (whose console goes to ``log``): its new console text, the
    seconds it took, the outputs' files."""
    import comfy_api

    with open(path, encoding="utf-8") as f:
        workflow = json.load(f)
    prompt = shrink(to_api(workflow, comfy_api.object_info(port=port)), size, frames)
    start = os.path.getsize(log)
    t0 = time.time()
    info = comfy_api.run_info(prompt, port=port, timeout=timeout)
    seconds = time.time() - t0
    time.sleep(0.5)
    with open(log, encoding="utf-8", errors="replace") as f:
        f.seek(start)
        console = f.read()
    return {"console": console, "seconds": seconds, "info": info, "prompt": prompt}


def tome_lines(console: str) -> list[str]:
    """Our node's console lines (``ToMe: True, ...`` with the cache steps, ``ToMe note: ...``, ``ToMe error: ...``)."""
    return [
        line.strip()
        for line in console.splitlines()
        if "ToMe" in line and ("ToMe: " in line or "ToMe note" in line or "ToMe error" in line)
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workflows", nargs="+")
    p.add_argument("--port", type=int, default=8288)
    p.add_argument("--harness", default=os.environ.get("TOME_COMFY_HARNESS", os.path.expanduser("~/comfy-harness")))
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--frames", type=int, default=5)
    a = p.parse_args(argv)
    sys.path.insert(0, a.harness)
    for path in a.workflows:
        out = run(path, a.port, os.path.join(a.harness, "comfy.log"), a.size, a.frames)
        print(f"== {os.path.basename(path)}: {out['seconds']:.0f} s")
        for line in tome_lines(out["console"]):
            print("  ", line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
