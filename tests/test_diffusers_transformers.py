"""Issue 51, item 4: every diffusers 0.42.1 transformer class that cache-dit accelerates is either cached by the step
cache, as a family of its own, or named where the cache leaves it alone. Each class is built here from diffusers' own
code, tiny and with seeded random weights, and sampled by hand under Euler (``test_cache_correction``'s sampler: six
steps, ``cache_interval`` 2, cond and uncond batched); each call gives the model its timestep as its pipeline does.

The classes cached before this file (FLUX.1 and Kontext's ``FluxTransformer2DModel``, Wan, SD3, Qwen-Image) are tested
through their pipelines in ``test_diffusers_host`` and in ``test_cache_correction``."""

from __future__ import annotations

import pytest
import test_cache_correction as correction
import torch
from diffusers import (
    ChromaTransformer2DModel,
    CogVideoXTransformer3DModel,
    CosmosTransformer3DModel,
    FlowMatchEulerDiscreteScheduler,
    Flux2Transformer2DModel,
    HunyuanVideo15Transformer3DModel,
    HunyuanVideoFramepackTransformer3DModel,
    HunyuanVideoTransformer3DModel,
    LTXVideoTransformer3DModel,
    Lumina2Transformer2DModel,
    ZImagePipeline,
    ZImageTransformer2DModel,
)
from test_cache_correction import B, euler, sampled

import tome_core
from tome_core import families
from tome_core.caching.cache import CORRECTION_FAMILY_NOTE
from tome_core.families import layout_for


def _context(width: int = 32) -> torch.Tensor:
    return torch.randn(B, 5, width, generator=torch.Generator().manual_seed(2))


def _ids(tokens: int, grid: int, axes: int) -> torch.Tensor:
    """FLUX-style position ids of ``tokens`` image tokens on a ``grid``-wide grid (axes 1 and 2: row, column)."""
    ids = torch.zeros(tokens, axes)
    ids[:, 1], ids[:, 2] = torch.arange(tokens) // grid, torch.arange(tokens) % grid
    return ids


def _seeded(cls, **config):
    torch.manual_seed(0)
    return cls(**config).eval().requires_grad_(False)


def _flux2():
    return _seeded(
        Flux2Transformer2DModel,
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        timestep_guidance_channels=16,
        axes_dims_rope=(2, 2, 2, 2),
        guidance_embeds=False,
    )


def _flux2_call(m, x, s):  # Flux2Pipeline: ``timestep=t / 1000``, the sigma
    txt_ids = torch.zeros(5, 4)
    txt_ids[:, 3] = torch.arange(5)
    return m(
        hidden_states=x,
        encoder_hidden_states=_context(),
        timestep=torch.full((B,), s),
        img_ids=_ids(16, 4, 4),
        txt_ids=txt_ids,
        return_dict=False,
    )[0]


def _chroma():
    return _seeded(
        ChromaTransformer2DModel,
        patch_size=1,
        in_channels=16,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(2, 2, 4),
        approximator_num_channels=8,
        approximator_hidden_dim=16,
        approximator_layers=1,
    )


def _chroma_call(m, x, s):  # ChromaPipeline: ``timestep=timestep / 1000``
    ids = _ids(16, 4, 3)
    return m(
        hidden_states=x,
        encoder_hidden_states=_context(),
        timestep=torch.full((B,), s),
        img_ids=ids,
        txt_ids=torch.zeros(5, 3),
        return_dict=False,
    )[0]


def _hunyuan_video():
    return _seeded(
        HunyuanVideoTransformer3DModel,
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,
        num_single_layers=2,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        guidance_embeds=False,
        text_embed_dim=32,
        pooled_projection_dim=8,
        rope_axes_dim=(2, 2, 4),
    )


def _hunyuan_video_call(m, x, s):  # HunyuanVideoPipeline: the scheduler's timestep
    return m(
        hidden_states=x,
        timestep=torch.full((B,), 1000 * s),
        encoder_hidden_states=_context(),
        encoder_attention_mask=torch.ones(B, 5),
        pooled_projections=torch.randn(B, 8, generator=torch.Generator().manual_seed(3)),
        return_dict=False,
    )[0]


def _hunyuan_video15():
    return _seeded(
        HunyuanVideo15Transformer3DModel,
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=3,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=32,
        text_embed_2_dim=16,
        image_embed_dim=16,
        rope_axes_dim=(2, 2, 4),
    )


def _hunyuan_video15_call(m, x, s):  # HunyuanVideo15Pipeline: the scheduler's timestep; text-to-video: no image
    return m(
        hidden_states=x,
        timestep=torch.full((B,), 1000 * s),
        encoder_hidden_states=_context(),
        encoder_attention_mask=torch.ones(B, 5),
        encoder_hidden_states_2=torch.randn(B, 3, 16, generator=torch.Generator().manual_seed(4)),
        encoder_attention_mask_2=torch.ones(B, 3),
        image_embeds=torch.zeros(B, 2, 16),
        return_dict=False,
    )[0]


