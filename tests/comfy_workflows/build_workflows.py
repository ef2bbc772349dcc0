"""Builds ``example_workflows/*.json`` (and their ``.jpg`` thumbnails) from ComfyUI's own templates.

Usage (any Python with torch, Pillow and this checkout; the templates are the ``comfyui-workflow-templates`` package
ComfyUI installs, 0.7.67 in the harness):
    python tests/comfy_workflows/build_workflows.py TEMPLATES_SITE_PACKAGES [--out example_workflows]

Each workflow is the family's template graph (its nodes, positions, file names, samplers and prompts) with the ToMe
nodes wired in between the model loader(s) and the sampler(s), a ``Note`` saying what they do there, and the changes
the tests' table asks for (said in each builder below and in the Note). The thumbnail is a picture of the graph
(ComfyUI's frontend shows ``/api/workflow_templates/<custom node>/<name>.jpg`` beside a custom node's template).
Run once by hand; the JSON files are what ships and what the tests check.
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import sys
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from comfy_tome import inputs  # noqa: E402
from comfy_tome.nodes import NODE_DISPLAY_NAME_MAPPINGS  # noqa: E402

TOME_SIZE = {"ToMe": [340, 430], "ToMeStepCache": [340, 250]}
TOME_COLOR = {"color": "#2a363b", "bgcolor": "#3f5159"}


def default_widgets(node_type: str, **given: Any) -> list[Any]:
    """The widgets_values of one of our nodes: every setting in its input order, the record's default unless given."""
    optional = inputs.input_types(inputs.merge_fields() if node_type == "ToMe" else inputs.cache_fields(), "")
    names = list(optional["optional"])
    unknown = set(given) - set(names)
    assert not unknown, f"{node_type} has no input {unknown}"
    return [given.get(name, optional["optional"][name][1]["default"]) for name in names]


class Graph:
    """A UI-format workflow being edited: nodes by id, links as the frontend's arrays."""

    def __init__(self, data: dict[str, Any]):
        self.d = data
        self.nodes = {n["id"]: n for n in data["nodes"]}

    def node(self, node_id: int) -> dict[str, Any]:
        return self.nodes[node_id]

    def _link(self, link_id: int) -> list[Any]:
        return next(link for link in self.d["links"] if link[0] == link_id)

    def remove(self, *ids: int) -> None:
        for node_id in ids:
            node = self.nodes.pop(node_id)
            self.d["nodes"].remove(node)
            for link in [link for link in self.d["links"] if node_id in (link[1], link[3])]:
                self.unlink(link[0])

    def unlink(self, link_id: int) -> None:
        link = self._link(link_id)
        self.d["links"].remove(link)
        origin, target = self.nodes.get(link[1]), self.nodes.get(link[3])
        if origin is not None:
            out = origin["outputs"][link[2]]
            out["links"] = [i for i in (out.get("links") or []) if i != link_id]
        if target is not None:
            target["inputs"][link[4]]["link"] = None

    def connect(self, origin: int, slot: int, target: int, target_slot: int) -> int:
        kind = self.nodes[origin]["outputs"][slot]["type"]
        old = self.nodes[target]["inputs"][target_slot].get("link")
        if old is not None:
            self.unlink(old)
        link_id = self.d["last_link_id"] = self.d["last_link_id"] + 1
        self.d["links"].append([link_id, origin, slot, target, target_slot, kind])
        out = self.nodes[origin]["outputs"][slot]
        out["links"] = [*(out.get("links") or []), link_id]
        self.nodes[target]["inputs"][target_slot]["link"] = link_id
        return link_id

    def input_slot(self, node_id: int, name: str) -> int:
        return next(i for i, x in enumerate(self.nodes[node_id]["inputs"]) if x["name"] == name)

    def add(
        self,
        node_type: str,
        pos: list[float],
        widgets: list[Any],
        *,
        size: list[float] | None = None,
        inputs_: list[dict] | None = None,
        outputs: list[dict] | None = None,
        title: str | None = None,
        mode: int = 0,
        extra: dict | None = None,
    ) -> int:
        node_id = self.d["last_node_id"] = self.d["last_node_id"] + 1
        node = {
            "id": node_id,
            "type": node_type,
            "pos": pos,
            "size": size or [315, 100],
            "flags": {},
            "order": len(self.d["nodes"]),
            "mode": mode,
            "inputs": inputs_ or [],
            "outputs": outputs or [],
            "properties": {"Node name for S&R": node_type},
            "widgets_values": widgets,
            **({"title": title} if title else {}),
            **(extra or {}),
        }
        self.d["nodes"].append(node)
        self.nodes[node_id] = node
        return node_id

    def tome(
        self, node_type: str, source: int, targets: list[int], pos: list[float], mode: int = 0, **settings: Any
    ) -> int:
        """Our node on the MODEL path: fed by ``source``'s MODEL output, feeding the ``model`` input of ``targets``."""
        node_id = self.add(
            node_type,
            pos,
            default_widgets(node_type, **settings),
            size=TOME_SIZE[node_type],
            inputs_=[{"name": "model", "type": "MODEL", "link": None}],
            outputs=[{"name": "MODEL", "type": "MODEL", "links": [], "slot_index": 0}],
            title=NODE_DISPLAY_NAME_MAPPINGS[node_type],
            mode=mode,
            extra=TOME_COLOR,
        )
        self.connect(source, 0, node_id, 0)
        for target in targets:
            self.connect(node_id, 0, target, self.input_slot(target, "model"))
        return node_id

    def note(self, text: str, pos: list[float], size: list[float] | None = None) -> int:
        return self.add(
            "Note",
            pos,
            [text],
            size=size or [420, 260],
            title="ToMe: what the nodes do here",
            extra={"color": "#432", "bgcolor": "#653"},
        )

    def set_widget_literal(self, node_id: int, name: str) -> None:
        """A widget input fed by a primitive or a subgraph input becomes a plain widget again."""
        for x in self.nodes[node_id]["inputs"]:
            if x["name"] == name and x.get("link") is not None:
                self.unlink(x["link"])

    def done(self) -> dict[str, Any]:
        for i, node in enumerate(sorted(self.d["nodes"], key=lambda n: n["id"])):
            node["order"] = i
        self.d.pop("id", None)
        return self.d


