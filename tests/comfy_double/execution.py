"""ComfyUI's ``execution.py`` (3cd7b32f): a prompt (API-format workflow) validated, then run node by node.

- ``validate_inputs`` (l.750-985): every required input present; a linked input's type matches the output it links
  to; a widget value converted to its type (INT, FLOAT, BOOLEAN, STRING) and refused below ``min`` or above ``max``
  (``value_smaller_than_min`` / ``value_bigger_than_max``, l.898-922) or outside a combo's list. A rejected prompt
  runs nothing (HTTP 400 with ``node_errors``).
- ``execute`` (l.400-620): each output node's inputs first, every node once per prompt (its outputs cached for the
  prompt); the node class instantiated and its ``FUNCTION`` called with its declared inputs as keywords (optional
  ones only when given; an undeclared input is part of ComfyUI's cache key, never passed on: ``get_input_data``,
  l.150-200). An exception fails the prompt: ``!!! Exception during processing !!! <message>`` and the traceback
  are logged, the error carries the node id, ``exception_type`` (module and class) and ``exception_message``
  (l.589-617); an OOM also unloads every model; an interrupt fails it as "Processing interrupted" (l.580-587).
"""

from __future__ import annotations

import logging
import traceback
from typing import Any

import nodes
from comfy import model_management


class PromptRejected(Exception):
    def __init__(self, node_errors: dict):
        super().__init__(f"prompt rejected: {node_errors}")
        self.node_errors = node_errors


class ExecutionFailed(Exception):
    def __init__(self, node_id: str, exception_type: str, exception_message: str, interrupted: bool = False):
        super().__init__(f"node {node_id}: {exception_type}: {exception_message}")
        self.node_id, self.exception_type, self.exception_message = node_id, exception_type, exception_message
        self.interrupted = interrupted


_CONVERT = {"INT": int, "FLOAT": float, "BOOLEAN": bool, "STRING": str}


def _errors(prompt: dict, node_id: str) -> list[dict]:
    node = prompt[node_id]
    cls = nodes.NODE_CLASS_MAPPINGS[node["class_type"]]
    spec = cls.INPUT_TYPES()
    declared = {
        **{k: ("required", v) for k, v in spec.get("required", {}).items()},
        **{k: ("optional", v) for k, v in spec.get("optional", {}).items()},
    }
    errors = []
    for name, (category, info) in declared.items():
        input_type, extra = info[0], (info[1] if len(info) > 1 else {})
        if name not in node["inputs"]:
            if category == "required":
                errors.append({"type": "required_input_missing", "details": name})
            continue
        value = node["inputs"][name]
        if isinstance(value, list):
            received = nodes.NODE_CLASS_MAPPINGS[prompt[value[0]]["class_type"]].RETURN_TYPES[value[1]]
            if received != input_type:
                errors.append({"type": "return_type_mismatch", "details": f"{name}, {received} != {input_type}"})
            continue
        if isinstance(input_type, str) and input_type in _CONVERT:
            value = node["inputs"][name] = _CONVERT[input_type](value)
        if "min" in extra and value < extra["min"]:
            errors.append(
                {
                    "type": "value_smaller_than_min",
                    "message": f"Value {value} smaller than min of {extra['min']}",
                    "details": name,
                }
            )
        elif "max" in extra and value > extra["max"]:
            errors.append(
                {
                    "type": "value_bigger_than_max",
                    "message": f"Value {value} bigger than max of {extra['max']}",
                    "details": name,
                }
            )
        elif isinstance(input_type, list) and value not in input_type:
            errors.append({"type": "value_not_in_list", "details": f"{name}: '{value}' not in {input_type}"})
    return errors


def validate_prompt(prompt: dict) -> None:
    node_errors = {node_id: errors for node_id in prompt if (errors := _errors(prompt, node_id))}
    if node_errors:
        raise PromptRejected(node_errors)


def execute(prompt: dict) -> dict[str, tuple]:
    """Validate and run every node of ``prompt``; the outputs by node id. Raises :class:`PromptRejected` or
    :class:`ExecutionFailed`."""
    validate_prompt(prompt)
    outputs: dict[str, tuple] = {}

    def run(node_id: str) -> tuple:
        if node_id in outputs:
            return outputs[node_id]
        node = prompt[node_id]
        cls = nodes.NODE_CLASS_MAPPINGS[node["class_type"]]
        spec = cls.INPUT_TYPES()
        declared = {*spec.get("required", {}), *spec.get("optional", {})}
        kwargs: dict[str, Any] = {}
        for name, value in node["inputs"].items():  # undeclared inputs are kept for the cache key, never passed on
            if name in declared:
                kwargs[name] = run(value[0])[value[1]] if isinstance(value, list) else value
        for name, kind in spec.get("hidden", {}).items():  # get_input_data (l.196-206): the node's own id
            if kind == "UNIQUE_ID":
                kwargs[name] = node_id
        try:
            outputs[node_id] = getattr(cls(), cls.FUNCTION)(**kwargs)
        except model_management.InterruptProcessingException:
            logging.info("Processing interrupted")
            raise ExecutionFailed(node_id, "InterruptProcessingException", "", interrupted=True) from None
        except Exception as ex:
            logging.error(f"!!! Exception during processing !!! {ex}")
            logging.error(traceback.format_exc())
            if isinstance(ex, model_management.OOM_EXCEPTION):
                model_management.unload_all_models()
            raise ExecutionFailed(node_id, f"{type(ex).__module__}.{type(ex).__qualname__}", str(ex)) from ex
        return outputs[node_id]

    for node_id in prompt:
        run(node_id)
    return outputs
