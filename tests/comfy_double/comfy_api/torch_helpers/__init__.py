"""``comfy_api/torch_helpers/torch_compile.py`` (3cd7b32f), what ``TorchCompileModel`` and KJNodes' compile nodes call.

- ``set_torch_compile_wrapper(model, backend, options=None, mode=None, fullgraph=False, dynamic=None,
  keys=["diffusion_model"])``: the ``APPLY_MODEL`` wrapper under the key ``"torch.compile"`` is removed, then each key
  (a dotted path from the ``BaseModel``: ``diffusion_model``, or ``diffusion_model.double_blocks.0`` for KJNodes'
  "compile transformer blocks only") is compiled at once with ``torch.compile(model=model.get_model_object(key),
  backend=, options=, mode=, fullgraph=, dynamic=)`` (compilation itself happens at the first call), and an
  ``APPLY_MODEL`` wrapper is added that, for the length of each ``apply_model`` call, sets each key of the
  ``BaseModel`` to its compiled module (``comfy.utils.set_attr``: a module in a ``ModuleList`` is replaced in it) and
  puts the originals back in a ``finally``; the kwargs are kept at ``model_options["torch_compile_kwargs"]``.
- ``torch.compile`` pops ``guard_filter_fn`` out of the ``options`` dict it is given: KJNodes passes one dict for every
  block, so only the first block compiled gets its guard filter (torch/__init__.py ``compile``).
"""

from __future__ import annotations

import torch
from comfy.patcher_extension import WrappersMP

COMPILE_KEY = "torch.compile"


def _set_attr(obj, path: str, value):
    *parents, name = path.split(".")
    for part in parents:
        obj = getattr(obj, part)
    old = getattr(obj, name)
    setattr(obj, name, value)
    return old


def set_torch_compile_wrapper(
    model, backend, options=None, mode=None, fullgraph=False, dynamic=None, keys=("diffusion_model",)
):
    model.remove_wrappers_with_key(WrappersMP.APPLY_MODEL, COMPILE_KEY)
    kwargs = {"backend": backend, "options": options, "mode": mode, "fullgraph": fullgraph, "dynamic": dynamic}
    compiled = {key: torch.compile(model=model.get_model_object(key), **kwargs) for key in keys or ["diffusion_model"]}

    def apply_torch_compile_wrapper(executor, *args, **kw):
        originals = {}
        try:
            for key, module in compiled.items():
                originals[key] = _set_attr(executor.class_obj, key, module)
            return executor(*args, **kw)
        finally:
            for key, module in originals.items():
                _set_attr(executor.class_obj, key, module)

    model.add_wrapper_with_key(WrappersMP.APPLY_MODEL, COMPILE_KEY, apply_torch_compile_wrapper)
    model.model_options["torch_compile_kwargs"] = kwargs
