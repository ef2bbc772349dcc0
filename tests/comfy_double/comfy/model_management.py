"""``comfy/model_management.py`` (3cd7b32f), what sampling meets: ``load_models_gpu`` keeps one loaded patcher per
model (a clone with other weight patches replaces it: the old one's weights unpatched, the new one's patched; l.621+),
the interrupt flag and its exception (``interrupt_current_processing`` / ``throw_exception_if_processing_interrupted``),
and ``OOM_EXCEPTION`` (``torch.cuda.OutOfMemoryError``; the executor unloads all models on it)."""

from __future__ import annotations

import torch

OOM_EXCEPTION = torch.cuda.OutOfMemoryError


class InterruptProcessingException(Exception):
    pass


_interrupted = False
_loaded: dict[int, object] = {}  # id(BaseModel) -> the patcher whose weights are on it


def interrupt_current_processing(value: bool = True) -> None:
    global _interrupted
    _interrupted = value


def throw_exception_if_processing_interrupted() -> None:
    global _interrupted
    if _interrupted:
        _interrupted = False
        raise InterruptProcessingException()


def load_models_gpu(models) -> None:
    for patcher in models:
        current = _loaded.get(id(patcher.model))
        if current is not None and getattr(current, "patches_uuid", None) == patcher.patches_uuid:
            continue
        if current is not None:
            current.unpatch_model()
        patcher.patch_model()
        _loaded[id(patcher.model)] = patcher


def unload_all_models() -> None:
    while _loaded:
        _loaded.popitem()[1].unpatch_model()
