"""Double of pkuliyi2015/multidiffusion-upscaler-for-automatic1111 ("Tiled Diffusion", 22798f6), its UNet tiling,
written from reading ``scripts/tilediffusion.py``, ``tile_methods/{abstractdiffusion,multidiffusion,
mixtureofdiffusers}.py`` and ``tile_utils/utils.py``; line numbers are the real files'.

``process`` replaces ``sd_samplers.create_sampler`` (tilediffusion.py l.365-368); the replacement creates the sampler
and hooks a delegate into it (l.410-484), ``postprocess`` puts it back (l.580-589). The delegate splits the latent
into overlapping tiles (``split_bboxes``, utils.py l.160-177; tile size capped at the latent, overlap at the tile
minus 4, abstractdiffusion.py l.173-188) in batches of ``tile_batch_size`` and calls the model on each batch of
tiles concatenated along the batch (``torch.cat([x_in[bbox.slicer] for bbox in bboxes])``), accumulating the outputs
in a buffer: **MultiDiffusion** replaces the sampler's ``model_wrap_cfg.inner_model.forward`` (multidiffusion.py
l.15-29, 131-167) and averages by the tiles' counts; **Mixture of Diffusers** replaces ``sd_model.apply_model``
(mixtureofdiffusers.py l.18-21, 61-120) and blends with gaussian weights. A latent of another size (the hires pass)
is not tiled (l.141-144). Arguments (latent units): enabled, method, tile_width, tile_height, overlap,
tile_batch_size. Left out: custom regions, noise inversion, ControlNet/StableSR tiling, Tiled VAE.
"""

import math

import gradio as gr
import torch
from modules import scripts, sd_samplers, shared

calls: list[tuple[int, int, int]] = []
"""Test-only: ``(batch, h, w)`` of every model call a delegate made."""


def split_bboxes(w, h, tile_w, tile_h, overlap, init_weight):
    cols = math.ceil((w - overlap) / (tile_w - overlap))
    rows = math.ceil((h - overlap) / (tile_h - overlap))
    dx = (w - tile_w) / (cols - 1) if cols > 1 else 0
    dy = (h - tile_h) / (rows - 1) if rows > 1 else 0
    bboxes, weight = [], torch.zeros((1, 1, h, w))
    for row in range(rows):
        y = min(int(row * dy), h - tile_h)
        for col in range(cols):
            x = min(int(col * dx), w - tile_w)
            bbox = (slice(None), slice(None), slice(y, y + tile_h), slice(x, x + tile_w))
            bboxes.append(bbox)
            weight[bbox] += init_weight
    return bboxes, weight


def gaussian_weights(tile_w, tile_h):
    def f(x, midpoint, var=0.01):
        return math.exp(-(x - midpoint) * (x - midpoint) / (tile_w * tile_w) / (2 * var)) / math.sqrt(2 * math.pi * var)

    x_probs = [f(x, (tile_w - 1) / 2) for x in range(tile_w)]
    y_probs = [f(y, tile_h / 2) for y in range(tile_h)]
    return torch.tensor([[y * x for x in x_probs] for y in y_probs], dtype=torch.float32)


class Delegate:
    def __init__(self, p, sampler, tile_w, tile_h, overlap, tile_bs, gaussian):
        self.p, self.sampler = p, sampler
        self.h, self.w = p.height // 8, p.width // 8
        self.tile_w, self.tile_h = min(tile_w, self.w), min(tile_h, self.h)
        overlap = max(0, min(overlap, min(tile_w, tile_h) - 4))
        self.tile_weights = gaussian_weights(self.tile_w, self.tile_h) if gaussian else 1.0
        bboxes, self.weights = split_bboxes(self.w, self.h, self.tile_w, self.tile_h, overlap, self.tile_weights)
        batches = math.ceil(len(bboxes) / tile_bs)
        size = math.ceil(len(bboxes) / batches)
        self.batched_bboxes = [bboxes[i * size : (i + 1) * size] for i in range(batches)]

    def tiles(self, x_in, run):
        """Each batch of tiles through ``run(x_tile, n_tiles)``; the outputs accumulated per tile (weighted)."""
        n = x_in.shape[0]
        buffer = torch.zeros_like(x_in)
        for bboxes in self.batched_bboxes:
            x_tile = torch.cat([x_in[bbox] for bbox in bboxes], dim=0)
            calls.append((x_tile.shape[0], x_tile.shape[2], x_tile.shape[3]))
            out = run(x_tile, len(bboxes))
            for i, bbox in enumerate(bboxes):
                buffer[bbox] += out[i * n : (i + 1) * n] * self.weight_of(bbox)
        return buffer

    def weight_of(self, bbox):
        return 1.0


