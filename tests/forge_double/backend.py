"""Double of the parts of Forge's ``backend/`` package that an extension meets (Forge main ``dfdcbab``).

Written from reading Forge; line numbers are those of the real files.

- ``EpsPredictor``: ``backend/modules/k_prediction.py`` discrete eps prediction (``timestep`` = nearest index
  l.148-151, ``calculate_input`` l.74-79, ``calculate_denoised``, ``noise_scaling`` l.94-104,
  ``percent_to_sigma`` l.161-167), SD's scaled-linear schedule.
- ``KModel`` (``backend/modules/k_model.py:7-45``): an ``nn.Module`` holding ``diffusion_model``; the sampler
  calls ``apply_model``, which calls the UNet with the timestep **positional** and ``transformer_options``.
- ``ModelPatcher`` / ``UnetPatcher`` (``backend/patcher/base.py:79-84,186-213``, ``patcher/unet.py:8-79,173-177``):
  clones share one ``model`` and deep-copy ``model_options``; patches live in
  ``model_options["transformer_options"]["patches" | "patches_replace"]``; the ControlNet linked list.
- ``ForgeObjects`` (``backend/diffusion_engine/base.py:7-20``) and the engines (``base.py:23-68``,
  ``sd15.py``, ``sdxl.py``; ``Flux`` stands for every engine whose diffusion model has no UNet transformer
  blocks: Flux, SD3, Chroma).
- ``ControlNet`` / ``ControlLora`` / ``T2IAdapter`` and ``apply_controlnet_advanced``
  (``backend/patcher/controlnet.py:11-83,180-281,282-357,420-474,477``). ControlLora's ``control_model`` is
  created in ``pre_run`` (at sampling start) and deleted in ``cleanup``.
- ``TomePatcher`` (``backend/misc/tomesd.py:127-162``): the built-in token merging, a q-only ``attn1_patch``
  plus an ``attn1_output_patch`` on a clone, stride 2x2, ``max_downsample`` 1, partition from the global RNG.
  The merge itself is tomesd's ``bipartite_soft_matching_random2d`` (the oracle package), called as Forge does.
- ``sampling_function`` / ``sampling_prepare`` / ``sampling_cleanup``
  (``backend/sampling/sampling_function.py:170-410``): cond and uncond in one batch, ``transformer_options``
  copied from the patcher's ``model_options`` plus ``cond_or_uncond`` and ``sigmas``; control from the linked list.

Simplified: no memory management, devices or dtypes (CPU, fp32); no LoRA; no areas/masks/multi-cond; the
text encoder and VAE are the WebUI double's stand-ins (``tiny_models.TinySdModel``).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import tomesd.merge
import torch
from bfl_flux_double import Flux as BflFlux
from tiny_models import CheckpointInfoDouble, TinySdModel
from torch import nn

COND, UNCOND = 0, 1


class EpsPredictor:
    """Discrete eps prediction over SD's 1000-step scaled-linear schedule."""

    def __init__(self) -> None:
        betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
        self.alphas_cumprod = torch.cumprod(1.0 - betas, dim=0).float()
        self.sigmas = ((1 - self.alphas_cumprod) / self.alphas_cumprod) ** 0.5
        self.log_sigmas = self.sigmas.log()

    def timestep(self, sigma: torch.Tensor) -> torch.Tensor:
        dists = sigma.log() - self.log_sigmas[:, None]
        return dists.abs().argmin(dim=0).view(sigma.shape)

    def sigma(self, timestep: torch.Tensor) -> torch.Tensor:
        t = torch.clamp(timestep.float(), min=0, max=len(self.sigmas) - 1)
        low, high, w = t.floor().long(), t.ceil().long(), t.frac()
        return ((1 - w) * self.log_sigmas[low] + w * self.log_sigmas[high]).exp()

    def percent_to_sigma(self, percent: float) -> float:
        if percent <= 0.0:
            return 999999999.9
        if percent >= 1.0:
            return 0.0
        return self.sigma(torch.tensor((1.0 - percent) * 999.0)).item()

    def calculate_input(self, sigma: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        sigma = sigma.view(sigma.shape[:1] + (1,) * (noise.ndim - 1))
        return noise / (sigma**2 + 1.0) ** 0.5

    def calculate_denoised(self, sigma: torch.Tensor, model_output: torch.Tensor, model_input: torch.Tensor):
        sigma = sigma.view(sigma.shape[:1] + (1,) * (model_output.ndim - 1))
        return model_input - model_output * sigma

    def noise_scaling(self, sigma, noise, latent_image, max_denoise=False):
        return noise * sigma + latent_image


class KModel(nn.Module):
    """``backend/modules/k_model.py``: hooks on this wrapper never fire, the sampler calls ``apply_model``."""

    def __init__(self, model: nn.Module, predictor: EpsPredictor | None = None):
        super().__init__()
        self.diffusion_model = model
        self.predictor = predictor or EpsPredictor()
        self.storage_dtype = self.computation_dtype = torch.float32

    def apply_model(self, x, t, c_concat=None, c_crossattn=None, control=None, transformer_options={}, **kwargs):  # noqa: B006 (Forge's signature)
        sigma = t
        xc = self.predictor.calculate_input(sigma, x)
        if c_concat is not None:
            xc = torch.cat([xc, c_concat], dim=1)
        t = self.predictor.timestep(t).float()
        out = self.diffusion_model(
            xc, t, context=c_crossattn, control=control, transformer_options=transformer_options, **kwargs
        ).float()
        return self.predictor.calculate_denoised(sigma, out, x)


class ModelPatcher:
    """``backend/patcher/base.py``: a patch set around a shared ``model``."""

    def __init__(self, model: nn.Module, load_device=None, offload_device=None, size=0, current_device=None):
        self.model = model
        self.size = size
        self.load_device, self.offload_device, self.current_device = load_device, offload_device, current_device
        self.lora_patches: dict = {}
        self.object_patches: dict = {}
        self.object_patches_backup: dict = {}
        self.model_options: dict[str, Any] = {"transformer_options": {}}

    def clone(self) -> ModelPatcher:
        """The same ``model`` (so one ``KModel`` for all clones), copies of the patch dicts, options deep-copied."""
        n = type(self)(self.model, self.load_device, self.offload_device, self.size, self.current_device)
        n.lora_patches = self.lora_patches.copy()
        n.object_patches = self.object_patches.copy()
        n.model_options = copy.deepcopy(self.model_options)
        return n

    def set_model_patch(self, patch, name: str) -> None:
        to = self.model_options["transformer_options"]
        to.setdefault("patches", {})
        to["patches"][name] = [*to["patches"].get(name, []), patch]

    def set_model_patch_replace(self, patch, name, block_name, number, transformer_index=None) -> None:
        self.model_options = set_model_options_patch_replace(
            self.model_options, patch, name, block_name, number, transformer_index
        )

    def set_model_attn1_patch(self, patch) -> None:
        self.set_model_patch(patch, "attn1_patch")

    def set_model_attn2_patch(self, patch) -> None:
        self.set_model_patch(patch, "attn2_patch")

    def set_model_attn1_replace(self, patch, block_name, number, transformer_index=None) -> None:
        self.set_model_patch_replace(patch, "attn1", block_name, number, transformer_index)

    def set_model_attn1_output_patch(self, patch) -> None:
        self.set_model_patch(patch, "attn1_output_patch")

    def set_model_input_block_patch(self, patch) -> None:
        self.set_model_patch(patch, "input_block_patch")

    def set_model_input_block_patch_after_skip(self, patch) -> None:
        self.set_model_patch(patch, "input_block_patch_after_skip")

    def set_model_output_block_patch(self, patch) -> None:
        self.set_model_patch(patch, "output_block_patch")

    def set_model_sampler_post_cfg_function(self, post_cfg_function, disable_cfg1_optimization=False) -> None:
        """``base.py:141-142``: appended to ``sampler_post_cfg_function``, run after CFG on the denoised result."""
        options = self.model_options = self.model_options.copy()
        options["sampler_post_cfg_function"] = [*options.get("sampler_post_cfg_function", []), post_cfg_function]
        if disable_cfg1_optimization:
            options["disable_cfg1_optimization"] = True

    def set_model_unet_function_wrapper(self, unet_wrapper_function) -> None:
        """``base.py:147-148``: ``wrapper(apply_model, {"input", "timestep", "c", "cond_or_uncond"})`` instead of the
        model call (``sampling_function.py:270-273``)."""
        self.model_options["model_function_wrapper"] = unet_wrapper_function

    def add_object_patch(self, name: str, obj) -> None:
        """``base.py:197-198``: ``obj`` is put at ``name`` (dotted, from the model) when the model is loaded."""
        self.object_patches[name] = obj

    def forge_patch_model(self) -> None:
        """``base.py:257-270``: every object patch set on the model, the originals kept."""
        for name, obj in self.object_patches.items():
            if name not in self.object_patches_backup:
                self.object_patches_backup[name] = _get_attr(self.model, name)
            _set_attr(self.model, name, obj)

    def forge_unpatch_model(self) -> None:
        """``base.py:272-282``: the originals back."""
        for name, obj in self.object_patches_backup.items():
            _set_attr(self.model, name, obj)
        self.object_patches_backup = {}


def _get_attr(obj, name: str):
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _set_attr(obj, name: str, value) -> None:
    *parents, last = name.split(".")
    setattr(_get_attr(obj, ".".join(parents)) if parents else obj, last, value)


def set_model_options_patch_replace(model_options, patch, name, block_name, number, transformer_index=None):
    """``backend/patcher/base.py``: a copy of ``model_options`` with the replace patch, copying the dicts on the way
    (so clones and the options a post-CFG function changes never share them)."""
    to = model_options["transformer_options"].copy()
    replace = to["patches_replace"] = dict(to.get("patches_replace", {}))
    replace[name] = dict(replace.get(name, {}))
    key = (block_name, number) if transformer_index is None else (block_name, number, transformer_index)
    replace[name][key] = patch
    return {**model_options, "transformer_options": to}


class UnetPatcher(ModelPatcher):
    """``backend/patcher/unet.py``: also carries the ControlNet linked list (shared by clones)."""

    @classmethod
    def from_model(cls, model: nn.Module, predictor: EpsPredictor | None = None) -> UnetPatcher:
        return cls(KModel(model, predictor))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.controlnet_linked_list = None
        self.extra_concat_condition = None

    def clone(self) -> UnetPatcher:
        n = super().clone()
        n.controlnet_linked_list = self.controlnet_linked_list
        n.extra_concat_condition = self.extra_concat_condition
        return n

    def add_patched_controlnet(self, cnet: ControlBase) -> None:
        cnet.set_previous_controlnet(self.controlnet_linked_list)
        self.controlnet_linked_list = cnet

    def list_controlnets(self) -> list[ControlBase]:
        out, pointer = [], self.controlnet_linked_list
        while pointer is not None:
            out.append(pointer)
            pointer = pointer.previous_controlnet
        return out

    def append_model_option(self, k: str, v) -> None:
        self.model_options[k] = [*self.model_options.get(k, []), v]

    def append_transformer_option(self, k: str, v) -> None:
        to = self.model_options["transformer_options"]
        to[k] = [*to.get(k, []), v]

    def add_conditioning_modifier(self, modifier) -> None:
        """``patcher/unet.py:113-115``: run by ``sampling_function`` before sampling_function_inner."""
        self.append_model_option("conditioning_modifiers", modifier)

    def add_block_modifier(self, modifier) -> None:
        """``patcher/unet.py:153-155``: ``modifier(h, "before" | "after", transformer_options)`` around each block."""
        self.append_transformer_option("block_modifiers", modifier)

    def set_model_replace_all(self, patch, target: str = "attn1") -> None:
        for block_name in ("input", "middle", "output"):
            for number in range(16):
                for transformer_index in range(16):
                    self.set_model_patch_replace(patch, target, block_name, number, transformer_index)


# --- ControlNet -------------------------------------------------------------------------------------


class ControlBase:
    def __init__(self) -> None:
        self.cond_hint_original = None
        self.cond_hint = None
        self.strength = 1.0
        self.timestep_percent_range = (0.0, 1.0)
        self.timestep_range = None
        self.transformer_options: dict = {}
        self.previous_controlnet: ControlBase | None = None

    def set_cond_hint(self, cond_hint, strength=1.0, timestep_percent_range=(0.0, 1.0)) -> ControlBase:
        self.cond_hint_original, self.strength, self.timestep_percent_range = (
            cond_hint,
            strength,
            timestep_percent_range,
        )
        return self

    def pre_run(self, model: KModel, percent_to_timestep_function) -> None:
        self.timestep_range = tuple(percent_to_timestep_function(p) for p in self.timestep_percent_range)
        if self.previous_controlnet is not None:
            self.previous_controlnet.pre_run(model, percent_to_timestep_function)

    def set_previous_controlnet(self, controlnet: ControlBase | None) -> ControlBase:
        self.previous_controlnet = controlnet
        return self

    def cleanup(self) -> None:
        if self.previous_controlnet is not None:
            self.previous_controlnet.cleanup()
        self.cond_hint = None
        self.timestep_range = None

    def copy_to(self, c: ControlBase) -> None:
        c.cond_hint_original, c.strength, c.timestep_percent_range = (
            self.cond_hint_original,
            self.strength,
            self.timestep_percent_range,
        )

    def _hint(self, x_noisy: torch.Tensor) -> torch.Tensor:
        size = (x_noisy.shape[2] * 8, x_noisy.shape[3] * 8)
        if self.cond_hint is None or tuple(self.cond_hint.shape[2:]) != size:
            self.cond_hint = nn.functional.interpolate(self.cond_hint_original, size=size, mode="nearest-exact")
        if self.cond_hint.shape[0] != x_noisy.shape[0]:
            self.cond_hint = self.cond_hint[:1].expand(x_noisy.shape[0], -1, -1, -1)
        return self.cond_hint

    def control_merge(self, control_input, control_output, control_prev) -> dict[str, list]:
        out: dict[str, list] = {"input": [], "middle": [], "output": []}
        for x in control_input or ():
            out["input"].insert(0, None if x is None else x * self.strength)
        for i, x in enumerate(control_output or ()):
            key = "middle" if i == len(control_output) - 1 else "output"
            out[key].append(None if x is None else x * self.strength)
        if control_prev is not None:
            for key in out:
                mine = out[key]
                for i, prev in enumerate(control_prev[key]):
                    if i >= len(mine):
                        mine.append(prev)
                    elif prev is not None:
                        mine[i] = prev if mine[i] is None else mine[i] + prev
        return out

    def _prev(self, x_noisy, t, cond, batched_number):
        if self.previous_controlnet is None:
            return None
        return self.previous_controlnet.get_control(x_noisy, t, cond, batched_number)


class ControlNet(ControlBase):
    """A cldm control model run with keyword arguments (``x, hint, timesteps, context, y``), no transformer_options."""

    def __init__(self, control_model: nn.Module | None) -> None:
        super().__init__()
        self.control_model = control_model
        self.model_sampling_current: EpsPredictor | None = None

    def get_control(self, x_noisy, t, cond, batched_number):
        control_prev = self._prev(x_noisy, t, cond, batched_number)
        if self.timestep_range is not None and (t[0] > self.timestep_range[0] or t[0] < self.timestep_range[1]):
            return control_prev
        timestep = self.model_sampling_current.timestep(t)
        x_in = self.model_sampling_current.calculate_input(t, x_noisy)
        control = self.control_model(
            x=x_in, hint=self._hint(x_noisy), timesteps=timestep.float(), context=cond["c_crossattn"], y=cond.get("y")
        )
        return self.control_merge(None, control, control_prev)

    def copy(self) -> ControlNet:
        c = ControlNet(self.control_model)
        self.copy_to(c)
        return c

    def pre_run(self, model, percent_to_timestep_function) -> None:
        super().pre_run(model, percent_to_timestep_function)
        self.model_sampling_current = model.predictor

    def cleanup(self) -> None:
        self.model_sampling_current = None
        super().cleanup()


class ControlLora(ControlNet):
    """The control model exists only between ``pre_run`` (built from the UNet config + weights) and ``cleanup``."""

    def __init__(self, make_control_model) -> None:
        super().__init__(None)
        self.make_control_model = make_control_model

    def pre_run(self, model, percent_to_timestep_function) -> None:
        super().pre_run(model, percent_to_timestep_function)
        self.control_model = self.make_control_model(model.diffusion_model)

    def copy(self) -> ControlLora:
        c = ControlLora(self.make_control_model)
        self.copy_to(c)
        return c

    def cleanup(self) -> None:
        del self.control_model
        self.control_model = None
        super().cleanup()


class T2IAdapter(ControlBase):
    """An adapter (``.t2i_model``, convolutions only) whose features go to the input blocks."""

    def __init__(self, t2i_model: nn.Module) -> None:
        super().__init__()
        self.t2i_model = t2i_model

    def get_control(self, x_noisy, t, cond, batched_number):
        control_prev = self._prev(x_noisy, t, cond, batched_number)
        features = self.t2i_model(self._hint(x_noisy))
        return self.control_merge(features, None, control_prev)

    def copy(self) -> T2IAdapter:
        c = T2IAdapter(self.t2i_model)
        self.copy_to(c)
        return c


def apply_controlnet_advanced(
    unet: UnetPatcher, controlnet: ControlBase, image_bchw, strength, start_percent, end_percent
):
    """``backend/patcher/controlnet.py:11-83``: a copy of the controlnet on a clone of the UNet patcher."""
    cnet = controlnet.copy().set_cond_hint(image_bchw, strength, (start_percent, end_percent))
    m = unet.clone()
    m.add_patched_controlnet(cnet)
    return m


# --- the built-in token merging -------------------------------------------------------------------


def _tome_functions(x: torch.Tensor, ratio: float, original_shape):
    """``get_functions``: stride 2x2, max_downsample 1, ``no_rand=False``: the partition is drawn from the global
    RNG (Forge's ``torch.randint(..., device=metric.device)``; the global CPU generator here)."""
    _, _, original_h, original_w = original_shape
    downsample = math.ceil(math.sqrt(original_h * original_w // x.shape[1]))
    if downsample <= 1:
        w, h = math.ceil(original_w / downsample), math.ceil(original_h / downsample)
        r = int(x.shape[1] * ratio)
        return tomesd.merge.bipartite_soft_matching_random2d(x, w, h, 2, 2, r, False, torch.default_generator)
    return (lambda y: y), (lambda y: y)


class TomePatcher:
    """``backend/misc/tomesd.py:147-162``: q-only merging through an attn1 patch on a clone."""

    functions = staticmethod(_tome_functions)  # ``get_functions`` (a Forge variant may read options there)

    def __init__(self) -> None:
        self.u = None

    def patch(self, model: UnetPatcher, ratio: float) -> UnetPatcher:
        def tomesd_m(q, k, v, extra_options):
            m, self.u = self.functions(q, ratio, extra_options["original_shape"])
            return m(q), k, v

        def tomesd_u(n, extra_options):
            return self.u(n)

        m = model.clone()
        m.set_model_attn1_patch(tomesd_m)
        m.set_model_attn1_output_patch(tomesd_u)
        return m


# --- sampling ---------------------------------------------------------------------------------------


def calc_cond_uncond_batch(model: KModel, cond, uncond, x_in, timestep, model_options, control=None, extra=None):
    """One ``apply_model`` call for cond (and uncond unless skipped), as Forge batches them on a roomy device."""
    chunks = [(cond, COND)] + ([(uncond, UNCOND)] if uncond is not None else [])
    cond_or_uncond = [kind for _, kind in chunks]
    input_x = torch.cat([x_in] * len(chunks))
    timestep_ = torch.cat([timestep] * len(chunks))
    c: dict[str, Any] = {"c_crossattn": torch.cat([cc for cc, _ in chunks])}
    for key, value in (extra or {}).items():
        c[key] = torch.cat([value] * len(chunks))
    transformer_options = model_options.get("transformer_options", {}).copy()
    transformer_options["cond_or_uncond"] = cond_or_uncond[:]
    transformer_options["sigmas"] = timestep
    n = int(timestep.shape[0])  # compute_cond_mark / compute_cond_indices (l.129-151)
    transformer_options["cond_mark"] = torch.tensor([float(k) for k in cond_or_uncond for _ in range(n)])
    transformer_options["cond_indices"] = [
        i * n + j for i, k in enumerate(cond_or_uncond) if k == COND for j in range(n)
    ]
    transformer_options["uncond_indices"] = [
        i * n + j for i, k in enumerate(cond_or_uncond) if k == UNCOND for j in range(n)
    ]
    c["transformer_options"] = transformer_options
    if control is not None:
        pointer = control
        while pointer is not None:
            pointer.transformer_options = transformer_options
            pointer = pointer.previous_controlnet
        c["control"] = control.get_control(input_x, timestep_, dict(c), len(cond_or_uncond))
        c["control_model"] = control
    if "model_function_wrapper" in model_options:
        args = {"input": input_x, "timestep": timestep_, "c": c, "cond_or_uncond": cond_or_uncond}
        output = model_options["model_function_wrapper"](model.apply_model, args).chunk(len(chunks))
    else:
        output = model.apply_model(input_x, timestep_, **c).chunk(len(chunks))
    return output[0], (output[1] if uncond is not None else output[0])


class Conds:
    """What Forge's compiled conditions carry that the double's calls need: the cross-attention context, the
    control linked list, the engine's extra conds (SDXL's ``y``). ``calc_cond_uncond_batch(model, cond, uncond, x,
    sigma, model_options)`` takes these, as Forge's takes its compiled lists (post-CFG functions call it so)."""

    def __init__(self, context: torch.Tensor, control=None, extra: dict | None = None):
        self.context, self.control, self.extra = context, control, extra or {}


def calc_cond_uncond_batch_of(model: KModel, cond: Conds, uncond: Conds | None, x, timestep, model_options):
    """``calc_cond_uncond_batch`` as an extension calls it (SAG, PAG): compiled conds, the given ``model_options``."""
    return calc_cond_uncond_batch(
        model,
        cond.context,
        None if uncond is None else uncond.context,
        x,
        timestep,
        model_options,
        control=cond.control,
        extra=cond.extra,
    )


def sampling_function_inner(model, x, timestep, uncond, cond, cond_scale, model_options, seed=None):
    """``sampling_function.py:292-322``: CFG 1 drops the uncond unless ``disable_cfg1_optimization``; post-CFG
    functions (SAG, PAG) get the denoised result and may run the model again."""
    cfg1 = math.isclose(cond_scale, 1.0) and not model_options.get("disable_cfg1_optimization", False)
    cond_pred, uncond_pred = calc_cond_uncond_batch_of(
        model, cond, None if cfg1 else uncond, x, timestep, model_options
    )
    cfg_result = uncond_pred + (cond_pred - uncond_pred) * cond_scale
    for fn in model_options.get("sampler_post_cfg_function", []):
        args = {
            "denoised": cfg_result,
            "cond": cond,
            "uncond": uncond,
            "model": model,
            "uncond_denoised": uncond_pred,
            "cond_denoised": cond_pred,
            "sigma": timestep,
            "model_options": model_options,
            "input": x,
        }
        cfg_result = fn(args)
    return cfg_result, cond_pred, uncond_pred


def sampling_function(denoiser, denoiser_params, cond_scale: float):
    """``sampling_function`` (l.325-363): the patcher is read afresh from the engine each call; the conditioning
    modifiers (reference-only's extra pass) run first."""
    unet_patcher = denoiser.inner_model.inner_model.forge_objects.unet
    model, x, timestep = unet_patcher.model, denoiser_params.x, denoiser_params.sigma
    extra = getattr(denoiser.inner_model.inner_model, "extra_conds", lambda n: {})(x.shape[0])
    control = unet_patcher.controlnet_linked_list
    cond = Conds(denoiser_params.text_cond, control, extra)
    uncond = Conds(denoiser_params.text_uncond, control, extra)
    model_options, seed = unet_patcher.model_options, None
    for modifier in model_options.get("conditioning_modifiers", []):
        model, x, timestep, uncond, cond, cond_scale, model_options, seed = modifier(
            model, x, timestep, uncond, cond, cond_scale, model_options, seed
        )
    return sampling_function_inner(model, x, timestep, uncond, cond, cond_scale, model_options, seed)


_loaded: list[ModelPatcher] = []
"""The patcher whose object patches are on its model (``memory_management.current_loaded_models``)."""


def unload_model_clones(model: ModelPatcher) -> None:
    """``memory_management.unload_model_clones``: a loaded clone of the same model is unloaded (its object patches
    taken off)."""
    if _loaded and _loaded[0].model is model.model:
        _loaded.pop().forge_unpatch_model()


def sampling_prepare(unet: UnetPatcher, x: torch.Tensor) -> None:
    """``l.366-398``: ``load_models_gpu`` applies the patcher's object patches to the model, after the previous
    patcher's were taken off (the real one takes them off when it unloads a model: at the next load of another
    patcher, here too); then each ControlNet's ``pre_run``."""
    if not _loaded or _loaded[0] is not unet:
        if _loaded:
            _loaded.pop().forge_unpatch_model()
        unet.forge_patch_model()
        _loaded.append(unet)
    real_model = unet.model
    for cnet in unet.list_controlnets():
        cnet.pre_run(real_model, real_model.predictor.percent_to_sigma)


def sampling_cleanup(unet: UnetPatcher) -> None:
    for cnet in unet.list_controlnets():
        cnet.cleanup()


# --- engines ----------------------------------------------------------------------------------------


class ForgeObjects:
    def __init__(self, unet, clip, vae, clipvision):
        self.unet, self.clip, self.vae, self.clipvision = unet, clip, vae, clipvision

    def shallow_copy(self) -> ForgeObjects:
        return ForgeObjects(self.unet, self.clip, self.vae, self.clipvision)


class VaeDouble:
    latent_channels = 4


class ForgeDiffusionEngine:
    """A plain object (not an ``nn.Module``, no ``.model``): the UNet is ``forge_objects.unet.model.diffusion_model``."""

    # the WebUI double's text encoder and VAE stand-ins (they read nothing from the instance)
    get_learned_conditioning = TinySdModel.get_learned_conditioning
    decode_first_stage = TinySdModel.decode_first_stage
    encode_first_stage = TinySdModel.encode_first_stage
    get_first_stage_encoding = TinySdModel.get_first_stage_encoding
    # Forge's process_images_inner has no ``ema_scope``; the reused WebUI one enters it: a null context
    ema_scope = TinySdModel.ema_scope

    def __init__(self, diffusion_model: nn.Module, name: str):
        unet = UnetPatcher.from_model(diffusion_model)
        self.forge_objects = ForgeObjects(unet, None, VaeDouble(), None)
        self.forge_objects_original = self.forge_objects.shallow_copy()
        self.forge_objects_after_applying_lora = self.forge_objects.shallow_copy()
        self.current_lora_hash = str([])
        self.tiling_enabled = False
        self.first_stage_model = self.cond_stage_model = None
        self.is_sd1 = self.is_sd2 = self.is_sdxl = self.is_sd3 = False
        self.cond_stage_key = "txt"
        self.latent_channels = 4
        self.sd_checkpoint_info = CheckpointInfoDouble(name)
        self.filename = self.sd_checkpoint_info.filename
        self.sd_model_hash = self.sd_checkpoint_info.shorthash
        self.extra_generation_params: dict = {}
        self.comments: list = []

    @property
    def alphas_cumprod(self) -> torch.Tensor:
        return self.forge_objects.unet.model.predictor.alphas_cumprod


class StableDiffusion(ForgeDiffusionEngine):
    def __init__(self, diffusion_model: nn.Module, name: str = "forge-sd15"):
        super().__init__(diffusion_model, name)
        self.is_sd1 = True


class StableDiffusionXL(ForgeDiffusionEngine):
    def __init__(self, diffusion_model: nn.Module, name: str = "forge-sdxl"):
        super().__init__(diffusion_model, name)
        self.is_sdxl = True

    def extra_conds(self, batch: int) -> dict[str, torch.Tensor]:
        """The ``y`` (adm) vector, when the UNet takes one (``num_classes='sequential'``)."""
        config = getattr(self.forge_objects.unet.model.diffusion_model, "config", None) or {}
        adm = config.get("adm_in_channels")  # Forge's UNet keeps it only in its config (loader.py:164-167)
        return {"y": torch.zeros(batch, adm)} if adm else {}


class FluxLikeModel(nn.Module):
    """A diffusion model with no UNet transformer blocks and no block layout the step cache knows (as SD3, Qwen-Image)."""

    def __init__(self, channels: int = 4, context_dim: int = 32, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.img_in = nn.Conv2d(channels, 16, 3, padding=1)
        self.txt_in = nn.Linear(context_dim, 16)
        self.out = nn.Conv2d(16, channels, 3, padding=1)

    def forward(self, x, timestep, context=None, y=None, guidance=None, control=None, transformer_options={}, **kwargs):  # noqa: B006
        h = self.img_in(x) + self.txt_in(context).mean(dim=1)[:, :, None, None]
        return self.out(torch.tanh(h) * (1 + timestep[:, None, None, None] / 1000))


class IntegratedFluxTransformer2DModel(BflFlux):
    """Forge's FLUX (``backend/nn/flux.py:325-420``, ``inner_forward``): the loop of ComfyUI's without ControlNet
    residuals, ``patches_replace`` or wrappers; its blocks add out of place (``img = img + ...``), which changes
    nothing for the cache."""

    WRAPPERS = False


class Flux(ForgeDiffusionEngine):
    def __init__(self, diffusion_model: nn.Module | None = None, name: str = "forge-flux"):
        super().__init__(diffusion_model or IntegratedFluxTransformer2DModel(), name)


CONTROL_MODELS: dict[str, ControlBase] = {}
"""The loaded control models by name (Forge caches them with ``functools.lru_cache``: the same modules every time)."""
