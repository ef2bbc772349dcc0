"""Full generations for the host tests (WebUI double and Forge double alike): ToMe's script arguments, a spy on the
modules that run, the generation inside ``closing(p)``, and comparisons that fail on missing outputs instead of
passing on none."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import closing

import harness
import modules
import numpy as np
import torch

import tome_core
from tome_core import settings as S


class Spy:
    """Per forward of ``module``: our patch's settings (None when unpatched), the output, the progress, whether the
    call was inside the step schedule, the merge plans computed so far, whether the step cache served it, and the
    ``transformer_options`` patches it was given (Forge; empty on the WebUI)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.calls: list[S.ToMeSettings | None] = []
        self.outputs: list = []
        self.progress: list[float | None] = []
        self.active: list[bool | None] = []
        self.plans: list[int | None] = []
        self.cached: list[bool] = []  # whether the step cache served the call
        self.patches: list[dict] = []
        self._handles = [
            module.register_forward_pre_hook(self._pre, with_kwargs=True),
            module.register_forward_hook(self._post),
        ]

    def _pre(self, module, args, kwargs):
        patch = tome_core.get_patch(module)
        self.calls.append(patch.settings if patch else None)
        self.progress.append(patch.progress if patch else None)
        self.patches.append(dict(kwargs.get("transformer_options", {}).get("patches", {})))

    def _post(self, module, args, out):
        self.outputs.append([o.clone() for o in out] if isinstance(out, list) else out.clone())
        patch = tome_core.get_patch(module)
        self.active.append(patch.merger.active if patch and patch.merger else None)
        self.plans.append(patch.merger.planner.plans_computed if patch and patch.merger else (0 if patch else None))
        self.cached.append(bool(patch and patch.cache and patch.cache.cached_now))

    def close(self):
        for handle in self._handles:
            handle.remove()


def tome_script(runner):
    """The ToMe script among ``runner``'s always-on scripts."""
    return next(s for s in runner.alwayson_scripts if s.title() == "ToMe")


def tome_args(runner, **values):
    """The runner's UI defaults with ToMe's slot set to the API's dict form (enabled unless said otherwise)."""
    args = harness.default_script_args(runner)
    args[tome_script(runner).args_from] = {"enabled": True, **values}
    return args


def generate(make: Callable, runner, script_args, spied: Iterable[torch.nn.Module] = (), **kwargs):
    """``make(runner, script_args=…, **kwargs)`` run through the running host's ``process_images`` (the harnesses
    point ``modules.processing`` at the WebUI's or Forge's) inside ``closing(p)``; returns the result and a
    :class:`Spy` per module of ``spied``."""
    p = make(runner, script_args=script_args, **kwargs)
    spies = [Spy(m) for m in spied]
    try:
        with closing(p):
            res = modules.processing.process_images(p)
    finally:
        for spy in spies:
            spy.close()
    return res, spies


def img2img(runner, script_args, steps: int = 4):
    """An img2img processing object for ``generate``: a flat 64 px image, denoising 0.5, seed 3, ``runner``'s
    scripts with ``script_args``."""
    from PIL import Image

    p = modules.processing.StableDiffusionProcessingImg2Img(
        init_images=[Image.new("RGB", (64, 64), (120, 80, 40))],
        prompt="a cat",
        steps=steps,
        width=64,
        height=64,
        denoising_strength=0.5,
        seed=3,
        do_not_save_samples=True,
        do_not_save_grid=True,
    )
    p.scripts = runner
    p.script_args = script_args
    return p


def pixels(res) -> list[np.ndarray]:
    return [np.asarray(img) for img in res.images]


def _equal(a, b) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_equal, a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return torch.equal(a, b)


def identical(xs: Iterable, ys: Iterable) -> bool:
    """As many outputs (at least one) on both sides, each bit-identical (tensors, arrays or lists of tensors)."""
    xs, ys = list(xs), list(ys)
    return len(xs) == len(ys) > 0 and all(map(_equal, xs, ys))
