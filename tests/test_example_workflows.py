"""The example workflows in ``example_workflows/``: one per model family, each its ComfyUI template's graph with the
ToMe nodes wired in (built by ``tests/comfy_workflows/build_workflows.py``).

Without ComfyUI (CI): every UI-format workflow is well-formed (links consistent both ways, every ToMe node's widget
values valid inputs of our node, valid settings together); each family's workflow has a Note about the ToMe nodes, a
``.jpg`` thumbnail (where ComfyUI's frontend looks for a custom node's template picture), the sampler and steps of
issue 54's table and a ToMe node on every sampler's model.

With the real ComfyUI (``TOME_COMFY_HARNESS`` = a harness built by ``shared/harness/comfy/build.sh``,
``TOME_COMFY_MODELS`` = a folder made by ``tests/comfy_workflows/make_models.py``; skipped otherwise): ComfyUI is
started with this checkout as its custom node, every workflow converted to the API format with the server's
``/object_info`` and run, and the ``ToMe cache steps`` line (or the ``ToMe note``) checked. To fit a CPU the runner
makes every empty latent 256 px square and videos 5 frames long (``tests/comfy_workflows/runner.py``: ``shrink``);
samplers, steps, CFG and the ToMe settings run as the workflow has them. ``TOME_COMFY_LOG_DIR``: where to keep each
run's console text and API prompt. ``tests/comfy_workflows/frontend_check.py`` (by hand, needs Chromium) loads every
workflow in ComfyUI's own frontend and checks that its prompt (``app.graphToPrompt()``) is the runner's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from comfy_tome import inputs
from comfy_tome.nodes import NODE_CLASS_MAPPINGS
from tome_core import settings as S

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / "example_workflows"
sys.path.insert(0, str(Path(__file__).resolve().parent / "comfy_workflows"))

import runner  # noqa: E402

# issue 54's table: workflow -> the sampler node, its sampler, the steps of each pass, whether the cache caches steps
# there (where not, the Note says why: on the lightx2v passes the cache stands aside by itself and the console says
# so in a "ToMe note"; on Z-Image-Turbo the node is bypassed)
TABLE: dict[str, dict[str, Any]] = {
    "tome_sdxl_hires_fix": {"node": "KSampler", "sampler": "euler", "steps": [25, 25], "caches": True},
    "tome_flux1_dev": {"node": "KSampler", "sampler": "euler", "steps": [20], "caches": True},
    "tome_wan2.1_t2v": {"node": "KSampler", "sampler": "uni_pc", "steps": [30], "caches": True},
    "tome_wan2.2_14B_t2v_two_experts": {
        "node": "KSamplerAdvanced",
        "sampler": "euler",
        "steps": [10, 10],
        "caches": True,
    },
    "tome_wan2.2_14B_t2v_lightx2v": {"node": "KSamplerAdvanced", "sampler": "euler", "steps": [2, 2], "caches": False},
    "tome_qwen_image": {"node": "KSampler", "sampler": "euler", "steps": [20], "caches": True},
    "tome_z_image_turbo": {
        "node": "KSampler",
        "sampler": "res_multistep",
        "steps": [8],
        "caches": False,
        "bypassed": True,
    },
}
SAMPLER_WIDGETS = {  # widgets_values names of ComfyUI's samplers (the seed's control value after the seed)
    "KSampler": ["seed", "control", "steps", "cfg", "sampler_name", "scheduler", "denoise"],
    "KSamplerAdvanced": [
        "add_noise",
        "noise_seed",
        "control",
        "steps",
        "cfg",
        "sampler_name",
        "scheduler",
        "start_at_step",
        "end_at_step",
        "return_with_leftover_noise",
    ],
}
OURS = set(NODE_CLASS_MAPPINGS)


def ui_workflows() -> list[Path]:
    """The UI-format workflows (the API-format example, a flat dict of nodes, is checked by test_comfy_nodes)."""
    return sorted(p for p in WORKFLOWS.glob("*.json") if "nodes" in json.loads(p.read_text(encoding="utf-8")))


def load(name: str) -> dict[str, Any]:
    return json.loads((WORKFLOWS / f"{name}.json").read_text(encoding="utf-8"))


def runs(node: dict[str, Any]) -> bool:
    return node.get("mode", 0) not in (runner.MUTED, runner.BYPASSED)


def sampler_passes(workflow: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The running samplers of a workflow, their widgets by name, in the order of their steps."""
    out = []
    for node in workflow["nodes"]:
        if node["type"] == kind and runs(node):
            out.append({"id": node["id"], **dict(zip(SAMPLER_WIDGETS[kind], node["widgets_values"]))})
    return sorted(out, key=lambda s: (s.get("start_at_step", 0), s["id"]))


