"""Other extensions that take over an attention layer ToMe would merge, read off the modules themselves (pure torch).

Some extensions change a UNet's attention layers in ways that need the full, raster-ordered token grid at that
layer's input, so merging or downsampling there would give a wrong image or an exception. The patch asks
:func:`taken_over` before each attention call and, where it answers, leaves that call's input as it is and says
so (:class:`~tome_core.report.MergeReport`). What is recognised (each from reading the extension's source):

* **Hypertile** (A1111 built-in, ``extensions-builtin/hypertile/hypertile.py`` at 82a973c0, l.318-351): wraps the
  ``forward`` of the self-attention modules it may tile and sets ``module.__webui_hypertile_params`` (a plain
  attribute: no name mangling outside a class); it tiles the call when that object's ``enabled`` is true, inferring
  the grid from the token count. ``enabled`` is set per pass (its ``process`` and ``before_hr``), so it is read per
  call.
* **ControlNet-LLLite** in Mikubill's sd-webui-controlnet (``scripts/controlnet_lllite.py`` at 56cec5b2,
  l.161-217): wraps ``to_q`` / ``to_k`` / ``to_v`` of the layers its model covers and adds an embedding of the
  control image laid out as the block's ``h x w`` grid; it keeps its modules in ``proj.lllite_list`` (emptied when it
  is cleared).
* **a layer that is no attention any more**: another extension put a module of its own where ``attn1`` / ``attn2``
  was (Layer Diffuse's SD1.5 attention sharing, ``AttentionSharingUnit``, indexes its control signals by token
  count): anything without ``to_q``, ``to_k`` and ``to_v``.

Forge's and ComfyUI's attention patches (``attn1_patch``, ``patches_replace``) are not modules and are handled by the
patch: one that hands a layer other tokens than its block's (ComfyUI's HyperTile tiles the queries into the batch, its
TomePatchModel merges them) leaves that call as it is, said with :data:`RESHAPED`.
"""

from __future__ import annotations

from torch import nn

HYPERTILE = "Hypertile tiles it"
LLLITE = "ControlNet-LLLite patches it"
REPLACED = "replaced by another extension"
RESHAPED = "another patch tiled or merged its tokens"
_HYPERTILE_ATTR = "__webui_hypertile_params"
_PROJECTIONS = ("to_q", "to_k", "to_v")


def hypertile_tiles(attn: nn.Module) -> bool:
    """Whether A1111's Hypertile tiles the next call of this attention layer."""
    params = attn.__dict__.get(_HYPERTILE_ATTR)
    return bool(getattr(params, "enabled", False))


def lllite_patches(attn: nn.Module) -> bool:
    """Whether Mikubill's ControlNet-LLLite adds its control embedding inside this attention layer's projections."""
    return any(getattr(getattr(attn, name, None), "lllite_list", None) for name in _PROJECTIONS)


def is_attention(attn: nn.Module) -> bool:
    """A layer laid out as ldm/sgm/Forge ``CrossAttention``: its query, key and value projections are modules."""
    return all(isinstance(getattr(attn, name, None), nn.Module) for name in _PROJECTIONS)


def taken_over(attn: nn.Module) -> str | None:
    """Why this attention layer's next call must get its input as it is (a phrase for the note), or None."""
    if not is_attention(attn):
        return REPLACED
    if hypertile_tiles(attn):
        return HYPERTILE
    if lllite_patches(attn):
        return LLLITE
    return None
