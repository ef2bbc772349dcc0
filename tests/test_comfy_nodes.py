"""This repository as a ComfyUI custom node: what ComfyUI's loader finds in it, the nodes' inputs derived from the
settings record, the root ``__init__.py`` beside the WebUI extension, and the example workflows."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import comfy_harness as ch
import nodes
import pytest
import torch

import comfy_tome
from comfy_tome import inputs
from tome_core import settings as S

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / "example_workflows"


@pytest.fixture(scope="module", autouse=True)
def comfy():
    ch.start(str(ROOT))


def test_comfy_imports_the_repository_as_a_custom_node_and_lists_both_nodes():
    assert nodes.NODE_CLASS_MAPPINGS["ToMe"] is comfy_tome.nodes.ToMe
    assert nodes.NODE_CLASS_MAPPINGS["ToMeStepCache"] is comfy_tome.nodes.ToMeStepCache
    assert nodes.NODE_DISPLAY_NAME_MAPPINGS == {
        "ToMe": "ToMe: token merging",
        "ToMeStepCache": "ToMe: step cache (DeepCache)",
    }
    builtin = set(nodes.NODE_CLASS_MAPPINGS) - set(comfy_tome.NODE_CLASS_MAPPINGS)
    assert "TomePatchModel" in builtin and not builtin & set(comfy_tome.NODE_CLASS_MAPPINGS)  # ComfyUI would skip it


def test_every_setting_is_an_input_of_one_node_with_the_records_name_default_bounds_and_hint():
    tome, cache = (cls.INPUT_TYPES() for cls in (comfy_tome.nodes.ToMe, comfy_tome.nodes.ToMeStepCache))
    assert tome["required"].keys() == cache["required"].keys() == {"model"}
    assert list(tome["optional"])[:3] == ["ratio", "method", "max_downsample"]
    assert list(cache["optional"]) == [n for n in S.NAMES if n.startswith("cache") and n != "cache"]  # new ones too
    taken = [*tome["optional"], *cache["optional"]]
    assert sorted([*taken, "enabled", "cache", "hires_ratio", "hires_cache_interval"]) == sorted(S.NAMES)
    for name, (kind, options) in {**tome["optional"], **cache["optional"]}.items():
        spec, default = S.spec(name), getattr(S.DEFAULTS, name)
        assert options["tooltip"] == spec.hint, name
        if spec.kind == "choice":
            assert kind == list(spec.choices) and options["default"] == str(default), name
        elif spec.kind == "bool":
            assert kind == "BOOLEAN" and options["default"] is default, name
        else:
            assert kind == ("INT" if spec.kind == "int" else "FLOAT"), name
            bounds = (options["default"], options["min"], options["max"], options["step"])
            assert bounds == (default, spec.minimum, spec.maximum, spec.step), name
    assert tome["optional"]["seed"][1]["control_after_generate"] is False  # -1 = the image seed stays


def test_a_workflow_naming_only_the_model_takes_the_records_defaults():
    named = ch.samples(ch.run(ch.txt2img("sd15", [("ToMe", {}), ("ToMeStepCache", {})], width=64, height=64)))
    defaults = {name: getattr(S.DEFAULTS, name) for name in (*inputs.merge_fields(), *inputs.cache_fields())}
    defaults["max_downsample"] = str(defaults["max_downsample"])
    merge = {k: v for k, v in defaults.items() if k in inputs.merge_fields()}
    cache = {k: v for k, v in defaults.items() if k in inputs.cache_fields()}
    given = ch.samples(ch.run(ch.txt2img("sd15", [("ToMe", merge), ("ToMeStepCache", cache)], width=64, height=64)))
    assert torch.equal(named, given)


def test_the_root_init_hands_the_mappings_on_and_importing_the_nodes_needs_no_comfy():
    spec_globals = runpy.run_path(str(ROOT / "__init__.py"), run_name="custom_nodes.tome")
    public = {k for k in spec_globals if not k.startswith("_")} - {"os", "sys"}
    assert public == {"NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"}
    assert spec_globals["NODE_CLASS_MAPPINGS"] is comfy_tome.NODE_CLASS_MAPPINGS
    code = "import sys, comfy_tome; comfy_tome.nodes.ToMe.INPUT_TYPES(); assert 'comfy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def _api_example() -> dict:
    return json.loads((WORKFLOWS / "api" / "tome_sd15_api.json").read_text())


def test_the_api_example_runs_its_tome_part_in_the_double():
    wf = _api_example()
    ours = {k: v for k, v in wf.items() if v["class_type"] in comfy_tome.NODE_CLASS_MAPPINGS}
    assert [v["class_type"] for v in ours.values()] == ["ToMe", "ToMeStepCache"]
    assert wf["3"]["inputs"]["model"] == ["11", 0] and wf["11"]["inputs"]["model"] == ["10", 0]
    patches = [(v["class_type"], {k: x for k, x in v["inputs"].items() if k != "model"}) for v in ours.values()]
    out = ch.run(ch.txt2img("sd15", patches, width=64, height=64))  # the double has no VAE: the graph up to the sampler
    assert torch.isfinite(ch.samples(out)).all()


def test_the_ui_example_is_the_api_example_as_the_frontend_lays_it_out():
    api, ui = _api_example(), json.loads((WORKFLOWS / "tome_sd15.json").read_text())
    by_id = {str(n["id"]): n for n in ui["nodes"]}
    assert by_id.keys() == api.keys() and all(by_id[k]["type"] == v["class_type"] for k, v in api.items())
    links = {link[0]: link for link in ui["links"]}
    for node_id, node in api.items():
        for slot in by_id[node_id]["inputs"]:
            _, src, src_slot, dst, _, _ = links[slot["link"]]
            assert [str(src), src_slot] == node["inputs"][slot["name"]] and str(dst) == node_id
    for node_id in ("10", "11"):  # our widgets in INPUT_TYPES order (append-only: a saved workflow keeps its values)
        cls = comfy_tome.NODE_CLASS_MAPPINGS[api[node_id]["class_type"]]
        names = list(cls.INPUT_TYPES()["optional"])
        values = dict(zip(names, by_id[node_id]["widgets_values"]))
        assert len(names) >= len(by_id[node_id]["widgets_values"]) >= len(api[node_id]["inputs"]) - 1
        assert all(values[k] == v for k, v in api[node_id]["inputs"].items() if k != "model")