def model_path(workflow: dict[str, Any], node_id: int) -> list[dict[str, Any]]:
    """The nodes up a sampler's model input, nearest first."""
    nodes = {n["id"]: n for n in workflow["nodes"]}
    links = {link[0]: link for link in workflow["links"]}
    out, node = [], nodes[node_id]
    while True:
        model = next((x for x in node.get("inputs", []) if x["type"] == "MODEL" and x.get("link") is not None), None)
        if model is None:
            return out
        node = nodes[links[model["link"]][1]]
        out.append(node)


# --- without ComfyUI -------------------------------------------------------------------------------------------


def test_every_family_of_the_table_has_its_workflow_and_thumbnail():
    names = {p.stem for p in ui_workflows()}
    assert set(TABLE) <= names
    for name in TABLE:
        jpg = (WORKFLOWS / f"{name}.jpg").read_bytes()
        assert jpg[:3] == b"\xff\xd8\xff" and len(jpg) > 2000, f"{name}.jpg is no JPEG picture"


@pytest.mark.parametrize("path", ui_workflows(), ids=lambda p: p.stem)
def test_a_workflows_links_are_consistent(path):
    workflow = json.loads(path.read_text(encoding="utf-8"))
    nodes = {n["id"]: n for n in workflow["nodes"]}
    assert len(nodes) == len(workflow["nodes"]), "duplicate node ids"
    assert max(nodes) <= workflow["last_node_id"]
    ids = [link[0] for link in workflow["links"]]
    assert len(set(ids)) == len(ids) and max(ids) <= workflow["last_link_id"]
    for link_id, origin, slot, target, target_slot, kind in workflow["links"]:
        assert link_id in (nodes[origin]["outputs"][slot].get("links") or []), f"link {link_id} not on its origin"
        assert nodes[origin]["outputs"][slot]["type"] == kind
        assert nodes[target]["inputs"][target_slot]["link"] == link_id, f"link {link_id} not on its target"
        assert nodes[target]["inputs"][target_slot]["type"] in (kind, "*")
    for node in workflow["nodes"]:
        for x in node.get("inputs", []):
            assert x.get("link") is None or x["link"] in ids, f"node {node['id']} input {x['name']}: dangling link"
        for x in node.get("outputs", []):
            assert set(x.get("links") or []) <= set(ids), f"node {node['id']} output {x['name']}: dangling link"


@pytest.mark.parametrize("path", ui_workflows(), ids=lambda p: p.stem)
def test_every_tome_node_has_valid_widget_values(path):
    workflow = json.loads(path.read_text(encoding="utf-8"))
    chains: dict[int, dict[str, Any]] = {}
    for node in workflow["nodes"]:
        if node["type"] not in OURS:
            continue
        spec = NODE_CLASS_MAPPINGS[node["type"]].INPUT_TYPES()
        assert [x["name"] for x in node["inputs"] if x["type"] == "MODEL"] == ["model"]
        assert node["inputs"][0]["link"] is not None, f"node {node['id']}: its model input is not connected"
        names = list(spec["optional"])
        values = node["widgets_values"]
        # a workflow saved before a setting was added has fewer values: the frontend gives the rest their defaults
        assert len(values) <= len(names), f"node {node['id']}: {len(values)} values for {len(names)} widgets"
        if path.stem in TABLE:
            assert len(values) == len(names), f"node {node['id']}: every widget's value is saved"
        settings = dict(zip(names, values))
        for name, value in settings.items():
            kind, options = spec["optional"][name]
            if isinstance(kind, list):
                assert value in kind, f"node {node['id']} {name}: {value!r} not one of {kind}"
            elif kind == "BOOLEAN":
                assert isinstance(value, bool), f"node {node['id']} {name}: {value!r}"
            else:
                assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{name}: {value!r}"
                assert options["min"] <= value <= options["max"], f"node {node['id']} {name}: {value} out of range"
                if kind == "INT":
                    assert value == int(value)
        chains[node["id"]] = settings
        S.from_dict({"enabled": True, "cache": node["type"] == "ToMeStepCache", **settings})  # raises on a bad one
    assert chains or path.stem not in TABLE


