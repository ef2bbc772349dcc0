"""Tiny but real ldm UNets and a LatentDiffusion-like model for the WebUI double.

- ``make_tiny_sd15_unet(seed)``: ``ldm.modules.diffusionmodules.openaimodel.UNetModel`` with the SD1.5 layout
  (channel_mult [1,2,4,4], attention_resolutions [4,2,1], num_res_blocks 2, one transformer per block, conv
  proj_in/proj_out) but model_channels 32, num_heads 8, context_dim 32. Block names match SD1.5
  (input_blocks.1.1.transformer_blocks.0 ... output_blocks.11.1...).
- ``make_tiny_sdxl_unet(seed)``: SDXL-like layout (channel_mult [1,2,4], transformers only at downsample 2 and 4,
  transformer_depth 2, linear proj_in/proj_out). The WebUI runs SDXL with ``sgm``; this ldm version cannot feed
  one context to a depth-2 SpatialTransformer, so such blocks get a subclass (still named SpatialTransformer)
  that reuses the single context for every block like sgm does. No ``y``/adm input.
- The zero-initialised output layers (ldm ``zero_module``: SpatialTransformer.proj_out, ResBlock
  out_layers[-1], UNet out[-1]) are re-initialised with small random values, otherwise every transformer
  block would add exactly nothing.
- ``install_unet_cat_hijack()`` reproduces modules/sd_hijack_unet.py ``TorchHijackForUnet`` (~L10-36, installed
  by modules/sd_hijack.py ~L70): openaimodel's ``th.cat`` resizes the upsampled tensor to the skip connection
  so latents of any size (multiples of 8 px) work.
- ``TinySdModel``: ``.model.diffusion_model`` (through a DiffusionWrapper like ldm's ddpm.DiffusionWrapper
  ~L1310-1349, crossattn branch), SD's scaled-linear ``alphas_cumprod``, ``apply_model``, a deterministic
  prompt -> context "text encoder", and a fake VAE (decode = nearest x8 upsample of 3 latent channels).
"""

import zlib

import torch
from models import install_unet_cat_hijack, make_unet

__all__ = ["install_unet_cat_hijack", "make_tiny_sd15_unet", "make_tiny_sdxl_unet"]

CONTEXT_DIM = 32
TOKENS = 77


def make_tiny_sd15_unet(seed=0, *, model_channels=32, num_res_blocks=2):
    return make_unet("sd15", model_channels, seed, CONTEXT_DIM, num_res_blocks=num_res_blocks, num_heads=8)


def make_tiny_sdxl_unet(seed=0, *, model_channels=32, num_res_blocks=2):
    return make_unet("sdxl", model_channels, seed, CONTEXT_DIM, num_res_blocks=num_res_blocks, num_head_channels=8)


class DiffusionWrapper(torch.nn.Module):
    """Like ldm.models.diffusion.ddpm.DiffusionWrapper with conditioning_key 'crossattn'."""

    def __init__(self, diffusion_model, conditioning_key="crossattn"):
        super().__init__()
        self.diffusion_model = diffusion_model
        self.conditioning_key = conditioning_key

    def forward(self, x, t, c_concat=None, c_crossattn=None, c_adm=None):
        cc = torch.cat(c_crossattn, 1)
        return self.diffusion_model(x, t, context=cc)


class CheckpointInfoDouble:
    def __init__(self, name):
        self.name = name
        self.name_for_extra = name
        self.model_name = name
        self.title = f"{name} [0000000000]"
        self.short_title = name
        self.filename = f"/models/Stable-diffusion/{name}.safetensors"
        self.hash = "00000000"
        self.shorthash = "0000000000"


class TinySdModel(torch.nn.Module):
    """LatentDiffusion-like model wrapping a (tiny) ldm UNet."""

    def __init__(self, unet, *, kind="sd1", name="tiny-sd15"):
        super().__init__()
        self.model = DiffusionWrapper(unet)
        self.parameterization = "eps"
        self.cond_stage_key = "txt"
        self.latent_channels = 4
        self.is_sd1 = kind == "sd1"
        self.is_sd2 = kind == "sd2"
        self.is_sdxl = kind == "sdxl"
        self.is_ssd = False
        self.is_sd3 = False
        self.is_sdxl_inpaint = False
        self.sd_checkpoint_info = CheckpointInfoDouble(name)
        self.sd_model_checkpoint = self.sd_checkpoint_info.filename
        self.sd_model_hash = self.sd_checkpoint_info.shorthash
        self.lowvram = False
        betas = torch.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=torch.float64) ** 2
        self.register_buffer("alphas_cumprod", torch.cumprod(1.0 - betas, dim=0).float(), persistent=False)
        self.unet_calls = 0
        """test-only: number of UNet forward calls (incremented in apply_model)"""

    def ema_scope(self):
        import contextlib

        return contextlib.nullcontext()

    def apply_model(self, x_noisy, t, cond):
        # like LatentDiffusion.apply_model: cond is {"c_crossattn": [ctx], "c_concat": [...]}
        self.unet_calls += 1
        if not isinstance(cond, dict):
            cond = {"c_crossattn": [cond]}
        return self.model(x_noisy, t, c_crossattn=cond["c_crossattn"])

    def get_learned_conditioning(self, prompts):
        """Deterministic stand-in for the text encoder: (len(prompts), 77, CONTEXT_DIM) from crc32(prompt)."""
        out = []
        for text in prompts:
            g = torch.Generator().manual_seed(zlib.crc32(str(text).encode("utf8")))
            out.append(torch.randn(TOKENS, CONTEXT_DIM, generator=g))
        return torch.stack(out)

    def decode_first_stage(self, z):
        img = torch.tanh(z[:, :3])
        return torch.nn.functional.interpolate(img, scale_factor=8, mode="nearest")

    def encode_first_stage(self, x):
        small = torch.nn.functional.avg_pool2d(x, 8)
        return torch.cat([small, small.mean(dim=1, keepdim=True)], dim=1)

    def get_first_stage_encoding(self, encoder_posterior):
        return encoder_posterior


def make_tiny_sd_model(kind="sd1", seed=0):
    unet = make_tiny_sdxl_unet(seed) if kind == "sdxl" else make_tiny_sd15_unet(seed)
    return TinySdModel(unet, kind=kind, name="tiny-sdxl" if kind == "sdxl" else "tiny-sd15")