def flatten(outer: dict[str, Any], instance: int, keep_outer: list[int]) -> Graph:
    """A graph whose nodes are those of the subgraph that outer node ``instance`` runs (links among them kept, links
    from the subgraph's inputs dropped, the widget values staying) plus the outer nodes ``keep_outer``; the
    subgraph's outputs feed what the instance fed."""
    node = next(n for n in outer["nodes"] if n["id"] == instance)
    sub = next(s for s in outer["definitions"]["subgraphs"] if s["id"] == node["type"])
    links = [
        [x["id"], x["origin_id"], x["origin_slot"], x["target_id"], x["target_slot"], x["type"]] for x in sub["links"]
    ]
    nodes = copy.deepcopy(sub["nodes"]) + [copy.deepcopy(n) for n in outer["nodes"] if n["id"] in keep_outer]
    outer_links = [link for link in outer["links"] if link[1] == instance and link[3] in keep_outer]
    data = {
        "last_node_id": max(n["id"] for n in nodes),
        "last_link_id": max(x[0] for x in links + outer["links"]),
        "nodes": nodes,
        "links": [x for x in links if x[1] >= 0 and x[3] >= 0],
        "groups": copy.deepcopy(sub.get("groups", [])),
        "config": {},
        "extra": {"ds": {"scale": 0.6, "offset": [0, 0]}},
        "version": 0.4,
    }
    g = Graph(data)
    inner_ids = {n["id"] for n in sub["nodes"]}
    for n in g.d["nodes"]:  # the subgraph's input/output ends are gone
        for x in n.get("inputs", []):
            if x.get("link") is not None and not any(link[0] == x["link"] for link in g.d["links"]):
                x["link"] = None
        for x in n.get("outputs", []):
            x["links"] = [i for i in (x.get("links") or []) if any(link[0] == i for link in g.d["links"])]
    for out in sub["outputs"]:  # the subgraph output -> the outer targets
        for link_id in out["linkIds"]:
            inner = next(x for x in sub["links"] if x["id"] == link_id)
            assert inner["origin_id"] in inner_ids
            for outer_link in outer_links:
                g.connect(inner["origin_id"], inner["origin_slot"], outer_link[3], outer_link[4])
    return g