@pytest.mark.parametrize("name", TABLE)
def test_each_family_runs_its_tables_sampler_and_steps_with_tome_on_every_samplers_model(name):
    workflow, row = load(name), TABLE[name]
    passes = sampler_passes(workflow, row["node"])
    assert passes, f"no running {row['node']}"
    assert {p["sampler_name"] for p in passes} == {row["sampler"]}
    if row["node"] == "KSamplerAdvanced":
        steps = [min(p["end_at_step"], p["steps"]) - p["start_at_step"] for p in passes]
    else:
        steps = [p["steps"] for p in passes]
    assert steps == row["steps"]
    for p in passes:
        ours = [n for n in model_path(workflow, p["id"]) if n["type"] in OURS]
        assert "ToMeStepCache" in [n["type"] for n in ours], f"sampler {p['id']}: no ToMeStepCache on its model"
        assert all(runs(n) for n in ours) != row.get("bypassed", False)
    notes = [n for n in workflow["nodes"] if n["type"] == "Note" and "ToMe" in n["widgets_values"][0]]
    assert notes, "no Note on what the ToMe nodes do"
    if not row["caches"]:
        assert re.search(r"too few|bypassed", notes[0]["widgets_values"][0])
    if row["node"] == "KSamplerAdvanced":  # one cache node per expert model
        experts = {id(model_path(workflow, p["id"])[-1]) for p in passes}
        assert len(experts) == len(passes)


def test_the_api_conversion_names_widgets_as_the_server_does():
    """The runner's conversion on a fixed /object_info excerpt: seeds carry a control value, ours does not."""
    info = {
        "KSampler": {
            "input": {
                "required": {
                    "model": ["MODEL"],
                    "seed": ["INT", {"control_after_generate": True}],
                    "steps": ["INT", {}],
                    "cfg": ["FLOAT", {}],
                    "sampler_name": [["euler", "uni_pc"]],
                    "scheduler": [["simple"]],
                    "positive": ["CONDITIONING"],
                    "negative": ["CONDITIONING"],
                    "latent_image": ["LATENT"],
                    "denoise": ["FLOAT", {}],
                }
            }
        },
        "ToMeStepCache": {"input": NODE_CLASS_MAPPINGS["ToMeStepCache"].INPUT_TYPES()},
        "ToMe": {"input": NODE_CLASS_MAPPINGS["ToMe"].INPUT_TYPES()},
    }
    workflow = {
        "nodes": [
            {
                "id": 1,
                "type": "ToMe",
                "mode": 0,
                "inputs": [{"name": "model", "type": "MODEL", "link": None}],
                "outputs": [{"name": "MODEL", "type": "MODEL", "links": [1]}],
                "widgets_values": [
                    0.4,
                    "merge",
                    "auto",
                    2,
                    2,
                    True,
                    -1,
                    True,
                    False,
                    False,
                    0,
                    True,
                    2,
                    0.0,
                    1.0,
                    False,
                    1,
                ],
            },
            {
                "id": 2,
                "type": "ToMeStepCache",
                "mode": 4,
                "inputs": [{"name": "model", "type": "MODEL", "link": 1}],
                "outputs": [{"name": "MODEL", "type": "MODEL", "links": [2]}],
                "widgets_values": [3],
            },
            {
                "id": 3,
                "type": "KSampler",
                "mode": 0,
                "inputs": [{"name": "model", "type": "MODEL", "link": 2}],
                "outputs": [],
                "widgets_values": [7, "randomize", 20, 1.0, "euler", "simple", 1.0],
            },
            {"id": 4, "type": "Note", "mode": 0, "inputs": [], "outputs": [], "widgets_values": ["text"]},
        ],
        "links": [[1, 1, 0, 2, 0, "MODEL"], [2, 2, 0, 3, 0, "MODEL"]],
    }
    api = runner.to_api(workflow, info)
    assert set(api) == {"1", "3"}  # the Note and the bypassed node do not run
    assert api["3"]["inputs"] == {
        "model": ["1", 0],
        "seed": 7,
        "steps": 20,
        "cfg": 1.0,
        "sampler_name": "euler",
        "scheduler": "simple",
        "denoise": 1.0,
    }
    assert api["1"]["inputs"]["seed"] == -1 and api["1"]["inputs"]["merge_attn"] is True
    assert dict(zip(inputs.merge_fields(), workflow["nodes"][0]["widgets_values"])) == {
        k: v for k, v in api["1"]["inputs"].items() if k != "model"
    }


