"""Seeded random weights under the file names the example workflows name, for running them in the real ComfyUI.

Usage (with the ComfyUI harness venv, whose ComfyUI source gives every key and shape):
    $HOME/comfy-harness/venv/bin/python tests/comfy_workflows/make_models.py MODELS_DIR \
        [--comfy $HOME/comfy-harness/ComfyUI] [--only NAME ...] [--seed 1234] [--force]

Writes ``MODELS_DIR/{checkpoints,diffusion_models,text_encoders,vae,loras}/<file>`` (no download; every tensor gets
values from a generator seeded by (seed, file, key)). The modules are built on the meta device from ComfyUI's own
classes, so every key and shape is one ComfyUI loads, and each diffusion model's state dict is checked against
ComfyUI's model detection (the family it must be detected as). Files are written tensor by tensor (a safetensors
header, then each tensor's bytes), so a multi-GB text encoder never sits in memory whole.

- Diffusion models: the family's real width where ComfyUI fixes it (FLUX 3072, Qwen-Image 3072, Z-Image 3840; the
  SDXL checkpoint is Segmind-Vega's layout, the smallest ComfyUI detects as SDXL) and as few blocks as the step cache
  needs (FLUX 1 double + 1 single, the others 2); Wan's width is read from the state dict: 256 (2 heads).
- Text encoders: full size (their configs are fixed in ComfyUI) in fp8 e4m3fn, norms included, so ComfyUI keeps the
  weights in fp8 (it takes the model's dtype from one tensor) and a 7B encoder fits in memory; file names as the
  templates have them even where they say fp16/bf16. umT5 carries a ``spiece_model`` (a SentencePiece model trained
  here on a few lines of text: its ids are valid umT5 ids, its words are not umT5's).
- VAEs full size (FLUX's 16-channel KL VAE; Wan 2.1's VAE, which Qwen-Image uses too), fp16.
- The lightx2v LoRAs: rank 4 on every linear layer of the reduced Wan blocks, keys as lightx2v's (``diffusion_model.``
  + module + ``.lora_down/.lora_up.weight`` and ``.alpha``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import struct
import sys
from collections.abc import Callable, Iterator

import torch

SDXL_VEGA = {
    "use_checkpoint": False,
    "image_size": 32,
    "out_channels": 4,
    "use_spatial_transformer": True,
    "legacy": False,
    "num_classes": "sequential",
    "adm_in_channels": 2816,
    "in_channels": 4,
    "model_channels": 320,
    "num_res_blocks": [2, 2, 2],
    "transformer_depth": [0, 0, 1, 1, 2, 2],
    "channel_mult": [1, 2, 4],
    "transformer_depth_middle": -1,
    "use_linear_in_transformer": True,
    "context_dim": 2048,
    "num_head_channels": 64,
    "num_heads": -1,
    "transformer_depth_output": [0, 0, 0, 1, 1, 1, 2, 2, 2],
    "use_temporal_attention": False,
    "use_temporal_resblock": False,
}
FLUX_DEV = {
    "image_model": "flux",
    "axes_dim": [16, 56, 56],
    "num_heads": 24,
    "mlp_ratio": 4.0,
    "theta": 10000,
    "out_channels": 16,
    "qkv_bias": True,
    "txt_ids_dims": [],
    "in_channels": 16,
    "hidden_size": 3072,
    "context_in_dim": 4096,
    "patch_size": 2,
    "vec_in_dim": 768,
    "depth": 1,
    "depth_single_blocks": 1,
    "guidance_embed": True,
}
WAN_T2V = {
    "image_model": "wan2.1",
    "dim": 256,
    "out_dim": 16,
    "num_heads": 2,
    "ffn_dim": 512,
    "num_layers": 2,
    "patch_size": (1, 2, 2),
    "freq_dim": 256,
    "window_size": (-1, -1),
    "qk_norm": True,
    "cross_attn_norm": True,
    "eps": 1e-6,
    "in_dim": 16,
    "model_type": "t2v",
}
QWEN_IMAGE = {"image_model": "qwen_image", "in_channels": 64, "num_layers": 2}
Z_IMAGE = {
    "image_model": "lumina2",
    "patch_size": 2,
    "in_channels": 16,
    "dim": 3840,
    "cap_feat_dim": 2560,
    "n_layers": 2,
    "qk_norm": True,
    "n_heads": 30,
    "n_kv_heads": 30,
    "axes_dims": [32, 48, 48],
    "axes_lens": [1536, 512, 512],
    "rope_theta": 256.0,
    "ffn_dim_multiplier": 8.0 / 3.0,
    "z_image_modulation": True,
    "time_scale": 1000.0,
    "pad_tokens_multiple": 32,
}
DETECTED = {  # the ComfyUI model class each diffusion model must be detected as
    "sdxl": "Segmind_Vega",
    "flux": "Flux",
    "wan": "WAN21_T2V",
    "qwen": "QwenImage",
    "zimage": "ZImage",
}
FP8 = torch.float8_e4m3fn
LORA_RANK = 4


# --- shapes, from ComfyUI's classes on the meta device -----------------------------------------------------------


def _diffusion(config: dict) -> dict[str, torch.Tensor]:
    import comfy.model_detection

    model_config = comfy.model_detection.model_config_from_unet_config(dict(config))
    assert model_config is not None, f"ComfyUI matches no model to {config}"
    with torch.device("meta"):
        model = model_config.get_model({})
    return model.diffusion_model.state_dict()


def _checked(family: str, sd: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    import comfy.model_detection

    found = comfy.model_detection.model_config_from_unet(sd, prefix)
    name = type(found).__name__ if found is not None else None
    assert name == DETECTED[family], f"{family}: ComfyUI detects {name}, not {DETECTED[family]}"
    return sd


def _te(make: Callable[[], torch.nn.Module]) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        return make().transformer.state_dict()


def sdxl_checkpoint() -> dict[str, torch.Tensor]:
    import comfy.ldm.models.autoencoder
    import comfy.sdxl_clip
    import comfy.supported_models

    config = comfy.supported_models.Segmind_Vega(dict(SDXL_VEGA))
    with torch.device("meta"):
        unet = config.get_model({}).diffusion_model.state_dict()
        clip = comfy.sdxl_clip.SDXLClipModel(device="meta", dtype=torch.float16).state_dict()
        vae = comfy.ldm.models.autoencoder.AutoencoderKL(ddconfig=dict(_SD_VAE, z_channels=4), embed_dim=4).state_dict()
    sd = {
        **config.process_unet_state_dict_for_saving(unet),
        **config.process_clip_state_dict_for_saving(clip),
        **config.process_vae_state_dict_for_saving(vae),
    }
    return _checked("sdxl", sd, "model.diffusion_model.")


_SD_VAE = {
    "double_z": True,
    "resolution": 256,
    "in_channels": 3,
    "out_ch": 3,
    "ch": 128,
    "ch_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_resolutions": [],
    "dropout": 0.0,
}


def flux_vae() -> dict[str, torch.Tensor]:
    import comfy.ldm.models.autoencoder

    with torch.device("meta"):
        return comfy.ldm.models.autoencoder.AutoencoderKL(
            ddconfig=dict(_SD_VAE, z_channels=16), embed_dim=16
        ).state_dict()


def wan_vae() -> dict[str, torch.Tensor]:
    import comfy.ldm.wan.vae

    config = {"dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": []}
    with torch.device("meta"):
        return comfy.ldm.wan.vae.WanVAE(**config, temperal_downsample=[False, True, True], dropout=0.0).state_dict()


def clip_l() -> dict[str, torch.Tensor]:
    import comfy.sd1_clip

    return _te(lambda: comfy.sd1_clip.SDClipModel(device="meta", dtype=torch.float16))


def t5xxl() -> dict[str, torch.Tensor]:
    import comfy.text_encoders.sd3_clip

    return _te(lambda: comfy.text_encoders.sd3_clip.T5XXLModel(device="meta", dtype=FP8))


def umt5xxl() -> dict[str, torch.Tensor]:
    import comfy.text_encoders.wan

    return _te(lambda: comfy.text_encoders.wan.UMT5XXlModel(device="meta", dtype=FP8))


def qwen25_7b() -> dict[str, torch.Tensor]:
    import comfy.text_encoders.qwen_image

    return _te(lambda: comfy.text_encoders.qwen_image.Qwen25_7BVLIModel(device="meta", dtype=FP8))


def qwen3_4b() -> dict[str, torch.Tensor]:
    import comfy.text_encoders.z_image

    return _te(lambda: comfy.text_encoders.z_image.Qwen3_4BModel(device="meta", dtype=FP8))


def wan_lora(model: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, t in model.items():
        if key.startswith("blocks.") and key.endswith(".weight") and t.dim() == 2:
            name = "diffusion_model." + key.removesuffix(".weight")
            out[name + ".lora_down.weight"] = torch.empty(LORA_RANK, t.shape[1], device="meta", dtype=torch.bfloat16)
            out[name + ".lora_up.weight"] = torch.empty(t.shape[0], LORA_RANK, device="meta", dtype=torch.bfloat16)
            out[name + ".alpha"] = torch.empty((), device="meta", dtype=torch.bfloat16)
    return out


def _as(dtype: torch.dtype, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        k: torch.empty(v.shape, device="meta", dtype=dtype if v.is_floating_point() else v.dtype) for k, v in sd.items()
    }


def files() -> dict[str, Callable[[], dict[str, torch.Tensor]]]:
    """file (under the models folder) -> its meta state dict (dtypes as written)."""
    wan = lambda: _checked("wan", _as(torch.float16, _diffusion(WAN_T2V)))  # noqa: E731
    return {
        "checkpoints/sd_xl_base_1.0.safetensors": lambda: _as(torch.float16, sdxl_checkpoint()),
        "diffusion_models/flux1-dev.safetensors": lambda: _checked("flux", _as(torch.bfloat16, _diffusion(FLUX_DEV))),
        "text_encoders/clip_l.safetensors": lambda: _as(torch.float16, clip_l()),
        "text_encoders/t5xxl_fp16.safetensors": lambda: _as(FP8, t5xxl()),
        "vae/ae.safetensors": lambda: _as(torch.float16, flux_vae()),
        "diffusion_models/wan2.1_t2v_1.3B_fp16.safetensors": wan,
        "diffusion_models/wan2.2_t2v_high_noise_14B_fp8_scaled.safetensors": wan,
        "diffusion_models/wan2.2_t2v_low_noise_14B_fp8_scaled.safetensors": wan,
        "loras/wan2.2_t2v_lightx2v_4steps_lora_v1.1_high_noise.safetensors": lambda: wan_lora(_diffusion(WAN_T2V)),
        "loras/wan2.2_t2v_lightx2v_4steps_lora_v1.1_low_noise.safetensors": lambda: wan_lora(_diffusion(WAN_T2V)),
        "text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors": lambda: _as(FP8, umt5xxl()),
        "vae/wan_2.1_vae.safetensors": lambda: _as(torch.float16, wan_vae()),
        "vae/qwen_image_vae.safetensors": lambda: _as(torch.float16, wan_vae()),
        "diffusion_models/qwen_image_fp8_e4m3fn.safetensors": lambda: _checked(
            "qwen", _as(FP8, _diffusion(QWEN_IMAGE))
        ),
        "text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors": lambda: _as(FP8, qwen25_7b()),
        "diffusion_models/z_image_turbo_bf16.safetensors": lambda: _checked(
            "zimage", _as(torch.bfloat16, _diffusion(Z_IMAGE))
        ),
        "text_encoders/qwen_3_4b.safetensors": lambda: _as(FP8, qwen3_4b()),
    }


# --- values ------------------------------------------------------------------------------------------------------


def _std(key: str, shape: torch.Size) -> tuple[float, float]:
    """(mean, std) of a tensor's values: conv/linear weights N(0, 1/fan_in), norms ~1, biases and embeddings small."""
    name = key.lower()
    last = name.rsplit(".", 2)[-2:] if "." in name else [name]
    if name.endswith(".alpha"):
        return float(LORA_RANK), 0.0
    if "lora_up" in name:
        return 0.0, 0.02
    if any(w in name for w in ("norm", "ln_", "layer_norm", "scale_shift", ".gamma", "_norm")) and len(shape) <= 1:
        return (1.0, 0.05) if name.endswith(("weight", "scale", "gamma")) else (0.0, 0.02)
    if name.endswith("bias") or len(shape) <= 1:
        return 0.0, 0.02
    if any(w in name for w in ("embed", "shared", "token", "position", "pad_token")) and "proj" not in last[-1]:
        return 0.0, 0.02
    fan_in = math.prod(shape[1:])
    return 0.0, 1.0 / math.sqrt(max(fan_in, 1))