# --- the workflows ---------------------------------------------------------------------------------------------

NOTE_CACHE = (
    "ToMe: step cache (DeepCache) on this model: every cache_interval-th step (3) runs the whole model, the steps "
    "between run only {first} and take the rest's result forecast from the last two full steps."
)
NOTE_CONSOLE = (
    "\n\nThe console says what it did after each sampling, e.g. 'ToMe cache steps: 7 full, 13 cached, ToMe cache "
    "speed-up: 2.43x' (the same text shows under the ToMeStepCache node); 'ToMe note: ...' says what it could not do."
)


def sdxl_hires(templates: Callable[[str], dict]) -> dict[str, Any]:
    """SDXL base, 2-pass "hires fix" (ComfyUI's examples: latent upscale x1.5, a second KSampler at denoise 0.5),
    from ``sdxl_simple_example``: its base checkpoint, prompts, latent size and sampler (euler, normal, 25 steps,
    CFG 8); the refiner branch and the step primitives replaced by the hires pass; plain KSamplers."""
    g = Graph(templates("sdxl_simple_example"))
    positive, negative = g.node(51)["widgets_values"][0], g.node(50)["widgets_values"][0]
    g.remove(45, 47, 48, 40, 11, 12, 15, 16, 37, 43, 51, 50, 52)
    g.d["groups"] = [
        x
        for x in g.d["groups"]
        if x["title"] not in ("Refiner Prompt", "Load in REFINER SDXL Model", "Step Control", "Refiner", "Text Prompts")
    ]
    for node_id, text in ((6, positive), (7, negative)):
        g.set_widget_literal(node_id, "text")
        g.node(node_id)["inputs"] = [x for x in g.node(node_id)["inputs"] if x["name"] != "text"]
        g.node(node_id)["widgets_values"] = [text]
    seed = g.node(10)["widgets_values"][1]
    sampler = {"type": "KSampler", "widgets": lambda denoise: [seed, "fixed", 25, 8, "euler", "normal", denoise]}
    ks_inputs = [
        {"name": "model", "type": "MODEL", "link": None},
        {"name": "positive", "type": "CONDITIONING", "link": None},
        {"name": "negative", "type": "CONDITIONING", "link": None},
        {"name": "latent_image", "type": "LATENT", "link": None},
    ]
    ks_out = [{"name": "LATENT", "type": "LATENT", "links": [], "slot_index": 0}]
    base_pos = g.node(10)["pos"]
    g.remove(10)
    base = g.add(
        "KSampler",
        [base_pos[0] + 400, base_pos[1]],
        sampler["widgets"](1.0),
        size=[315, 262],
        inputs_=copy.deepcopy(ks_inputs),
        outputs=copy.deepcopy(ks_out),
        title="KSampler - BASE (1024 px)",
    )
    upscale = g.add(
        "LatentUpscaleBy",
        [base_pos[0] + 400, base_pos[1] + 320],
        ["nearest-exact", 1.5],
        size=[315, 82],
        inputs_=[{"name": "samples", "type": "LATENT", "link": None}],
        outputs=[{"name": "LATENT", "type": "LATENT", "links": [], "slot_index": 0}],
        title="Upscale Latent By (hires fix)",
    )
    hires = g.add(
        "KSampler",
        [base_pos[0] + 400, base_pos[1] + 460],
        sampler["widgets"](0.5),
        size=[315, 262],
        inputs_=copy.deepcopy(ks_inputs),
        outputs=copy.deepcopy(ks_out),
        title="KSampler - HIRES (1536 px)",
    )
    g.connect(6, 0, base, 1)
    g.connect(7, 0, base, 2)
    g.connect(5, 0, base, 3)
    g.connect(base, 0, upscale, 0)
    g.connect(6, 0, hires, 1)
    g.connect(7, 0, hires, 2)
    g.connect(upscale, 0, hires, 3)
    g.connect(hires, 0, 17, 0)
    g.connect(4, 2, 17, 1)
    g.node(17)["pos"], g.node(41)["pos"] = (
        [base_pos[0] + 780, base_pos[1] + 460],
        [base_pos[0] + 780, base_pos[1] + 560],
    )
    g.node(19)["pos"] = [base_pos[0] + 1120, base_pos[1]]
    g.tome("ToMeStepCache", 4, [base], [base_pos[0], base_pos[1] - 320])
    merge = g.tome("ToMe", 4, [], [base_pos[0], base_pos[1] + 20])
    g.tome("ToMeStepCache", merge, [hires], [base_pos[0], base_pos[1] + 500])
    g.note(
        "ToMe on SDXL: the base pass (1024 px) gets the step cache alone: every 3rd step runs the whole UNet, the "
        "steps between run only its shallowest skip branch and take the deep features forecast from the last two "
        "full steps (token merging gains little at 1024 px on SDXL).\n\nThe hires pass (1536 px, another KSampler) "
        "gets its own chain, ToMe: token merging (ratio 0.5, merged at SDXL's first attention level: max_downsample "
        "auto) then the step cache: at 1536 px merging pays. Each pass caches on its own steps (its own "
        "ToMeStepCache node)." + NOTE_CONSOLE,
        [base_pos[0] - 480, base_pos[1] - 320],
    )
    return g.done()


