"""Double of Forge's ``extensions-builtin/sd_forge_sag/scripts/forge_sag.py`` (dfdcbab), from reading it.

``SelfAttentionGuidance.patch`` (l.103-164) clones the patcher with an attn1 replace at ``("middle", 0, 0)`` that
runs the attention with its similarity matrix kept for the uncond chunk (``attention_basic_with_sim``, l.16-54),
and a post-CFG function (``disable_cfg1_optimization``) that blurs the uncond prediction where that attention is
strong (``create_blur_map``, l.57-88: the mask's h, w from the middle block's token count, falling back on
``shared.kohya_shrink_shape``) and runs the UNet once more on it (``calc_cond_uncond_batch``). Needs CFG > 1.
Arguments as the real UI: enabled, scale (0.5), blur_sigma (2.0), threshold (1.0).
"""

import math

import torch
from forge_double import backend
from forge_double.extensions_builtin._builtin import controls
from modules import scripts, shared


def attention_basic_with_sim(q, k, v, heads):
    b, _, dim_head = q.shape
    dim_head //= heads
    q, k, v = (
        t.reshape(b, -1, heads, dim_head).permute(0, 2, 1, 3).reshape(b * heads, -1, dim_head) for t in (q, k, v)
    )
    sim = (torch.einsum("b i d, b j d -> b i j", q, k) * dim_head**-0.5).softmax(dim=-1)
    out = torch.einsum("b i j, b j d -> b i d", sim, v)
    return out.reshape(b, heads, -1, dim_head).permute(0, 2, 1, 3).reshape(b, -1, heads * dim_head), sim


def gaussian_blur_2d(img, kernel_size, sigma):
    half = (kernel_size - 1) * 0.5
    x = torch.linspace(-half, half, steps=kernel_size)
    pdf = torch.exp(-0.5 * (x / sigma).pow(2))
    k1 = (pdf / pdf.sum()).to(img)
    kernel = torch.mm(k1[:, None], k1[None, :]).expand(img.shape[-3], 1, kernel_size, kernel_size)
    pad = [kernel_size // 2] * 4
    return torch.nn.functional.conv2d(torch.nn.functional.pad(img, pad, mode="reflect"), kernel, groups=img.shape[-3])


def create_blur_map(x0, attn, sigma=3.0, threshold=1.0):
    _, hw1, hw2 = attn.shape
    b, _, lh, lw = x0.shape
    attn = attn.reshape(b, -1, hw1, hw2)
    mask = attn.mean(1, keepdim=False).sum(1, keepdim=False) > threshold
    ratio = 2 ** (math.ceil(math.sqrt(lh * lw / hw1)) - 1).bit_length()
    h, w = math.ceil(lh / ratio), math.ceil(lw / ratio)
    if h * w != mask.size(1):
        shrink = getattr(shared, "kohya_shrink_shape", None)
        if shrink:
            w, h = shrink
    mask = mask.reshape(b, h, w).unsqueeze(1).type(attn.dtype)
    mask = torch.nn.functional.interpolate(mask, (lh, lw))
    blurred = gaussian_blur_2d(x0, kernel_size=9, sigma=sigma)
    return blurred * mask + x0 * (1 - mask)


def patch(model, scale, blur_sigma, threshold):
    m = model.clone()
    attn_scores = None

    def attn_and_record(q, k, v, extra_options):
        nonlocal attn_scores
        heads = extra_options["n_heads"]
        cond_or_uncond = extra_options["cond_or_uncond"]
        b = q.shape[0] // len(cond_or_uncond)
        if 1 in cond_or_uncond:
            uncond_index = cond_or_uncond.index(1)
            out, sim = attention_basic_with_sim(q, k, v, heads=heads)
            n_slices = heads * b
            attn_scores = sim[n_slices * uncond_index : n_slices * (uncond_index + 1)]
            return out
        return attention_basic_with_sim(q, k, v, heads=heads)[0]

    def post_cfg_function(args):
        uncond_pred, cfg_result, x = args["uncond_denoised"], args["denoised"], args["input"]
        if min(cfg_result.shape[2:]) <= 4:
            return cfg_result
        degraded = create_blur_map(uncond_pred, attn_scores, blur_sigma, threshold)
        degraded_noised = degraded + x - uncond_pred
        sag, _ = backend.calc_cond_uncond_batch_of(
            args["model"], args["uncond"], None, degraded_noised, args["sigma"], args["model_options"]
        )
        return cfg_result + (degraded - sag) * scale

    m.set_model_sampler_post_cfg_function(post_cfg_function, disable_cfg1_optimization=True)
    m.set_model_attn1_replace(attn_and_record, "middle", 0, 0)
    return m


class SAGForForge(scripts.Script):
    def title(self):
        return "SelfAttentionGuidance Integrated (SD 1.x, SD 2.x, SDXL)"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return controls(False, 0.5, 2.0, 1.0)

    def process_before_every_sampling(self, p, *script_args, **kwargs):
        enabled, scale, blur_sigma, threshold = script_args
        if not enabled:
            return
        if (not p.is_hr_pass and p.cfg_scale <= 1) or (p.is_hr_pass and p.hr_cfg <= 1):
            print("Self Attention Guidance requires CFG > 1")
            return
        p.sd_model.forge_objects.unet = patch(p.sd_model.forge_objects.unet, scale, blur_sigma, threshold)
        p.extra_generation_params.update(sag_enabled=enabled, sag_scale=scale)