def _values(seed: int, file: str, key: str, t: torch.Tensor) -> Iterator[bytes]:
    """The tensor's bytes, in chunks of rows (a 1B-value embedding is made a few hundred MB at a time)."""
    digest = hashlib.sha256(f"{seed}:{file}:{key}".encode()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    mean, std = _std(key, t.shape)
    if t.dim() == 0:
        yield (
            torch.tensor(mean + std * float(torch.randn((), generator=gen)), dtype=t.dtype)
            .reshape(1)
            .view(torch.uint8)
            .numpy()
            .tobytes()
        )
        return
    rows, per_row = t.shape[0], max(1, math.prod(t.shape[1:]))
    step = max(1, (64 << 20) // per_row)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        chunk = torch.randn((n, *t.shape[1:]), generator=gen).mul_(std).add_(mean)
        yield chunk.to(t.dtype).contiguous().view(torch.uint8).numpy().tobytes()


_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    FP8: "F8_E4M3",
    torch.uint8: "U8",
    torch.int64: "I64",
}


def write(path: str, sd: dict[str, torch.Tensor], seed: int, extra: dict[str, bytes] | None = None) -> int:
    """Write ``sd`` (meta tensors) as a safetensors file, tensor by tensor; ``extra``: raw uint8 tensors. Its size."""
    extra = extra or {}
    header: dict = {"__metadata__": {"format": "pt", "maker": "tome tests/comfy_workflows/make_models.py"}}
    offset = 0
    for key, t in sd.items():
        size = t.numel() * t.element_size()
        header[key] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    for key, data in extra.items():
        header[key] = {"dtype": "U8", "shape": [len(data)], "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path + ".part"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for key, t in sd.items():
            for part in _values(seed, os.path.basename(path), key, t):
                f.write(part)
        for data in extra.values():
            f.write(data)
    os.replace(tmp, path)
    return os.path.getsize(path)


SPIECE_TEXT = (  # the words the umT5 tokenizer is trained on
    "a fox moving quickly in a beautiful winter scenery nature trees mountains daytime tracking camera "
    "young woman hair turning her head back over shoulder gentle smile bright eyes looking at light warm "
    "the of and to in is it with on for as at by an be this that from or are was video image style color "
)


def spiece_model() -> bytes:
    """A small SentencePiece model (trained here, deterministic) for the umT5 tokenizer ComfyUI reads from the file."""
    import io

    import sentencepiece as spm

    words = SPIECE_TEXT.split()
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(400)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=out,
        vocab_size=64,
        hard_vocab_limit=False,
        model_type="unigram",
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
        seed_sentencepiece_size=1000,
        num_threads=1,
    )
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="the models folder (ComfyUI/models layout)")
    p.add_argument("--comfy", default=os.path.expanduser("~/comfy-harness/ComfyUI"), help="ComfyUI source folder")
    p.add_argument("--only", nargs="*", help="only the files whose name contains one of these")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--force", action="store_true", help="rewrite files that exist")
    a = p.parse_args(argv)
    sys.path.insert(0, os.path.abspath(a.comfy))
    sys.argv = [sys.argv[0], "--cpu"]
    import comfy.options

    comfy.options.enable_args_parsing()
    written = {}
    for name, make in files().items():
        if a.only and not any(o in name for o in a.only):
            continue
        path = os.path.join(a.out, name)
        if os.path.exists(path) and not a.force:
            print(f"exists: {path} ({os.path.getsize(path) / 2**30:.2f} GiB)", flush=True)
            continue
        sd = make()
        extra = {"spiece_model": spiece_model()} if "umt5" in name else None
        size = write(path, sd, a.seed, extra)
        written[name] = size
        print(f"wrote {path}: {len(sd)} tensors, {size / 2**30:.2f} GiB", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
