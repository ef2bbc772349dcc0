"""ComfyUI's built-in nodes that patch a model and that users chain with ToMe (``comfy_extras/*.py`` at 3cd7b32f),
as V1 classes with the real node ids and inputs (the real ones use the V3 schema; only what they put on the clone
matters here).

- ``TomePatchModel`` (nodes_tomesd.py:144-178): ``attn1_patch`` ``tomesd_m`` merging the queries only (tomesd's
  bipartite soft matching, stride 2x2, random destinations from the global RNG, only where the tokens are the latent's
  h*w: ``max_downsample`` 1, l.128-141) and ``attn1_output_patch`` ``tomesd_u``; both closures of ``execute``.
- ``HyperTile`` (nodes_hypertile.py:25-88): an ``attn1_patch`` tiling the queries into the batch where the token count
  is the latent's at a depth up to ``max_depth`` (divisors drawn from the global RNG), and the output patch untiling.
- ``EasyCache`` / ``LazyCache`` (nodes_easycache.py:330-359, 465-490): wrappers under the keys ``"easycache"`` (OUTER_SAMPLE,
  CALC_COND_BATCH, DIFFUSION_MODEL) and ``"lazycache"`` (OUTER_SAMPLE, PREDICT_NOISE). The double keeps their keys
  and skips whole model calls the simple way: after ``start`` calls, every other one returns the last output.
- ``FreeU`` (nodes_freelunch.py:28-70): an ``output_block_patch`` scaling half of ``h``'s channels in place and
  filtering ``hsp`` in Fourier space at ``model_channels * 4`` and ``* 2`` channels.
- ``SelfAttentionGuidance`` (nodes_sag.py:112-181): an attn1 replace at ``("middle", 0, 0)`` recording the attention,
  a post-CFG function calling ``calc_cond_batch`` again on the blurred uncond (``disable_cfg1_optimization``); the
  double blurs with an average pool instead of the attention-masked Gaussian.
- ``PerturbedAttentionGuidance`` (nodes_pag.py:15-55): a post-CFG function calling ``calc_cond_batch`` with a copy of
  the options whose attn1 at ``("middle", 0)`` returns the values.
- ``TorchCompileModel`` (nodes_torch_compile.py:8-31): the whole ``diffusion_model`` compiled for each ``apply_model``
  call through ``comfy_api.torch_helpers.set_torch_compile_wrapper`` (the double's ``comfy_api``), with the guard filter
  that drops every guard on ``transformer_options``; ``COMPILE_BACKEND`` replaces the backend chosen (tests).
- ``PatchModelAddDownscale`` (nodes_model_downscale.py:8-52): Kohya's Deep Shrink, an input block patch resizing the
  features of ``block_number`` by ``1 / downscale_factor`` while the sigma is in range, an output block patch
  resizing them back.
"""

from __future__ import annotations

import math

import einops
import tomesd.merge
import torch
from comfy import model_patcher, samplers
from comfy.patcher_extension import WrappersMP
from torch import nn


def _model(inputs: dict | None = None) -> dict:
    return {"required": {"model": ("MODEL",), **(inputs or {})}}