def flux_dev(templates: Callable[[str], dict]) -> dict[str, Any]:
    """``flux_dev_full_text_to_image`` (UNETLoader flux1-dev, DualCLIPLoader clip_l + t5xxl_fp16, ae; euler, simple,
    20 steps): the step cache between the loader and the KSampler."""
    g = Graph(templates("flux_dev_full_text_to_image"))
    g.tome("ToMeStepCache", 38, [31], [-320, 800])
    g.note(
        NOTE_CACHE.format(first="the first double block") + " On FLUX under euler the default cache_correction "
        "also re-estimates the cached steps at the next full step. Token merging (the ToMe node) acts in UNets "
        "only, so FLUX gets the step cache alone." + NOTE_CONSOLE,
        [-910, 500],
    )
    return g.done()


def wan21_t2v(templates: Callable[[str], dict]) -> dict[str, Any]:
    """``text_to_video_wan`` (Wan 2.1 T2V 1.3B, umT5, uni_pc simple 30 steps, 832x480x33): the step cache between
    ModelSamplingSD3 and the KSampler."""
    g = Graph(templates("text_to_video_wan"))
    g.tome("ToMeStepCache", 48, [3], [770, -300])
    g.note(
        NOTE_CACHE.format(first="the first transformer block") + " Under uni_pc (a multistep sampler) the "
        "correction, which needs euler, stands aside; the forecast still acts." + NOTE_CONSOLE,
        [310, -300],
    )
    return g.done()


WAN22_LIGHTX2V = (71, 73, 76, 75, 83, 85, 86, 82, 89, 81, 88, 80, 106, 87, 72, 74, 78, 112)
WAN22_PLAIN = (90, 92, 94, 101, 102, 93, 100, 99, 91, 97, 104, 98, 96, 95, 106)


def wan22_two_experts(templates: Callable[[str], dict]) -> dict[str, Any]:
    """``video_wan2_2_14B_t2v``'s second group (no LoRA; the high-noise expert steps 0-10 of 20, the low-noise expert
    10-20, KSamplerAdvanced, euler simple, CFG 3.5) turned on, the lightx2v group left out: one ToMeStepCache per
    expert."""
    g = Graph(templates("video_wan2_2_14B_t2v"))
    g.remove(*WAN22_LIGHTX2V)
    g.d["groups"] = [x for x in g.d["groups"] if x["bounding"][1] > 700]
    for node in g.d["nodes"]:
        node["mode"] = 0
    g.node(62)["pos"], g.node(64)["pos"] = [-520, 860], [-520, 1430]  # the model notes beside this group
    high = _expert(g, 96)
    low = _expert(g, 95)
    g.tome("ToMeStepCache", high, [96], [660, 1800])
    g.tome("ToMeStepCache", low, [95], [1020, 1800])
    g.note(
        "ToMe on Wan 2.2's two experts: each expert model gets its own ToMeStepCache, so each pass (the "
        "high-noise expert's steps 0-10, the low-noise expert's 10-20) starts its own cache: every 3rd step of the "
        "pass runs the whole model, the steps between only the first transformer block, the rest forecast from the "
        "last two full steps; under euler the default cache_correction re-estimates cached steps too."
        + NOTE_CONSOLE
        + " (one line per expert)",
        [200, 1800],
    )
    return g.done()


