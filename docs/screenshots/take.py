"""Retake the screenshots that the README and docs show, from the real hosts, with this checkout as the extension.

    python3 -m venv ~/shots-venv && ~/shots-venv/bin/pip install playwright   # once; no browser download needed
    ~/shots-venv/bin/python docs/screenshots/take.py                        # every picture
    ~/shots-venv/bin/python docs/screenshots/take.py webui neo              # some of them

Needs the real hosts built by the harnesses of ``../shared/harness`` (its README: ``webui/``, ``forge/``, ``neo/``,
``classic/``, ``comfy/``; each ``build.sh`` makes ``$HOME/<host>-harness``, ``--harnesses`` says where else) and a Chromium
(Debian's ``/usr/bin/chromium``, ``--chromium`` another), which Playwright drives headless. For each host it starts
the host with this checkout as its extension (the harness's own start script, under ``nice``), takes the picture,
and stops the host again, one host at a time:

- ``webui`` → ``docs/accordion.png``: AUTOMATIC1111 1.10.1 (gradio 3.41), the txt2img tab's ToMe accordion opened
  (which ticks it) and its *Advanced* group opened, cropped to the accordion;
- ``forge`` → ``docs/accordion-forge.png``: the same in Forge main (gradio 4.40);
- ``classic`` → ``docs/accordion-classic.png``: the same in Forge Classic (gradio 3.41);
- ``neo`` → ``docs/accordion-neo.png``: the same in Forge Neo (gradio 4.40, Neo's theme);
- ``comfy`` → ``docs/comfy-workflow.png``: ComfyUI's frontend with ``example_workflows/tome_sd15.json`` loaded
  (Load Checkpoint → ToMe → ToMeStepCache → KSampler), the canvas as the frontend lays it out. ComfyUI is started
  from the harness's tree and venv, not by its ``start_comfy.sh``, in a base directory of its own (see
  :func:`start_comfy`), so a harness ComfyUI that is running stays as it is.

The window is as wide as makes the txt2img column, and so the accordion, 600 px wide in A1111 and Classic (1300 px) and
about that in Forge and Neo (1332 px), so the labels wrap as a person sees them there. Each accordion shows only the
controls that can act in its host (*Cache correction* in Neo only). Look at every picture before committing it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]
ACCORDION = "#script_txt2img_tome_enabled"  # scripts/tome.py's InputAccordion in the txt2img tab
ADVANCED = "#script_txt2img_tome_advanced"  # the Advanced group inside it
WORKFLOW = ROOT / "example_workflows" / "tome_sd15.json"
COMFY_SETTINGS = {
    "Comfy.TutorialCompleted": True,  # else a new user's first page opens the templates over the graph
    "Comfy.Graph.CanvasInfo": False,  # the frame-rate corner
    "Comfy.Minimap.Visible": False,
    "Comfy.Workflow.WorkflowTabsPosition": "Sidebar",  # no tab bar (the empty default workflow's tab)
}
"""The frontend's settings for the picture (a new user's, less what covers the graph)."""


@dataclass(frozen=True)
class Host:
    folder: str  # the harness, under --harnesses
    start: str  # its start script: start.sh EXT_DIR PORT
    stop: str
    port: int
    picture: str  # under docs/
    width: int = 1300  # the window's: the txt2img column (and so the accordion) about 600 px wide
    kind: str = "webui"  # "webui": the ToMe accordion; "comfy": the example workflow


HOSTS = {
    "webui": Host("webui-harness", "start_webui.sh", "stop_webui.sh", 7866, "accordion.png"),
    "forge": Host("forge-harness", "start_forge.sh", "stop_forge.sh", 7886, "accordion-forge.png", 1332),
    "classic": Host("classic-harness", "start_classic.sh", "stop_classic.sh", 7891, "accordion-classic.png"),
    "neo": Host("neo-harness", "start_neo.sh", "stop_neo.sh", 7896, "accordion-neo.png", 1332),
    "comfy": Host("comfy-harness", "", "", 8290, "comfy-workflow.png", 1480, "comfy"),
}


def log(message: str) -> None:
    print(f"[take] {message}", flush=True)


def start(host: Host, harnesses: Path) -> subprocess.Popen | None:
    """Start ``host`` with this checkout as its extension; ComfyUI: a process of our own (returned), see
    :func:`start_comfy`."""
    folder = harnesses / host.folder
    if not folder.exists():
        raise SystemExit(f"no {folder}: build the harness first (../shared/harness/README.md)")
    log(f"starting {host.folder} on port {host.port} with {ROOT} as the extension")
    if host.kind == "comfy":
        return start_comfy(folder, host.port)
    subprocess.run(["nice", "-n", "10", "bash", str(folder / host.start), str(ROOT), str(host.port)], check=True)
    return None


def start_comfy(folder: Path, port: int, timeout: float = 600) -> subprocess.Popen:
    """The harness's ComfyUI, but not through its ``start_comfy.sh`` (which stops the harness's running ComfyUI, maybe
    someone else's): its own base directory (a temporary ``custom_nodes/`` holding only this checkout, no models, its
    own user settings) and an in-memory database, so nothing of a running harness ComfyUI is touched."""
    base = Path(tempfile.mkdtemp(prefix="tome-shots-comfy-"))
    (base / "custom_nodes").mkdir()
    (base / "custom_nodes" / "tome-under-test").symlink_to(ROOT)
    (base / "user" / "default").mkdir(parents=True)
    (base / "user" / "default" / "comfy.settings.json").write_text(json.dumps(COMFY_SETTINGS), encoding="utf-8")
    env = {
        **os.environ,
        **dict.fromkeys(("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "DO_NOT_TRACK"), "1"),
        **dict.fromkeys(("OMP_NUM_THREADS", "MKL_NUM_THREADS"), "2"),
        "PYTHONPYCACHEPREFIX": str(base / "pycache"),
    }
    command = [
        "nice", "-n", "10", str(folder / "venv" / "bin" / "python"), "main.py", "--cpu", "--listen", "127.0.0.1",
        "--port", str(port), "--disable-auto-launch", "--disable-api-nodes", "--base-directory", str(base),
        "--database-url", "sqlite:///:memory:",
    ]  # fmt: skip
    with open(base / "comfy.log", "w") as out:
        process = subprocess.Popen(
            command, cwd=folder / "ComfyUI", env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    t0 = time.time()
    while True:
        if process.poll() is not None:
            raise SystemExit(f"ComfyUI exited while starting: {base / 'comfy.log'}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/system_stats", timeout=10)
            break
        except OSError:
            if time.time() - t0 > timeout:
                stop_process(process)
                raise SystemExit(f"ComfyUI did not answer in {timeout:.0f} s: {base / 'comfy.log'}") from None
            time.sleep(1)
    log(f"ComfyUI up on port {port} (pid {process.pid}, {time.time() - t0:.0f} s, log {base / 'comfy.log'})")
    return process


def stop_process(process: subprocess.Popen) -> None:
    """Stop the process group we started (and only it)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def stop(host: Host, harnesses: Path, process: subprocess.Popen | None) -> None:
    if process is not None:
        stop_process(process)
    else:
        subprocess.run(["bash", str(harnesses / host.folder / host.stop)], check=False)