class TomePatchModel:
    @classmethod
    def INPUT_TYPES(cls):
        return _model({"ratio": ("FLOAT", {"default": 0.3, "min": 0.0, "max": 1.0, "step": 0.01})})

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "execute"

    @classmethod
    def execute(cls, model, ratio):
        u = None

        def tomesd_m(q, k, v, extra_options):
            nonlocal u
            _, _, original_h, original_w = extra_options["original_shape"]
            downsample = math.ceil(math.sqrt(original_h * original_w // q.shape[1]))
            if downsample <= 1:
                w, h = math.ceil(original_w / downsample), math.ceil(original_h / downsample)
                r = int(q.shape[1] * ratio)
                m, u = tomesd.merge.bipartite_soft_matching_random2d(q, w, h, 2, 2, r, False, torch.default_generator)
                return m(q), k, v
            u = None
            return q, k, v

        def tomesd_u(n, extra_options):
            return n if u is None else u(n)

        m = model.clone()
        m.set_model_attn1_patch(tomesd_m)
        m.set_model_attn1_output_patch(tomesd_u)
        return (m,)


class HyperTile:
    @classmethod
    def INPUT_TYPES(cls):
        return _model(
            {
                "tile_size": ("INT", {"default": 256, "min": 1, "max": 2048}),
                "swap_size": ("INT", {"default": 2, "min": 1, "max": 128}),
                "max_depth": ("INT", {"default": 0, "min": 0, "max": 10}),
                "scale_depth": ("BOOLEAN", {"default": False}),
            }
        )

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "execute"

    @classmethod
    def execute(cls, model, tile_size, swap_size, max_depth, scale_depth):
        latent_tile_size = max(32, tile_size) // 8
        temp = None

        def random_divisor(value: int, min_value: int, max_options: int = 1) -> int:
            min_value = min(min_value, value)
            divisors = [i for i in range(min_value, value + 1) if value % i == 0]
            ns = [value // i for i in divisors[:max_options]]
            idx = torch.randint(low=0, high=len(ns) - 1, size=(1,)).item() if len(ns) - 1 > 0 else 0
            return ns[idx]

        def hypertile_in(q, k, v, extra_options):
            nonlocal temp
            shape = extra_options["original_shape"]
            apply_to = [(shape[-2] / 2**i) * (shape[-1] / 2**i) for i in range(max_depth + 1)]
            if q.shape[-2] in apply_to:
                aspect_ratio = shape[-1] / shape[-2]
                hw = q.size(1)
                h, w = round(math.sqrt(hw * aspect_ratio)), round(math.sqrt(hw / aspect_ratio))
                factor = (2 ** apply_to.index(q.shape[-2])) if scale_depth else 1
                nh = random_divisor(h, latent_tile_size * factor, swap_size)
                nw = random_divisor(w, latent_tile_size * factor, swap_size)
                if nh * nw > 1:
                    q = einops.rearrange(q, "b (nh h nw w) c -> (b nh nw) (h w) c", h=h // nh, w=w // nw, nh=nh, nw=nw)
                    temp = (nh, nw, h, w)
            return q, k, v

        def hypertile_out(out, extra_options):
            nonlocal temp
            if temp is not None:
                nh, nw, h, w = temp
                temp = None
                out = einops.rearrange(out, "(b nh nw) hw c -> b nh nw hw c", nh=nh, nw=nw)
                out = einops.rearrange(out, "b nh nw (h w) c -> b (nh h nw w) c", h=h // nh, w=w // nw)
            return out

        m = model.clone()
        m.set_model_attn1_patch(hypertile_in)
        m.set_model_attn1_output_patch(hypertile_out)
        return (m,)


class _SkippingCache:
    """What the double of EasyCache / LazyCache does: after ``start`` model calls, every other one is skipped (the last
    output returned)."""

    def __init__(self, start: int = 2):
        self.start, self.calls, self.last = start, 0, None

    def call(self, run, *args, **kwargs):
        self.calls += 1
        if self.last is not None and self.calls > self.start and self.calls % 2:
            return self.last
        self.last = run(*args, **kwargs)
        return self.last


def _cache_node(key: str, kinds: tuple[str, ...]):
    class Node:
        @classmethod
        def INPUT_TYPES(cls):
            return _model({"reuse_threshold": ("FLOAT", {"default": 0.2, "min": 0.0, "max": 3.0, "step": 0.01})})

        RETURN_TYPES = ("MODEL",)
        FUNCTION = "execute"

        @classmethod
        def execute(cls, model, reuse_threshold=0.2):
            state: dict = {}

            def outer_sample(executor, *args, **kwargs):
                state["cache"] = _SkippingCache()
                try:
                    return executor(*args, **kwargs)
                finally:
                    state.pop("cache", None)

            def skipping(executor, *args, **kwargs):
                return state["cache"].call(executor, *args, **kwargs)

            def passing(executor, *args, **kwargs):
                return executor(*args, **kwargs)

            m = model.clone()
            m.add_wrapper_with_key(WrappersMP.OUTER_SAMPLE, key, outer_sample)
            for kind in kinds:
                m.add_wrapper_with_key(kind, key, skipping if kind == kinds[-1] else passing)
            return (m,)

    return Node


EasyCache = _cache_node("easycache", (WrappersMP.CALC_COND_BATCH, WrappersMP.DIFFUSION_MODEL))
LazyCache = _cache_node("lazycache", (WrappersMP.PREDICT_NOISE,))


def _fourier_filter(x, threshold, scale):
    x_freq = torch.fft.fftshift(torch.fft.fftn(x.float(), dim=(-2, -1)), dim=(-2, -1))
    b, c, h, w = x_freq.shape
    mask = torch.ones((b, c, h, w), device=x.device)
    crow, ccol = h // 2, w // 2
    mask[..., crow - threshold : crow + threshold, ccol - threshold : ccol + threshold] = scale
    x_freq = torch.fft.ifftshift(x_freq * mask, dim=(-2, -1))
    return torch.fft.ifftn(x_freq, dim=(-2, -1)).real.to(x.dtype)


class FreeU:
    @classmethod
    def INPUT_TYPES(cls):
        f = {"min": 0.0, "max": 10.0, "step": 0.01}
        return _model(
            {name: ("FLOAT", {"default": d, **f}) for name, d in (("b1", 1.1), ("b2", 1.2), ("s1", 0.9), ("s2", 0.2))}
        )

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "execute"

    @classmethod
    def execute(cls, model, b1, b2, s1, s2):
        model_channels = model.model.model_config.unet_config["model_channels"]
        scale_dict = {model_channels * 4: (b1, s1), model_channels * 2: (b2, s2)}

        def output_block_patch(h, hsp, transformer_options):
            scale = scale_dict.get(int(h.shape[1]))
            if scale is not None:
                h[:, : h.shape[1] // 2] = h[:, : h.shape[1] // 2] * scale[0]
                hsp = _fourier_filter(hsp, threshold=1, scale=scale[1])
            return h, hsp

        m = model.clone()
        m.set_model_output_block_patch(output_block_patch)
        return (m,)


def _attention(q, k, v, heads):
    b, _, inner = q.shape
    q, k, v = (t.view(b, -1, heads, inner // heads).transpose(1, 2) for t in (q, k, v))
    return nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, inner)


class SelfAttentionGuidance:
    @classmethod
    def INPUT_TYPES(cls):
        return _model(
            {
                "scale": ("FLOAT", {"default": 0.5, "min": -2.0, "max": 5.0, "step": 0.01}),
                "blur_sigma": ("FLOAT", {"default": 2.0, "min": 0.0, "max": 10.0, "step": 0.1}),
            }
        )

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "execute"

    @classmethod
    def execute(cls, model, scale, blur_sigma):
        m = model.clone()
        attn_scores = None

        def attn_and_record(q, k, v, extra_options):
            nonlocal attn_scores
            attn_scores = q.shape  # the real one keeps the uncond's attention map for the blur mask
            return _attention(q, k, v, extra_options["n_heads"])

        def post_cfg_function(args):
            uncond_pred, uncond, cfg_result = args["uncond_denoised"], args["uncond"], args["denoised"]
            sigma, model_options, x = args["sigma"], args["model_options"], args["input"]
            if min(cfg_result.shape[2:]) <= 4:
                return cfg_result
            degraded = nn.functional.avg_pool2d(uncond_pred, 3, stride=1, padding=1, count_include_pad=False)
            (sag,) = samplers.calc_cond_batch(args["model"], [uncond], degraded + x - uncond_pred, sigma, model_options)
            return cfg_result + (degraded - sag) * scale

        m.set_model_sampler_post_cfg_function(post_cfg_function, disable_cfg1_optimization=True)
        m.set_model_attn1_replace(attn_and_record, "middle", 0, 0)
        return (m,)


class PerturbedAttentionGuidance:
    @classmethod
    def INPUT_TYPES(cls):
        return _model({"scale": ("FLOAT", {"default": 3.0, "min": 0.0, "max": 100.0, "step": 0.01})})

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "execute"

    @classmethod
    def execute(cls, model, scale):
        m = model.clone()

        def perturbed_attention(q, k, v, extra_options, mask=None):
            return v

        def post_cfg_function(args):
            cond_pred, cond, cfg_result = args["cond_denoised"], args["cond"], args["denoised"]
            model_options = model_patcher.set_model_options_patch_replace(
                args["model_options"].copy(), perturbed_attention, "attn1", "middle", 0
            )
            (pag,) = samplers.calc_cond_batch(args["model"], [cond], args["input"], args["sigma"], model_options)
            return cfg_result + (cond_pred - pag) * scale

        m.set_model_sampler_post_cfg_function(post_cfg_function)
        return (m,)


class PatchModelAddDownscale:
    @classmethod
    def INPUT_TYPES(cls):
        return _model(
            {
                "block_number": ("INT", {"default": 3, "min": 1, "max": 32}),
                "downscale_factor": ("FLOAT", {"default": 2.0, "min": 0.1, "max": 9.0, "step": 0.001}),
                "start_percent": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.001}),
                "end_percent": ("FLOAT", {"default": 0.35, "min": 0.0, "max": 1.0, "step": 0.001}),
                "downscale_after_skip": ("BOOLEAN", {"default": True}),
            }
        )

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "execute"

    @classmethod
    def execute(cls, model, block_number, downscale_factor, start_percent, end_percent, downscale_after_skip):
        model_sampling = model.get_model_object("model_sampling")
        sigma_start = model_sampling.percent_to_sigma(start_percent)
        sigma_end = model_sampling.percent_to_sigma(end_percent)

        def input_block_patch(h, transformer_options):
            if transformer_options["block"][1] == block_number:
                sigma = transformer_options["sigmas"][0].item()
                if sigma_end <= sigma <= sigma_start:
                    size = (round(h.shape[-2] / downscale_factor), round(h.shape[-1] / downscale_factor))
                    h = nn.functional.interpolate(h, size=size, mode="bicubic")
            return h

        def output_block_patch(h, hsp, transformer_options):
            if h.shape[2] != hsp.shape[2]:
                h = nn.functional.interpolate(h, size=hsp.shape[-2:], mode="bicubic")
            return h, hsp

        m = model.clone()
        if downscale_after_skip:
            m.set_model_input_block_patch_after_skip(input_block_patch)
        else:
            m.set_model_input_block_patch(input_block_patch)
        m.set_model_output_block_patch(output_block_patch)
        return (m,)


COMPILE_BACKEND = None
"""What the double's ``TorchCompileModel`` compiles with instead of the backend chosen (a test's: dynamo's ``"eager"`` or a
counting backend; inductor takes minutes on a CPU); None: the one chosen."""


def skip_torch_compile_dict(guard_entries):
    """nodes_torch_compile.py:5-6: every dynamo guard whose name mentions ``transformer_options`` is dropped."""
    return [("transformer_options" not in entry.name) for entry in guard_entries]


class TorchCompileModel:
    """nodes_torch_compile.py:8-31: the whole ``diffusion_model`` compiled (``set_torch_compile_wrapper``, default
    keys) with the guard filter above."""

    @classmethod
    def INPUT_TYPES(cls):
        return _model({"backend": (["inductor", "cudagraphs"],)})

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "execute"

    @classmethod
    def execute(cls, model, backend):
        from comfy_api.torch_helpers import set_torch_compile_wrapper

        m = model.clone()
        options = {"guard_filter_fn": skip_torch_compile_dict}
        set_torch_compile_wrapper(model=m, backend=COMPILE_BACKEND or backend, options=options)
        return (m,)


NODE_CLASS_MAPPINGS = {
    cls.__name__: cls
    for cls in (
        TorchCompileModel,
        TomePatchModel,
        HyperTile,
        FreeU,
        SelfAttentionGuidance,
        PerturbedAttentionGuidance,
        PatchModelAddDownscale,
    )
}
NODE_CLASS_MAPPINGS.update(EasyCache=EasyCache, LazyCache=LazyCache)
