"""Tiny diffusers 0.42.1 pipelines built from diffusers' own classes with random weights (no download: the prompt
embeddings are passed in, so no text encoder or tokenizer is needed), for the diffusers adapter's tests."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLWan,
    ControlNetModel,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    StableDiffusionControlNetPipeline,
    StableDiffusionPipeline,
    UNet2DConditionModel,
    WanPipeline,
    WanTransformer3DModel,
)
from diffusers import EulerDiscreteScheduler as Euler

SD_CONTEXT = 32


def _sd_unet() -> UNet2DConditionModel:
    torch.manual_seed(0)
    return UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=32,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=SD_CONTEXT,
        attention_head_dim=8,
        norm_num_groups=8,
    ).eval()


def _vae(seed: int = 1, **config: Any) -> AutoencoderKL:
    """A one-level VAE (the latent keeps the image's size), 4 latent channels."""
    torch.manual_seed(seed)
    return AutoencoderKL(
        block_out_channels=(16,),
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
        norm_num_groups=8,
        **config,
    ).eval()


def sd_pipeline(scheduler: Any = None, controlnets: int = 0) -> StableDiffusionPipeline:
    """An SD1.x-layout pipeline (the VAE keeps the size: 32 px are a 32x32 latent, whose first level has attention);
    with ``controlnets`` one ControlNet (1) or a ``MultiControlNetModel`` of that many."""
    parts = dict(
        vae=_vae(),
        text_encoder=None,
        tokenizer=None,
        unet=_sd_unet(),
        scheduler=scheduler or Euler(steps_offset=1),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    if not controlnets:
        pipe = StableDiffusionPipeline(**parts)
    else:
        nets = []
        for i in range(controlnets):
            torch.manual_seed(10 + i)
            net = ControlNetModel.from_unet(
                parts["unet"],
                conditioning_channels=3,
                conditioning_embedding_out_channels=(16,),  # the latent's size
            ).eval()
            for p in net.controlnet_down_blocks.parameters():  # zero convolutions made non-zero: the control acts
                torch.nn.init.normal_(p, std=0.02)
            nets.append(net)
        pipe = StableDiffusionControlNetPipeline(controlnet=nets[0] if controlnets == 1 else nets, **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sdxl_pipeline() -> Any:
    """An SDXL-layout pipeline: the UNet with SDXL's added text-and-time conditioning, a 16-wide pooled embedding."""
    from diffusers import StableDiffusionXLPipeline

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=32,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=SD_CONTEXT,
        attention_head_dim=8,
        norm_num_groups=8,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=8 * 6 + 16,
    ).eval()
    parts = dict(
        text_encoder=None, text_encoder_2=None, tokenizer=None, tokenizer_2=None, scheduler=Euler(steps_offset=1)
    )
    pipe = StableDiffusionXLPipeline(vae=_vae(), unet=unet, **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sdxl_call(pipe: Any, steps: int = 4, **more: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    pooled = {"pooled_prompt_embeds": torch.randn(1, 16, generator=g)}
    pooled["negative_pooled_prompt_embeds"] = torch.randn(1, 16, generator=g)
    return sd_call(pipe, steps=steps, **pooled, **more)


def sd_call(pipe: Any, steps: int = 6, seed: int = 1, **more: Any) -> torch.Tensor:
    """One generation's latents (cond and uncond batched: classifier-free guidance 7)."""
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(1, 7, SD_CONTEXT, generator=g)
    negative = torch.randn(1, 7, SD_CONTEXT, generator=g)
    kwargs = {"height": 32, "width": 32, "output_type": "latent", **more}
    generator = torch.Generator().manual_seed(seed)
    return _call(
        pipe,
        prompt_embeds=embeds,
        negative_prompt_embeds=negative,
        num_inference_steps=steps,
        generator=generator,
        **kwargs,
    ).images


def _call(pipe: Any, **kwargs: Any) -> Any:
    """The pipeline's call with ``kwargs`` less those given as None (an img2img pipeline takes no size)."""
    with torch.no_grad():
        return pipe(**{k: v for k, v in kwargs.items() if v is not None})


def flux_pipeline(scheduler: Any = None) -> FluxPipeline:
    torch.manual_seed(2)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=3,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[4, 6, 6],
    ).eval()
    vae = _vae(3, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0, scaling_factor=1.0)
    pipe = FluxPipeline(
        scheduler=scheduler or FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def flux_call(pipe: Any, steps: int = 8, seed: int = 1, text: int = 5, **more: Any) -> torch.Tensor:
    """One generation's latents; ``text``: the prompt's tokens (context parallelism splits them: even there)."""
    g = torch.Generator().manual_seed(0)
    kwargs = {"height": 16, "width": 16, "guidance_scale": 1.0, "output_type": "latent", **more}
    return _call(
        pipe,
        prompt_embeds=torch.randn(1, text, 32, generator=g),
        pooled_prompt_embeds=torch.randn(1, 32, generator=g),
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    ).images


def _wan_transformer(seed: int) -> WanTransformer3DModel:
    torch.manual_seed(seed)
    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=32,
        ffn_dim=32,
        num_layers=3,
        rope_max_seq_len=32,
    ).eval()


def wan_pipeline(experts: int = 1, scheduler: Any = None) -> WanPipeline:
    """Wan 2.1 (one transformer) or Wan 2.2 14B's layout (two experts, ``boundary_ratio`` 0.5)."""
    torch.manual_seed(4)
    vae = AutoencoderKLWan(
        base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    ).eval()
    pipe = WanPipeline(
        tokenizer=None,
        text_encoder=None,
        vae=vae,
        scheduler=scheduler or FlowMatchEulerDiscreteScheduler(shift=3.0),
        transformer=_wan_transformer(5),
        transformer_2=_wan_transformer(6) if experts == 2 else None,
        boundary_ratio=0.5 if experts == 2 else None,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def wan_call(pipe: Any, steps: int = 10, seed: int = 1, **more: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    kwargs = {"height": 16, "width": 16, "num_frames": 5, "guidance_scale": 4.0, "output_type": "latent", **more}
    return _call(
        pipe,
        prompt_embeds=torch.randn(1, 5, 32, generator=g),
        negative_prompt_embeds=torch.randn(1, 5, 32, generator=g),
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
        **kwargs,
    ).frames


def sd3_pipeline() -> Any:
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    torch.manual_seed(7)
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        num_layers=3,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        caption_projection_dim=32,
        pooled_projection_dim=32,
        out_channels=4,
        pos_embed_max_size=32,
    ).eval()
    vae = _vae(8, shift_factor=0.0, scaling_factor=1.0)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        text_encoder_3=None,
        tokenizer_3=None,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sd3_call(pipe: Any, steps: int = 8, seed: int = 1, **more: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    embeds = {
        "prompt_embeds": torch.randn(1, 5, 32, generator=g),
        "negative_prompt_embeds": torch.randn(1, 5, 32, generator=g),
        "pooled_prompt_embeds": torch.randn(1, 32, generator=g),
        "negative_pooled_prompt_embeds": torch.randn(1, 32, generator=g),
    }
    kwargs = {"height": 16, "width": 16, "guidance_scale": 4.0, "output_type": "latent", **more}
    generator = torch.Generator().manual_seed(seed)
    return _call(pipe, num_inference_steps=steps, generator=generator, **embeds, **kwargs).images


def qwen_pipeline() -> Any:
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline, QwenImageTransformer2DModel

    torch.manual_seed(11)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,
        out_channels=16,
        num_layers=3,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(4, 6, 6),
    ).eval()
    torch.manual_seed(12)
    vae = AutoencoderKLQwenImage(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True]
    ).eval()
    parts = dict(text_encoder=None, tokenizer=None, scheduler=FlowMatchEulerDiscreteScheduler())
    pipe = QwenImagePipeline(vae=vae, transformer=transformer, **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def qwen_call(pipe: Any, steps: int = 8, seed: int = 1, **more: Any) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    embeds = {
        "prompt_embeds": torch.randn(1, 5, 32, generator=g),
        "prompt_embeds_mask": torch.ones(1, 5, dtype=torch.long),
    }
    kwargs = {"height": 32, "width": 32, "true_cfg_scale": 1.0, "output_type": "latent", **more}
    generator = torch.Generator().manual_seed(seed)
    return _call(pipe, num_inference_steps=steps, generator=generator, **embeds, **kwargs).images
