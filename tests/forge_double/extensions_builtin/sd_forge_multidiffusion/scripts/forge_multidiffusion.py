"""Double of Forge's ``extensions-builtin/sd_forge_multidiffusion`` (dfdcbab: ``scripts/forge_multidiffusion.py``,
``lib_multidiffusion/tiled_diffusion.py``), from reading it.

``TiledDiffusion.apply`` (l.626-649) sets a UNet function wrapper on a clone: for each batch of overlapping tiles
(``split_bboxes``, l.92-110; sizes in pixels / 8, capped at the latent, overlap at the tile minus 4; batched as
``init_grid_bbox``, l.224-241) it calls the model on the tiles concatenated along the batch, ``c_crossattn`` (and
``y``) repeated, the rest of ``c`` (``transformer_options``) as it is, and averages the outputs by how many tiles
cover each latent pixel (``MultiDiffusion.__call__``, l.412-474). Mixture of Diffusers is left out (the same calls,
gaussian weights). Arguments as the real UI: enabled, method, tile_width (768), tile_height (768), tile_overlap
(64), tile_batch_size (4).
"""

import math

import torch
from forge_double.extensions_builtin._builtin import controls
from modules import scripts

calls: list[tuple[int, int, int]] = []
"""Test-only: ``(batch, h, w)`` of every model call the wrapper made."""


def split_bboxes(w, h, tile_w, tile_h, overlap):
    cols = math.ceil((w - overlap) / (tile_w - overlap))
    rows = math.ceil((h - overlap) / (tile_h - overlap))
    dx = (w - tile_w) / (cols - 1) if cols > 1 else 0
    dy = (h - tile_h) / (rows - 1) if rows > 1 else 0
    bboxes, weights = [], torch.zeros((1, 1, h, w))
    for row in range(rows):
        y = min(int(row * dy), h - tile_h)
        for col in range(cols):
            x = min(int(col * dx), w - tile_w)
            bbox = (slice(None), slice(None), slice(y, y + tile_h), slice(x, x + tile_w))
            bboxes.append(bbox)
            weights[bbox] += 1.0
    return bboxes, weights


class MultiDiffusion:
    def __init__(self, tile_width, tile_height, tile_overlap, tile_batch_size):
        self.tile_width, self.tile_height = tile_width, tile_height
        self.tile_overlap, self.tile_batch_size = tile_overlap, tile_batch_size
        self.h = self.w = None

    def init_grid_bbox(self):
        tile_w, tile_h = min(self.tile_width, self.w), min(self.tile_height, self.h)
        overlap = max(0, min(self.tile_overlap, min(self.tile_width, self.tile_height) - 4))
        bboxes, self.weights = split_bboxes(self.w, self.h, tile_w, tile_h, overlap)
        batches = math.ceil(len(bboxes) / self.tile_batch_size)
        size = math.ceil(len(bboxes) / batches)
        self.batched_bboxes = [bboxes[i * size : (i + 1) * size] for i in range(batches)]

    def __call__(self, model_function, args):
        x_in, t_in, c_in = args["input"], args["timestep"], args["c"]
        n, _, h, w = x_in.shape
        if (self.h, self.w) != (h, w):
            self.h, self.w = h, w
            self.init_grid_bbox()
        buffer = torch.zeros_like(x_in)
        for bboxes in self.batched_bboxes:
            x_tile = torch.cat([x_in[bbox] for bbox in bboxes], dim=0)
            k = len(bboxes)
            c_tile = c_in.copy()
            c_tile["c_crossattn"] = torch.cat([c_in["c_crossattn"]] * k)
            if "y" in c_tile:
                c_tile["y"] = torch.cat([c_in["y"]] * k)
            calls.append((x_tile.shape[0], x_tile.shape[2], x_tile.shape[3]))
            out = model_function(x_tile, torch.cat([t_in] * k), **c_tile)
            for i, bbox in enumerate(bboxes):
                buffer[bbox] += out[i * n : (i + 1) * n]
        return torch.where(self.weights > 1, buffer / self.weights, buffer)


class MultiDiffusionForForge(scripts.Script):
    def title(self):
        return "MultiDiffusion Integrated"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return controls(False, "MultiDiffusion", 768, 768, 64, 4)

    def process_before_every_sampling(self, p, *script_args, **kwargs):
        enabled, method, tile_width, tile_height, tile_overlap, tile_batch_size = script_args
        if not enabled:
            return
        implement = MultiDiffusion(
            int(tile_width) // 8, int(tile_height) // 8, int(tile_overlap) // 8, int(tile_batch_size)
        )
        unet = p.sd_model.forge_objects.unet.clone()
        unet.set_model_unet_function_wrapper(implement)
        unet.model_options["tiled_diffusion"] = True
        p.sd_model.forge_objects.unet = unet
        p.extra_generation_params.update(multidiffusion_enabled=enabled, multidiffusion_method=method)
