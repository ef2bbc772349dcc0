"""The README stays true: its two set-up commands, the API order, the controls table and the code example."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.gpu import PUBLISHED
from tome_core import settings as S

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_first_lines_are_the_two_setup_commands_and_ci_runs_the_test_one():
    lines = README.splitlines()
    assert lines[0] == "```sh" and lines[3] == "```"
    bench, tests = (line.split("#")[0].strip() for line in lines[1:3])
    assert bench.startswith("bash .ci/setup && ") and "benchmarks.speed.suite" in bench
    assert tests == "bash .ci/setup && .venv/bin/python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/setup" in ci and ".venv/bin/python -m pytest -q" in ci


def test_api_order_and_controls_table_match_the_settings_record():
    assert ", ".join(S.NAMES) in " ".join(README.split())
    table = README[README.index("| control | API name |") : README.index("Bad values never patch")]
    api_column = [row.split("|")[2] for row in table.splitlines()[2:] if row.startswith("|")]
    named = [name for cell in api_column for name in re.findall(r"`([a-z_]+)`", cell)]
    assert sorted(set(named)) == sorted(S.NAMES)


def test_core_example_runs():
    code = README[README.index("```python\nimport torch\nimport tome_core") + len("```python\n") :]
    code = code[: code.index("```")]
    # the same code at test size: narrower and smaller latents
    code = code.replace("model_channels=320", "model_channels=32").replace("context_dim=768", "context_dim=64")
    code = code.replace("128, 128", "16, 16").replace("77, 768", "7, 64").replace("num_heads=8", "num_heads=4")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["eps"].shape == (2, 4, 16, 16)
    assert scope["tome_core"].get_patch(scope["unet"]) is None


def _table(text: str, header: str) -> tuple[list[str], dict[str, list[str]]]:
    """The column titles and rows (first cell -> the other cells) of the markdown table starting at ``header``."""
    rows = []
    for line in text[text.index(header) :].splitlines():
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows[0][1:], {row[0]: row[1:] for row in rows[2:]}


def _section(text: str, name: str) -> str:
    """The part of RESULTS.md between ``<!-- name:begin -->`` and ``<!-- name:end -->``."""
    return text.split(f"<!-- {name}:begin -->", 1)[1].split(f"<!-- {name}:end -->", 1)[0]


# README table header -> the RESULTS.md section (one benchmark's last run) it is copied from
TABLES = {
    "| real width: model, size |": "real-cpu",  # python -m benchmarks.speed.suite --real
    "| step cache: model, size |": "cache",  # python -m benchmarks.speed.cache (derived 20-step speed-ups, real width)
    "| model, size |": "suite",  # python -m benchmarks.speed.suite (reduced widths: the shape of the curve)
    "| sampling: size |": "sampling",  # python -m benchmarks.speed.webui_its
}
SPEEDUP_SECTION = README[README.index("## What speed-up to expect") :].split("\n## ", 1)[0]


def _assert_copied(readme_section: str, header: str, results_section: str) -> None:
    """The README table at ``header`` is rows and columns of the one in RESULTS.md's ``results_section``, unchanged."""
    results = _section((ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8"), results_section)
    columns, measured = _table(results, header)
    readme_columns, readme = _table(readme_section, header)
    picked = [columns.index(column) for column in readme_columns]
    assert readme and set(readme) <= set(measured)
    for name, values in readme.items():
        assert values == [measured[name][i] for i in picked], name


@pytest.mark.parametrize("header", TABLES)
def test_speedup_tables_are_the_benchmarks_last_runs(header):
    _assert_copied(SPEEDUP_SECTION, header, TABLES[header])


def test_real_widths_lead_and_every_speedup_shown_was_measured():
    order = [SPEEDUP_SECTION.index(header) for header in TABLES]
    assert order == sorted(order)  # real widths (ToMe, then the cache), the shape of the curve, sampling
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    measured = set()
    for header, name in TABLES.items():
        measured |= {cell for row in _table(_section(results, name), header)[1].values() for cell in row}
    # the fidelity run's speed-ups: the same real-width runs, and a data-dependent mode's steps priced with them
    measured |= set(re.findall(r"\d+\.\d+×", _section(results, "fidelity")))
    published = {f"{v:.2f}×" for v in PUBLISHED.values()}  # tomesd's own GPU numbers, quoted as such
    shown = set(re.findall(r"\d+\.\d+×", SPEEDUP_SECTION))
    assert shown <= measured | published, shown - measured - published


QUALITY_SECTION = README[README.index("## Quality") :].split("\n## ", 1)[0]
QUALITY_TABLES = (
    "| quality: mode |",
    "| quality, DPM++ 2M Karras: mode |",
    "| case, speed |",
    "| case (DeepCache N=3: PSNR, speed) |",
)


@pytest.mark.parametrize("header", QUALITY_TABLES)
def test_quality_tables_are_the_fidelity_benchmarks_last_run(header):
    """The README's quality figures are the trained models' (``python -m benchmarks.quality.fidelity``), copied unchanged."""
    _assert_copied(QUALITY_SECTION, header, "fidelity")


COMFY_SECTION = README[README.index("## ComfyUI") :].split("\n## ", 1)[0]


def test_the_comfy_speed_table_is_the_comfy_benchmarks_last_run():
    """The real ComfyUI's numbers in the README (``python -m benchmarks.speed.comfy``), copied unchanged."""
    _assert_copied(COMFY_SECTION, "| ComfyUI (CPU): model, size |", "comfy-cpu")


NEIGHBOURS_SECTION = README[README.index("## With other extensions") :].split("\n## ", 1)[0]


def _tests_named(cell: str) -> dict[str, list[str]]:
    """``test_file.py: `test_a_*`, `test_b_*`; other.py: ...`` in a table cell -> {file: [patterns]}."""
    named: dict[str, list[str]] = {}
    for part in cell.split(";"):
        match = re.search(r"`?(test_[a-z0-9_]+\.py)`?:(.*)", part)
        if match:
            named.setdefault(match.group(1), []).extend(re.findall(r"`(test_[a-z0-9_*]+)`", match.group(2)))
    return named


def test_every_row_of_the_extensions_table_names_tests_that_exist_and_every_neighbour_test_has_a_row():
    """Each extension in "With other extensions" is backed by tests that exist (a renamed or dropped test fails here),
    and no test of ``tests/test_neighbours_*.py`` is left out of the table."""
    columns, rows = _table(NEIGHBOURS_SECTION, "| extension |")
    assert columns[-1] == "checked" and len(rows) >= 9
    defined = {
        path.name: set(re.findall(r"^def (test_\w+)", path.read_text(encoding="utf-8"), re.M))
        for path in (ROOT / "tests").glob("test_*.py")
    }
    covered: set[tuple[str, str]] = set()
    for extension, cells in rows.items():
        named = _tests_named(cells[-1])
        assert named, f"{extension}: no test named"
        for file, patterns in named.items():
            assert file in defined and patterns, (extension, file)
            for pattern in patterns:
                regex = re.compile(re.escape(pattern).replace(r"\*", r"\w*") + "$")
                hits = {name for name in defined[file] if regex.match(name)}
                assert hits, f"{extension}: no test {pattern} in {file}"
                covered |= {(file, name) for name in hits}
    neighbours = {(f, n) for f, names in defined.items() if f.startswith("test_neighbours_") for n in names}
    assert neighbours - covered == set()


STEP_CACHE_SECTION = README[README.index("## Step cache") :].split("\n## ", 1)[0]


def test_the_sampler_table_is_the_samplers_benchmarks_last_run():
    """Issue 27's table (``python -m benchmarks.quality.cache_by_sampler``), copied unchanged, every sampler of the benchmark in it."""
    _assert_copied(STEP_CACHE_SECTION, "| sampler, N |", "samplers")
    _, rows = _table(STEP_CACHE_SECTION, "| sampler, N |")
    from benchmarks.lab.sampling import LABELS

    assert {row.split(", N=")[0] for row in rows} == set(LABELS.values())