def _open(page, selector: str) -> None:
    """Open a gradio accordion (3.41 and 4.40 alike: its header is ``.label-wrap``, ``open`` when it is)."""
    header = page.locator(f"{selector} .label-wrap").first
    header.scroll_into_view_if_needed()
    if "open" not in (header.get_attribute("class") or ""):
        header.click()
    page.wait_for_function(
        "s => (document.querySelector(s + ' .label-wrap')?.className || '').includes('open')", arg=selector
    )


def accordion(page, url: str, out: Path, width: int) -> None:
    """The txt2img ToMe accordion, ticked and opened with its Advanced group: the accordion's box alone."""
    page.set_viewport_size({"width": width, "height": 1600})
    page.goto(url, wait_until="domcontentloaded", timeout=300_000)
    page.wait_for_selector(f"{ACCORDION} .label-wrap", state="visible", timeout=300_000)
    page.wait_for_timeout(3000)  # the WebUI's onUiLoaded scripts (the accordion's checkbox, the hints)
    _open(page, ACCORDION)  # linked to the checkbox in A1111's InputAccordion: opening it ticks ToMe
    box = page.locator(ACCORDION).first
    checkbox = page.locator(f"{ACCORDION} .input-accordion-checkbox").first
    if checkbox.count() and not checkbox.is_checked():
        checkbox.check()
    _open(page, ADVANCED)
    page.mouse.move(0, 0)  # no hover state on the picture
    page.wait_for_timeout(1500)  # the accordion's opening transition
    box.scroll_into_view_if_needed()
    box.screenshot(path=str(out), animations="disabled")


def comfy(page, url: str, out: Path, width: int) -> None:
    """The example workflow as ComfyUI's frontend draws it."""
    page.set_viewport_size({"width": width, "height": 680})
    page.goto(url, wait_until="domcontentloaded", timeout=300_000)
    page.wait_for_function("() => window.app && window.app.graph && window.app.canvas", timeout=300_000)
    page.wait_for_timeout(3000)
    workflow = json.loads(WORKFLOW.read_text(encoding="utf-8"))
    page.evaluate(
        "async ([w, name]) => { await window.app.loadGraphData(w, true, true, name); }", [workflow, WORKFLOW.stem]
    )
    page.evaluate("async () => { await window.app.extensionManager.command.execute('Comfy.Canvas.FitView'); }")
    page.wait_for_timeout(2000)
    page.mouse.move(width - 1, 300)
    page.screenshot(path=str(out), animations="disabled")


def take(names: list[str], harnesses: Path, chromium: str, out_dir: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            for name in names:
                host = HOSTS[name]
                out = out_dir / host.picture
                process = start(host, harnesses)
                try:
                    page = browser.new_page(device_scale_factor=1)
                    t0 = time.time()
                    (comfy if host.kind == "comfy" else accordion)(
                        page, f"http://127.0.0.1:{host.port}", out, host.width
                    )
                    page.close()
                finally:
                    stop(host, harnesses, process)
                log(f"{name}: wrote {out} ({out.stat().st_size} bytes, {time.time() - t0:.0f} s in the browser)")
                written.append(out)
        finally:
            browser.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hosts", nargs="*", help="some of " + ", ".join(HOSTS) + " (default: all)")
    parser.add_argument("--harnesses", type=Path, default=Path(os.environ.get("HOME", "~")).expanduser())
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--out", type=Path, default=DOCS, help="where the PNGs go (default: docs/)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.hosts if name not in HOSTS]
    if unknown:
        parser.error(f"unknown host {', '.join(unknown)}: choose from {', '.join(HOSTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    take(args.hosts or list(HOSTS), args.harnesses, args.chromium, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
