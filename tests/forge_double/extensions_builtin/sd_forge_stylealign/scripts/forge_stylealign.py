"""Double of Forge's ``extensions-builtin/sd_forge_stylealign/scripts/forge_stylealign.py`` (dfdcbab), from reading
it.

``set_model_replace_all(attn1_proc, "attn1")`` (l.88): every self-attention runs, per cond/uncond chunk, over the
whole batch joined into one sequence (``aligned_attention``, l.41-46), blended with the plain attention by
``strength``. Arguments as the real UI: shared_attention (False), strength (1.0).
"""

import torch
from forge_double.extensions_builtin._builtin import controls
from forge_double.unet import attention_pytorch
from modules import scripts


def sdp(q, k, v, transformer_options):
    return attention_pytorch(q, k, v, heads=transformer_options["n_heads"])


class StyleAlignForForge(scripts.Script):
    def title(self):
        return "StyleAlign Integrated"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return controls(False, 1.0)

    def process_before_every_sampling(self, p, *script_args, **kwargs):
        shared_attention, strength = script_args
        if not shared_attention:
            return
        unet = p.sd_model.forge_objects.unet.clone()

        def join(x):
            b, f, c = x.shape
            return x.reshape(1, b * f, c)

        def aligned_attention(q, k, v, transformer_options):
            b = q.shape[0]
            o = sdp(join(q), join(k), join(v), transformer_options)
            b2, f2, c2 = o.shape
            return o.reshape(b, b2 * f2 // b, c2)

        def attn1_proc(q, k, v, transformer_options):
            results = []
            for cx in transformer_options["cond_or_uncond"]:
                indices = transformer_options["cond_indices" if cx == 0 else "uncond_indices"]
                if len(indices) > 0:
                    bq, bk, bv = q[indices], k[indices], v[indices]
                    if strength < 0.01:
                        results.append(sdp(bq, bk, bv, transformer_options))
                    elif strength > 0.99:
                        results.append(aligned_attention(bq, bk, bv, transformer_options))
                    else:
                        original = sdp(bq, bk, bv, transformer_options)
                        aligned = aligned_attention(bq, bk, bv, transformer_options)
                        results.append((1.0 - strength) * original + strength * aligned)
            return torch.cat(results, dim=0)

        unet.set_model_replace_all(attn1_proc, "attn1")
        p.sd_model.forge_objects.unet = unet
        p.extra_generation_params.update(stylealign_enabled=shared_attention, stylealign_strength=strength)
