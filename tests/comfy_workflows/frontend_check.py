"""Loads every example workflow in ComfyUI's own frontend (headless Chromium) and compares the frontend's API prompt
(``app.graphToPrompt()``, what "Queue" sends) with ``runner.to_api``'s.

Usage, with a ComfyUI started by the harness (``start_comfy.sh /path/to/this/checkout 8288``) and Chromium on PATH:
    $HOME/comfy-harness/venv/bin/python tests/comfy_workflows/frontend_check.py [--port 8288] [WORKFLOW.json ...]

Prints, per workflow, whether the frontend loaded it (``app.loadGraphData``) and whether the two prompts are the same
(class and inputs of every node); exit 1 on a difference or an error. The harness venv has aiohttp, which speaks the
DevTools protocol here (no browser driver needed).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import runner  # noqa: E402

SCRIPT = """
(async () => {
  const wf = %s;
  const errors = [];
  const onError = (e) => errors.push(String(e && (e.message || e.reason || e)));
  window.addEventListener('error', onError);
  await window.app.loadGraphData(wf, true, true, 'check');
  const p = await window.app.graphToPrompt();
  window.removeEventListener('error', onError);
  return JSON.stringify({output: p.output, errors});
})()
"""


async def _cdp(port: int, url: str, workflows: list[str], api_port: int) -> dict[str, dict]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        targets = await (await session.get(f"http://127.0.0.1:{port}/json")).json()
        page = next(t for t in targets if t.get("type") == "page")
        async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            counter = 0

            async def call(method: str, **params):
                nonlocal counter
                counter += 1
                await ws.send_json({"id": counter, "method": method, "params": params})
                while True:
                    msg = await ws.receive_json(timeout=600)
                    if msg.get("id") == counter:
                        if "error" in msg:
                            raise RuntimeError(msg["error"])
                        return msg["result"]

            async def evaluate(expression: str):
                result = await call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
                if "exceptionDetails" in result:
                    raise RuntimeError(json.dumps(result["exceptionDetails"])[:2000])
                return result["result"].get("value")

            await call("Page.navigate", url=url)
            t0 = time.time()
            while time.time() - t0 < 300:  # the app and its node definitions
                ready = await evaluate(
                    "!!(window.app && window.app.graph && window.LiteGraph && "
                    "window.LiteGraph.registered_node_types['ToMeStepCache'])"
                )
                if ready:
                    break
                await asyncio.sleep(2)
            else:
                raise RuntimeError("the frontend did not come up (no app, or no ToMe nodes registered)")
            out = {}
            for path in workflows:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
                try:
                    value = json.loads(await evaluate(SCRIPT % text))
                    out[path] = value
                except Exception as error:  # reported per workflow
                    out[path] = {"output": None, "errors": [str(error)]}
            return out


def compare(frontend: dict, ours: dict) -> list[str]:
    """Where the frontend's prompt and ours differ (node ids, class types, inputs)."""
    diffs = []
    if set(frontend) != set(ours):
        diffs.append(f"nodes: frontend {sorted(frontend)} vs ours {sorted(ours)}")
    for node_id in sorted(set(frontend) & set(ours)):
        a, b = frontend[node_id], ours[node_id]
        if a["class_type"] != b["class_type"]:
            diffs.append(f"{node_id}: {a['class_type']} vs {b['class_type']}")
        for name in sorted(set(a["inputs"]) | set(b["inputs"])):
            x, y = a["inputs"].get(name, "<none>"), b["inputs"].get(name, "<none>")
            if isinstance(x, list) and isinstance(y, list):
                x, y = [str(x[0]), x[1]], [str(y[0]), y[1]]
            if x != y and not (isinstance(x, (int, float)) and isinstance(y, (int, float)) and abs(x - y) < 1e-9):
                diffs.append(f"{node_id} {a['class_type']}.{name}: frontend {x!r} vs ours {y!r}")
    return diffs


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workflows", nargs="*")
    p.add_argument("--port", type=int, default=8288)
    p.add_argument("--harness", default=os.environ.get("TOME_COMFY_HARNESS", os.path.expanduser("~/comfy-harness")))
    p.add_argument("--debug-port", type=int, default=9333)
    a = p.parse_args(argv)
    sys.path.insert(0, a.harness)
    import comfy_api

    paths = a.workflows or sorted(
        x for x in glob.glob(os.path.join(ROOT, "example_workflows", "*.json")) if "nodes" in _load(x)
    )
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    assert browser, "no Chromium on PATH"
    profile = tempfile.mkdtemp(prefix="tome-frontend-")
    proc = subprocess.Popen(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            f"--remote-debugging-port={a.debug_port}",
            f"--user-data-dir={profile}",
            "--window-size=1600,1000",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(60):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{a.debug_port}/json/version", timeout=2)
                break
            except OSError:
                time.sleep(1)
        results = asyncio.run(_cdp(a.debug_port, f"http://127.0.0.1:{a.port}/", paths, a.port))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)
    info = comfy_api.object_info(port=a.port)
    bad = 0
    for path, value in results.items():
        name = os.path.basename(path)
        if value["output"] is None:
            print(f"{name}: NOT LOADED: {value['errors']}")
            bad += 1
            continue
        with open(path, encoding="utf-8") as f:
            ours = {
                k: {"class_type": v["class_type"], "inputs": v["inputs"]}
                for k, v in runner.to_api(json.load(f), info).items()
            }
        diffs = compare(value["output"], ours)
        bad += bool(diffs) or bool(value["errors"])
        print(
            f"{name}: loaded, {len(value['output'])} nodes queued; "
            + ("same prompt as runner.to_api" if not diffs else "DIFFERS:")
        )
        for d in diffs:
            print("   ", d)
        for e in value["errors"]:
            print("    page error:", e)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
