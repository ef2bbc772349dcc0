"""Activation-quantized fp8 (W8A8), as ComfyUI v0.8.0 runs a model loaded with ``weight_dtype`` ``fp8_e4m3fn_fast``
(``comfy/ops.py`` ``fp8_linear``, on a GPU with fp8 matmuls): each linear layer's weight is stored in float8_e4m3fn
(scale 1), its input clamped to ±448 and cast to float8_e4m3fn (scale 1), and ``torch._scaled_mm`` multiplies the two
with float32 accumulation. Here the product of the fp8 values runs in float32 on the CPU: the same rounding of
weights and activations, the noise the step cache must see through. Inputs that are neither 2-D nor 3-D keep
``fp8_linear``'s fallback (the weight cast up)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


class Fp8FastLinear(nn.Linear):
    """A linear layer on an fp8 weight that quantizes its input to fp8 as well."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # diffusers' Wan casts its time embedding to the weight's dtype: computed in float32, as a host's compute dtype
        dtype = torch.float32 if x.dtype == FP8 else x.dtype
        if x.ndim in (2, 3):
            # ComfyUI clamps the caller's tensor in place; the values agree
            x = x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8)
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias).to(dtype)


def recast_linears(model: nn.Module, layer_class: type[nn.Linear], dtype: torch.dtype) -> int:
    """Turns ``model``'s ``nn.Linear`` layers into ``layer_class`` (a subclass that computes differently), their
    weights stored in ``dtype``, in place; returns how many."""
    count = 0
    for layer in model.modules():
        if type(layer) is nn.Linear:
            layer.__class__ = layer_class
            layer.weight = nn.Parameter(layer.weight.detach().to(dtype), requires_grad=False)
            count += 1
    return count


def fp8_fast(model: nn.Module) -> int:
    """Gives ``model``'s linear layers fp8 weights and fp8 inputs (see the module), in place; returns how many."""
    return recast_linears(model, Fp8FastLinear, FP8)
