"""The README and docs/ stay true: the two set-up commands, the API order, the controls tables, the code example, the
tables copied from RESULTS.md, the README's length, its figures' sources and every relative link."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from benchmarks.gpu import PUBLISHED
from tome_core import settings as S

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = ROOT / "docs"


def _doc(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def _part(text: str, heading: str) -> str:
    """``text`` from ``heading`` (a ``## `` line) to the next ``## `` heading."""
    return text[text.index(heading) :].split("\n## ", 1)[0]


def test_first_lines_are_the_two_setup_commands_and_ci_runs_the_test_one():
    lines = README.splitlines()
    assert lines[0] == "```sh" and lines[3] == "```"
    bench, tests = (line.split("#")[0].strip() for line in lines[1:3])
    assert bench.startswith("bash .ci/setup && ") and "benchmarks.speed.suite" in bench
    assert tests == "bash .ci/setup && .venv/bin/python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/setup" in ci and ".venv/bin/python -m pytest -q" in ci


def _api_names(table: str) -> list[str]:
    api_column = [row.split("|")[2] for row in table.splitlines()[2:] if row.startswith("|")]
    return [name for cell in api_column for name in re.findall(r"`([a-z_]+)`", cell)]


def test_api_order_and_controls_tables_match_the_settings_record():
    api = _doc("api.md")
    assert ", ".join(S.NAMES) in " ".join(_part(api, "## HTTP API").split())
    # the README's short table, and the full one with the ranges in docs/api.md: every setting, nothing else
    short = README[README.index("| control | API name |") : README.index("Bad values never patch")]
    full = api[api.index("| control | API name |") : api.index("Bad values never patch")]
    for table in (short, full):
        assert sorted(set(_api_names(table))) == sorted(S.NAMES)
    assert "| default | range |" in full.splitlines()[0]


def test_core_example_runs(tmp_path):
    text = _doc("python-api.md")
    code = text[text.index("```python\nimport torch\nimport tome_core") + len("```python\n") :]
    code = code[: code.index("```")]
    # the same code at test size: narrower and smaller latents
    code = code.replace("model_channels=320", "model_channels=32").replace("context_dim=768", "context_dim=64")
    code = code.replace("128, 128", "16, 16").replace("77, 768", "7, 64").replace("num_heads=8", "num_heads=4")
    example = tmp_path / "python_api_example.py"
    example.write_text(code)
    scope = runpy.run_path(str(example))
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


# docs/speed.md table header -> the RESULTS.md section (one benchmark's last run) it is copied from
TABLES = {
    "| real width: model, size |": "real-cpu",  # python -m benchmarks.speed.suite --real
    "| step cache: model, size |": "cache",  # python -m benchmarks.speed.cache (derived 20-step speed-ups, real width)
    "| model, size |": "suite",  # python -m benchmarks.speed.suite (reduced widths: the shape of the curve)
    "| sampling: size |": "sampling",  # python -m benchmarks.speed.webui_its
}
SPEEDUP_SECTION = _part(_doc("speed.md"), "## What speed-up to expect")


def _assert_copied(readme_section: str, header: str, results_section: str) -> None:
    """The docs table at ``header`` is rows and columns of the one in RESULTS.md's ``results_section``, unchanged."""
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


QUALITY_SECTION = _part(_doc("quality.md"), "## Quality")
QUALITY_TABLES = (
    "| quality: mode |",
    "| quality, DPM++ 2M Karras: mode |",
    "| case, speed |",
    "| case (DeepCache N=3: PSNR, speed) |",
)


@pytest.mark.parametrize("header", QUALITY_TABLES)
def test_quality_tables_are_the_fidelity_benchmarks_last_run(header):
    """docs/quality.md's figures are the trained models' (``python -m benchmarks.quality.fidelity``), copied unchanged."""
    _assert_copied(QUALITY_SECTION, header, "fidelity")


COMFY_SECTION = _part(_doc("hosts.md"), "## ComfyUI")


def test_the_comfy_speed_table_is_the_comfy_benchmarks_last_run():
    """The real ComfyUI's numbers in docs/hosts.md (``python -m benchmarks.speed.comfy``), copied unchanged."""
    _assert_copied(COMFY_SECTION, "| ComfyUI (CPU): model, size |", "comfy-cpu")


NEIGHBOURS_SECTION = _part(_doc("compatibility.md"), "## With other extensions")


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


STEP_CACHE_SECTION = _part(_doc("step-cache.md"), "## Step cache")


def test_the_sampler_table_is_the_samplers_benchmarks_last_run():
    """Issue 27's table (``python -m benchmarks.quality.cache_by_sampler``), copied unchanged, every sampler of the benchmark in it."""
    _assert_copied(STEP_CACHE_SECTION, "| sampler, N |", "samplers")
    _, rows = _table(STEP_CACHE_SECTION, "| sampler, N |")
    from benchmarks.lab.sampling import LABELS

    assert {row.split(", N=")[0] for row in rows} == set(LABELS.values())


# --- the README is short, its figures have a source, and every relative link resolves -------------------------


def test_the_readme_is_at_most_250_lines():
    assert len(README.splitlines()) <= 250


def _without_code(text: str) -> str:
    """``text`` with its fenced code blocks blanked (a ``# comment`` there is no heading, a ``](x)`` no link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (``-`` and ``_`` kept), spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(text: str) -> list[tuple[int, str, int]]:
    """(level, anchor, offset) of each heading outside code, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = []
    for match in re.finditer(r"^(#{1,6}) (.+)$", _without_code(text), re.M):
        anchor = _slug(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.append((len(match.group(1)), anchor if count == 0 else f"{anchor}-{count}", match.start()))
    return found


def _links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", _without_code(text))


PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = target.partition("#")
    return (page if not path else (page.parent / path).resolve()), anchor


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    """Each relative link, image and ``#anchor`` (into a markdown file of this repository) of README.md and docs/*.md
    points at a file or folder that exists and, for an anchor, at a heading that file has."""
    links = [t for t in _links(page.read_text(encoding="utf-8")) if not re.match(r"[a-z]+:", t)]
    assert links
    for target in links:
        path, anchor = _resolve(page, target)
        assert path.exists(), f"{page.name}: {target}"
        if anchor:
            assert path.suffix == ".md", f"{page.name}: {target}"
            anchors = {a for _, a, _ in _headings(path.read_text(encoding="utf-8"))}
            assert anchor in anchors, f"{page.name}: {target}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {_resolve(ROOT / "README.md", t)[0] for t in _links(README)}
    assert {page.resolve() for page in PAGES[1:]} <= linked


def _linked_section(page: Path, target: str) -> str:
    """The text a link points at: a heading's section (to the next heading of its level or above), else the file."""
    path, anchor = _resolve(page, target)
    text = path.read_text(encoding="utf-8")
    if not anchor:
        return text
    headings = _headings(text)
    level, start = next((lvl, off) for lvl, a, off in headings if a == anchor)
    end = next((off for lvl, _, off in headings if off > start and lvl <= level), len(text))
    return text[start:end]


WHAT_TO_SET = _part(README, "## What to set")


def test_every_figure_in_what_to_set_is_in_the_section_its_row_links_to():
    """Each row of the README's "What to set" tables names where its numbers come from, and they are there: every
    speed-up (``2.05×``) and PSNR (``37.1 dB``) of the row occurs in the docs section (or sections) it links to."""
    rows = [line for line in WHAT_TO_SET.splitlines() if line.startswith("|") and not line.startswith("|---")]
    body = [row for row in rows if not row.startswith("| you want |")]
    assert len(body) >= 15
    figures_checked = 0
    for row in body:
        targets = [t for t in _links(row) if not re.match(r"[a-z]+:", t)]
        assert targets, row
        source = "\n".join(_linked_section(ROOT / "README.md", t) for t in targets)
        for figure in re.findall(r"(\d+\.\d+)(?=×| dB)", row):
            assert re.search(rf"(?<![\d.]){re.escape(figure)}(?![\d])", source), (figure, row)
            figures_checked += 1
    assert figures_checked >= 30
