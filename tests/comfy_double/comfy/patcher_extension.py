"""``comfy/patcher_extension.py`` (3cd7b32f): keyed wrappers and callbacks, and the executor that chains wrappers.

Wrappers live in a dict ``{wrapper_type: {key: [fn, ...]}}`` on the model patcher (l.49-56, 65-90); the sampler copies
them into ``model_options["transformer_options"]["wrappers"]`` (``prepare_model_patcher``). A wrapper is called as
``fn(executor, *args, **kwargs)`` and continues the chain with ``executor(*args, **kwargs)``; the last one reaches the
wrapped function (``WrapperExecutor``, l.91-134). ``copy_nested_dicts`` copies dicts and lists all the way down,
other values are shared (l.136-143).
"""

from __future__ import annotations

from collections.abc import Callable


class CallbacksMP:
    ON_CLONE = "on_clone"
    ON_PRE_RUN = "on_pre_run"
    ON_CLEANUP = "on_cleanup"


class WrappersMP:
    OUTER_SAMPLE = "outer_sample"
    PREPARE_SAMPLING = "prepare_sampling"
    SAMPLER_SAMPLE = "sampler_sample"
    PREDICT_NOISE = "predict_noise"
    CALC_COND_BATCH = "calc_cond_batch"
    APPLY_MODEL = "apply_model"
    DIFFUSION_MODEL = "diffusion_model"


def _options(transformer_options: dict, is_model_options: bool) -> dict:
    return transformer_options.get("transformer_options", {}) if is_model_options else transformer_options


def get_all_wrappers(wrapper_type: str, transformer_options: dict, is_model_options=False) -> list[Callable]:
    """Every wrapper of a type, key by key in insertion order (l.83-90)."""
    wrappers = _options(transformer_options, is_model_options).get("wrappers", {})
    return [w for by_key in wrappers.get(wrapper_type, {}).values() for w in by_key]


def get_all_callbacks(call_type: str, transformer_options: dict, is_model_options=False) -> list[Callable]:
    callbacks = _options(transformer_options, is_model_options).get("callbacks", {})
    return [c for by_key in callbacks.get(call_type, {}).values() for c in by_key]


class WrapperExecutor:
    """l.91-134: ``execute`` starts the chain; a wrapper gets the executor for the next link."""

    def __init__(self, original: Callable, class_obj: object, wrappers: list[Callable], idx: int):
        self.original, self.class_obj, self.wrappers, self.idx = original, class_obj, wrappers.copy(), idx
        self.is_last = idx == len(wrappers)

    def __call__(self, *args, **kwargs):
        return WrapperExecutor(self.original, self.class_obj, self.wrappers, self.idx + 1).execute(*args, **kwargs)

    def execute(self, *args, **kwargs):
        if self.is_last:
            return self.original(*args, **kwargs)
        return self.wrappers[self.idx](self, *args, **kwargs)

    @classmethod
    def new_executor(cls, original: Callable, wrappers: list[Callable], idx=0) -> WrapperExecutor:
        return cls(original, None, wrappers, idx)

    @classmethod
    def new_class_executor(cls, original: Callable, class_obj: object, wrappers: list[Callable], idx=0):
        return cls(original, class_obj, wrappers, idx)


def copy_nested_dicts(input_dict: dict) -> dict:
    new_dict = input_dict.copy()
    for key, value in input_dict.items():
        if isinstance(value, dict):
            new_dict[key] = copy_nested_dicts(value)
        elif isinstance(value, list):
            new_dict[key] = value.copy()
    return new_dict


def merge_nested_dicts(dict1: dict, dict2: dict, copy_dict1=True) -> dict:
    """l.145-158: lists are concatenated, dicts merged, other values of ``dict2`` win."""
    merged = copy_nested_dicts(dict1) if copy_dict1 else dict1
    for key, value in dict2.items():
        if isinstance(value, dict):
            merged[key] = merge_nested_dicts(merged.setdefault(key, {}), value)
        elif isinstance(value, list):
            merged.setdefault(key, []).extend(value)
        else:
            merged[key] = value
    return merged
