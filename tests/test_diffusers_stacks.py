"""ToMe on the stacks diffusers users run (issue 51): offloading (model, sequential, group), ``torch.compile`` (of the
transformer, in place, of its repeated blocks), LoRA (peft adapters, ``set_adapters``, ``fuse_lora``) and GGUF weights.
On each, ``tome_core.apply_patch(pipe, cache=True, ...)`` (and merging on the UNet, ratio 0.5) gives the image it gives
on the plain weights: bit for bit where the stack computes the same, within float rounding where it computes the same
weights otherwise (LoRA's low-rank product beside the weight, compiled kernels). And ``remove_patch`` leaves the
pipeline as it was: its attributes, every module's hooks and instance ``forward`` (the stack's own), its output.

On this CPU-only machine the offload devices are the CPU: diffusers' ``enable_model_cpu_offload()`` refuses without an
accelerator and runs with ``device="cpu"`` (accelerate's hooks on each model, as on a GPU); sequential offload on the
CPU fails in diffusers itself (accelerate 1.16's offload of a weight to ``meta`` after a call raises ``TypeError``
under torch 2.13, with or without ToMe), so its hooks are attached as ``accelerate.cpu_offload`` attaches them, the
weights left in place. Tiny pipelines of diffusers' own classes (tests/diffusers_pipelines.py)."""

from __future__ import annotations

import functools

import gguf
import pytest
import torch
from diffusers_pipelines import flux_call, flux_pipeline, sd_call, sd_pipeline
from torch import nn

import diffusers_tome
import tome_core

FLUX = dict(ratio=0, cache=True)
SD = dict(ratio=0.5, use_rand=False, cache=True)
PIPES = {"flux": (flux_pipeline, flux_call, FLUX), "sd": (sd_pipeline, sd_call, SD)}


class Reference:
    """A configuration on the plain weights: the plain image, ToMe's, its cache steps and notes."""

    def __init__(self, pipe, call, settings):
        self.plain = call(pipe)
        caches = hasattr(pipe, "transformer")  # the UNet's cache is not asserted here: its tests are its own
        tome_core.apply_patch(pipe, **settings)
        try:
            self.ours = call(pipe)
            self.stats = tome_core.cache_stats(pipe)
            self.notes = tome_core.get_patch(pipe).last.notes
        finally:
            tome_core.remove_patch(pipe)
        assert not torch.equal(self.ours, self.plain)  # merging or the cache acted
        if caches:
            assert self.stats[0]["cached"] > 0 and not self.notes


@pytest.fixture(scope="module")
def reference():
    made = {}

    def get(kind: str) -> Reference:
        if kind not in made:
            build, call, settings = PIPES[kind]
            made[kind] = Reference(build(), call, settings)
        return made[kind]

    return get


def _attrs(pipe) -> dict:
    """The pipeline's attributes; model offloading's hooks by kind (the pipeline attaches new ones after each call)."""
    return {k: [type(h) for h in v] if k == "_all_hooks" else v for k, v in pipe.__dict__.items()}


def _what(forward) -> object:
    """An instance ``forward`` as what made it: accelerate's hook makes a new one each time the pipeline attaches it."""
    return getattr(getattr(forward, "func", None), "__qualname__", forward)


def _carried(pipe) -> dict:
    """What each module of the pipeline's models carries: its hooks, its instance ``forward``, our record."""
    out = {}
    for attr, model in pipe.components.items():
        if isinstance(model, nn.Module):
            for name, m in model.named_modules():
                out[f"{attr}.{name}"] = (
                    tuple(m._forward_pre_hooks),
                    tuple(m._forward_hooks),
                    _what(vars(m).get("forward")),
                    vars(m).get(diffusers_tome.pipeline.ATTR),
                )
    return out


def _ours(pipe, call, settings):
    """ToMe's image on ``pipe`` as it is now, its cache steps and notes; then ``remove_patch``, after which the
    pipeline carries and computes exactly what it did before."""
    before, carried, attrs = call(pipe), _carried(pipe), _attrs(pipe)
    tome_core.apply_patch(pipe, **settings)
    try:
        out = call(pipe)
        stats, notes = tome_core.cache_stats(pipe), tome_core.get_patch(pipe).last.notes
    finally:
        tome_core.remove_patch(pipe)
    assert _attrs(pipe) == attrs and _carried(pipe) == carried
    assert torch.equal(call(pipe), before)
    return out, stats, notes


def _as_on_plain(ref: Reference, out, stats, notes, exact: bool = True) -> None:
    assert stats == ref.stats and notes == ref.notes
    if exact:
        assert torch.equal(out, ref.ours)
    else:  # float rounding of the same weights, far below what the cache or merging change
        scale = ref.ours.abs().max()
        assert (out - ref.ours).abs().max() <= 1e-5 * scale < (ref.ours - ref.plain).abs().max()


