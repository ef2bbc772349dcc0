"""The step cache on quantized weights (issue 37): a FLUX whose linear layers hold GGUF (ComfyUI-GGUF's packed
``GGMLTensor``) or fp8 weights, as ``tests/quantized_weights.py`` models them. The cache runs, keeps what it keeps on
float weights, keeps its features in the compute dtype, and states the speed from the logical weights."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
import torch
from quantized_weights import GGMLTensor, cast_weights, neo_gguf, quantize_gguf, quantize_q4_k, scaled_fp8

import tome_core
from benchmarks.lab import dit
from benchmarks.lab.trained import data, flux
from benchmarks.lab.trained.loading import load_flux
from tome_core.families import layout_for

Q8, Q4, Q4K = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_K
STEPS = 8


def _mixed(name: str) -> gguf.GGMLQuantizationType:
    """A K-quant file's mix: the double-stream blocks kept at 8 bits, the single-stream ones at 4."""
    return Q8 if name.startswith("transformer_blocks") else Q4


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = (a - b).pow(2).mean().item()
    return 10 * math.log10(4.0 / mse)  # samples in [-1, 1]: peak-to-peak 2


def test_the_speed_estimate_counts_a_gguf_models_logical_weights_not_their_packed_bytes():
    model = flux.build(len(data.CLASSES), seed=3)
    float_share = layout_for(model.transformer, 0).skipped_share(None)
    assert quantize_gguf(model.transformer, lambda name: _mixed(name.removeprefix("transformer."))) > 20
    weight = model.transformer.transformer_blocks[0].ff.net[2].weight
    assert isinstance(weight, GGMLTensor) and weight.numel() != math.prod(weight.shape)  # packed bytes
    assert layout_for(model.transformer, 0).skipped_share(None) == pytest.approx(float_share, abs=1e-12)


def test_the_speed_estimate_counts_a_hosts_own_linear_layers_that_are_not_nn_linear():
    """ComfyUI's mixed-precision layers (scaled fp8) and Forge's are modules with in/out features: in the real
    ComfyUI a scaled-fp8 FLUX said 'ToMe cache speed-up: 1.00x' for 5 full and 7 cached steps before."""
    model = flux.build(len(data.CLASSES), seed=3)
    float_share = layout_for(model.transformer, 0).skipped_share(None)
    assert scaled_fp8(model.transformer) > 20
    assert layout_for(model.transformer, 0).skipped_share(None) == pytest.approx(float_share, abs=1e-12)


def test_the_speed_estimate_counts_forge_neos_gguf_layers_by_their_logical_shape():
    """Forge Neo's GGUF layers have no in/out features and a packed weight: in the real Neo a GGUF Wan said 'ToMe cache
    speed-up: 1.00x' for 4 full and 6 cached steps before (its fp32 and fp8 loadings: 1.82x)."""
    model = flux.build(len(data.CLASSES), seed=3)
    float_share = layout_for(model.transformer, 0).skipped_share(None)
    assert neo_gguf(model.transformer, lambda name: _mixed(name)) > 20
    weight = model.transformer.transformer_blocks[0].ff.net[2].weight
    assert not hasattr(model.transformer.transformer_blocks[0].ff.net[2], "in_features")
    assert weight.numel() != math.prod(weight.shape)  # packed bytes
    assert layout_for(model.transformer, 0).skipped_share(None) == pytest.approx(float_share, abs=1e-12)


@pytest.fixture(scope="module")
def noise_and_labels():
    gen = torch.Generator().manual_seed(0)
    return torch.randn(2, flux.CHANNELS, flux.SIZE, flux.SIZE, generator=gen), torch.tensor([3, 7])


MODE = dit.Mode("linear-3", "linear", "uniform", 3)


def _run(model, noise_and_labels, mode):
    return dit.sample(model, *noise_and_labels, STEPS, mode)


@pytest.fixture(scope="module")
def float_psnr(noise_and_labels) -> float:
    """What the cache keeps on the float model: PSNR of its samples against the plain ones."""
    model = load_flux().eval().requires_grad_(False)
    return _psnr(_run(model, noise_and_labels, MODE)[0], _run(model, noise_and_labels, None)[0])