class MultiDiffusion(Delegate):
    def hook(self):
        inner = self.sampler.model_wrap_cfg.inner_model
        self.sampler_forward = inner.forward
        inner.forward = self.kdiff_forward

    def kdiff_forward(self, x_in, sigma_in, cond):
        if tuple(x_in.shape[2:]) != (self.h, self.w):
            return self.sampler_forward(x_in, sigma_in, cond=cond)

        def run(x_tile, k):
            cond_tile = {key: [torch.cat([v] * k) for v in value] for key, value in cond.items()}
            return self.sampler_forward(x_tile, torch.cat([sigma_in] * k), cond=cond_tile)

        buffer = self.tiles(x_in, run)
        return torch.where(self.weights > 1, buffer / self.weights, buffer)


class MixtureOfDiffusers(Delegate):
    def hook(self):
        model = shared.sd_model
        if "apply_model_original_md" not in model.__dict__:
            model.apply_model_original_md = model.apply_model
        model.apply_model = self.apply_model_hijack
        self.rescale_factor = 1 / self.weights

    @staticmethod
    def unhook():
        model = shared.sd_model
        if model is not None and "apply_model_original_md" in model.__dict__:
            del model.__dict__["apply_model"]
            del model.__dict__["apply_model_original_md"]

    def weight_of(self, bbox):
        return self.tile_weights * self.rescale_factor[bbox]

    def apply_model_hijack(self, x_in, t_in, cond):
        original = shared.sd_model.apply_model_original_md
        if tuple(x_in.shape[2:]) != (self.h, self.w):
            return original(x_in, t_in, cond)

        def run(x_tile, k):
            cond_tile = {key: [torch.cat([v] * k) for v in value] for key, value in cond.items()}
            return original(x_tile, torch.cat([t_in] * k), cond_tile)

        return self.tiles(x_in, run)


class Script(scripts.Script):
    def title(self):
        return "Tiled Diffusion"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, is_img2img):
        defaults = (False, "MultiDiffusion", 96, 96, 48, 4)
        return [
            gr.Textbox(value=v, visible=False) if isinstance(v, str) else gr.Number(value=v, visible=False)
            for v in defaults
        ]

    def process(self, p, enabled, method, tile_width, tile_height, overlap, tile_batch_size):
        self.reset()
        if not enabled:
            return
        original = sd_samplers.create_sampler
        Script.create_sampler_original_md = original
        cls = MixtureOfDiffusers if method == "Mixture of Diffusers" else MultiDiffusion

        def create_sampler(name, model):
            sampler = original(name, model)
            delegate = cls(
                p,
                sampler,
                int(tile_width),
                int(tile_height),
                int(overlap),
                int(tile_batch_size),
                cls is MixtureOfDiffusers,
            )
            delegate.hook()
            return sampler

        sd_samplers.create_sampler = create_sampler
        p.extra_generation_params["Tiled Diffusion"] = {"Method": method, "Tile tile width": tile_width}

    def postprocess(self, p, processed, *args):
        self.reset()

    def reset(self):
        if hasattr(Script, "create_sampler_original_md"):
            sd_samplers.create_sampler = Script.create_sampler_original_md
            del Script.create_sampler_original_md
        MixtureOfDiffusers.unhook()