def _cogvideox():
    return _seeded(
        CogVideoXTransformer3DModel,
        num_attention_heads=2,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        time_embed_dim=8,
        text_embed_dim=32,
        num_layers=3,
        sample_width=8,
        sample_height=8,
        sample_frames=5,
        patch_size=2,
        max_text_seq_length=5,
    )


def _cogvideox_call(m, x, s):  # CogVideoXPipeline: the scheduler's timestep
    return m(hidden_states=x, encoder_hidden_states=_context(), timestep=torch.full((B,), 1000 * s), return_dict=False)[
        0
    ]


def _lumina2():
    return _seeded(
        Lumina2Transformer2DModel,
        sample_size=8,
        patch_size=2,
        in_channels=4,
        hidden_size=32,
        num_layers=3,
        num_refiner_layers=1,
        num_attention_heads=2,
        num_kv_heads=2,
        multiple_of=16,
        axes_dim_rope=(4, 6, 6),
        axes_lens=(32, 32, 32),
        cap_feat_dim=32,
    )


def _lumina2_call(m, x, s):  # Lumina2Pipeline: ``1 - t / 1000``, and it negates the output
    return -m(
        hidden_states=x,
        timestep=torch.full((B,), 1 - s),
        encoder_hidden_states=_context(),
        encoder_attention_mask=torch.ones(B, 5, dtype=torch.bool),
        return_dict=False,
    )[0]


def _ltx_video():
    return _seeded(
        LTXVideoTransformer3DModel,
        in_channels=8,
        out_channels=8,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        num_layers=3,
        caption_channels=32,
    )


def _ltx_video_call(m, x, s):  # LTXPipeline: packed tokens, the scheduler's timestep
    return m(
        hidden_states=x,
        encoder_hidden_states=_context(),
        timestep=torch.full((B,), 1000 * s),
        encoder_attention_mask=torch.ones(B, 5),
        num_frames=2,
        height=4,
        width=4,
        return_dict=False,
    )[0]


def _cosmos():
    return _seeded(
        CosmosTransformer3DModel,
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=16,
        num_layers=3,
        mlp_ratio=2,
        text_embed_dim=32,
        adaln_lora_dim=4,
        max_size=(4, 8, 8),
        patch_size=(1, 2, 2),
        rope_scale=(1.0, 1.0, 1.0),
        concat_padding_mask=False,
    )


def _cosmos_call(m, x, s):  # Cosmos2TextToImagePipeline: ``σ / (σ + 1)``
    return m(
        hidden_states=x, timestep=torch.full((B,), s / (s + 1)), encoder_hidden_states=_context(), return_dict=False
    )[0]


CACHED = {  # class: (model, its latent, a call at sigma s, its family, whether the correction acts)
    "Flux2Transformer2DModel": (_flux2, (16, 16), _flux2_call, families.DiffusersFlux2, True),
    "ChromaTransformer2DModel": (_chroma, (16, 16), _chroma_call, families.DiffusersFlux2, True),
    "HunyuanVideoTransformer3DModel": (
        _hunyuan_video,
        (4, 2, 4, 4),
        _hunyuan_video_call,
        families.DiffusersHunyuanVideo,
        True,
    ),
    "HunyuanVideo15Transformer3DModel": (
        _hunyuan_video15,
        (4, 2, 4, 4),
        _hunyuan_video15_call,
        families.DiffusersHunyuanVideo15,
        True,
    ),
    "CogVideoXTransformer3DModel": (_cogvideox, (2, 4, 8, 8), _cogvideox_call, families.DiffusersCogVideoX, False),
    "Lumina2Transformer2DModel": (_lumina2, (4, 8, 8), _lumina2_call, families.DiffusersLumina2, False),
    "LTXVideoTransformer3DModel": (_ltx_video, (32, 8), _ltx_video_call, families.DiffusersLTXVideo, False),
    "CosmosTransformer3DModel": (_cosmos, (4, 2, 8, 8), _cosmos_call, families.DiffusersCosmos, False),
}
CORRECTED = [name for name, entry in CACHED.items() if entry[4]]
UNCORRECTED = [name for name, entry in CACHED.items() if not entry[4]]


@pytest.fixture(scope="module", params=list(CACHED))
def cached(request):
    build, latent, call, family, corrects = CACHED[request.param]
    return build(), latent, call, family, corrects


def _untouched(model) -> None:
    """Nothing of ours left in any module of ``model``: no hook, no instance ``forward``, no session."""
    for module in model.modules():
        assert not module._forward_pre_hooks and not module._forward_hooks, type(module).__name__
        assert "forward" not in module.__dict__
    assert tome_core.get_patch(model) is None


def test_each_class_is_its_own_family_and_says_whether_the_correction_acts(cached):
    model, _, _, family, corrects = cached
    layout = layout_for(model, 0)
    assert type(layout) is family and layout.transformer and layout.corrects is corrects
    assert layout.entry is getattr(model, family.names[-2]) and layout.skipped and layout.entry not in layout.skipped


