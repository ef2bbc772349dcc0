"""Doubles of the quantized weights people load FLUX and Wan with (issue 37), on any model's ``nn.Linear`` layers.

- **GGUF** (city96/ComfyUI-GGUF at 795e451, ``ops.py``): a layer's weight is a ``GGMLTensor``, a tensor of the packed
  GGML bytes (``numel()`` counts bytes) whose ``shape`` is the logical one and whose ``detach``/``clone`` return
  itself (so ``nn.Parameter`` keeps it); ``GGMLLayer`` dequantizes it to the input's dtype at each call. The packing
  is the ``gguf`` package's own (``gguf.quants``), as that repository's ``tools/convert.py`` writes files, and for
  Q4_K (which that package reads but cannot write) :func:`quantize_q4_k`'s; as there, 1-D and small tensors (≤ 1,024
  values) and rows not a multiple of the block stay float.
- **scaled fp8** (ComfyUI v0.8.0, ``comfy/ops.py`` ``mixed_precision_ops``, which loads the ``scaled_fp8`` checkpoints
  it converts in ``comfy/utils.py`` ``convert_old_quants``): the layer is a plain ``nn.Module`` with ``in_features``
  and ``out_features``, not an ``nn.Linear`` (as Forge's ``ForgeOperations.Linear`` is too), its weight float8_e4m3fn
  with a per-tensor ``weight_scale``, multiplied back at each call.
- **GGUF in Forge Neo** (exo101/sd-webui-forge-neo-v3 at 5692d2d, ``webui/backend/operations.py``
  ``ForgeOperationsGGUF.Linear``, ``operations_gguf.py`` ``ParameterGGUF``): the layer is a plain ``nn.Module`` with
  neither ``in_features`` nor ``out_features``, its weight a parameter of the packed bytes whose ``shape`` is the
  logical one (``real_shape``), dequantized at each call.
- **fp8 weights** (ComfyUI v0.8.0, ``UNETLoader`` ``weight_dtype`` fp8_e4m3fn / fp8_e5m2 with ``comfy.ops.manual_cast``):
  the weight is stored in the float8 dtype and cast to the input's dtype at each call.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.lab.quantized import recast_linears

QUANTIZATION_THRESHOLD = 1024  # tools/convert.py: tensors this small stay float
Q4_K = gguf.GGMLQuantizationType.Q4_K


def quantize_q4_k(values: np.ndarray) -> np.ndarray:
    """GGML's Q4_K packing of float rows (a multiple of 256 values each), which the ``gguf`` package reads but cannot
    write: per super-block of 256, fp16 ``d`` and ``dmin``, eight 6-bit scales and mins (12 bytes, laid out as ggml's
    ``get_scale_min_k4`` reads them) and 128 bytes of 4-bit quants, ``x ≈ d·sc·q − dmin·m`` per sub-block of 32
    (each sub-block's own range, not ggml's search for the best one)."""
    rows = values.astype(np.float32).reshape(-1, 8, 32)
    low = np.minimum(rows.min(-1), 0.0)
    scale, mins = (rows.max(-1) - low) / 15, -low
    d16, dmin16 = (
        (scale.max(-1, keepdims=True) / 63).astype(np.float16),
        (mins.max(-1, keepdims=True) / 63).astype(np.float16),
    )
    d, dmin = d16.astype(np.float32), dmin16.astype(np.float32)
    sc = np.clip(np.rint(np.divide(scale, d, out=np.zeros_like(scale), where=d > 0)), 0, 63).astype(np.uint8)
    m = np.clip(np.rint(np.divide(mins, dmin, out=np.zeros_like(mins), where=dmin > 0)), 0, 63).astype(np.uint8)
    step = (d * sc)[..., None]
    shifted = rows + (dmin * m)[..., None]
    q = np.clip(np.rint(np.divide(shifted, step, out=np.zeros_like(rows), where=step > 0)), 0, 15).astype(np.uint8)
    scales = np.empty((len(rows), 12), np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    quants = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(len(rows), 128)  # sub-blocks 2k and 2k+1 share bytes
    blocks = np.concatenate([d16.view(np.uint8), dmin16.view(np.uint8), scales, quants], axis=1)
    return blocks.reshape(*values.shape[:-1], values.shape[-1] // 256 * 144)


def pack(values: np.ndarray, kind: gguf.GGMLQuantizationType) -> np.ndarray:
    """``values`` packed as GGML ``kind`` (the ``gguf`` package's packing; :func:`quantize_q4_k` for Q4_K)."""
    return quantize_q4_k(values) if kind == Q4_K else gguf.quants.quantize(values, kind)


class GGMLTensor(torch.Tensor):
    """Packed GGML bytes with the logical ``shape`` (ops.py ``GGMLTensor``)."""

    @staticmethod
    def __new__(cls, packed: torch.Tensor, *, tensor_type: gguf.GGMLQuantizationType, tensor_shape: torch.Size):
        tensor = torch.Tensor._make_subclass(cls, packed)
        tensor.tensor_type, tensor.tensor_shape = tensor_type, tensor_shape
        return tensor

    def detach(self, *args, **kwargs):
        return self

    def clone(self, *args, **kwargs):
        return self

    @property
    def shape(self) -> torch.Size:
        return self.tensor_shape

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        packed = torch.Tensor(self).numpy()  # the bytes, as a plain tensor's view
        values = gguf.quants.dequantize(packed, self.tensor_type)
        return torch.from_numpy(values).reshape(self.tensor_shape).to(dtype)


class GGMLLinear(nn.Linear):
    """A linear layer on a :class:`GGMLTensor` weight, dequantized at each call (``GGMLLayer.get_weight``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.dequantized(x.dtype), bias)


class CastLinear(nn.Linear):
    """A linear layer whose weight is stored in a low dtype and cast to the input's at each call (``manual_cast``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


class ScaledFp8Linear(nn.Module):
    """A host's own linear layer (see the module) on a scaled float8_e4m3fn weight."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scale = weight.abs().max() / 448
        self.weight = nn.Parameter((weight / scale).to(torch.float8_e4m3fn), False)
        self.register_buffer("weight_scale", scale)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype) * self.weight_scale.to(x.dtype), bias)


def scaled_fp8(model: nn.Module) -> int:
    """Replaces ``model``'s linear layers by :class:`ScaledFp8Linear` ones, in place; returns how many."""
    linears = [(name, layer) for name, layer in model.named_modules() if type(layer) is nn.Linear]
    for name, layer in linears:
        _replace(model, name, ScaledFp8Linear(layer))
    return len(linears)


def _quantizable(layer: nn.Linear, kind: gguf.GGMLQuantizationType | None = None) -> bool:
    block = 256 if kind == Q4_K else 32
    return layer.weight.numel() > QUANTIZATION_THRESHOLD and layer.in_features % block == 0


def _packed_linears(model: nn.Module, tensor_type) -> list[tuple[str, nn.Linear, GGMLTensor]]:
    """``model``'s quantizable ``nn.Linear`` layers with their weights packed as ``tensor_type(name)`` (None: the
    layer stays float)."""
    out = []
    for name, layer in list(model.named_modules()):
        kind = tensor_type(name) if type(layer) is nn.Linear else None
        if kind is None or not _quantizable(layer, kind):
            continue
        weight = layer.weight.detach().float()
        packed = torch.from_numpy(pack(weight.numpy(), kind))
        out.append((name, layer, GGMLTensor(packed, tensor_type=kind, tensor_shape=weight.shape)))
    return out


def _replace(model: nn.Module, name: str, layer: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, layer)


def quantize_gguf(model: nn.Module, tensor_type=lambda name: gguf.GGMLQuantizationType.Q8_0) -> int:
    """Gives ``model``'s linear layers GGUF weights, ``tensor_type(name)`` per layer (None: stays float), in place;
    returns how many."""
    packed = _packed_linears(model, tensor_type)
    for _, layer, weight in packed:
        layer.__class__ = GGMLLinear
        layer.weight = nn.Parameter(weight, False)
    return len(packed)


class NeoGGUFLinear(nn.Module):
    """Forge Neo's GGUF linear layer (see the module): no ``in_features``/``out_features``, a packed weight with the
    logical ``shape``; it computes as :class:`GGMLLinear`."""

    def __init__(self, weight: GGMLTensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, False)
        self.bias = bias

    forward = GGMLLinear.forward


def neo_gguf(model: nn.Module, tensor_type=lambda name: gguf.GGMLQuantizationType.Q8_0) -> int:
    """Replaces ``model``'s quantizable linear layers by :class:`NeoGGUFLinear` ones (``tensor_type(name)``), in
    place; returns how many."""
    packed = _packed_linears(model, tensor_type)
    for name, layer, weight in packed:
        _replace(model, name, NeoGGUFLinear(weight, layer.bias))
    return len(packed)


def cast_weights(model: nn.Module, dtype: torch.dtype = torch.float8_e4m3fn) -> int:
    """Stores ``model``'s linear layers' weights in ``dtype`` (cast at each call), in place; returns how many."""
    return recast_linears(model, CastLinear, dtype)
