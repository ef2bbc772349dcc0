"""The ToMe accordion as a person meets it: controls, layout, what the sliders draw after every event chain
(paste-back, stride and ratio changes, method), labels and messages. Runs under gradio 3.41.2 (.venv: A1111,
Forge Classic) and gradio 4.40.0 (.venv-gradio4: Forge), see .ci/run."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import gradio as gr
import harness
import pytest
from generation import tome_script
from gradio_page import Page
from modules import infotext_utils
from modules.api import api

from tome_core import settings as S
from webui_tome import extension as ext

ROOT = Path(__file__).resolve().parents[1]
TABS = ("txt2img", "img2img")


def _script_module():
    spec = importlib.util.spec_from_file_location("tome_ui_module", ROOT / "scripts" / "tome.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def webui():
    """Both tabs of a WebUI with our extension and the XYZ script (no model: the UI needs none)."""
    txt, img = harness.start_webui([str(ROOT)])
    yield {"txt2img": txt, "img2img": img}
    harness.reset_webui()


@pytest.fixture(params=TABS)
def tab(request, webui):
    """One tab: its script runner, the ToMe controls by name, and a fresh browser page of it."""
    runner = webui[request.param]
    return runner, controls(runner), Page(runner.demo)


ORDERS = pytest.mark.parametrize("order", ["forward", "reverse"])


def controls(runner) -> dict[str, gr.components.Component]:
    script = tome_script(runner)
    return dict(zip(S.NAMES, runner.inputs[script.args_from : script.args_to]))


def shown_settings(page: Page, runner) -> S.ToMeSettings:
    """The settings the page's controls would send: what a generation started now uses."""
    return S.from_args([page.value(c) for c in controls(runner).values()])


def assert_drawn_as_held(page: Page, runner) -> None:
    """Every slider's thumb sits at the value the slider holds (and sends)."""
    for name, c in controls(runner).items():
        if S.spec(name).kind in ("int", "float") and name != "seed":
            assert page.drawn(c) == pytest.approx(page.value(c), abs=1e-9), (name, page.drawn(c), page.value(c))


def cap_note(runner) -> gr.Markdown:
    accordion = controls(runner)["enabled"].accordion
    return next(b for b in _descendants(accordion) if (b.elem_id or "").endswith("_tome_ratio_cap"))


def infotext(**fields: object) -> str:
    params = ", ".join(f"{S.spec(k).infotext}: {v}" for k, v in fields.items())
    return f"a lighthouse\nSteps: 20, Sampler: Euler, Seed: 1, Size: 512x512, {params}"


# --- controls follow the record --------------------------------------------------------------------


@pytest.mark.parametrize("tab", TABS)
def test_controls_follow_the_settings_record(webui, tab):
    runner = webui[tab]
    script = tome_script(runner)
    got = controls(runner)
    assert list(got) == list(S.NAMES)
    for name, control in got.items():
        s = S.spec(name)
        suffix = "-checkbox" if name == "enabled" else ""  # InputAccordion: the accordion has the id
        assert control.label == s.label and control.elem_id == f"script_{tab}_tome_{name}{suffix}"
        default = getattr(S.DEFAULTS, name)
        assert control.value == (str(default) if s.kind == "choice" else default)
        if s.kind in ("int", "float"):
            assert (control.minimum, control.maximum) == (s.minimum, s.maximum)
    assert [key for _, key in script.infotext_fields] == [S.spec(n).infotext for n in S.NAMES]
    info = api.script_info_entries(script)
    assert [e["label"] for e in info] == [S.spec(n).label for n in S.NAMES]
    ratio = info[S.NAMES.index("ratio")]
    assert (ratio["minimum"], ratio["maximum"], ratio["step"], ratio["value"]) == (0.0, 0.95, 0.01, 0.5)


def _descendants(block) -> list:
    out = []
    for child in getattr(block, "children", []):
        out += [child, *_descendants(child)]
    return out


