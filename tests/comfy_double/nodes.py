"""ComfyUI's ``nodes.py`` (3cd7b32f): the built-in nodes a txt2img / img2img / ControlNet / LoRA graph uses, the
node registry and the custom-node loader.

- ``load_custom_node(module_path, ignore)`` (l.2135-2191): the folder's ``__init__.py`` is imported as a package under
  a name made from its path (``spec_from_file_location`` + ``module_from_spec``, registered in ``sys.modules``), then
  its ``NODE_CLASS_MAPPINGS`` are added except names in ``ignore`` (the built-ins: a custom node cannot take a
  built-in's name, l.2186), and ``NODE_DISPLAY_NAME_MAPPINGS``. An import error is logged and the node skipped
  (l.2225-2227). ComfyUI's ``sys.path`` does not hold the folder.
- ``common_ksampler`` (l.1493-1514): the noise from ``comfy.sample.prepare_noise`` (``torch.manual_seed(seed)``: the
  global generator), a progress callback per step (the real one updates the progress bar; the interrupt is thrown
  from ComfyUI's ops, ``comfy/ops.py:27-31``, which the tests stand for by raising inside the UNet), ``sample``.
- ``KSampler`` / ``KSamplerAdvanced`` (l.1516-1590), ``EmptyLatentImage``, ``ControlNetApplyAdvanced`` (l.870-917),
  ``LoraLoaderModelOnly`` (l.698-703: ``load_lora_for_models`` -> a clone with weight patches).
- Stand-ins: ``CheckpointLoaderSimple`` returns the MODEL of a checkpoint the test registered
  (:data:`CHECKPOINTS`), a CLIP whose ``CLIPTextEncode`` gives a context tensor seeded from the text, no VAE; a LoRA
  is a dict of weight differences (:data:`LORAS`), a ControlNet a control model (:data:`CONTROLNETS`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import zlib
from collections.abc import Callable

import torch
from comfy import model_management, model_patcher, samplers
from comfy.controlnet import ControlNet, hint_from_image
from comfy_extras import speedups

CHECKPOINTS: dict[str, Callable[[], model_patcher.ModelPatcher]] = {}
CONTROLNETS: dict[str, ControlNet] = {}
LORAS: dict[str, dict[str, torch.Tensor]] = {}
CONTEXT = (7, 32)  # tokens and width of the stand-in text encoder's context (the tiny models' context_dim)


class _Clip:
    def encode(self, text: str) -> torch.Tensor:
        gen = torch.Generator().manual_seed(zlib.crc32(text.encode()))
        return torch.randn(1, *CONTEXT, generator=gen)


class CheckpointLoaderSimple:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"ckpt_name": (sorted(CHECKPOINTS),)}}

    RETURN_TYPES = ("MODEL", "CLIP", "VAE")
    FUNCTION = "load_checkpoint"

    def load_checkpoint(self, ckpt_name):
        return CHECKPOINTS[ckpt_name](), _Clip(), None


class CLIPTextEncode:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"multiline": True}), "clip": ("CLIP",)}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "encode"

    def encode(self, clip, text):
        return ([[clip.encode(text), {}]],)


class EmptyHunyuanLatentVideo:
    """``comfy_extras/nodes_hunyuan.py:40-60``: the video latent Wan samples, 16 channels, ``(length - 1) // 4 + 1``
    frames."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "width": ("INT", {"default": 848, "min": 16, "max": 16384, "step": 16}),
                "height": ("INT", {"default": 480, "min": 16, "max": 16384, "step": 16}),
                "length": ("INT", {"default": 25, "min": 1, "max": 16384, "step": 4}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 4096}),
            }
        }

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "generate"

    def generate(self, width, height, length, batch_size=1):
        return ({"samples": torch.zeros([batch_size, 16, (length - 1) // 4 + 1, height // 8, width // 8])},)


class EmptyLatentImage:
    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "width": ("INT", {"default": 512, "min": 16, "max": 16384, "step": 8}),
                "height": ("INT", {"default": 512, "min": 16, "max": 16384, "step": 8}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 4096}),
            }
        }

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "generate"

    def generate(self, width, height, batch_size=1):
        return ({"samples": torch.zeros([batch_size, 4, height // 8, width // 8])},)


def prepare_noise(latent_image: torch.Tensor, seed: int) -> torch.Tensor:
    generator = torch.manual_seed(seed)
    return torch.randn(latent_image.size(), dtype=latent_image.dtype, generator=generator, device="cpu")


def common_ksampler(
    model,
    seed,
    steps,
    cfg,
    sampler_name,
    scheduler,
    positive,
    negative,
    latent,
    denoise=1.0,
    disable_noise=False,
    start_step=None,
    last_step=None,
    force_full_denoise=False,
):
    latent_image = latent["samples"]
    noise = torch.zeros_like(latent_image) if disable_noise else prepare_noise(latent_image, seed)

    def callback(step, x0, x, total_steps):
        model_management.throw_exception_if_processing_interrupted()

    sampler = samplers.KSampler(model, steps, sampler_name, scheduler, denoise, model.model_options)
    samples = sampler.sample(
        noise,
        positive,
        negative,
        cfg,
        latent_image,
        start_step,
        last_step,
        force_full_denoise,
        callback=callback,
        seed=seed,
    )
    return ({**latent, "samples": samples},)


_SAMPLING = {
    "model": ("MODEL",),
    "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True}),
    "steps": ("INT", {"default": 20, "min": 1, "max": 10000}),
    "cfg": ("FLOAT", {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01}),
    "sampler_name": (list(samplers.SAMPLERS),),
    "scheduler": (["normal"],),
    "positive": ("CONDITIONING",),
    "negative": ("CONDITIONING",),
    "latent_image": ("LATENT",),
}


class KSampler:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {**_SAMPLING, "denoise": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "sample"

    def sample(self, model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image, denoise=1.0):
        return common_ksampler(
            model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image, denoise
        )


class KSamplerAdvanced:
    @classmethod
    def INPUT_TYPES(cls):
        sampling = {k: v for k, v in _SAMPLING.items() if k != "seed"}
        return {
            "required": {
                "add_noise": (["enable", "disable"],),
                "noise_seed": _SAMPLING["seed"],
                **sampling,
                "start_at_step": ("INT", {"default": 0, "min": 0, "max": 10000}),
                "end_at_step": ("INT", {"default": 10000, "min": 0, "max": 10000}),
                "return_with_leftover_noise": (["disable", "enable"],),
            }
        }

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "sample"

    def sample(
        self,
        model,
        add_noise,
        noise_seed,
        steps,
        cfg,
        sampler_name,
        scheduler,
        positive,
        negative,
        latent_image,
        start_at_step,
        end_at_step,
        return_with_leftover_noise,
        denoise=1.0,
    ):
        return common_ksampler(
            model,
            noise_seed,
            steps,
            cfg,
            sampler_name,
            scheduler,
            positive,
            negative,
            latent_image,
            denoise=denoise,
            disable_noise=add_noise == "disable",
            start_step=start_at_step,
            last_step=end_at_step,
            force_full_denoise=return_with_leftover_noise != "enable",
        )


class ControlNetLoader:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"control_net_name": (sorted(CONTROLNETS),)}}

    RETURN_TYPES = ("CONTROL_NET",)
    FUNCTION = "load_controlnet"

    def load_controlnet(self, control_net_name):
        return (CONTROLNETS[control_net_name],)


class ControlNetApplyAdvanced:
    @classmethod
    def INPUT_TYPES(cls):
        percent = {"min": 0.0, "max": 1.0, "step": 0.001}
        return {
            "required": {
                "positive": ("CONDITIONING",),
                "negative": ("CONDITIONING",),
                "control_net": ("CONTROL_NET",),
                "image": ("IMAGE",),
                "strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 10.0, "step": 0.01}),
                "start_percent": ("FLOAT", {"default": 0.0, **percent}),
                "end_percent": ("FLOAT", {"default": 1.0, **percent}),
            }
        }

    RETURN_TYPES = ("CONDITIONING", "CONDITIONING")
    FUNCTION = "apply_controlnet"

    def apply_controlnet(self, positive, negative, control_net, image, strength, start_percent, end_percent):
        if strength == 0:
            return positive, negative
        control_hint, cnets, out = hint_from_image(image), {}, []
        for conditioning in (positive, negative):
            c = []
            for t in conditioning:
                d = t[1].copy()
                prev = d.get("control")
                if prev not in cnets:
                    cnets[prev] = control_net.copy().set_cond_hint(control_hint, strength, (start_percent, end_percent))
                    cnets[prev].set_previous_controlnet(prev)
                d["control"], d["control_apply_to_uncond"] = cnets[prev], False
                c.append([t[0], d])
            out.append(c)
        return out[0], out[1]


class LoraLoaderModelOnly:
    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("MODEL",),
                "lora_name": (sorted(LORAS),),
                "strength_model": ("FLOAT", {"default": 1.0, "min": -100.0, "max": 100.0, "step": 0.01}),
            }
        }

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load_lora_model_only"

    def load_lora_model_only(self, model, lora_name, strength_model):
        patched = model.clone()
        patched.add_patches({k: ("diff", (v,)) for k, v in LORAS[lora_name].items()}, strength_model)
        return (patched,)


BUILTIN = (
    CheckpointLoaderSimple,
    CLIPTextEncode,
    EmptyLatentImage,
    EmptyHunyuanLatentVideo,
    KSampler,
    KSamplerAdvanced,
    ControlNetLoader,
    ControlNetApplyAdvanced,
    LoraLoaderModelOnly,
)
NODE_CLASS_MAPPINGS: dict[str, type] = {}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {}


def init_builtin_nodes() -> None:
    """The registry as a fresh start leaves it: the built-in nodes and the extras, no custom node."""
    NODE_CLASS_MAPPINGS.clear()
    NODE_DISPLAY_NAME_MAPPINGS.clear()
    NODE_CLASS_MAPPINGS.update({cls.__name__: cls for cls in BUILTIN}, **speedups.NODE_CLASS_MAPPINGS)


def load_custom_node(module_path: str, ignore=frozenset()) -> bool:
    sys_module_name = module_path.replace(".", "_x_")
    try:
        spec = importlib.util.spec_from_file_location(sys_module_name, os.path.join(module_path, "__init__.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[sys_module_name] = module
        spec.loader.exec_module(module)
    except Exception:
        logging.warning(f"Cannot import {module_path} module for custom nodes:", exc_info=True)
        return False
    for name, node_cls in getattr(module, "NODE_CLASS_MAPPINGS", {}).items():
        if name not in ignore:
            NODE_CLASS_MAPPINGS[name] = node_cls
    NODE_DISPLAY_NAME_MAPPINGS.update(getattr(module, "NODE_DISPLAY_NAME_MAPPINGS", {}) or {})
    return True
