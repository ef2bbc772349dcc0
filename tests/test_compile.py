"""The step cache under ``torch.compile`` (issue 37), in the ComfyUI double: ComfyUI's ``TorchCompileModel`` (the whole
``diffusion_model`` compiled, its guard filter dropping every guard on ``transformer_options``) and KJNodes'
``TorchCompileModelAdvanced`` with "compile transformer blocks only" (each block of the model's block lists compiled
and put in its list for the length of each call), in both node orders, on FLUX (Black Forest Labs' layout), SD1.5 and
Wan (a 5-frame video under CFG; the whole model compiled).

Dynamo's ``"eager"`` backend through a counting backend (what dynamo traces and guards is the same as inductor's: the
graphs are run as traced), so the test counts every graph dynamo made, recompiles included, and fails where a frame
hits dynamo's recompile limit (past it the frame runs uncompiled, quietly)."""

from __future__ import annotations

from pathlib import Path

import comfy_harness as ch
import nodes
import pytest
import torch
import torch._dynamo
from comfy_api.torch_helpers import set_torch_compile_wrapper
from comfy_extras import speedups

import tome_core

ROOT = Path(__file__).resolve().parents[1]
CACHE = {"cache_interval": 2, "cache_forecast": "linear", "cache_schedule": "uniform"}
GRAPHS: list = []


def counting(gm: torch.fx.GraphModule, example_inputs) -> object:
    """A dynamo backend that runs the graph as traced (dynamo's ``"eager"``) and counts it."""
    GRAPHS.append(gm)
    return gm.forward


class TorchCompileModelAdvanced:
    """KJNodes' node (nodes/model_optimization_nodes.py ``TorchCompileModelAdvanced.patch``) with "compile transformer
    blocks only": the keys ``diffusion_model.<list>.<i>`` of every block list it knows (``double_blocks``,
    ``single_blocks``, ``blocks``, ...; the whole ``diffusion_model`` when there is none), one options dict with
    ComfyUI's guard filter for all of them, ``torch._dynamo.config.cache_size_limit`` set to the node's 64."""

    LISTS = ("double_blocks", "single_blocks", "layers", "transformer_blocks", "blocks")

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"

    @classmethod
    def patch(cls, model):
        m = model.clone()
        dm = m.get_model_object("diffusion_model")
        keys = [f"diffusion_model.{name}.{i}" for name in cls.LISTS for i in range(len(getattr(dm, name, ())))]
        options = {"guard_filter_fn": speedups.skip_torch_compile_dict}
        set_torch_compile_wrapper(m, backend=speedups.COMPILE_BACKEND, options=options, keys=keys or None)
        return (m,)


@pytest.fixture(scope="module", autouse=True)
def comfy():
    ch.start(str(ROOT))
    nodes.NODE_CLASS_MAPPINGS["TorchCompileModelAdvanced"] = TorchCompileModelAdvanced
    speedups.COMPILE_BACKEND = counting
    yield
    speedups.COMPILE_BACKEND = None
    torch._dynamo.reset()
    for kind in ("flux1", "sd15", "wan"):
        tome_core.remove_patch(ch.base_model(kind).diffusion_model)


def sample(ckpt: str, patches=()) -> torch.Tensor:
    if ckpt == "wan":  # a 5-frame video under CFG (two streams)
        return ch.samples(ch.run(ch.txt2img(ckpt, patches, width=64, height=64, steps=8, length=5, cfg=5.0)))
    size = 64 if ckpt == "flux1" else 128
    return ch.samples(ch.run(ch.txt2img(ckpt, patches, width=size, height=size, steps=8)))


CASES = [
    ("flux1", "TorchCompileModel"),
    ("flux1", "TorchCompileModelAdvanced"),
    ("sd15", "TorchCompileModel"),
    ("wan", "TorchCompileModel"),
]