@pytest.mark.parametrize("tab", TABS)
def test_first_view_and_a_labelled_advanced_group(webui, tab):
    module = _script_module()
    runner = webui[tab]
    got = controls(runner)
    accordion = got["enabled"].accordion
    advanced = [b for b in _descendants(accordion) if isinstance(b, gr.Accordion)]
    assert len(advanced) == 1 and advanced[0].label.startswith("Advanced") and advanced[0].open is False
    inside_advanced = {id(b) for b in _descendants(advanced[0])}
    in_accordion = {id(b) for b in _descendants(accordion)}
    first = {name for row in module.FIRST_VIEW for name in row}
    assert first == {"ratio", "hires_ratio", "method", "max_downsample", "cache"}
    assert sorted(name for row in module.LAYOUT for name in row) == sorted(set(S.NAMES) - {"enabled"})
    for name, c in got.items():
        if name == "enabled":
            continue
        assert id(c) in in_accordion, name
        assert (id(c) in inside_advanced) == (name not in first), name
    notes = [b for b in _descendants(accordion) if isinstance(b, gr.Markdown)]
    assert [n.elem_id for n in notes] == [f"script_{tab}_tome_intro", f"script_{tab}_tome_ratio_cap"]
    assert "1024 px" in notes[0].value and "hires" in notes[0].value
    assert id(notes[1]) in inside_advanced and all(module.NOTE_CLASS in n.elem_classes for n in notes)


@pytest.mark.parametrize("tab", TABS)
def test_a_control_that_cannot_act_here_is_hidden_and_kept(webui, tab):
    """A1111's models are UNets: *Cache correction* (transformers under Euler, with the sampler's sigmas: Neo and
    ComfyUI) is hidden, and kept in its place for the positional API, the paste-back and the XYZ axes (issue 54;
    Forge and Classic: tests/test_forge_host.py, Neo shows it: tests/test_neo_host.py)."""
    runner = webui[tab]
    got = controls(runner)
    assert list(got) == list(S.NAMES) and got["cache_correction"].visible is False
    assert [n for n, c in got.items() if c.visible is False] == [
        "enabled",
        "cache_correction",
    ]  # enabled: the accordion
    assert S.spec("cache_correction").infotext in [key for _, key in tome_script(runner).infotext_fields]
    assert "[ToMe] Cache correction" in [axis.label for axis in ext.axes()]
    assert ext.hidden_controls(None) == ext.hidden_controls("classic") == ext.hidden_controls("2.0.1v1.10.1")
    assert ext.hidden_controls("neo") == frozenset() and ext.host_version() is None


def test_labels_are_short_and_details_are_hints():
    """Labels fit one line at a 600 px column (the longest, 25 characters, was checked in the real WebUI at
    600 px: docs/accordion.png); what a label no longer says is in its hover hint."""
    for name in S.NAMES:
        s = S.spec(name)
        assert len(s.label) <= 25 and "=" not in s.label, s.label
        assert len(s.hint) > len(s.label), name
    assert "image seed" in S.spec("seed").hint and "0 (the default) uses the merge ratio" in S.spec("hires_ratio").hint
    assert "0 (the default): always on" in S.spec("min_size").hint


def test_readme_shows_the_accordion():
    controls_section = (ROOT / "README.md").read_text(encoding="utf-8").split("## The controls", 1)[1].split("\n## ")[0]
    for name in ("accordion.png", "accordion-forge.png"):
        assert f"](docs/{name})" in controls_section
        image = (ROOT / "docs" / name).read_bytes()
        assert image.startswith(b"\x89PNG\r\n\x1a\n") and len(image) < 300_000


def test_the_notes_are_styled_once():
    """gradio 3 gives a Markdown's elem_id and classes to its block and to the .prose inside it (gradio 4: classes
    only to both): style.css targets the .prose inside a note, one element in either."""
    module = _script_module()
    css = (ROOT / "style.css").read_text(encoding="utf-8")
    selectors = [
        s.strip()
        for rule in re.findall(r"([^{}]+)\{", re.sub(r"/\*.*?\*/", "", css, flags=re.S))
        for s in rule.split(",")
    ]
    assert selectors and all(s == f".{module.NOTE_CLASS} .prose" for s in selectors), selectors
    assert not re.search(r"opacity|margin|\d+(\.\d+)?em", css)  # nothing that compounds or pulls it onto a slider


# --- event chains: every control shows the value that will be used ------------------------------------


@ORDERS
def test_paste_above_the_stride_cap_is_drawn_where_it_is(tab, order):
    """The issue's bug: strides 1x1 pull the ratios to 0; pasting ratio 0.3 must draw 0.3, not a thumb at 0."""
    runner, c, page = tab
    page.user_sets(c["sx"], 1, order)
    page.user_sets(c["sy"], 1, order)
    page.user_sets(c["hires_ratio"], 0.4, order)
    assert (page.value(c["ratio"]), page.value(c["hires_ratio"])) == (0, 0)
    assert "**0**" in page.value(cap_note(runner))
    assert_drawn_as_held(page, runner)

    page.paste(runner, infotext(enabled=True, ratio=0.3, hires_ratio=0.4), order)
    assert shown_settings(page, runner) == S.DEFAULTS.replace(enabled=True, ratio=0.3, hires_ratio=0.4)
    assert_drawn_as_held(page, runner)


