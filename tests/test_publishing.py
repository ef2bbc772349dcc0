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


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return _tracked_copy(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def wheel(checkout) -> Path:
    out = checkout.parent  # a build writes build/ and *.egg-info beside the sources
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(checkout), "-w", out],
        cwd=out,
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("tome_core-*.whl")
    return built


def test_the_wheel_carries_the_license(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(licence).decode() == (ROOT / "LICENSE").read_text()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        head = archive.read(metadata).decode().split("\n\n")[0].splitlines()
    assert "License-Expression: MIT" in head and "License-File: LICENSE" in head
    assert {"tome_core/__init__.py", "tome_core/holders.py", "diffusers_tome/__init__.py"} <= set(names)
    assert not any(n.split("/")[0] in {"comfy_tome", "webui_tome", "scripts", "tests", "benchmarks"} for n in names)


SEED = """
import sys, torch, tome_core, diffusers_tome
from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline
from diffusers_pipelines import sd_call, sd_pipeline  # the tests' tiny pipeline (tests/ on the path, not the repository)
assert tome_core.__file__.startswith(sys.prefix) and diffusers_tome.__file__.startswith(sys.prefix), tome_core.__file__
pipe = sd_pipeline()
plain = sd_call(pipe, steps=3)
tome_core.apply_patch(pipe, ratio=0.5)
merged = sd_call(pipe, steps=3)
assert isinstance(tome_core.get_patch(pipe), diffusers_tome.PipelinePatch) and not torch.equal(merged, plain)
tome_core.remove_patch(pipe)
assert torch.equal(sd_call(pipe, steps=3), plain)
print("seed snippet ok")
"""


def _clean_venv(where: Path) -> Path:
    """A fresh venv (no site packages, no pip) that sees this checkout's torch and diffusers through a path file, not
    its packages: none of the repository's files, none of its installs (a path line adds the folder only; the ``.pth``
    files in it are not read)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, capture_output=True)
    python = where / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    outer = next(p for p in sys.path if p.endswith("site-packages") and (Path(p) / "torch").is_dir())
    (Path(site) / "outer_site.pth").write_text(outer + "\n")
    return python


@pytest.mark.parametrize("source", ["wheel", "git+file"])
def test_pip_installs_the_core_and_the_diffusers_adapter_without_a_webui(source, request, tmp_path):
    """``pip install .`` (the wheel it builds) or ``pip install git+file://...`` into a clean venv, without
    dependencies (torch and diffusers come from this environment, see :func:`_clean_venv`), then the seed's snippet
    from outside the repository."""
    python = _clean_venv(tmp_path / "venv")
    target = (
        str(request.getfixturevalue("wheel"))
        if source == "wheel"
        else f"git+file://{request.getfixturevalue('checkout')}"
    )
    install = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(python),
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
    ]
    done = subprocess.run([*install, target], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (info,) = Path(tmp_path / "venv").glob("lib/python*/site-packages/tome_core-*.dist-info")
    assert (info / "licenses" / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT / "tests")  # the tiny pipeline only: tests/ holds no tome_core
    ran = subprocess.run([python, "-c", SEED], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0 and "seed snippet ok" in ran.stdout, ran.stdout + ran.stderr


def test_the_package_list_holds_the_core_and_the_diffusers_adapter():
    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["tome_core*", "diffusers_tome*"]


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
