"""A browser tab's view of a gradio Blocks, for tests, under gradio 3.41 and 4.40 alike.

:class:`Page` holds what the browser holds for each component (its props, from the Blocks' config) and runs the
registered event listeners the way the gradio frontend does: a listener's inputs are read from the page when the
event is dispatched, its function runs through gradio's own request processing (``Blocks.process_api``:
preprocess, call, postprocess), and the answer's updates are applied to the page; every component whose value
that changed fires its ``change`` listeners in turn, until nothing changes.

Events dispatched together (one answer changes several components) all read the page as it was when they were
dispatched, and their answers may come back in any order (``order="forward"`` or ``"reverse"``), as with real
requests.

For sliders it also models what the browser *draws*: an ``<input type=range>`` snaps the value it is given to
its step and clamps it to its min/max at the moment the value is set, and re-clamps the drawn value (not the
component's value) when min/max change later. Svelte sets the value only when it differs from the one it holds,
and a value and new bounds that arrive together are taken in the worse order (value first). ``drawn(c)`` is where
the thumb is.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import gradio as gr

GRADIO_4 = int(gr.__version__.split(".")[0]) >= 4
UPDATE_TYPES = ("update", "generic_update")


class Page:
    def __init__(self, demo: gr.Blocks):
        self.demo = demo
        config = demo.get_config_file()
        self.props: dict[int, dict[str, Any]] = {c["id"]: dict(c.get("props") or {}) for c in config["components"]}
        self.kind: dict[int, str] = {c["id"]: c["type"] for c in config["components"]}
        self.listeners: list[tuple[int, set[tuple[int, str]], list[int], list[int]]] = []
        for index, dep in enumerate(config["dependencies"]):
            if not dep.get("backend_fn"):
                continue  # javascript-only listeners (InputAccordion's sync) change no component here
            if GRADIO_4:
                key, targets = dep["id"], {(int(t[0]), t[1]) for t in dep["targets"]}
            else:
                key, targets = index, {(int(t), dep["trigger"]) for t in dep["targets"]}
            self.listeners.append((key, targets, list(dep["inputs"]), list(dep["outputs"])))
        self._drawn = {i: self._clamped(i, p.get("value")) for i, p in self.props.items() if self.kind[i] == "slider"}
        self.calls = 0

    # --- reading ----------------------------------------------------------------------------------
    def value(self, component: Any) -> Any:
        return self.props[component._id].get("value")

    def drawn(self, component: Any) -> float:
        """Where the slider's thumb is."""
        return self._drawn[component._id]

    def interactive(self, component: Any) -> bool:
        props = self.props[component._id]
        if props.get("interactive") is not None:
            return bool(props["interactive"])
        return props.get("mode") != "static"

    # --- acting -----------------------------------------------------------------------------------
    def user_sets(self, component: Any, value: Any, order: str = "forward") -> None:
        """A person sets a control (drags a slider, types a number, picks a choice); its listeners run. A slider
        takes no value beyond its current bounds or off its steps from a person."""
        if component._id in self._drawn:
            value = self._clamped(component._id, value)
        changed = self._apply(component._id, {"__type__": "update", "value": value})
        self._settle(self._triggered(changed, "change") + self._triggered({component._id}, "input"), order)

    def click(self, component: Any, order: str = "forward") -> None:
        self._settle(self._triggered({component._id}, "click"), order)

    def paste(self, runner: Any, infotext: str, order: str = "forward") -> None:
        """The tab's paste button with ``infotext`` in its prompt box (the harness's ``runner.prompt/paste``)."""
        self._apply(runner.prompt._id, {"__type__": "update", "value": infotext})
        self.click(runner.paste, order)

    # --- the event loop -----------------------------------------------------------------------------
    def _triggered(self, ids: set[int], event: str) -> list[int]:
        return [n for n, (_, targets, _, _) in enumerate(self.listeners) if any((i, event) in targets for i in ids)]

    def _settle(self, pending: list[int], order: str, limit: int = 50) -> None:
        for _ in range(limit):
            if not pending:
                return
            dispatched = [(n, [self.props[i].get("value") for i in self.listeners[n][2]]) for n in pending]
            if order == "reverse":
                dispatched.reverse()
            changed: set[int] = set()
            for n, inputs in dispatched:
                key, _, _, outputs = self.listeners[n]
                data = asyncio.run(self._process(key, inputs))
                self.calls += 1
                for output, item in zip(outputs, data):
                    changed |= self._apply(output, item)
            pending = self._triggered(changed, "change")
        raise AssertionError(f"change listeners still firing after {limit} rounds")

    async def _process(self, key: int, inputs: list[Any]) -> list[Any]:
        if GRADIO_4:
            from gradio.state_holder import SessionState

            out = await self.demo.process_api(block_fn=key, inputs=inputs, state=SessionState(self.demo))
        else:
            out = await self.demo.process_api(fn_index=key, inputs=inputs, state={})
        return out["data"]

    def _apply(self, i: int, item: Any) -> set[int]:
        """Apply one output to component ``i``; the ids whose value changed."""
        update = item if isinstance(item, dict) and item.get("__type__") in UPDATE_TYPES else {"value": item}
        if "mode" in update:  # gradio 3 sends interactive as mode static / dynamic
            update = {**update, "interactive": update["mode"] != "static"}
        props = self.props[i]
        old_value = props.get("value")
        bounds = {k: update[k] for k in ("minimum", "maximum", "step") if k in update}
        if "value" in update and update["value"] != old_value:
            props["value"] = update["value"]
            if i in self._drawn:
                self._drawn[i] = self._clamped(i, update["value"])  # set against the bounds it had
        props.update({k: v for k, v in update.items() if k not in ("__type__", "value")})
        if bounds and i in self._drawn:
            self._drawn[i] = self._clamped(i, self._drawn[i])  # the browser re-clamps what it draws
        return {i} if props.get("value") != old_value else set()

    def _clamped(self, i: int, value: Any) -> float:
        props = self.props[i]
        low, high, step = props.get("minimum"), props.get("maximum"), props.get("step") or 1
        if value is None:
            return low
        snapped = low + math.floor((float(value) - low) / step + 0.5) * step
        return round(min(max(snapped, low), high), 10)