@ORDERS
def test_strides_and_ratios_in_any_order(tab, order):
    runner, c, page = tab
    note = cap_note(runner)

    page.user_sets(c["ratio"], 0.9, order)  # above 2x2's cap: pulled down to it
    assert page.value(c["ratio"]) == 0.75 and "**0.75**" in page.value(note)
    page.user_sets(c["sx"], 3, order)
    page.user_sets(c["sy"], 1, order)  # cap 2/3: the largest value on the slider's steps, which validates
    assert page.value(c["ratio"]) == 0.66 and "3×1" in page.value(note) and "**0.66**" in page.value(note)
    assert shown_settings(page, runner).ratio == 0.66
    page.user_sets(c["sx"], 4, order)  # a wider cap never raises a ratio
    assert page.value(c["ratio"]) == 0.66
    page.user_sets(c["sy"], 4, order)
    page.user_sets(c["hires_ratio"], 0.95, order)
    assert page.value(c["hires_ratio"]) == 0.93  # 1 - 1/16 = 0.9375 on 0.01 steps
    page.paste(runner, infotext(enabled=True, ratio=0.8, sx=4, sy=2, hires_ratio=0.5, start=0.33), order)
    assert shown_settings(page, runner) == S.DEFAULTS.replace(
        enabled=True, ratio=0.8, sx=4, sy=2, hires_ratio=0.5, start=0.33
    )
    page.user_sets(c["sx"], 1, order)
    assert (page.value(c["ratio"]), page.value(c["hires_ratio"])) == (0.5, 0.5)
    assert_drawn_as_held(page, runner)
    shown_settings(page, runner)  # valid: what the controls show is what a generation gets


@ORDERS
def test_steps_and_maximum_saved_in_ui_config_are_honoured(tab, order):
    """The WebUI saves each slider's step and maximum in ui-config.json by label and restores them at start (an
    install from before the ratio's step became 0.01 keeps 0.05): the cap is taken on the slider's own grid."""
    runner, c, _ = tab
    c["ratio"].step, c["hires_ratio"].maximum = 0.05, 0.6  # as ui_loadsave sets them, before the page is served
    page = Page(runner.demo)
    page.user_sets(c["ratio"], 0.95, order)
    page.user_sets(c["sx"], 3, order)
    page.user_sets(c["sy"], 1, order)
    page.user_sets(c["hires_ratio"], 0.6, order)
    assert (page.value(c["ratio"]), page.value(c["hires_ratio"])) == (0.65, 0.6)
    assert "**0.65**" in page.value(cap_note(runner))
    page.paste(runner, infotext(enabled=True, ratio=0.9, sx=4, sy=4, hires_ratio=0.9), order)
    assert (page.value(c["ratio"]), page.value(c["hires_ratio"])) == (0.9, 0.6)
    assert_drawn_as_held(page, runner)
    shown_settings(page, runner)


@ORDERS
def test_values_typed_faster_than_the_server_answers(tab, order):
    """gradio 3 drops a change that comes while its listener runs: "0" then "0.9" typed at 2x2 strides must still
    end at the cap, and a quick merge → downsample → merge must leave the merge controls interactive."""
    runner, c, page = tab
    page.user_types(c["ratio"], [0.0, 0.9], order)
    assert page.value(c["ratio"]) == 0.75
    page.user_types(c["sy"], [1, 4, 1], order)
    page.user_types(c["hires_ratio"], [0.2, 0.6], order)
    assert (page.value(c["ratio"]), page.value(c["hires_ratio"])) == (0.5, 0.5)
    page.user_types(c["method"], ["downsample", "merge"], order)
    assert page.interactive(c["ratio"]) and not page.interactive(c["downsample_factor"])
    page.user_types(c["method"], ["merge", "downsample"], order)
    assert not page.interactive(c["ratio"]) and page.interactive(c["downsample_factor"])
    assert_drawn_as_held(page, runner)


