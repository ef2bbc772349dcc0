"""Double of Forge's ControlNet-LLLite (``extensions-builtin/sd_forge_controlllite``, dfdcbab:
``lib_controllllite/lib_controllllite.py``, ``scripts/forge_controllllite.py``), from reading it.

The real one is a ControlNet model patcher run by a ControlNet unit; here a script stands for that unit and calls
``LLLiteLoader.load_lllite`` (l.262-272): one ``attn1_patch`` and one ``attn2_patch`` on a clone, which map the
block (``extra_options["block"]``, ``block_index``) to its LLLite modules (l.5-25) and add ``module(q)`` (and to
``k``, ``v`` for self-attention) before the attention (l.86-106). An ``LLLiteModule`` (l.116-237) embeds the control
image once as ``h * w`` tokens of the block's grid and concatenates it with ``down(x)``: ``x`` must have all the
block's tokens. Here the top level of an SD1.5-layout UNet (input 1-2, output 9-11) has modules for attn1's
``to_q``/``to_k``/``to_v``, random weights, depth 1 (the embedding is at 1/8 of the image); attn2's ``to_q`` module
and the ``attn2_patch`` are left out: the tests' tiny UNet has a context as wide as its top level, so LLLite's own
attn1/attn2 test (``q.shape[-1] == k.shape[-1]``) could not tell them apart. Arguments: enabled, strength (1.0),
image (3 x H x W).
"""

import torch
from forge_double.extensions_builtin._builtin import controls
from modules import scripts
from torch import nn

calls: list[tuple[int, int]] = []
"""Test-only: ``(tokens of x, tokens of the embedding)`` of every LLLite module call."""


def module_prefix(extra_options):
    block, index = extra_options["block"], extra_options["block_index"]
    if block[0] == "input":
        return f"lllite_unet_input_blocks_{block[1]}_1_transformer_blocks_{index}"
    if block[0] == "middle":
        return f"lllite_unet_middle_block_1_transformer_blocks_{index}"
    return f"lllite_unet_output_blocks_{block[1]}_1_transformer_blocks_{index}"


class LLLiteModule(nn.Module):
    def __init__(self, in_dim, cond_emb_dim=16, mlp_dim=16, multiplier=1.0, seed=0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.conditioning1 = nn.Sequential(
                nn.Conv2d(3, cond_emb_dim // 2, 4, stride=4),
                nn.ReLU(),
                nn.Conv2d(cond_emb_dim // 2, cond_emb_dim, 2, stride=2),
            )
            self.down = nn.Sequential(nn.Linear(in_dim, mlp_dim), nn.ReLU())
            self.mid = nn.Sequential(nn.Linear(mlp_dim + cond_emb_dim, mlp_dim), nn.ReLU())
            self.up = nn.Sequential(nn.Linear(mlp_dim, in_dim))
        self.multiplier = multiplier
        self.cond_image = self.cond_emb = None

    def forward(self, x):
        if self.cond_emb is None:
            cx = self.conditioning1(self.cond_image.to(x))
            n, c, h, w = cx.shape
            self.cond_emb = cx.view(n, c, h * w).permute(0, 2, 1)
        cx = self.cond_emb
        if x.shape[0] != cx.shape[0]:
            cx = cx.repeat(x.shape[0] // cx.shape[0], 1, 1)
        calls.append((x.shape[1], cx.shape[1]))
        return self.up(self.mid(torch.cat([cx, self.down(x)], dim=2))) * self.multiplier


def load_lllite(unet, cond_image, strength):
    modules = {}
    names = [("input", i) for i in (1, 2)] + [("output", i) for i in (9, 10, 11)]
    dim = unet.model.diffusion_model.config["model_channels"]
    for seed, (root, index) in enumerate(names):
        prefix = module_prefix({"block": (root, index), "block_index": 0})
        for suffix in ("_attn1_to_q", "_attn1_to_k", "_attn1_to_v"):
            module = LLLiteModule(dim, multiplier=strength, seed=seed * 3 + len(modules) % 3)
            module.cond_image = cond_image * 2.0 - 1.0
            modules[prefix + suffix] = module

    def patch(q, k, v, extra_options):
        prefix = module_prefix(extra_options) + ("_attn1" if q.shape[-1] == k.shape[-1] else "_attn2")
        if prefix + "_to_q" in modules:
            q = q + modules[prefix + "_to_q"](q)
        if prefix + "_to_k" in modules:
            k = k + modules[prefix + "_to_k"](k)
        if prefix + "_to_v" in modules:
            v = v + modules[prefix + "_to_v"](v)
        return q, k, v

    m = unet.clone()
    m.set_model_attn1_patch(patch)
    return m


class ControlLLLiteUnit(scripts.Script):
    def title(self):
        return "ControlLLLite (ControlNet unit)"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return [*controls(False, 1.0), controls(False)[0]]

    def process_before_every_sampling(self, p, enabled, strength, image, **kwargs):
        if enabled:
            p.sd_model.forge_objects.unet = load_lllite(p.sd_model.forge_objects.unet, image[None], strength)