def wan22_lightx2v(templates: Callable[[str], dict]) -> dict[str, Any]:
    """``video_wan2_2_14B_t2v``'s first group (the lightx2v 4-step LoRAs, 2 + 2 steps, KSamplerAdvanced, euler,
    CFG 1), the plain group left out: one ToMeStepCache per expert, which stands aside (2 steps an expert)."""
    g = Graph(templates("video_wan2_2_14B_t2v"))
    g.remove(*WAN22_PLAIN, 110)
    g.d["groups"] = [x for x in g.d["groups"] if x["bounding"][1] < 700]
    g.tome("ToMeStepCache", 82, [81], [990, 620])
    g.tome("ToMeStepCache", 86, [78], [1350, 620])
    g.note(
        "ToMe with the lightx2v 4-step LoRA: each expert runs 2 steps here, too few for the step cache to "
        "forecast (it needs cache_interval + 3 steps a pass: 6 at the default 3), so each ToMeStepCache stands "
        "aside and the experts run every step in full. The console says so: 'ToMe cache steps: 2 full, 0 cached' "
        "and 'ToMe note: step cache off: 2 steps are too few to forecast at cache_interval 3 (from 6)', once per "
        "expert. The nodes are wired in so that the same graph caches when you raise the steps (e.g. the plain "
        "20-step two-expert workflow).",
        [1700, 620],
    )
    return g.done()


def _expert(g: Graph, sampler: int) -> int:
    """The node feeding a sampler's model input (the expert's ModelSamplingSD3)."""
    link = g.node(sampler)["inputs"][g.input_slot(sampler, "model")]["link"]
    return g._link(link)[1]


def qwen_image(templates: Callable[[str], dict]) -> dict[str, Any]:
    """``image_qwen_image``'s subgraph "Text to Image (Qwen-Image)" flattened, without the Lightning LoRA (20 steps,
    CFG 2.5, euler simple: the template's settings for the model alone), the prompt as the template has it: the step
    cache between ModelSamplingAuraFlow and the KSampler."""
    t = templates("image_qwen_image")
    prompt = next(n for n in t["nodes"] if n["id"] == 76)["widgets_values"][0]
    g = flatten(t, 76, [60])
    g.remove(73)
    g.connect(37, 0, 66, 0)
    g.node(6)["widgets_values"] = [prompt]
    ks = g.node(3)["widgets_values"]
    ks[2], ks[3] = 20, 2.5
    g.node(60)["pos"] = [1130, 10]
    g.tome("ToMeStepCache", 66, [3], [560, -300])
    g.note(
        NOTE_CACHE.format(first="the first transformer block") + " On Qwen-Image under euler the default "
        "cache_correction also re-estimates cached steps. The template's Lightning LoRA (8 steps) is left out: "
        "this is the 20-step graph." + NOTE_CONSOLE,
        [100, -300],
    )
    return g.done()


def z_image_turbo(templates: Callable[[str], dict]) -> dict[str, Any]:
    """``image_z_image_turbo``'s subgraph "Text to Image (Z-Image-Turbo)" flattened (res_multistep simple, CFG 1,
    8 steps as the tests' table asks; the template has 4), the prompt the template's: a ToMeStepCache in place but
    bypassed, with the Note saying why."""
    t = templates("image_z_image_turbo")
    prompt = next(n for n in t["nodes"] if n["id"] == 58)["widgets_values"][0]
    g = flatten(t, 57, [9])
    g.node(27)["widgets_values"] = [prompt]
    ks = g.node(3)["widgets_values"]
    ks[1], ks[2] = "fixed", 8
    g.node(9)["pos"] = [1460, -110]
    g.tome("ToMeStepCache", 11, [3], [880, -330], mode=4)
    g.note(
        "ToMe on Z-Image-Turbo: the ToMeStepCache node is in place but bypassed (purple; Ctrl+B toggles it). "
        "Turbo samples 8 steps; at the default cache_interval 3 the cache would run 4 of them in full and forecast "
        "4, and on the model measured (docs/transformers.md) caching 6- and 8-step passes came out further from "
        "the plain image than simply running fewer steps. So no 'ToMe cache steps' line appears here. Turn the "
        "node on when you sample 12 steps or more (there it keeps +3.5 dB and more over running only the full "
        "steps); below cache_interval + 3 steps it stands aside by itself and says so in a 'ToMe note'.",
        [420, -330],
    )
    return g.done()