@pytest.mark.parametrize("compile_first", [True, False], ids=["compile-cache", "cache-compile"])
@pytest.mark.parametrize(("ckpt", "node"), CASES, ids=["flux-model", "flux-blocks", "sd15-model", "wan-model"])
def test_the_cache_under_compile_caches_as_without_it_with_graphs_made_once(console, ckpt, node, compile_first):
    compiled = (node, {"backend": "inductor"} if node == "TorchCompileModel" else {})
    cache = ("ToMeStepCache", CACHE)
    expected = sample(ckpt, [cache])
    steps = console()[-1]
    assert "ToMe cache steps: 5 full, 3 cached, ToMe cache speed-up: " in steps

    torch._dynamo.reset()
    GRAPHS.clear()
    limit = 64 if node == "TorchCompileModelAdvanced" else 8  # the node's own; ComfyUI leaves dynamo's
    with torch._dynamo.config.patch(recompile_limit=limit, fail_on_recompile_limit_hit=True):
        got = sample(ckpt, [compiled, cache] if compile_first else [cache, compiled])
        assert console()[-1] == steps and not any("step cache off" in line for line in console())
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        made = len(GRAPHS)
        assert made > 0  # something was compiled
        again = sample(ckpt, [compiled, cache] if compile_first else [cache, compiled])
        torch.testing.assert_close(again, expected, rtol=1e-5, atol=1e-5)
        assert len(GRAPHS) == made  # no recompile at another sampling (nor, so, per step or call)
        plain = sample(ckpt, [compiled])  # the same compiled model without the cache: the plain image
    torch.testing.assert_close(plain, sample(ckpt), rtol=1e-5, atol=1e-5)


def test_token_merging_stands_aside_on_a_compiled_model_and_says_so(console):
    """Merging's hooks sit at every attention layer: under compile they would break the graph in every block and make
    dynamo recompile the host's attention code per block up to its limit (then run it uncompiled, quietly). So on a
    compiled model the ToMe node merges nothing and says why; the image is the plain compiled one."""
    compiled = ("TorchCompileModel", {"backend": "inductor"})
    plain = sample("sd15", [compiled])
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True):
        merged = sample("sd15", [compiled, ("ToMe", {"ratio": 0.5})])
    assert any("token merging off: the model is compiled (torch.compile)" in line for line in console())
    torch.testing.assert_close(merged, plain, rtol=1e-5, atol=1e-5)
    both = sample("sd15", [compiled, ("ToMe", {"ratio": 0.5}), ("ToMeStepCache", CACHE)])
    assert any("ToMe cache steps: 5 full, 3 cached, " in line for line in console()[-2:])
    torch.testing.assert_close(both, sample("sd15", [compiled, ("ToMeStepCache", CACHE)]), rtol=1e-5, atol=1e-5)


def test_on_a_compiled_model_the_builtin_token_merging_is_kept_where_ours_stands_aside(console):
    """Ours stands aside on a compiled model, so ComfyUI's own TomePatchModel on it is left to run (not taken over)."""
    compiled, builtin = ("TorchCompileModel", {"backend": "inductor"}), ("TomePatchModel", {"ratio": 0.5})
    torch._dynamo.reset()
    alone = sample("sd15", [compiled, builtin])
    torch._dynamo.reset()
    beside = sample("sd15", [compiled, builtin, ("ToMe", {"ratio": 0.5})])
    assert not any("ToMe replaced built-in ratio" in line for line in console())
    torch.testing.assert_close(beside, alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ckpt", ["flux1", "wan"])
def test_the_cache_correction_under_compile_corrects_as_without_it_with_graphs_made_once(console, ckpt):
    """``cache_correction`` re-runs the output layer from the cache's hook, out of any graph: on a compiled model the
    corrected pass is the eager one, and no graph is made again at the next sampling."""
    corrected = ("ToMeStepCache", {**CACHE, "cache_correction": 1.0})
    expected = sample(ckpt, [corrected])
    assert not torch.equal(expected, sample(ckpt, [("ToMeStepCache", CACHE)]))
    torch._dynamo.reset()
    GRAPHS.clear()
    compiled = ("TorchCompileModel", {"backend": "inductor"})
    with torch._dynamo.config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True):
        got = sample(ckpt, [compiled, corrected])
        assert "ToMe cache correction: 1" in console()[-1] and not any("off" in line for line in console()[-2:])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        made = len(GRAPHS)
        assert made > 0
        torch.testing.assert_close(sample(ckpt, [compiled, corrected]), expected, rtol=1e-5, atol=1e-5)
        assert len(GRAPHS) == made
