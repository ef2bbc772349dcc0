"""The modes the quality and speed benchmarks compare, by one name each: plain sampling, the WebUI's built-in
token merging (tomesd 0.1.3 with A1111's settings), ComfyUI's built-in (``TomePatchModel``: queries only, the highest
level only; :mod:`benchmarks.comfy_builtin`), and our settings records.

A mode is applied to a bare UNet for one sampling run (re-applied for the next: plan reuse starts afresh); our
modes start from the extension's defaults (``ToMeSettings()``) and change only what their name says.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomesd
from torch import nn

import tome_core
from benchmarks import comfy_builtin

_TESTS = str(Path(__file__).resolve().parents[1] / "tests")
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
from models import Holder  # noqa: E402

SEED = 1234  # the "image seed" our random partition is derived from


@dataclass(frozen=True)
class Mode:
    """``settings``: ToMeSettings fields changed from the defaults (with ``enabled``); ``tomesd``: the WebUI's built-in;
    ``comfy``: the ratio of ComfyUI's built-in."""

    name: str
    label: str
    settings: dict[str, Any] | None = None
    tomesd: bool = False
    comfy: float | None = None
    tags: tuple[str, ...] = field(default=())

    def apply(self, unet: nn.Module) -> tome_core.Patch | None:
        """Leave ``unet`` as this mode wants it (anything applied before removed); our patch, if any."""
        tome_core.remove_patch(unet)
        tomesd.remove_patch(Holder(unet))
        comfy_builtin.remove(unet)
        if self.comfy is not None:  # ComfyUI's TomePatchModel: queries merged in attn1 at the highest level only
            comfy_builtin.apply(unet, self.comfy, SEED)
        elif self.tomesd:  # A1111's built-in: tomesd at its defaults, no randomness, self-attention only
            tomesd.apply_patch(
                Holder(unet), ratio=0.5, use_rand=False, merge_attn=True, merge_crossattn=False, merge_mlp=False
            )
        elif self.settings is not None:
            return tome_core.apply_settings(unet, tome_core.ToMeSettings(enabled=True, seed=SEED, **self.settings))
        return None


PLAIN = Mode("plain", "plain")
TOMESD = Mode("tomesd", "built-in (tomesd 0.5, max downsample 1)", tomesd=True)
COMFY = Mode("comfy-tome", "ComfyUI built-in (TomePatchModel 0.3)", comfy=0.3)
"""ComfyUI's built-in at its own default ratio, 0.3 (what a user who adds the node gets; beside ours at 0.3)."""
TOME = (
    Mode("exact-0.3", "ours: exact, ratio 0.3", {"ratio": 0.3}),
    Mode("exact-0.5", "ours: exact, ratio 0.5 (default)", {}),
    Mode("exact-0.7", "ours: exact, ratio 0.7", {"ratio": 0.7}),
    Mode("share+interval", "ours: share_plan + plan_interval 2", {"share_plan": True, "plan_interval": 2}),
    Mode("todo-2", "ours: ToDo, factor 2", {"method": "downsample", "downsample_factor": 2}),
    Mode("todo-3", "ours: ToDo, factor 3", {"method": "downsample", "downsample_factor": 3}),
    Mode("exact-0.5-md2", "ours: exact 0.5, max downsample 2", {"max_downsample": 2}, tags=("sd15",)),
    Mode("exact-0.5-md4", "ours: exact 0.5, max downsample 4", {"max_downsample": 4}),
)
"""Token merging alone (issue 16's list); ``tags``: the layouts where the mode differs from another one (SDXL's
auto level is 2 already)."""


def cached(mode: Mode, interval: int, start: float = 0.0) -> Mode:
    """``mode`` with the step cache (branch 0) at ``interval`` (from ``start``); on plain: the cache alone."""
    base = mode.settings if mode.settings is not None else {"ratio": 0.0}
    name = f"cache-{interval}" + (f"-from-{start:g}" if start else "") + ("" if mode is PLAIN else f"+{mode.name}")
    what = f"cache N={interval}" + (f" from {start:.0%}" if start else "")
    label = f"ours: {what}" + ("" if mode is PLAIN else f" + {mode.label.removeprefix('ours: ')}")
    settings = {**base, "cache": True, "cache_interval": interval, "cache_start": start}
    return Mode(name, label, settings, tags=mode.tags)


CACHE = (
    *(cached(PLAIN, n) for n in (2, 3, 5)),
    *(cached(m, 3) for m in TOME if m.name in ("exact-0.3", "exact-0.5", "todo-2")),
    cached(TOME[1], 5),
    cached(PLAIN, 3, 0.2),
    cached(TOME[1], 3, 0.2),
)
"""The step cache alone (= DeepCache, branch 0) and with token merging (issue 14)."""
MODES: dict[str, Mode] = {m.name: m for m in (PLAIN, TOMESD, COMFY, *TOME, *CACHE)}


def for_layout(layout: str, names: tuple[str, ...] | None = None) -> list[Mode]:
    """The modes that mean something on ``layout`` (all of ``names``, default every mode)."""
    chosen = [MODES[n] for n in names] if names else list(MODES.values())
    return [m for m in chosen if not m.tags or layout in m.tags]
