"""Start the ComfyUI double with this repository as a custom node, and run prompts (API-format workflows) in it.

    import comfy_harness as ch
    ch.start(repo_root)                                      # built-ins, then custom_nodes/<repo>
    out = ch.run(ch.txt2img("sd15", patches=[("ToMe", {"ratio": 0.5})]))
    latent = out["5"][0]["samples"]                           # node "5" is the KSampler

Checkpoints are the tests' tiny ldm UNets in ComfyUI's layout, one ``BaseModel`` each for the whole session (ComfyUI
caches loaded models: every prompt and every clone shares its modules), so anything a prompt leaves on a UNet is
still there at the next one.
"""

from __future__ import annotations

import functools

import controlnet_double
import execution
import nodes
import server
import tiny_models
import torch
from bfl_flux_double import Flux as BflFluxDouble
from comfy import model_management
from comfy.controlnet import ControlNet
from comfy.ldm import controlnet_from_ldm, unet_from_ldm
from comfy.model_base import WAN21, BaseModel, Flux
from comfy.model_patcher import ModelPatcher
from forge_double.backend import FluxLikeModel
from wan_double import WanModel as WanDouble


@functools.cache
def base_model(kind: str) -> BaseModel:
    """``sd15``, ``sdxl`` (the tiny ldm UNets of seed 0 in ComfyUI's layout), ``sd15b`` (seed 1: another checkpoint, the
    refiner), ``flux`` (a model without UNet transformer blocks: no family knows it) or ``flux1`` (FLUX in Black Forest
    Labs' layout, ``tests/bfl_flux_double.py``, on the flow-matching schedule), ``wan`` / ``wan_low`` (Wan,
    ``tests/wan_double.py``, on the discrete-flow schedule: two checkpoints, as Wan 2.2's two experts)."""
    if kind == "flux":
        return BaseModel(FluxLikeModel(context_dim=nodes.CONTEXT[1]))
    if kind == "flux1":
        return Flux(BflFluxDouble(context_dim=nodes.CONTEXT[1]).requires_grad_(False))
    if kind in ("wan", "wan_low"):  # Wan 2.2's two experts: the high-noise and the low-noise model
        return WAN21(WanDouble(in_dim=16, text_dim=nodes.CONTEXT[1], seed=int(kind == "wan_low")).requires_grad_(False))
    make = tiny_models.make_tiny_sdxl_unet if kind == "sdxl" else tiny_models.make_tiny_sd15_unet
    return BaseModel(unet_from_ldm(make(1 if kind == "sd15b" else 0)))


@functools.cache
def control_model() -> torch.nn.Module:
    return controlnet_from_ldm(controlnet_double.make_control_net().control_model)


def start(*custom_nodes: str) -> None:
    """A fresh start: the built-in nodes, the checkpoints, a ControlNet and a LoRA each for SD1.5 and FLUX, then each
    custom node folder."""
    nodes.init_builtin_nodes()
    server.PromptServer()  # main.py starts the server before it loads the nodes
    model_management.unload_all_models()
    model_management.interrupt_current_processing(False)
    for kind in ("sd15", "sd15b", "sdxl", "flux", "flux1", "wan", "wan_low"):
        nodes.CHECKPOINTS[kind] = lambda kind=kind: ModelPatcher(base_model(kind))
    nodes.CONTROLNETS["control"] = ControlNet(control_model())
    unet = base_model("sd15").diffusion_model
    gen = torch.Generator().manual_seed(5)
    nodes.LORAS["lora"] = {
        f"diffusion_model.{name}": 0.05 * torch.randn(p.shape, generator=gen)
        for name, p in unet.named_parameters()
        if name.endswith(("attn1.to_q.weight", "attn2.to_k.weight"))
    }
    flux = base_model("flux1").diffusion_model
    nodes.LORAS["flux_lora"] = {
        f"diffusion_model.{name}": 0.05 * torch.randn(p.shape, generator=gen)
        for name, p in flux.named_parameters()
        if name.endswith(("img_attn.qkv.weight", "linear1.weight"))
    }
    builtin = set(nodes.NODE_CLASS_MAPPINGS)
    for path in custom_nodes:
        nodes.load_custom_node(path, ignore=builtin)


def run(prompt: dict) -> dict[str, tuple]:
    return execution.execute(prompt)


def txt2img(
    ckpt: str = "sd15",
    patches=(),
    *,
    width=128,
    height=128,
    steps=4,
    cfg=7.0,
    sampler="euler",
    seed=1,
    batch_size=1,
    denoise=1.0,
    control_image: torch.Tensor | None = None,
    latent: torch.Tensor | None = None,
    sampler_id: str = "5",
    length: int | None = None,
) -> dict:
    """CheckpointLoaderSimple -> CLIPTextEncode x2 (-> ControlNetApplyAdvanced) -> (EmptyLatentImage) -> KSampler, with
    ``patches`` ((class_type, inputs) MODEL -> MODEL nodes, ids "10", "11", ...) between the checkpoint and the sampler.
    Ids as the harness's ``comfy_api.txt2img_workflow``: "1" checkpoint, "2"/"3" prompts, "4" latent, "5" sampler."""
    wf = {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a photo of a cat", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": width, "height": height, "batch_size": batch_size}},
    }
    if length is not None:  # a video latent
        wf["4"] = {
            "class_type": "EmptyHunyuanLatentVideo",
            "inputs": {"width": width, "height": height, "length": length, "batch_size": batch_size},
        }
    positive, negative = ["2", 0], ["3", 0]
    if control_image is not None:
        wf["8"] = {"class_type": "ControlNetLoader", "inputs": {"control_net_name": "control"}}
        wf["9"] = {
            "class_type": "ControlNetApplyAdvanced",
            "inputs": {
                "positive": positive,
                "negative": negative,
                "control_net": ["8", 0],
                "image": control_image,
                "strength": 1.0,
                "start_percent": 0.0,
                "end_percent": 1.0,
            },
        }
        positive, negative = ["9", 0], ["9", 1]
    model = ["1", 0]
    for i, (class_type, inputs) in enumerate(patches):
        wf[str(10 + i)] = {"class_type": class_type, "inputs": {**inputs, "model": model}}
        model = [str(10 + i), 0]
    latent_in = ["4", 0]
    if latent is not None:
        wf["4"] = {"class_type": "_Latent", "inputs": {}}
        nodes.NODE_CLASS_MAPPINGS["_Latent"] = _latent_node(latent)
    wf[sampler_id] = {
        "class_type": "KSampler",
        "inputs": {
            "model": model,
            "seed": seed,
            "steps": steps,
            "cfg": cfg,
            "sampler_name": sampler,
            "scheduler": "normal",
            "positive": positive,
            "negative": negative,
            "latent_image": latent_in,
            "denoise": denoise,
        },
    }
    return wf


def _latent_node(latent: torch.Tensor):
    class _Latent:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {}}

        RETURN_TYPES = ("LATENT",)
        FUNCTION = "load"

        def load(self):
            return ({"samples": latent.clone()},)

    return _Latent


def samples(outputs: dict, node_id: str = "5") -> torch.Tensor:
    """The LATENT a sampler node returned."""
    return outputs[node_id][0]["samples"]