def test_method_specific_controls_follow_the_method(tab):
    runner, c, page = tab
    merge_only = [n for n in S.NAMES if S.spec(n).method == "merge"]
    assert {"ratio", "sx", "use_rand", "share_plan"} <= set(merge_only)
    assert [n for n in S.NAMES if S.spec(n).method == "downsample"] == ["downsample_factor"]

    def interactive(method: str) -> None:
        assert page.value(c["method"]) == method
        for name in [*merge_only, "downsample_factor"]:
            assert page.interactive(c[name]) == (S.spec(name).method == method), (method, name)
        for name in ("enabled", "max_downsample", "min_size", "start", "end", "merge_controlnet", "method"):
            assert page.interactive(c[name]), name

    interactive("merge")
    page.user_sets(c["method"], "downsample")
    interactive("downsample")
    page.paste(runner, infotext(enabled=True, method="merge"))
    interactive("merge")
    page.paste(runner, infotext(enabled=True, method="downsample", downsample_factor=3))
    interactive("downsample")
    assert shown_settings(page, runner) == S.DEFAULTS.replace(enabled=True, method="downsample", downsample_factor=3)
    page.paste(runner, "a dog\nSteps: 20, Sampler: Euler, Seed: 1")  # no ToMe: off, the rest untouched
    assert page.value(c["enabled"]) is False and page.value(c["method"]) == "downsample"
    interactive("downsample")


OLD_INFOTEXT = (
    "a lighthouse\nNegative prompt: fog\nSteps: 20, Sampler: Euler a, Schedule type: Automatic, CFG scale: 7, "
    "Seed: 1234, Size: 512x768, Model hash: 0123456789, ToMe: True, ToMe ratio: 0.35, ToMe max downsample: 2, "
    "ToMe stride x: 1, ToMe stride y: 2, ToMe seed: 1234, ToMe merge mlp: True, ToMe hires ratio: 0.25, "
    "ToMe min size: 32, ToMe start: 0.1, ToMe end: 0.8, ToMe plan interval: 2, Version: v1.10.1"
)
"""An infotext as this extension wrote it before the accordion changed: it still pastes."""


def test_old_infotexts_still_paste(tab):
    runner, _, page = tab
    page.paste(runner, OLD_INFOTEXT)
    expected = S.from_dict(
        {
            "enabled": True,
            "ratio": 0.35,
            "max_downsample": 2,
            "sx": 1,
            "sy": 2,
            "seed": 1234,
            "merge_mlp": True,
            "hires_ratio": 0.25,
            "min_size": 32,
            "start": 0.1,
            "end": 0.8,
            "plan_interval": 2,
        }
    )
    assert shown_settings(page, runner) == expected
    assert_drawn_as_held(page, runner)
    script = tome_script(runner)  # the pasted values alone, as the double's paste computes them
    pasted = infotext_utils.apply_paste_fields(script.infotext_fields, OLD_INFOTEXT)
    assert S.from_args([pasted[c] for c, _ in script.infotext_fields]) == expected


# --- names that outlive a release ----------------------------------------------------------------------


def test_xyz_axis_labels_never_change():
    """Saved XYZ grids and API scripts name axes by label: shortening a control's label keeps its axis label."""
    assert [a.label for a in ext.axes()] == [
        "[ToMe] Enabled",
        "[ToMe] Merge ratio",
        "[ToMe] Max downsample",
        "[ToMe] Stride x",
        "[ToMe] Stride y",
        "[ToMe] Stride (XxY)",
        "[ToMe] Random destinations",
        "[ToMe] Random seed (-1 = image seed)",
        "[ToMe] Merge self-attention",
        "[ToMe] Merge cross-attention",
        "[ToMe] Merge MLP",
        "[ToMe] Hires. fix ratio (0 = same)",
        "[ToMe] Minimum size (px, 0 = always)",
        "[ToMe] Merge in ControlNet models",
        "[ToMe] Method",
        "[ToMe] Key/value downsample factor",
        "[ToMe] Start at (fraction of steps)",
        "[ToMe] End at (fraction of steps)",
        "[ToMe] Share plan within a level",
        "[ToMe] Recompute plan every N steps",
        "[ToMe] Step cache",
        "[ToMe] Cache interval",
        "[ToMe] Cache branch",
        "[ToMe] Cache start (fraction of steps)",
        "[ToMe] Cache end (fraction of steps)",
        "[ToMe] Hires. fix cache interval (0 = same)",
        "[ToMe] Cache forecast",
        "[ToMe] Cache schedule",
        "[ToMe] Cache threshold",
        "[ToMe] Cache device",
        "[ToMe] Cache correction",
    ]


def test_messages_print_integers_as_integers():
    with pytest.raises(S.SettingsError) as error:
        S.from_dict({"seed": 2**32})
    assert "allowed an integer from -1 to 4294967295" in str(error.value)
    with pytest.raises(S.SettingsError) as error:
        S.from_dict({"min_size": -8})
    assert "from 0 to 8192" in str(error.value)
    with pytest.raises(S.SettingsError) as error:
        S.from_dict({"ratio": 1.5})
    assert "allowed a number from 0 to 0.95" in str(error.value)
    assert S.spec("start").number(0.05) == "0.05" and S.spec("seed").number(4294967295.0) == "4294967295"
