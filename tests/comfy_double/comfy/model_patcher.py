"""``comfy/model_patcher.py`` (3cd7b32f): the ``ModelPatcher`` a MODEL output is, and its clone.

- ``clone()`` (l.287-344): the same ``model`` (a ``BaseModel``: one UNet module for every clone), weight patches
  copied per key, ``model_options`` deep-copied (l.296), attachments shared (l.304-309), callbacks and wrappers copied
  per key (l.314-323), then the ``ON_CLONE`` callbacks.
- Patch setters (l.386-474): ``set_model_patch`` appends to ``model_options["transformer_options"]["patches"][name]``
  (l.409-413), the named helpers, ``set_model_patch_replace`` via ``set_model_options_patch_replace`` (l.55-74, which
  copies the dicts on its way), the sampler cfg / post-cfg functions (l.76-80, 386-398), the single-slot
  ``model_function_wrapper`` (l.403-404); ``add_wrapper_with_key`` / ``remove_wrappers_with_key`` (l.1032-1039),
  ``add_callback_with_key`` (l.1011), attachments (l.1050-1058).
- Weights: ``add_patches`` (l.557-579: per key, a new ``patches_uuid``) and ``patch_model`` / ``unpatch_model``
  (l.814-870): the patched weights are written into the shared model at load, the originals kept in ``backup`` (shared
  by clones) and written back at unload. Only the ``"diff"`` weight patch is modelled (``w += strength * diff``).
- ``pre_run`` / ``cleanup`` (l.1001-1006, 1129-1133) run their callbacks.
"""

from __future__ import annotations

import copy
import uuid

import torch

from . import patcher_extension
from .patcher_extension import CallbacksMP


def set_model_options_patch_replace(model_options, patch, name, block_name, number, transformer_index=None):
    to = model_options["transformer_options"].copy()
    replace = to["patches_replace"] = dict(to.get("patches_replace", {}))
    replace[name] = dict(replace.get(name, {}))
    key = (block_name, number) if transformer_index is None else (block_name, number, transformer_index)
    replace[name][key] = patch
    return {**model_options, "transformer_options": to}


def set_model_options_post_cfg_function(model_options, post_cfg_function, disable_cfg1_optimization=False):
    model_options["sampler_post_cfg_function"] = [
        *model_options.get("sampler_post_cfg_function", []),
        post_cfg_function,
    ]
    if disable_cfg1_optimization:
        model_options["disable_cfg1_optimization"] = True
    return model_options


def create_model_options_clone(orig_model_options: dict) -> dict:
    return patcher_extension.copy_nested_dicts(orig_model_options)


