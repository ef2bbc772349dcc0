"""What the Neo double's tests share (their fixtures, ``neo_builders`` and ``start_neo``, are in conftest.py): ToMe's
arguments, generations through Neo's ``process_images``, a built-in's arguments and module."""

from __future__ import annotations

import generation
import torch
from modules import scripts
from neo_double import harness as neo

F, C = False, True  # a full call, a cached one


def unet_of(build) -> torch.nn.Module:
    return build().forge_objects.unet.model.diffusion_model


def tome_args(runner, **values):
    return generation.tome_args(runner, **{"seed": 3, **values})


def generate(runner, script_args, modules=(), img2img=False, **kwargs):
    return generation.generate(
        neo.make_img2img if img2img else neo.make_txt2img, runner, script_args, modules, **kwargs
    )


def module_of(runner, title):
    """The loaded module of the script called ``title`` (a built-in's test-only records)."""
    script = next(s for s in runner.alwayson_scripts if s.title() == title)
    return next(d.module for d in scripts.scripts_data if d.script_class is type(script))


def with_script(runner, args, title, *values):
    """``args`` with ``values`` in the slots of the script called ``title`` (a built-in's hidden controls)."""
    script = next(s for s in runner.alwayson_scripts if s.title() == title)
    args[script.args_from : script.args_from + len(values)] = list(values)
    return args
