"""Double of lllyasviel/sd-forge-layerdiffuse ``lib_layerdiffusion/attention_sharing.py`` (e4d5060), the SD1.5
attention sharing, written from reading it; line numbers are the real file's.

``AttentionSharingPatcher`` (l.200-231) makes one ``AttentionSharingUnit`` per attention module of the 16 SD1.5
transformer blocks (attn1 and attn2, ``module_mapping_sd15``, l.11) and registers it with the UNet patcher's
``add_object_patch`` (after ``unload_model_clones``, which takes a loaded clone's units off), so Forge puts it in place of the original when the model is loaded for sampling. A unit
(l.30-137) has no ``to_q``/``to_k``/``to_v`` of its own (LoRA'd copies of the original's, per frame); its forward
``(h, context=None, value=None, transformer_options={})`` splits the batch into ``frames`` (``(b f) d c``), adds
``control_signals[d]`` — the control image's features keyed by token count (``AdditionalAttentionCondsEncoder``,
l.140-191) — attends per frame, then across frames at every token, and returns the change. The encoder and the LoRA
are smaller here (random weights); ``cond_overwrite`` is left out.
"""

import einops
import torch
from forge_double import backend
from forge_double.unet import attention_pytorch

CONTROL_CHANNELS = 8

module_mapping_sd15 = [
    f"{root}.{i}.1.transformer_blocks.0.{attn}"
    for root, indices in (("input_blocks", (1, 2, 4, 5, 7, 8)), ("output_blocks", range(3, 12)))
    for i in indices
    for attn in ("attn1", "attn2")
] + ["middle_block.1.transformer_blocks.0.attn1", "middle_block.1.transformer_blocks.0.attn2"]


class LoRALinearLayer(torch.nn.Module):
    def __init__(self, in_features, out_features, rank=4, org=None):
        super().__init__()
        self.down = torch.nn.Linear(in_features, rank, bias=False)
        self.up = torch.nn.Linear(rank, out_features, bias=False)
        self.org = [org]

    def forward(self, h):
        org = self.org[0]
        bias = org.bias.to(h) if org.bias is not None else None
        return torch.nn.functional.linear(h, org.weight.to(h) + torch.mm(self.up.weight, self.down.weight), bias)


class AttentionSharingUnit(torch.nn.Module):
    def __init__(self, module, frames=2, use_control=True, rank=4):
        super().__init__()
        self.heads = module.heads
        self.frames = frames
        self.original_module = [module]
        hidden = module.to_k.out_features
        self.to_q_lora = torch.nn.ModuleList(
            LoRALinearLayer(module.to_q.in_features, hidden, rank, module.to_q) for _ in range(frames)
        )
        self.to_k_lora = torch.nn.ModuleList(
            LoRALinearLayer(module.to_k.in_features, hidden, rank, module.to_k) for _ in range(frames)
        )
        self.to_v_lora = torch.nn.ModuleList(
            LoRALinearLayer(module.to_v.in_features, hidden, rank, module.to_v) for _ in range(frames)
        )
        out = module.to_out[0]
        self.to_out_lora = torch.nn.ModuleList(
            LoRALinearLayer(out.in_features, out.out_features, rank, out) for _ in range(frames)
        )
        self.temporal_i = torch.nn.Linear(hidden, hidden)
        self.temporal_n = torch.nn.LayerNorm(hidden, elementwise_affine=True, eps=1e-6)
        self.temporal_q = torch.nn.Linear(hidden, hidden)
        self.temporal_k = torch.nn.Linear(hidden, hidden)
        self.temporal_v = torch.nn.Linear(hidden, hidden)
        self.temporal_o = torch.nn.Linear(hidden, hidden)
        self.control_convs = (
            torch.nn.ModuleList(torch.nn.Conv2d(CONTROL_CHANNELS, hidden, 1) for _ in range(frames))
            if use_control
            else None
        )
        self.control_signals = None
        self.calls = 0  # test-only

    def forward(self, h, context=None, value=None, transformer_options={}):  # noqa: B006 (the real signature)
        self.calls += 1
        modified = einops.rearrange(h, "(b f) d c -> f b d c", f=self.frames)
        if self.control_convs is not None:
            context_dim = int(modified.shape[2])
            outs = []
            for f in range(self.frames):
                signal = self.control_signals[context_dim].to(modified)
                outs.append(einops.rearrange(self.control_convs[f](signal), "b c h w -> b (h w) c"))
            modified = modified + torch.stack(outs, dim=0).to(modified)
        framed_context = (
            modified if context is None else einops.rearrange(context, "(b f) d c -> f b d c", f=self.frames)
        )
        attn_outs = []
        for f in range(self.frames):
            q = self.to_q_lora[f](modified[f])
            k = self.to_k_lora[f](framed_context[f])
            v = self.to_v_lora[f](framed_context[f])
            o = self.to_out_lora[f](attention_pytorch(q, k, v, self.heads))
            attn_outs.append(self.original_module[0].to_out[1](o))
        modified = modified + torch.stack(attn_outs, dim=0)
        modified = einops.rearrange(modified, "f b d c -> (b f) d c", f=self.frames)
        x = self.temporal_i(self.temporal_n(modified))
        d = x.shape[1]
        x = einops.rearrange(x, "(b f) d c -> (b d) f c", f=self.frames)
        x = attention_pytorch(self.temporal_q(x), self.temporal_k(x), self.temporal_v(x), self.heads)
        x = einops.rearrange(self.temporal_o(x), "(b d) f c -> (b f) d c", d=d)
        return modified + x - h


class AdditionalAttentionCondsEncoder(torch.nn.Module):
    """The control image's features at 1/8 to 1/64 of its size, keyed by their token count (l.140-191)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.Conv2d(3, CONTROL_CHANNELS, 3, padding=1, stride=8), torch.nn.SiLU())]
            + [
                torch.nn.Sequential(
                    torch.nn.Conv2d(CONTROL_CHANNELS, CONTROL_CHANNELS, 3, padding=1, stride=2), torch.nn.SiLU()
                )
                for _ in range(3)
            ]
        )

    def __call__(self, h):
        results = {}
        for block in self.blocks:
            h = block(h)
            results[int(h.shape[2]) * int(h.shape[3])] = h
        return results


class AttentionSharingPatcher(torch.nn.Module):
    def __init__(self, unet, frames=2, use_control=True, seed=0):
        super().__init__()
        backend.unload_model_clones(unet)  # l.203: a loaded clone's units off, the originals back
        units = []
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for key in module_mapping_sd15:
                module = unet.model.diffusion_model.get_submodule(key)
                unit = AttentionSharingUnit(module, frames=frames, use_control=use_control)
                units.append(unit)
                unet.add_object_patch("diffusion_model." + key, unit)
            self.hookers = torch.nn.ModuleList(units)
            self.kwargs_encoder = AdditionalAttentionCondsEncoder() if use_control else None

    def set_control(self, img):
        signals = self.kwargs_encoder(img.float() * 2.0 - 1.0)
        for m in self.hookers:
            m.control_signals = signals