# --- in the real ComfyUI -------------------------------------------------------------------------------------------

HARNESS = os.environ.get("TOME_COMFY_HARNESS")
MODELS = os.environ.get("TOME_COMFY_MODELS")
real = pytest.mark.skipif(
    not (HARNESS and MODELS and Path(HARNESS, "start_comfy.sh").exists() and Path(MODELS).is_dir()),
    reason="needs TOME_COMFY_HARNESS (a built ComfyUI harness) and TOME_COMFY_MODELS (make_models.py's folder)",
)


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    """A real ComfyUI with this checkout as its custom node and the random models; its port and console log."""
    port = int(os.environ.get("TOME_COMFY_PORT", "8299"))
    config = tmp_path_factory.mktemp("comfy") / "extra_model_paths.yaml"
    folders = ("checkpoints", "diffusion_models", "text_encoders", "vae", "loras")
    config.write_text("tome_workflows:\n" + f"  base_path: {MODELS}\n" + "".join(f"  {f}: {f}\n" for f in folders))
    env = {**os.environ, "COMFY_EXTRA_ARGS": f"--extra-model-paths-config {config}"}
    started = subprocess.run(
        [f"{HARNESS}/start_comfy.sh", str(ROOT), str(port)], env=env, capture_output=True, text=True
    )
    assert started.returncode == 0, started.stdout + started.stderr
    assert "IMPORT FAILED" not in started.stdout
    sys.path.insert(0, HARNESS)
    try:
        yield port, str(Path(HARNESS, "comfy.log"))
    finally:
        subprocess.run([f"{HARNESS}/stop_comfy.sh"], capture_output=True)


LOADED: dict[str, str] = {}


@real
@pytest.mark.parametrize("name", TABLE)
def test_each_workflow_runs_in_the_real_comfyui_with_its_expected_tome_line(comfy, name):
    import comfy_api

    port, log = comfy
    family = name.split("_")[1].split(".")[0]  # sdxl, flux1, wan2, qwen, z
    if LOADED.get("family") != family:  # one family's models in memory at a time (a family's workflows share them)
        comfy_api.free(unload_models=True, free_memory=True, port=port)
        LOADED["family"] = family
    out = runner.run(str(WORKFLOWS / f"{name}.json"), port, log, size=256, frames=5)
    lines = runner.tome_lines(out["console"])
    keep = os.environ.get("TOME_COMFY_LOG_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        Path(keep, f"{name}.log").write_text(
            f"{out['seconds']:.1f} s\n" + "\n".join(lines) + "\n\n--- console ---\n" + out["console"], encoding="utf-8"
        )
        Path(keep, f"{name}.api.json").write_text(json.dumps(out["prompt"], indent=1), encoding="utf-8")
    assert "Traceback" not in out["console"] and not [x for x in lines if "ToMe error" in x]
    row = TABLE[name]
    steps = [x for x in lines if "ToMe cache steps" in x]
    if row.get("bypassed"):  # the cache node is bypassed: ToMe says nothing, the Note says why
        assert lines == []
        return
    assert len(steps) == len(row["steps"]), lines
    for line, n in zip(steps, row["steps"]):
        full, cached = map(int, re.search(r"ToMe cache steps: (\d+) full, (\d+) cached", line).groups())
        assert full + cached == n
        assert (cached > 0) == row["caches"], line
    if not row["caches"]:  # the lightx2v passes: the cache stood aside and says why
        notes = [x for x in lines if "ToMe note" in x]
        assert len(notes) == len(row["steps"])
        assert all("2 steps are too few to forecast at cache_interval 3 (from 6)" in x for x in notes)


def test_every_json_comfyui_lists_as_a_template_is_a_ui_workflow():
    """ComfyUI lists every ``example_workflows/*.json`` under *Browse templates* (``app/custom_node_manager.py``: the
    folder's top level only) and loads it as a graph: an API-format file belongs in ``example_workflows/api/``."""
    listed = sorted(WORKFLOWS.glob("*.json"))
    assert len(listed) >= 8
    for path in listed:
        assert "nodes" in json.loads(path.read_text(encoding="utf-8")), path.name
    assert (WORKFLOWS / "api" / "tome_sd15_api.json").is_file()