@pytest.mark.parametrize(
    "weights",
    ["Q8_0", "Q4_0", "mixed", "fp8_e4m3fn", "fp8_e5m2", "scaled_fp8"],
)
def test_the_cache_keeps_on_quantized_weights_what_it_keeps_on_float_weights(weights, noise_and_labels, float_psnr):
    model = load_flux().eval().requires_grad_(False)
    if weights == "scaled_fp8":
        assert scaled_fp8(model.transformer) > 20
    elif weights.startswith("fp8"):
        assert cast_weights(model.transformer, getattr(torch, f"float8_{weights.removeprefix('fp8_')}")) > 20
    else:
        kind = {"Q8_0": lambda _: Q8, "Q4_0": lambda _: Q4, "mixed": _mixed}[weights]
        assert quantize_gguf(model.transformer, kind) > 20
    plain, _ = _run(model, noise_and_labels, None)
    cached, counts = _run(model, noise_and_labels, MODE)
    again, _ = _run(model, noise_and_labels, MODE)
    assert counts == {"full": 4, "cached": 4, "skipped": 0}
    assert torch.equal(cached, again)  # deterministic
    assert torch.equal(_run(model, noise_and_labels, None)[0], plain)  # the plain model back, bit for bit
    quantized_psnr = _psnr(cached, plain)
    print(f"{weights}: {quantized_psnr:.2f} dB (float weights {float_psnr:.2f} dB)")
    assert quantized_psnr > float_psnr - 3, (quantized_psnr, float_psnr)


def test_the_cache_keeps_its_features_in_the_compute_dtype_on_fp8_weights(noise_and_labels):
    model = load_flux().eval().requires_grad_(False)
    cast_weights(model.transformer)
    session = tome_core.apply_settings(model.transformer, MODE.settings())
    kept: list[torch.Tensor] = []

    def progress(i: int, n: int) -> None:
        session.set_progress(i / n, n)
        if i == n - 1:  # before the last step: what the full steps left for the cached ones
            kept.extend(f.deep for s in session.cache._streams.values() for f in s.forecasts if f.deep is not None)

    try:
        dit.guided_euler(model, *noise_and_labels, STEPS, progress)
    finally:
        tome_core.remove_patch(model.transformer)
    assert kept and {t.dtype for t in kept} == {torch.float32}
    assert model.transformer.transformer_blocks[0].ff.net[2].weight.dtype == torch.float8_e4m3fn


def test_the_w8a8_double_multiplies_fp8_weights_by_fp8_activations_as_comfyuis_fp8_linear():
    from benchmarks.lab.quantized import FP8, Fp8FastLinear, fp8_fast

    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32))
    x = 300 * torch.randn(2, 5, 64, generator=gen)  # some beyond fp8's ±448: clamped
    weight, bias = model[0].weight.detach().clone(), model[0].bias.detach().clone()
    assert fp8_fast(model) == 1 and type(model[0]) is Fp8FastLinear and model[0].weight.dtype == FP8
    expected = torch.nn.functional.linear(x.clamp(-448, 448).to(FP8).float(), weight.to(FP8).float(), bias)
    assert torch.equal(model(x), expected)
    four_d = x.view(2, 5, 8, 8).transpose(-1, -2).reshape(2, 5, 1, 64)  # not 2-D or 3-D: fp8_linear's fallback
    assert torch.equal(model(four_d), torch.nn.functional.linear(four_d, weight.to(FP8).float(), bias))


def test_the_fp8_activations_benchmark_measures_both_forecasts_on_both_weights():
    from benchmarks.quality import fp8_activations as bench

    rows = bench.measure(1, 8, log=lambda _: None)
    assert [(r["weights"], r["interval"]) for r in rows] == [(w, n) for w in bench.WEIGHTS for n in bench.INTERVALS]
    assert all(r["counts"]["cached"] > 0 for r in rows)
    assert all(r["difference"][0] == pytest.approx(r["linear"][0] - r["off"][0]) for r in rows)  # paired, one seed
    text = bench.section(rows, {"seeds": 1, "steps": 8, "torch": "x", "finished": "now"})
    assert text.startswith(bench.BEGIN) and "| fp8_e4m3fn_fast (W8A8) | 4 | 3 / 5 |" in text