WORKFLOWS: dict[str, Callable[[Callable[[str], dict]], dict[str, Any]]] = {
    "tome_sdxl_hires_fix": sdxl_hires,
    "tome_flux1_dev": flux_dev,
    "tome_wan2.1_t2v": wan21_t2v,
    "tome_wan2.2_14B_t2v_two_experts": wan22_two_experts,
    "tome_wan2.2_14B_t2v_lightx2v": wan22_lightx2v,
    "tome_qwen_image": qwen_image,
    "tome_z_image_turbo": z_image_turbo,
}


# --- thumbnails ---------------------------------------------------------------------------------------------------


def thumbnail(workflow: dict[str, Any], path: str, width: int = 512, height: int = 384) -> None:
    """A picture of the graph: the nodes as boxes with their titles, the links, our nodes highlighted."""
    from PIL import Image, ImageDraw

    nodes = workflow["nodes"]
    x0 = min(n["pos"][0] for n in nodes)
    y0 = min(n["pos"][1] for n in nodes) - 30
    x1 = max(n["pos"][0] + n["size"][0] for n in nodes)
    y1 = max(n["pos"][1] + n["size"][1] for n in nodes)
    scale = min((width - 20) / (x1 - x0), (height - 20) / (y1 - y0))
    ox, oy = (
        10 - x0 * scale + ((width - 20) - (x1 - x0) * scale) / 2,
        10 - y0 * scale + ((height - 20) - (y1 - y0) * scale) / 2,
    )

    def at(x: float, y: float) -> tuple[float, float]:
        return x * scale + ox, y * scale + oy

    img = Image.new("RGB", (width, height), (32, 32, 36))
    draw = ImageDraw.Draw(img)
    by_id = {n["id"]: n for n in nodes}
    for link in workflow["links"]:
        a, b = by_id.get(link[1]), by_id.get(link[3])
        if a is None or b is None:
            continue
        start = at(a["pos"][0] + a["size"][0], a["pos"][1] + 10 + 20 * link[2])
        end = at(b["pos"][0], b["pos"][1] + 10 + 20 * link[4])
        color = (120, 200, 255) if link[5] == "MODEL" else (110, 110, 120)
        draw.line([start, end], fill=color, width=2 if link[5] == "MODEL" else 1)
    for n in nodes:
        ours = n["type"] in TOME_SIZE
        note = n["type"] in ("Note", "MarkdownNote")
        fill = (70, 150, 90) if ours else (100, 85, 55) if note else (60, 60, 68)
        if n.get("mode") == 4:
            fill = (110, 60, 130)
        box = [*at(n["pos"][0], n["pos"][1] - 30), *at(n["pos"][0] + n["size"][0], n["pos"][1] + n["size"][1])]
        draw.rectangle(box, fill=fill, outline=(230, 230, 230) if ours else (140, 140, 150), width=2 if ours else 1)
        title = n.get("title") or n["type"]
        if ours or (box[2] - box[0]) > 40:
            draw.text((box[0] + 3, box[1] + 2), title[: max(4, int((box[2] - box[0]) / 6))], fill=(240, 240, 240))
    img.save(path, "JPEG", quality=88)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("site_packages", help="where the comfyui_workflow_templates* packages are")
    p.add_argument("--out", default=os.path.join(ROOT, "example_workflows"))
    a = p.parse_args(argv)

    def templates(name: str) -> dict:
        found = glob.glob(os.path.join(a.site_packages, "comfyui_workflow_templates*", "templates", f"{name}.json"))
        assert found, f"no template {name} under {a.site_packages}"
        with open(found[0], encoding="utf-8") as f:
            return json.load(f)

    for name, build in WORKFLOWS.items():
        workflow = build(templates)
        with open(os.path.join(a.out, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(workflow, f, indent=1, ensure_ascii=False)
            f.write("\n")
        thumbnail(workflow, os.path.join(a.out, f"{name}.jpg"))
        print(f"wrote {name}.json, {name}.jpg")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
