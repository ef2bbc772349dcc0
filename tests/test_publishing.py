"""What the registries take: the license in every place the code ships (the wheel, the checkout that the WebUI and
ComfyUI clone, the ComfyUI registry's archive), the ComfyUI registry's own metadata check (comfy-cli's
``comfy node validate``, in the venv .ci/setup makes) and the A1111 extension index entry drafted in docs/hosts.md,
checked by the index's own rules (its ``.github/scripts/validate.py``: the keys, tags from its ``tags.json``, a
``https://`` URL)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
COMFY_CLI = ROOT / ".venv-comfy-cli" / "bin" / "comfy"

INDEX_TAGS = {  # AUTOMATIC1111/stable-diffusion-webui-extensions, tags.json at 956826e: the tags an entry may name
    "script",
    "localization",
    "tab",
    "dropdown",
    "ads",
    "installed",
    "training",
    "models",
    "UI related",
    "prompting",
    "editing",
    "manipulations",
    "online",
    "animation",
    "query",
    "science",
    "extras",
}


def _tracked_copy(tmp_path: Path) -> Path:
    """A git repository holding the checkout's tracked files as they are in the working tree (what a clone of this
    commit holds), so comfy-cli's ``pack`` (git-tracked files only) sees this change before it is committed."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    copy = tmp_path / "checkout"
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    for name in ("LICENSE", ".comfyignore"):  # new files a working tree may not have added yet
        if (ROOT / name).is_file() and not (copy / name).exists():
            shutil.copy2(ROOT / name, copy / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=copy, check=True)
    subprocess.run([*git, "add", "-A"], cwd=copy, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=copy, check=True)
    return copy


def _comfy(args: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    return subprocess.run(
        [str(COMFY_CLI), "--skip-prompt", "--no-enable-telemetry", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_license_is_mit_and_the_project_says_so():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n") and "Permission is hereby granted, free of charge" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]


def test_the_wheel_carries_the_license(tmp_path):
    copy = _tracked_copy(tmp_path)  # a build writes build/ and *.egg-info beside the sources
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(copy), "-w", tmp_path],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("tome_core-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licence).decode() == (ROOT / "LICENSE").read_text()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        head = archive.read(metadata).decode().split("\n\n")[0].splitlines()
    assert "License-Expression: MIT" in head and "License-File: LICENSE" in head
    assert {"tome_core/__init__.py", "tome_core/holders.py", "diffusers_tome/__init__.py"} <= set(names)
    assert not any(n.split("/")[0] in {"comfy_tome", "webui_tome", "scripts", "tests", "benchmarks"} for n in names)


@pytest.mark.skipif(not COMFY_CLI.exists(), reason="comfy-cli is installed by .ci/setup (.venv-comfy-cli)")
def test_comfy_clis_registry_check_passes_and_its_archive_carries_the_nodes_and_the_license(tmp_path):
    copy = _tracked_copy(tmp_path)
    checked = _comfy(["node", "validate"], copy, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    said = checked.stdout + checked.stderr
    assert "All validation checks passed successfully" in said and "warning" not in said.lower(), said
    packed = _comfy(["node", "pack"], copy, tmp_path)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    with zipfile.ZipFile(copy / "node.zip") as archive:
        names = set(archive.namelist())
    assert {"LICENSE", "__init__.py", "pyproject.toml", "comfy_tome/nodes.py", "tome_core/session.py"} <= names
    assert {n for n in names if n.startswith("example_workflows/")} >= {"example_workflows/tome_sd15.json"}
    assert not {n for n in names if n.split("/")[0] in {"tests", "benchmarks", ".ci"}}  # .comfyignore


def _index_entry() -> dict:
    hosts = (ROOT / "docs" / "hosts.md").read_text()
    part = hosts[hosts.index("### The A1111 extension index") :]
    return json.loads(part[part.index("```json\n") + len("```json\n") : part.index("\n```", part.index("```json"))])


def test_the_a1111_index_entry_passes_the_indexs_own_rules():
    entry = _index_entry()
    assert set(entry) == {"name", "url", "description", "tags"}  # "added" is the index's to fill
    assert entry["tags"] and set(entry["tags"]) <= INDEX_TAGS - {"installed", "online", "ads"}
    assert re.match(r"(https://[^ ]+?)(?:(?:\.git)$|$)", entry["url"])
    assert entry["description"].isascii() and len(entry["description"]) <= 300