def test_the_cache_caches_steps_close_to_plain_and_removing_it_leaves_the_model_bit_identical(cached):
    model, latent, call, _, _ = cached
    x = correction._noise(*latent)
    with torch.no_grad():
        before = call(model, x, 0.5)
    plain, _ = euler(model, latent, call)
    xs, _, report = sampled(model, latent, call, 0.0)
    assert (report.cache.full, report.cache.cached) == (4, 2) and not report.cache.notes
    assert [(p.full, p.cached) for p in report.cache.passes] == [(4, 2)]
    ours, theirs = xs[-1], plain[-1]
    assert torch.isfinite(ours).all() and not torch.equal(ours, theirs)
    assert (ours - theirs).norm() < 0.05 * theirs.norm()
    _untouched(model)
    with torch.no_grad():
        assert torch.equal(call(model, x, 0.5), before)


@pytest.mark.parametrize("name", CORRECTED)
def test_where_the_output_layer_is_one_module_the_correction_is_exact(name, monkeypatch):
    """``test_cache_correction``'s exactness test on these classes: the corrected pass moves ``x`` as re-running the
    cached step with the interpolated residual would."""
    build, latent, call, _, _ = CACHED[name]
    correction.test_the_correction_moves_x_as_the_cached_step_rerun_with_the_interpolated_residual_would(
        (build(), latent, call), monkeypatch
    )


@pytest.mark.parametrize("name", UNCORRECTED)
def test_where_the_correction_would_not_be_exact_it_stands_aside_and_a_gain_set_by_hand_says_so(name):
    build, latent, call, _, _ = CACHED[name]
    model = build()
    uncorrected, _, _ = sampled(model, latent, call, 0.0)
    default, _, report = sampled(model, latent, call, 0.75)
    assert torch.equal(default[-1], uncorrected[-1]) and not report.cache.notes
    by_hand, _, report = sampled(model, latent, call, 0.5)
    assert torch.equal(by_hand[-1], uncorrected[-1]) and report.cache.notes == (CORRECTION_FAMILY_NOTE,)


ZIMAGE_NOTE = (
    "step cache off: the cache does not know this model's blocks (ZImageTransformer2DModel: its input is a list of "
    "latents and its output layer one of all_final_layer, picked per call by patch size)"
)


def _zimage():
    return _seeded(
        ZImageTransformer2DModel,
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=4,
        dim=32,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=32,
        axes_dims=[4, 6, 6],
        axes_lens=[64, 32, 32],
    )


def test_z_image_is_named_not_cached_and_its_pipeline_logs_why(console):
    """Z-Image takes a list of latents and picks its output layer per call: the cache leaves it alone, the output is
    plain's, and the note (the session's, the pipeline's ``ToMe note``) names the class and why."""
    model = _zimage()
    assert layout_for(model, 0) is None

    def call(m, x, s):  # ZImagePipeline: a list of latents, ``(1000 - t) / 1000``
        return torch.stack(m(list(x.unbind(0)), torch.full((B,), 1 - s), list(_context().unbind(0)), False)[0])

    plain, _ = euler(model, (4, 1, 8, 8), call)
    xs, _, report = sampled(model, (4, 1, 8, 8), call, 0.0)
    assert torch.equal(xs[-1], plain[-1]) and report.notes == (ZIMAGE_NOTE,)
    _untouched(model)

    pipe = ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=None, text_encoder=None, tokenizer=None, transformer=model
    )
    pipe.set_progress_bar_config(disable=True)
    embeds = list(_context().unbind(0))

    def generate():
        with torch.no_grad():
            return pipe(
                prompt_embeds=embeds[:1],
                negative_prompt_embeds=embeds[1:],
                height=32,
                width=32,
                num_inference_steps=6,
                output_type="latent",
                generator=torch.Generator().manual_seed(1),
            ).images

    before = generate()
    tome_core.apply_patch(pipe, ratio=0, cache=True)
    try:
        assert torch.equal(generate(), before)
        assert tome_core.get_patch(pipe).last.notes == [ZIMAGE_NOTE] and tome_core.cache_stats(pipe) == []
        assert f"ToMe note: {ZIMAGE_NOTE}" in console()
    finally:
        tome_core.remove_patch(pipe)
    _untouched(model)


def test_a_class_not_listed_with_the_same_block_lists_is_no_family_and_the_cache_says_it_does_not_know_it():
    """HunyuanVideo Framepack has FLUX.1's and HunyuanVideo's names, blocks and output layer, but reads history
    latents of its own into the stream: no family takes it (each is restricted to its classes), and the cache says
    so without naming it (it is in no ``ASIDE`` entry)."""
    config = dict(num_attention_heads=2, attention_head_dim=8, num_layers=1, num_single_layers=1, text_embed_dim=32)
    model = _seeded(HunyuanVideoFramepackTransformer3DModel, in_channels=4, out_channels=4, **config)
    assert isinstance(model.single_transformer_blocks, torch.nn.ModuleList) and hasattr(model, "x_embedder")
    assert layout_for(model, 0) is None and families.aside(model) is None
    session = tome_core.apply_patch(model, ratio=0, cache=True)
    try:
        assert session.report().notes == ("step cache off: the cache does not know this model's blocks",)
    finally:
        tome_core.remove_patch(model)
    _untouched(model)