def _video(model, settings=None) -> tuple[torch.Tensor, int]:
    """Six steps of the Wan double on a 3-frame video under CFG-sized batches; the last output and the cached calls."""
    gen = torch.Generator().manual_seed(1)
    x, context = torch.randn(2, 4, 3, 8, 8, generator=gen), torch.randn(2, 5, 32, generator=gen)
    session = None if settings is None else tome_core.apply_settings(model, settings)
    try:
        for i, sigma in enumerate((0.95, 0.85, 0.7, 0.55, 0.4, 0.25)):
            if session is not None:
                session.set_progress(i / 6, 6)
            x = x - 0.15 * model(x, torch.full((2,), 1000 * sigma), context)
        cached = 0 if session is None else session.report().cache.cached
    finally:
        tome_core.remove_patch(model)
    return x, cached


def test_the_q4_k_packing_is_read_back_by_the_gguf_package():
    """The K-quant double's bytes are GGML's Q4_K: ``gguf``'s own reader dequantizes them to within 4-bit error."""
    values = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32)
    packed = quantize_q4_k(values)
    assert packed.shape == (8, 2 * 144) and packed.dtype == np.uint8
    back = gguf.quants.dequantize(packed, Q4K)
    error = np.abs(back - values).mean() / np.abs(values).mean()
    q4_0 = gguf.quants.dequantize(gguf.quants.quantize(values, Q4), Q4)
    assert error < 0.1 and error < np.abs(q4_0 - values).mean() / np.abs(values).mean() * 1.1


@pytest.mark.parametrize(
    "weights", ["Q8_0", "Q4_0", "Q4_K", "fp8_e4m3fn", "scaled_fp8", "Neo Q8_0", "Neo Q4_0", "Neo Q4_K"]
)
def test_the_cache_runs_on_a_wan_video_model_with_quantized_weights(weights):
    from wan_double import WanModel

    settings = MODE.settings()
    dim = 256 if weights.endswith("K") else 64  # K-quants pack rows of 256
    reference = WanModel(dim=dim, seed=3).eval().requires_grad_(False)
    float_share = layout_for(reference, 0).skipped_share((3, 8, 8))
    float_psnr = _psnr(_video(reference, settings)[0], _video(reference)[0])
    model = WanModel(dim=dim, seed=3).eval().requires_grad_(False)
    if weights == "scaled_fp8":
        assert scaled_fp8(model) > 4
    elif weights.startswith("fp8"):
        assert cast_weights(model) > 4
    elif weights.startswith("Neo"):
        assert neo_gguf(model, lambda _: {"Neo Q8_0": Q8, "Neo Q4_0": Q4, "Neo Q4_K": Q4K}[weights]) > 4
    else:
        assert quantize_gguf(model, lambda _: {"Q8_0": Q8, "Q4_0": Q4, "Q4_K": Q4K}[weights]) > 4
    assert layout_for(model, 0).skipped_share((3, 8, 8)) == pytest.approx(float_share, abs=1e-12)
    plain, _ = _video(model)
    cached, count = _video(model, settings)
    assert count > 0 and torch.equal(_video(model, settings)[0], cached)
    assert torch.equal(_video(model)[0], plain)
    assert _psnr(cached, plain) > float_psnr - 3, (_psnr(cached, plain), float_psnr)


def test_the_fp8_activations_benchmark_takes_the_trained_wan_model_into_its_own_section():
    from benchmarks.lab.subjects import SUBJECTS
    from benchmarks.quality import fp8_activations as bench

    rows = bench.measure(1, 8, log=lambda _: None, subject=SUBJECTS["wan"])
    assert [(r["weights"], r["interval"]) for r in rows] == [(w, n) for w in bench.WEIGHTS for n in bench.INTERVALS]
    assert all(r["counts"]["cached"] > 0 and r["linear"][0] < 100 for r in rows)  # cached steps changed the clips
    text = bench.section(rows, {"seeds": 1, "steps": 8, "torch": "x", "finished": "now", "model": "wan"})
    assert text.startswith("<!-- fp8-activations-wan:begin -->") and "fp8_activations --model wan" in text
    assert "`benchmarks/lab/trained/weights/wan.md`" in text
