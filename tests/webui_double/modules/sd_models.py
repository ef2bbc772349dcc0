"""Double of modules/sd_models.py (WebUI 1.10.1): apply_token_merging and no-op model management.

``apply_token_merging`` (~L1011-1034) is reproduced exactly: it compares the requested ratio with
``sd_model.applied_token_merged_ratio`` (default 0), returns if equal, calls ``tomesd.remove_patch`` if a
ratio > 0 was applied, calls ``tomesd.apply_patch(sd_model, ratio=..., use_rand=False, merge_attn=True,
merge_crossattn=False, merge_mlp=False)`` if the new ratio > 0 (max_downsample stays at tomesd's default 1,
so SDXL layouts, whose transformers sit at downsample 2 and 4 only, are not merged at all), then records the
ratio. Importing this module installs the UNet ``th.cat`` hijack (see tiny_models.install_unet_cat_hijack).
"""

import tomesd
from tiny_models import install_unet_cat_hijack

from modules import script_callbacks, shared

install_unet_cat_hijack()

checkpoint_aliases = {}
checkpoints_list = {}
loaded_models = {}
"""test-only: every model load_model made current, by checkpoint title (the real cache is model_data.loaded_sd_models)"""
apply_token_merging_calls = []
"""test-only: every (ratio requested) passed to apply_token_merging, in order"""


def apply_token_merging(sd_model, token_merging_ratio):
    apply_token_merging_calls.append(token_merging_ratio)
    current = getattr(sd_model, "applied_token_merged_ratio", 0)
    if current == token_merging_ratio:
        return
    if current > 0:
        tomesd.remove_patch(sd_model)
    if token_merging_ratio > 0:
        tomesd.apply_patch(
            sd_model, ratio=token_merging_ratio, use_rand=False, merge_attn=True, merge_crossattn=False, merge_mlp=False
        )
    sd_model.applied_token_merged_ratio = token_merging_ratio


def reload_model_weights(sd_model=None, info=None, forced_reload=False):
    """The checkpoint ``info`` (default: ``opts.sd_model_checkpoint``'s) becomes the current model, if it is not
    already (~L940-960). The double switches between models already loaded, as the real one does through
    ``reuse_model_from_already_loaded`` with a checkpoint cache (or for a refiner of another config: a new model
    object); the previous model keeps whatever is attached to it."""
    checkpoint_info = info or checkpoints_list.get(shared.opts.sd_model_checkpoint)
    current = shared.sd_model
    if checkpoint_info is None or (current is not None and current.sd_checkpoint_info.title == checkpoint_info.title):
        return current
    model_data.set_sd_model(loaded_models[checkpoint_info.title])
    return shared.sd_model


def get_closet_checkpoint_match(search_string):
    """By title or by name (~L217-239, without the sorted partial matches)."""
    found = checkpoints_list.get(search_string)
    return found or next((i for i in checkpoints_list.values() if search_string in (i.name, i.model_name)), None)


def apply_alpha_schedule_override(sd_model, p=None):
    pass


class SkipWritingToConfig:
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, tb):
        return False


class _ModelData:
    def __init__(self):
        self.sd_model = None
        self.loaded_sd_models = []

    def get_sd_model(self):
        return shared.sd_model

    def set_sd_model(self, v, already_loaded=False):
        shared.sd_model = v
        self.sd_model = v


model_data = _ModelData()


def load_model(sd_model):
    """Make ``sd_model`` the current model and fire on_model_loaded callbacks, like the end of the real
    load_model (~L800-830: ``script_callbacks.model_loaded_callback(sd_model)``)."""
    model_data.set_sd_model(sd_model)
    checkpoints_list[sd_model.sd_checkpoint_info.title] = sd_model.sd_checkpoint_info
    loaded_models[sd_model.sd_checkpoint_info.title] = sd_model
    shared.opts.sd_model_checkpoint = sd_model.sd_checkpoint_info.title
    script_callbacks.model_loaded_callback(sd_model)
    return sd_model