def _denoiser(pipe) -> nn.Module:
    return pipe.transformer if hasattr(pipe, "transformer") else pipe.unet


# --- offloading -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["flux", "sd"])
def test_model_cpu_offload_caches_and_merges_as_on_plain_weights(kind, reference):
    """accelerate's hook wraps the denoiser's ``forward`` (``enable_model_cpu_offload``): no other cache for ours."""
    build, call, settings = PIPES[kind]
    pipe = build()
    pipe.enable_model_cpu_offload(device="cpu")
    assert "forward" in vars(_denoiser(pipe)) and hasattr(_denoiser(pipe), "_hf_hook")
    _as_on_plain(reference(kind), *_ours(pipe, call, settings))


@pytest.mark.parametrize("kind", ["flux", "sd"])
def test_sequential_offloads_hooks_on_every_layer_cache_and_merge_as_on_plain_weights(kind, reference):
    """The hooks ``enable_sequential_cpu_offload`` attaches (``accelerate.cpu_offload``: one on each module with
    weights of its own, and the inputs' device kept at the root), the weights left where they are (see the module)."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module, attach_align_device_hook

    build, call, settings = PIPES[kind]
    pipe = build()
    model = _denoiser(pipe)
    attach_align_device_hook(model, execution_device=torch.device("cpu"), offload=False)
    add_hook_to_module(model, AlignDevicesHook(io_same_device=True), append=True)
    assert sum("forward" in vars(m) for m in model.modules()) > 10
    _as_on_plain(reference(kind), *_ours(pipe, call, settings))


@pytest.mark.parametrize("offload", ["block_level", "leaf_level"])
@pytest.mark.parametrize("kind", ["flux", "sd"])
def test_group_offloading_caches_and_merges_as_on_plain_weights(kind, offload, reference):
    """diffusers' hook registry wraps the denoiser's ``forward`` (and its blocks' or layers')."""
    build, call, settings = PIPES[kind]
    pipe = build()
    cpu = torch.device("cpu")
    _denoiser(pipe).enable_group_offload(cpu, offload_device=cpu, offload_type=offload, num_blocks_per_group=1)
    hooked = [m for m in _denoiser(pipe).modules() if "forward" in vars(m) and hasattr(m, "_diffusers_hook")]
    assert len(hooked) > 2 and (_denoiser(pipe) in hooked) == (offload == "block_level")
    _as_on_plain(reference(kind), *_ours(pipe, call, settings))


def test_deepcache_under_an_offload_hook_is_still_named():
    """The step cache steps aside on DeepCache's helper under accelerate's hook (offloading enabled after the helper;
    enabled before it, diffusers' re-attaching of its hooks after each generation drops the helper's wrapper)."""
    from DeepCache import DeepCacheSDHelper

    pipe = sd_pipeline()
    helper = DeepCacheSDHelper(pipe=pipe)
    helper.set_params(cache_interval=2, cache_branch_id=0)
    helper.enable()
    pipe.enable_model_cpu_offload(device="cpu")
    call = functools.partial(sd_call, steps=4)
    call(pipe)  # DeepCache's helper keeps a state from its first generation
    theirs = call(pipe)
    out, stats, notes = _ours(pipe, call, dict(SD, ratio=0))
    assert torch.equal(out, theirs) and not any(count["cached"] for count in stats)
    note = "another wrapper of its forward (DeepCache's helper) already caches unet (two caches never both run)"
    assert notes == [f"step cache off: {note}"]


# --- torch.compile ----------------------------------------------------------------------------------------------------
@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("how", ["torch.compile(transformer)", "transformer.compile()"])
def test_a_compiled_transformer_is_cached_as_on_plain_weights_without_a_recompile_per_step(
    how, reference, fresh_dynamo
):
    """The session goes on the module the compiled wrapper holds; its decisions run as Python out of the graph. The
    graphs are dynamo's own, run as captured (a counting backend), so the image is the plain weights' bit for bit."""
    from torch._dynamo.testing import CompileCounter

    pipe, frames = flux_pipeline(), CompileCounter()
    if how == "torch.compile(transformer)":
        pipe.transformer = torch.compile(pipe.transformer, backend=frames)
    else:
        pipe.transformer.compile(backend=frames)
    tome_core.apply_patch(pipe, **FLUX)
    try:
        first = flux_call(pipe)
        compiled = frames.frame_count
        assert tome_core.cache_stats(pipe) == reference("flux").stats and torch.equal(first, reference("flux").ours)
    finally:
        tome_core.remove_patch(pipe)
    _as_on_plain(reference("flux"), *_ours(pipe, flux_call, FLUX))
    assert frames.frame_count == compiled  # a second loop (and the plain one between) compiled nothing more


def test_compiled_repeated_blocks_are_cached_as_on_plain_weights(reference, fresh_dynamo):
    """``compile_repeated_blocks()`` with inductor: each block compiled, the skipped ones' decision out of the graph."""
    pipe = flux_pipeline()
    pipe.transformer.compile_repeated_blocks()
    _as_on_plain(reference("flux"), *_ours(pipe, flux_call, FLUX), exact=False)