class ModelPatcher:
    def __init__(self, model, load_device=None, offload_device=None, size=0):
        self.model = model
        self.load_device, self.offload_device, self.size = load_device, offload_device, size
        self.patches: dict[str, list] = {}
        self.backup: dict[str, torch.Tensor] = {}
        self.model_options: dict = {"transformer_options": {}}
        self.patches_uuid = uuid.uuid4()
        self.parent = None
        self.attachments: dict = {}
        self.callbacks: dict = {}
        self.wrappers: dict = {}

    def clone(self) -> ModelPatcher:
        n = self.__class__(self.model, self.load_device, self.offload_device, self.size)
        n.patches = {k: v[:] for k, v in self.patches.items()}
        n.patches_uuid = self.patches_uuid
        n.model_options = copy.deepcopy(self.model_options)
        n.backup = self.backup
        n.parent = self
        n.attachments = dict(self.attachments)
        n.callbacks = {k: {k1: c1.copy() for k1, c1 in c.items()} for k, c in self.callbacks.items()}
        n.wrappers = {k: {k1: w1.copy() for k1, w1 in w.items()} for k, w in self.wrappers.items()}
        for callback in self.get_all_callbacks(CallbacksMP.ON_CLONE):
            callback(self, n)
        return n

    def is_clone(self, other) -> bool:
        return getattr(other, "model", None) is self.model

    # --- model options ---------------------------------------------------------------------------------------------
    def set_model_sampler_post_cfg_function(self, post_cfg_function, disable_cfg1_optimization=False):
        self.model_options = set_model_options_post_cfg_function(
            self.model_options, post_cfg_function, disable_cfg1_optimization
        )

    def set_model_unet_function_wrapper(self, unet_wrapper_function):
        self.model_options["model_function_wrapper"] = unet_wrapper_function

    def set_model_patch(self, patch, name):
        to = self.model_options["transformer_options"]
        if "patches" not in to:
            to["patches"] = {}
        to["patches"][name] = [*to["patches"].get(name, []), patch]

    def set_model_patch_replace(self, patch, name, block_name, number, transformer_index=None):
        self.model_options = set_model_options_patch_replace(
            self.model_options, patch, name, block_name, number, transformer_index
        )

    def set_model_attn1_patch(self, patch):
        self.set_model_patch(patch, "attn1_patch")

    def set_model_attn1_replace(self, patch, block_name, number, transformer_index=None):
        self.set_model_patch_replace(patch, "attn1", block_name, number, transformer_index)

    def set_model_attn1_output_patch(self, patch):
        self.set_model_patch(patch, "attn1_output_patch")

    def set_model_input_block_patch(self, patch):
        self.set_model_patch(patch, "input_block_patch")

    def set_model_input_block_patch_after_skip(self, patch):
        self.set_model_patch(patch, "input_block_patch_after_skip")

    def set_model_output_block_patch(self, patch):
        self.set_model_patch(patch, "output_block_patch")

    def get_model_object(self, name: str):
        obj = self.model
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    # --- wrappers, callbacks, attachments --------------------------------------------------------------------------
    def add_callback_with_key(self, call_type: str, key: str, callback):
        self.callbacks.setdefault(call_type, {}).setdefault(key, []).append(callback)

    def get_all_callbacks(self, call_type: str) -> list:
        return [c for by_key in self.callbacks.get(call_type, {}).values() for c in by_key]

    def add_wrapper_with_key(self, wrapper_type: str, key: str, wrapper):
        self.wrappers.setdefault(wrapper_type, {}).setdefault(key, []).append(wrapper)

    def remove_wrappers_with_key(self, wrapper_type: str, key: str):
        w = self.wrappers.get(wrapper_type, {})
        if key in w:
            w.pop(key)

    def get_all_wrappers(self, wrapper_type: str) -> list:
        return [w for by_key in self.wrappers.get(wrapper_type, {}).values() for w in by_key]

    def set_attachments(self, key: str, attachment):
        self.attachments[key] = attachment

    def get_attachment(self, key: str):
        return self.attachments.get(key, None)

    # --- weights -----------------------------------------------------------------------------------------------------
    def add_patches(self, patches: dict, strength_patch=1.0, strength_model=1.0) -> list:
        model_sd = self.model.state_dict()
        added = []
        for key, value in patches.items():
            if key in model_sd:
                added.append(key)
                self.patches.setdefault(key, []).append((strength_patch, value, strength_model, None, None))
        self.patches_uuid = uuid.uuid4()
        return added

    def patch_model(self):
        """Write the patched weights into the model (the originals into ``backup``)."""
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for key, entries in self.patches.items():
                weight = params[key]
                if key not in self.backup:
                    self.backup[key] = weight.detach().clone()
                for strength, (kind, (diff,)), strength_model, _, _ in entries:
                    assert kind == "diff"
                    weight.mul_(strength_model).add_(diff.to(weight.dtype), alpha=strength)
        return self.model

    def unpatch_model(self):
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for key, weight in self.backup.items():
                params[key].copy_(weight)
        self.backup.clear()

    def pre_run(self):
        for callback in self.get_all_callbacks(CallbacksMP.ON_PRE_RUN):
            callback(self)

    def cleanup(self):
        for callback in self.get_all_callbacks(CallbacksMP.ON_CLEANUP):
            callback(self)
