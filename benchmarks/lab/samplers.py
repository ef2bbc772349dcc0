"""Guided sampling of the lab's trained DiTs under the samplers people run beside Euler (issue 53): ComfyUI's own
sampler functions, imported from its sampling code where a checkout is named (``TOME_COMFYUI``), else the core's own
implementations of them (:data:`tome_core.caching.samplers.BUILT_IN`, held to ComfyUI's by
``tests/test_samplers_linear.py``), with our cache told the sampler as a host tells it (``Session.set_sampler`` with
the function that runs).

ComfyUI's ``uni_pc`` and ``uni_pc_bh2`` drop the next-to-last sigma (``DISCARD_PENULTIMATE_SIGMA_SAMPLERS``): a pass of
``steps`` runs ``steps − 1`` steps, as there.

diffusers' multistep schedulers run as samplers too (:func:`diffusers_functions`: ``UniPCMultistepScheduler``,
``DPMSolverMultistepScheduler``, each at its defaults with flow prediction, on the lab's sigmas), and the cache is told
them as the diffusers host tells it: by the scheduler's name, with its loop as the function."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch

import tome_core
from benchmarks.lab.dit import CFG, Trained
from tome_core.caching import samplers as core
from tome_core.settings import ToMeSettings

COMFY = ("euler", "dpmpp_2m", "deis", "res_multistep", "uni_pc", "uni_pc_bh2")
DIFFUSERS = ("UniPCMultistepScheduler", "DPMSolverMultistepScheduler")
NAMES = COMFY + DIFFUSERS
DISCARD_PENULTIMATE = ("uni_pc", "uni_pc_bh2")


def comfy_functions(root: str | None = None) -> dict[str, Callable] | None:
    """ComfyUI's sampler functions by name from the checkout at ``root`` (default ``TOME_COMFYUI``; its sampling
    modules alone, the two modules they import for other samplers stubbed), or None without one. Another ``comfy``
    already imported (the tests' ComfyUI double) is set aside while they load and put back after."""
    root = root or os.environ.get("TOME_COMFYUI")
    if not root or not (Path(root) / "comfy" / "k_diffusion" / "sampling.py").is_file():
        return None

    def ours(name: str) -> bool:
        return name == "comfy" or name.startswith("comfy.")

    held = {n: m for n, m in sys.modules.items() if ours(n)}
    for n in held:
        del sys.modules[n]
    try:
        package = sys.modules["comfy"] = types.ModuleType("comfy")  # a namespace package there: ComfyUI's alone
        package.__path__ = [str(Path(root) / "comfy")]
        for name in ("comfy.model_patcher", "comfy.model_sampling"):
            sys.modules[name] = types.ModuleType(name)
        import comfy.k_diffusion.sampling as k
        from comfy.extra_samplers import uni_pc
    finally:
        for n in [n for n in sys.modules if ours(n)]:
            del sys.modules[n]
        sys.modules.update(held)

    found = {
        "euler": k.sample_euler,
        "dpmpp_2m": k.sample_dpmpp_2m,
        "deis": k.sample_deis,
        "res_multistep": k.sample_res_multistep,
        "uni_pc": uni_pc.sample_unipc,
        "uni_pc_bh2": uni_pc.sample_unipc_bh2,
    }
    return {n: (lambda m, x, s, f=f: f(m, x, s, extra_args={}, disable=True)) for n, f in found.items()}


def diffusers_functions() -> dict[str, Callable]:
    """diffusers' multistep schedulers by class name, each as a sampler function (k-diffusion's signature): a fresh
    scheduler at its defaults with flow prediction (UniPC: order 2, bh2; DPM-Solver++: order 2, midpoint), its
    sigmas and timesteps (``1000 σ``) set to the ones given, stepped on the model's velocity ``(x − D)/σ``."""
    import diffusers

    def loop(kind: str) -> Callable:
        def sample(model: Callable, x: torch.Tensor, sigmas: torch.Tensor, **_) -> torch.Tensor:
            scheduler = getattr(diffusers, kind)(prediction_type="flow_prediction", use_flow_sigmas=True)
            scheduler.set_timesteps(len(sigmas) - 1)
            scheduler.sigmas = sigmas.detach().to("cpu", torch.float32)
            scheduler.timesteps = scheduler.sigmas[:-1] * 1000
            for i, t in enumerate(scheduler.timesteps):
                s = sigmas[i]
                velocity = (x - model(x, s * x.new_ones(len(x)))) / s
                x = scheduler.step(velocity, t, x, return_dict=False)[0]
            return x

        return sample

    return {kind: loop(kind) for kind in DIFFUSERS}


def sample_functions() -> dict[str, Callable]:
    """The samplers to run by name (:func:`functions` without where they come from)."""
    return functions()[0]


def functions() -> tuple[dict[str, Callable], str]:
    """The samplers to run and where they come from: ComfyUI's (or the core's own) and diffusers' schedulers."""
    comfy, source = comfy_functions(), "ComfyUI's own sampler functions (TOME_COMFYUI)"
    if comfy is None:
        comfy, source = dict(core.BUILT_IN), "the core's own samplers (no ComfyUI checkout named: TOME_COMFYUI)"
    return {**comfy, **diffusers_functions()}, source


def calls(name: str, steps: int) -> int:
    """The model calls of a pass of ``steps`` under the sampler ``name``."""
    return steps - 1 if name in DISCARD_PENULTIMATE else steps


def sigmas_for(model: Trained, name: str, steps: int, noise: torch.Tensor) -> list[float]:
    sigmas = model.schedule(steps, noise)
    return [*sigmas[:-2], sigmas[-1]] if name in DISCARD_PENULTIMATE else sigmas


def sample(
    model: Trained,
    noise: torch.Tensor,
    labels: torch.Tensor,
    steps: int,
    name: str,
    function: Callable,
    settings: ToMeSettings | None = None,
    uncond_first: bool = False,
) -> tuple[torch.Tensor, dict[str, int] | None]:
    """One guided run under the sampler ``function`` (``name``), our cache at ``settings`` on the transformer for it and
    told the sampler (removed after): the samples and the pass's steps. Cond and uncond batched: [cond, uncond], or
    ``uncond_first``, as diffusers' pipelines batch them (the same samples)."""
    sigmas = sigmas_for(model, name, steps, noise)
    patch = None if settings is None else tome_core.apply_settings(model.transformer, settings)
    if patch is not None:
        patch.set_sampler(name, sigmas, function)
    empty = torch.full_like(labels, -1)
    both = torch.cat([empty, labels] if uncond_first else [labels, empty])
    n = len(sigmas) - 1

    def denoiser(x: torch.Tensor, sigma: torch.Tensor, **kwargs) -> torch.Tensor:
        s = float(torch.as_tensor(sigma).reshape(-1)[0])
        if patch is not None:
            step = min(range(n), key=lambda j: abs(sigmas[j] - s))
            patch.set_progress(step / n, n)
        with torch.no_grad():
            first, second = model(torch.cat([x, x]), torch.full((2 * len(x),), s), both).chunk(2)
        cond, uncond = (second, first) if uncond_first else (first, second)
        return x - s * (uncond + CFG * (cond - uncond))

    try:
        with torch.no_grad():
            out = function(denoiser, noise.clone(), torch.tensor(sigmas))
        passes = patch.report().cache.passes if patch is not None else ()
    finally:
        if patch is not None:
            tome_core.remove_patch(model.transformer)
    return out, (passes[0].to_dict() if passes else None)
