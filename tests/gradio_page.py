"""A browser tab's view of a gradio Blocks, for tests, under gradio 3.41 and 4.40 alike.

:class:`Page` holds what the browser holds for each component (its props, from the Blocks' config) and runs the
registered event listeners the way the gradio frontend does: a listener's inputs are read from the page when the
event is dispatched, its function runs through gradio's own request processing (``Blocks.process_api``:
preprocess, call, postprocess), and the answer's updates are applied to the page; every component whose value
that changed fires its ``change`` listeners in turn, and a finished listener starts its ``.then`` listeners, until
nothing is left to run.

Requests take time: a listener triggered again while its request is in flight is dropped by gradio 3 (the frontend
skips a function whose status is pending); gradio 4 runs it once more afterwards with the inputs of its last trigger
(``trigger_mode="always_last"``, the default of ``change``; ``"once"`` drops it like gradio 3). Requests in flight
together may come back in either order (``order="forward"`` or ``"reverse"``). ``user_types`` sets several values
faster than the server answers.

For sliders it also models what the browser *draws*: an ``<input type=range>`` snaps the value it is given to
its step and clamps it to its min/max at the moment the value is set, and re-clamps the drawn value (not the
component's value) when min/max change later. Svelte sets the value only when it differs from the one it holds,
and a value and new bounds that arrive together are taken in the worse order (value first). ``drawn(c)`` is where
the thumb is.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

import gradio as gr
from modules.gradio_extensions import GRADIO_4

UPDATE_TYPES = ("update", "generic_update")


@dataclass
class Listener:
    key: Any  # what process_api takes: the fn index (gradio 3) or the dependency id (gradio 4)
    targets: set[tuple[int, str]]
    inputs: list[int]
    outputs: list[int]
    dep: dict[str, Any]
    then: list[Listener] = field(default_factory=list)


class Page:
    def __init__(self, demo: gr.Blocks):
        self.demo = demo
        config = demo.get_config_file()
        self.props: dict[int, dict[str, Any]] = {c["id"]: dict(c.get("props") or {}) for c in config["components"]}
        self.kind: dict[int, str] = {c["id"]: c["type"] for c in config["components"]}
        self.listeners: list[Listener] = []
        by_index: dict[Any, Listener] = {}
        for index, dep in enumerate(config["dependencies"]):
            if GRADIO_4:
                key, targets = dep["id"], {(t[0], t[1]) for t in dep["targets"] if t[0] is not None}
            else:
                key, targets = index, {(t, dep["trigger"]) for t in dep["targets"] if dep["trigger"] != "then"}
            listener = Listener(key, targets, list(dep["inputs"]), list(dep["outputs"]), dep)
            by_index[key] = listener
            if dep.get("trigger_after") is not None:
                by_index[dep["trigger_after"]].then.append(listener)
            if dep.get("backend_fn"):  # javascript-only listeners (InputAccordion's sync) change no component here
                self.listeners.append(listener)
        self._drawn = {i: self._clamped(i, p.get("value")) for i, p in self.props.items() if self.kind[i] == "slider"}
        self._in_flight: list[tuple[Listener, list[Any]]] = []
        self._last_trigger: dict[int, list[Any]] = {}  # gradio 4 always_last: inputs of the trigger to run next
        self.calls = 0
        self.dropped = 0

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
        """A person sets a control (drags a slider, types a number, picks a choice); its listeners run."""
        self.user_types(component, [value], order)

    def user_types(self, component: Any, values: list[Any], order: str = "forward") -> None:
        """A person sets a control to each of ``values`` in turn, faster than the server answers; then every
        request runs to its end. A slider takes no value beyond its bounds or off its steps from a person."""
        for value in values:
            if component._id in self._drawn:
                value = self._clamped(component._id, value)
            changed = self._apply(component._id, {"__type__": "update", "value": value})
            self._trigger(changed, "change")
            self._trigger({component._id}, "input")
        self._settle(order)

    def click(self, component: Any, order: str = "forward") -> None:
        self._trigger({component._id}, "click")
        self._settle(order)

    def paste(self, runner: Any, infotext: str, order: str = "forward") -> None:
        """The tab's paste button with ``infotext`` in its prompt box (the harness's ``runner.prompt/paste``)."""
        self._apply(runner.prompt._id, {"__type__": "update", "value": infotext})
        self.click(runner.paste, order)

    # --- the event loop -----------------------------------------------------------------------------
    def _trigger(self, ids: set[int], event: str) -> None:
        for listener in self.listeners:
            if any((i, event) in listener.targets for i in ids):
                self._dispatch(listener)

    def _dispatch(self, listener: Listener) -> None:
        inputs = [self.props[i].get("value") for i in listener.inputs]
        if any(busy is listener for busy, _ in self._in_flight):
            if GRADIO_4 and listener.dep.get("trigger_mode") == "always_last":
                self._last_trigger[id(listener)] = inputs
            else:
                self.dropped += 1
            return
        self._in_flight.append((listener, inputs))

    def _settle(self, order: str, limit: int = 200) -> None:
        for _ in range(limit):
            if not self._in_flight:
                return
            listener, inputs = self._in_flight[-1 if order == "reverse" else 0]
            data = asyncio.run(self._process(listener.key, inputs))
            self.calls += 1
            changed: set[int] = set()
            for output, item in zip(listener.outputs, data):
                changed |= self._apply(output, item)
            self._trigger(changed, "change")  # while this request still counts as in flight
            self._in_flight = [(other, i) for other, i in self._in_flight if other is not listener]
            for follower in listener.then:
                self._dispatch(follower)
            if id(listener) in self._last_trigger:
                self._in_flight.append((listener, self._last_trigger.pop(id(listener))))
        raise AssertionError(f"listeners still running after {limit} requests")

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