# --- LoRA ---------------------------------------------------------------------------------------------------------------
def _lora(model: nn.Module, prefix: str, seed: int, rank: int = 4) -> dict[str, torch.Tensor]:
    """A random LoRA in diffusers' (peft's) format on the attention projections of ``model``'s blocks."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, layer in model.named_modules():
        if name.endswith((".to_q", ".to_k", ".to_v", ".to_out.0")) and isinstance(layer, nn.Linear):
            state[f"{prefix}.{name}.lora_A.weight"] = torch.randn(rank, layer.in_features, generator=g) * 0.1
            state[f"{prefix}.{name}.lora_B.weight"] = torch.randn(layer.out_features, rank, generator=g) * 0.1
    return state


@pytest.mark.parametrize("kind", ["flux", "sd"])
def test_lora_adapters_set_and_fused_are_cached_and_merged_as_on_plain_weights(kind):
    """Two adapters (``load_lora_weights``, ``set_adapters`` with weights), peft's layers in place of the projections;
    then ``fuse_lora``. Plain weights: the same LoRA fused and unloaded (plain ``nn.Linear`` layers)."""
    build, call, settings = PIPES[kind]
    prefix = "transformer" if kind == "flux" else "unet"
    pipe = build()
    adapters = [_lora(_denoiser(pipe), prefix, seed) for seed in (0, 1)]

    def loaded(p):
        for name, state in zip("ab", adapters):
            p.load_lora_weights(dict(state), adapter_name=name)
        p.set_adapters(["a", "b"], [1.0, 0.5])
        return p

    plain = loaded(build())
    plain.fuse_lora()
    plain.unload_lora_weights()
    assert all(type(m).__module__.startswith(("torch", "diffusers")) for m in _denoiser(plain).modules())
    ref = Reference(plain, call, settings)
    loaded(pipe)
    assert any(type(m).__module__.startswith("peft") for m in _denoiser(pipe).modules())
    _as_on_plain(ref, *_ours(pipe, call, settings), exact=False)
    if kind == "flux":  # the fused peft layers (on the UNet too: the same layers, a slow test)
        pipe.fuse_lora()
        _as_on_plain(ref, *_ours(pipe, call, settings), exact=False)


# --- GGUF -------------------------------------------------------------------------------------------------------------
def _gguf_transformer(model: nn.Module, folder) -> nn.Module:
    """``model`` written as a GGUF file (Q8_0 where a row is whole blocks of 32, as ``gguf``'s writer packs it; float
    elsewhere) under its own keys, loaded back as diffusers loads one (``from_single_file`` with
    ``GGUFQuantizationConfig``: ``GGUFLinear`` layers, ``GGUFParameter`` weights dequantized at each call)."""
    from diffusers import GGUFQuantizationConfig

    model.save_config(folder)
    path = folder / "transformer.gguf"
    writer = gguf.GGUFWriter(path, arch="flux")
    for key, value in model.state_dict().items():
        values = value.float().numpy()
        if values.ndim == 2 and values.shape[1] % 32 == 0:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(key, gguf.quants.quantize(values, q8), raw_dtype=q8)
        else:
            writer.add_tensor(key, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = GGUFQuantizationConfig(compute_dtype=torch.float32)
    return type(model).from_single_file(str(path), config=str(folder), quantization_config=config)


def test_gguf_weights_are_cached_as_on_their_plain_weights(tmp_path):
    """Plain weights: the same file's weights dequantized once (``dequantize()``: ``nn.Linear`` layers)."""
    from diffusers import FluxPipeline

    base = flux_pipeline()
    quantized = _gguf_transformer(base.transformer, tmp_path)
    assert type(quantized.transformer_blocks[0].attn.to_q).__name__ == "GGUFLinear"
    dequantized = _gguf_transformer(base.transformer, tmp_path)
    dequantized.dequantize()
    assert type(dequantized.transformer_blocks[0].attn.to_q) is nn.Linear
    pipes = []
    for transformer in (dequantized, quantized):
        pipe = FluxPipeline(**{**base.components, "transformer": transformer})
        pipe.set_progress_bar_config(disable=True)
        pipes.append(pipe)
    ref = Reference(pipes[0], flux_call, FLUX)
    _as_on_plain(ref, *_ours(pipes[1], flux_call, FLUX))
