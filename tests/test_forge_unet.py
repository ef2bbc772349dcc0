"""ToMe on Forge's UNet layout (tests/forge_double/unet.py), with the weights of the ldm UNets the other tests use:
the patched Forge layout equals the patched ldm UNet (and so tomesd), whatever the merge targets, in spite of
Forge's in-place block adds and keyword attention calls; Forge's attention patches; the UNet resolver; and what
the patch reports where it cannot act."""

from __future__ import annotations

import contextlib
import types

import controlnet_double
import pytest
import tomesd
import torch
from forge_double.unet import attention_pytorch, controlnet_from_ldm, unet_from_ldm
from generation import identical
from models import Holder, photo_latents, rel
from torch import nn

import tome_core
from tome_core.families import transformer_blocks
from tome_core.merging.planning import level_sizes
from tome_core.session import find_unet


@pytest.fixture(scope="module")
def pairs(sd15_unet, sdxl_unet):
    """layout -> (ldm UNet, Forge-layout UNet with the same weights)."""
    return {"sd15": (sd15_unet, unet_from_ldm(sd15_unet)), "sdxl": (sdxl_unet, unet_from_ldm(sdxl_unet))}


@contextlib.contextmanager
def forge_upsampling(ldm: nn.Module):
    """Let the ldm UNet upsample as Forge does (to the skip connection's size, then the conv; unet.py:340-355)
    instead of doubling and letting the WebUI's cat hijack resize after the conv: the two differ only at latent
    sizes that are not multiples of the deepest level's factor."""
    from ldm.modules.diffusionmodules.openaimodel import Upsample

    latent: list[tuple[int, int]] = []
    hook = ldm.register_forward_pre_hook(lambda m, args: latent.insert(0, tuple(args[0].shape[2:])))

    def forward(up, x):
        sizes = [(h, w) for _, h, w in level_sizes(*latent[0])]
        target = sizes[sizes.index(tuple(x.shape[2:])) - 1]
        return up.conv(nn.functional.interpolate(x, size=target, mode="nearest"))

    ups = [m for m in ldm.modules() if isinstance(m, Upsample)]
    for up in ups:
        up.forward = types.MethodType(forward, up)
    try:
        yield
    finally:
        hook.remove()
        for up in ups:
            del up.forward


def inputs(batch: int, size: tuple[int, int], seed: int = 0, t: float = 601.0):
    ctx = torch.randn(batch, 7, 64, generator=torch.Generator().manual_seed(seed))
    return photo_latents(batch, *size, seed), torch.full((batch,), t), ctx


@contextlib.contextmanager
def patched(*unets: nn.Module, **settings):
    """The modules patched with ``settings`` inside the block (its value: their patches), unpatched after it."""
    try:
        yield [tome_core.apply_patch(unet, **settings) for unet in unets]
    finally:
        for unet in unets:
            tome_core.remove_patch(unet)


def ours_on_both(pairs, layout: str, x, t, ctx, **settings) -> tuple[torch.Tensor, torch.Tensor]:
    """Our patch's output on the ldm UNet and on the Forge-layout one with the same weights."""
    ldm, forge = pairs[layout]
    with forge_upsampling(ldm), patched(ldm, forge, **settings):
        return ldm(x, t, ctx), forge_run(forge, x, t, ctx)


def forge_run(unet, x, t, ctx, transformer_options=None):
    """As ``KModel.apply_model`` calls it: timesteps positional, the rest by keyword (k_model.py:45)."""
    return unet(x, t, context=ctx, control=None, transformer_options=transformer_options or {})


# --- the double is faithful ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["sd15", "sdxl"])
@pytest.mark.parametrize("size", [(32, 40), (27, 45)])
def test_forge_layout_unpatched_is_bit_identical_to_ldm(pairs, layout, size):
    ldm, forge = pairs[layout]
    assert sorted(ldm.state_dict()) == sorted(forge.state_dict())  # same keys (Forge registers in another order)
    x, t, ctx = inputs(2, size)
    with forge_upsampling(ldm):
        assert torch.equal(forge_run(forge, x, t, ctx), ldm(x, t, ctx))


def test_forge_controlnet_unpatched_is_bit_identical_to_the_ldm_one():
    ldm = controlnet_double.make_control_net(context_dim=64).control_model
    forge = controlnet_from_ldm(ldm)
    x, t, ctx = inputs(2, (16, 24))
    hint = torch.rand(2, 3, 128, 192, generator=torch.Generator().manual_seed(1))
    ref, out = ldm(x, hint, t, ctx), forge(x=x, hint=hint, timesteps=t, context=ctx)
    assert identical(ref, out)


# --- exactness: Forge layout patched == ldm patched == tomesd ----------------------------------------------------

TARGETS = {
    "attn": dict(merge_attn=True),
    "crossattn": dict(merge_attn=False, merge_crossattn=True),
    "mlp": dict(merge_attn=False, merge_mlp=True),
    "cross+mlp": dict(merge_attn=False, merge_crossattn=True, merge_mlp=True),
    "attn+mlp": dict(merge_attn=True, merge_mlp=True),
    "all": dict(merge_attn=True, merge_crossattn=True, merge_mlp=True),
}

CASES = [
    # layout, targets, ratio, max_downsample, sx, sy, batch, size
    ("sd15", "attn", 0.5, 1, 2, 2, 1, (32, 40)),
    ("sd15", "crossattn", 0.5, 1, 2, 2, 2, (32, 40)),
    ("sd15", "mlp", 0.6, 2, 2, 2, 3, (27, 45)),
    ("sd15", "cross+mlp", 0.4, 4, 1, 2, 2, (33, 41)),
    ("sd15", "attn+mlp", 0.65, 2, 3, 1, 1, (24, 56)),
    ("sd15", "all", 0.3, 8, 4, 4, 2, (29, 37)),
    ("sdxl", "attn", 0.5, "auto", 2, 2, 2, (32, 40)),
    ("sdxl", "crossattn", 0.5, 2, 2, 2, 1, (27, 45)),
    ("sdxl", "mlp", 0.5, 4, 2, 1, 3, (33, 41)),
    ("sdxl", "all", 0.4, "auto", 2, 2, 2, (29, 37)),
]


def _settings(targets, ratio, max_downsample, sx, sy, use_rand):
    return dict(ratio=ratio, max_downsample=max_downsample, sx=sx, sy=sy, use_rand=use_rand, **TARGETS[targets])


@pytest.mark.parametrize("layout,targets,ratio,max_downsample,sx,sy,batch,size", CASES)
def test_forge_layout_patched_equals_ldm_patched_and_tomesd(
    pairs, layout, targets, ratio, max_downsample, sx, sy, batch, size
):
    ldm = pairs[layout][0]
    x, t, ctx = inputs(batch, size)
    settings = _settings(targets, ratio, max_downsample, sx, sy, use_rand=False)
    with forge_upsampling(ldm):
        base = ldm(x, t, ctx)
        holder = Holder(ldm)
        tomesd.apply_patch(holder, **{**settings, "max_downsample": 2 if max_downsample == "auto" else max_downsample})
        try:
            ref = ldm(x, t, ctx)
        finally:
            tomesd.remove_patch(holder)
    ours_ldm, ours_forge = ours_on_both(pairs, layout, x, t, ctx, **settings)
    assert rel(ref, base) > 1e-4, "the merge must change the output, or the comparison proves nothing"
    assert torch.equal(ours_forge, ours_ldm)
    assert rel(ours_forge, ref) < 1e-5


@pytest.mark.parametrize("layout,targets", [("sd15", "crossattn"), ("sd15", "all"), ("sdxl", "mlp")])
@pytest.mark.parametrize("batch", [1, 3])
def test_seeded_random_partition_same_on_both_layouts(pairs, layout, targets, batch):
    x, t, ctx = inputs(batch, (32, 40), seed=3)
    settings = dict(_settings(targets, 0.5, 2, 2, 2, use_rand=True), seed=1234)
    ours_ldm, ours_forge = ours_on_both(pairs, layout, x, t, ctx, **settings)
    assert rel(ours_ldm, pairs[layout][0](x, t, ctx)) > 1e-4
    assert torch.equal(ours_forge, ours_ldm)


@pytest.mark.parametrize("layout,max_downsample,factor", [("sd15", 1, 2), ("sd15", 4, 3), ("sdxl", "auto", 2)])
def test_todo_on_forge_layout_equals_todo_on_ldm(pairs, layout, max_downsample, factor):
    ldm = pairs[layout][0]
    x, t, ctx = inputs(2, (27, 45))
    with forge_upsampling(ldm):
        base = ldm(x, t, ctx)
    settings = dict(method="downsample", downsample_factor=factor, max_downsample=max_downsample)
    ours_ldm, ours_forge = ours_on_both(pairs, layout, x, t, ctx, **settings)
    assert rel(ours_ldm, base) > 1e-4
    assert torch.equal(ours_forge, ours_ldm)


@pytest.mark.parametrize("options", [None, "keep_kv"])
def test_todo_passes_keys_through_context_and_leaves_value_none_unless_given(pairs, options):
    """Forge's attn1 takes values from ``value`` if given, else from ``context``: without an attn1_patch ``value``
    stays None (values from the downsampled keys); with one that passed ``n`` as both, both are downsampled."""
    _, forge = pairs["sd15"]
    x, t, ctx = inputs(1, (32, 40))
    attn1 = next(transformer_blocks(forge)).attn1
    calls = []
    with patched(forge, method="downsample", downsample_factor=2):  # the spy runs after our pre-hook
        spy = attn1.register_forward_pre_hook(lambda m, a, k: calls.append((a[0].shape, k)), with_kwargs=True)
        try:
            forge_run(forge, x, t, ctx, _attn1_patch(_keep_kv) if options else None)
        finally:
            spy.remove()
    (shape, kwargs), *_ = calls
    assert shape[1] == 32 * 40 and kwargs["context"].shape[1] == 16 * 20
    if options:
        assert kwargs["value"] is kwargs["context"]
    else:
        assert kwargs["value"] is None


def test_max_downsample_auto_is_read_from_forges_config_before_any_forward(pairs):
    forge = pairs["sdxl"][1]
    assert not hasattr(forge, "attention_resolutions")
    assert forge.config["transformer_depth"][:2] == [0, 0]  # no transformer blocks at full resolution
    with patched(forge, pairs["sd15"][1], max_downsample="auto") as (sdxl, sd15):
        assert sdxl.merger.planner.auto_downsample == 2 and sd15.merger.planner.auto_downsample == 1


def test_forge_controlnet_patched_equals_the_ldm_one_patched():
    ldm = controlnet_double.make_control_net(context_dim=64).control_model
    forge = controlnet_from_ldm(ldm)
    x, t, ctx = inputs(2, (17, 23))
    hint = torch.rand(2, 3, 136, 184, generator=torch.Generator().manual_seed(1))
    settings = dict(ratio=0.5, max_downsample=2, merge_crossattn=True, merge_mlp=True)
    base = ldm(x, hint, t, ctx)
    with patched(ldm, forge, **settings):
        ref, out = ldm(x, hint, t, ctx), forge(x=x, hint=hint, timesteps=t, context=ctx)
    assert rel(ref[-1], base[-1]) > 1e-4
    assert identical(ref, out)


# --- Forge's attention patches ---------------------------------------------------------------------------------


def _block_keys(unet) -> list[tuple]:
    return (
        [("input", i) for i in range(len(unet.input_blocks))]
        + [("middle", 0)]
        + [("output", i) for i in range(len(unet.output_blocks))]
    )


def _attn1_patch(fn):
    return {"patches": {"attn1_patch": [fn]}}


def _keep_kv(n, context, value, extra):
    return n, context, value  # sets nothing: keys and values are the block's n, as Forge passes them


def _own_kv(n, context, value, extra):
    return n, context * 1.0, value * 0.9  # keys/values of its own (ControlLLLite-like), full length


def _count_level1_blocks(unet) -> int:
    x, t, ctx = inputs(1, (16, 16))
    seen = []
    hooks = [
        b.register_forward_pre_hook(lambda m, a, k: seen.append(a[0].shape[1]), with_kwargs=True)
        for b in transformer_blocks(unet)
    ]
    forge_run(unet, x, t, ctx)
    for h in hooks:
        h.remove()
    return seen.count(16 * 16)


@pytest.mark.parametrize("method", ["merge", "downsample"])
def test_attn1_patch_that_keeps_keys_and_values_is_merged_in_full(pairs, method):
    """An attn1_patch makes Forge pass ``context=n, value=n``: the same attention as none, merged the same."""
    _, forge = pairs["sd15"]
    x, t, ctx = inputs(2, (27, 45))
    with patched(forge, ratio=0.5, method=method) as (patch,):
        plain = forge_run(forge, x, t, ctx)
        with_patch = forge_run(forge, x, t, ctx, _attn1_patch(_keep_kv))
        report = patch.report()
    assert rel(plain, forge_run(forge, x, t, ctx)) > 1e-4
    assert torch.equal(with_patch, plain)
    assert report.merge.query_only == report.merge.todo_off == 0 and report.notes == ()


def test_attn1_patch_with_its_own_keys_leaves_only_queries_merged_and_says_so(pairs):
    _, forge = pairs["sd15"]
    x, t, ctx = inputs(2, (32, 40))
    options = _attn1_patch(_own_kv)
    unmerged = forge_run(forge, x, t, ctx, options)
    with patched(forge, ratio=0.5) as (patch,):
        out = forge_run(forge, x, t, ctx, options)
        report = patch.report()
    assert out.shape == unmerged.shape and rel(out, unmerged) > 1e-4  # the queries were merged
    assert report.merge.query_only == _count_level1_blocks(forge) == 5
    assert report.notes == ("only queries merged in 5 of 16 blocks (an attn1 patch set keys/values)",)


def test_todo_leaves_keys_and_values_of_an_attn1_patch_alone_and_says_so(pairs):
    _, forge = pairs["sd15"]
    x, t, ctx = inputs(2, (32, 40))
    options = _attn1_patch(_own_kv)
    unmerged = forge_run(forge, x, t, ctx, options)
    with patched(forge, method="downsample") as (patch,):  # downsamples the highest level only
        out = forge_run(forge, x, t, ctx, options)
        report = patch.report()
    assert torch.equal(out, unmerged)
    assert report.merge.todo_off == 5 and report.merge.query_only == 0
    assert "no token downsampling in 5 of 16 blocks" in report.notes[0]


def _replace_attn1(unet, keys=None) -> dict:
    def replace(q, k, v, extra):
        return attention_pytorch(q, k, v, extra["n_heads"])

    return {"patches_replace": {"attn1": dict.fromkeys(keys or _block_keys(unet), replace)}}


@pytest.mark.parametrize("method", ["merge", "downsample"])
def test_replaced_attn1_is_not_merged_and_is_reported(pairs, method):
    """reference-only / StyleAlign replace attn1 through patches_replace: Forge calls to_q/to_k/to_v/to_out itself."""
    _, forge = pairs["sd15"]
    x, t, ctx = inputs(2, (32, 40))
    options = _replace_attn1(forge)
    unmerged = forge_run(forge, x, t, ctx, options)
    assert torch.equal(unmerged, forge_run(forge, x, t, ctx))  # the replacement computes the same attention
    with patched(forge, ratio=0.5, method=method) as (patch,):
        out = forge_run(forge, x, t, ctx, options)
        report = patch.report()
        patch.reset_report()
        forge_run(forge, x, t, ctx)
        after_reset = patch.report()
    assert torch.equal(out, unmerged)  # attn1 was the only target: nothing merged
    assert report.merge.attn1_skipped == 5 and report.forwards == 1
    assert report.notes == ("self-attention not merged in 5 of 16 blocks (attn1 replaced by another extension)",)
    assert after_reset.notes == () and after_reset.forwards == 1


@pytest.mark.parametrize("settings", [dict(ratio=0.0), dict(method="downsample", downsample_factor=1)])
def test_replaced_attn1_is_not_reported_where_tome_would_not_have_changed_it(pairs, settings):
    """Ratio 0 merges no token and ToDo with factor 1 keeps every key: a replaced attn1 loses nothing there (and the
    session builds no merger at all: no hook, no forward counted)."""
    _, forge = pairs["sd15"]
    x, t, ctx = inputs(2, (32, 40))
    with patched(forge, **settings) as (patch,):
        forge_run(forge, x, t, ctx, _replace_attn1(forge))
        report = patch.report()
    assert report.forwards == 0 and report.merge is None and report.notes == ()


def test_replaced_attn1_in_some_blocks_with_crossattn_merged_plans_from_the_block_input(pairs):
    """attn1 replaced (by the same attention) in the input blocks: crossattn still merges there, from a plan made
    of the block input, not of the input plus attn1's output (Forge adds it in place)."""
    ldm, forge = pairs["sd15"]
    x, t, ctx = inputs(2, (32, 40))
    settings = dict(ratio=0.5, merge_attn=False, merge_crossattn=True, use_rand=False)
    with patched(ldm, forge, **settings) as (_, patch):
        ref = ldm(x, t, ctx)
        out = forge_run(forge, x, t, ctx, _replace_attn1(forge, [("input", i) for i in range(12)]))
        report = patch.report()
    assert torch.equal(out, ref)
    assert report.merge.attn1_skipped == 0  # attn1 is no target here


def test_attn1_output_patch_and_attn2_patch_see_full_length_tokens(pairs):
    _, forge = pairs["sd15"]
    x, t, ctx = inputs(1, (32, 40))
    seen = []

    def attn1_output(n, extra):
        seen.append(("attn1_out", n.shape[1]))
        return n

    def attn2(n, context, value, extra):
        seen.append(("attn2", n.shape[1]))
        return n, context, value

    options = {"patches": {"attn1_output_patch": [attn1_output], "attn2_patch": [attn2]}}
    base = forge_run(forge, x, t, ctx, options)
    with patched(forge, ratio=0.5, merge_crossattn=True):
        seen.clear()
        out = forge_run(forge, x, t, ctx, options)
    assert rel(out, base) > 1e-4
    assert ("attn1_out", 32 * 40) in seen and ("attn2", 32 * 40) in seen  # merging stays inside the modules


def test_blocks_whose_tokens_do_not_fit_the_latent_are_reported(pairs):
    """E.g. Kohya deep shrink rescales a block's input: that block runs unmerged, and the report says so."""
    _, forge = pairs["sd15"]
    x, t, ctx = inputs(2, (32, 40))
    with patched(forge, ratio=0.5) as (patch,):
        forge_run(forge, x, t, ctx)  # records the latent size 32x40
        assert patch.report().notes == ()
        blocks = list(transformer_blocks(forge))
        tokens = torch.randn(2, 77, blocks[0].norm1.normalized_shape[0])
        out = blocks[0](tokens.clone(), context=ctx)
        report = patch.report()
    assert torch.equal(out, blocks[0](tokens.clone(), context=ctx))
    assert report.merge.unfit == 1 and report.notes == (
        "1 of 16 blocks unmerged (token count does not fit the latent size)",
    )


# --- leak-proof ---------------------------------------------------------------------------------------------------


def test_remove_patch_is_bit_identical_and_leaves_tree_classes_and_state_dict(pairs):
    _, forge = pairs["sdxl"]
    x, t, ctx = inputs(2, (27, 45))
    options = _attn1_patch(_own_kv)
    before = forge_run(forge, x, t, ctx, options)
    tree = [(name, type(m)) for name, m in forge.named_modules()]
    state = {k: v.clone() for k, v in forge.state_dict().items()}
    for method in ("merge", "downsample"):
        patch = tome_core.apply_patch(forge, ratio=0.5, merge_crossattn=True, merge_mlp=True, method=method)
        assert [(name, type(m)) for name, m in forge.named_modules()] == tree
        assert list(forge.state_dict()) == list(state)
        forge_run(forge, x, t, ctx, options)
        tome_core.remove_patch(forge)
        assert tome_core.get_patch(forge) is None and not patch._handles
    assert [(name, type(m)) for name, m in forge.named_modules()] == tree
    assert all(torch.equal(v, state[k]) for k, v in forge.state_dict().items())
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in forge.modules())
    assert torch.equal(forge_run(forge, x, t, ctx, options), before)


# --- the resolver -------------------------------------------------------------------------------------------------


class KModel(nn.Module):
    """backend/modules/k_model.py:7-46: holds the UNet at ``.diffusion_model``; the sampler calls ``apply_model``."""

    def __init__(self, unet: nn.Module):
        super().__init__()
        self.diffusion_model = unet

    def apply_model(self, x, t, c_crossattn=None, transformer_options=None, **kwargs):
        return self.diffusion_model(x, t, context=c_crossattn, transformer_options=transformer_options or {}, **kwargs)


def _engine(unet: nn.Module):
    """ForgeDiffusionEngine (a plain object) -> ForgeObjects.unet (UnetPatcher, plain) -> .model (KModel)."""
    patcher = types.SimpleNamespace(model=KModel(unet))
    return types.SimpleNamespace(forge_objects=types.SimpleNamespace(unet=patcher)), patcher


class _Raising:
    @property
    def forge_objects(self):
        raise RuntimeError("not loaded")


def test_find_unet_resolves_every_host_shape(pairs):
    ldm, forge = pairs["sd15"]
    engine, patcher = _engine(forge)
    wrapper = nn.Module()
    wrapper.diffusion_model = ldm  # ldm's DiffusionWrapper
    assert find_unet(engine) is forge
    assert find_unet(patcher) is forge
    assert find_unet(patcher.model) is forge  # the KModel itself: never (its hooks would never fire)
    assert find_unet(forge) is forge
    assert find_unet(Holder(ldm)) is ldm  # A1111 / Forge Classic LatentDiffusion
    assert find_unet(wrapper) is ldm
    for nothing in (None, object(), types.SimpleNamespace(forge_objects=None), _Raising()):
        assert find_unet(nothing) is None
        assert tome_core.get_patch(nothing) is None
        assert tome_core.remove_patch(nothing) is nothing
    with pytest.raises(TypeError, match="no UNet module in object"):
        tome_core.apply_patch(object())


def test_patching_the_engine_merges_in_the_unet_that_runs(pairs):
    _, forge = pairs["sd15"]
    engine, patcher = _engine(forge)
    x, t, ctx = inputs(1, (32, 40))
    base = patcher.model.apply_model(x, t, c_crossattn=ctx)
    patch = tome_core.apply_patch(engine, ratio=0.5)
    try:
        assert tome_core.get_patch(engine) is patch is tome_core.get_patch(patcher) is tome_core.get_patch(forge)
        out = patcher.model.apply_model(x, t, c_crossattn=ctx)
    finally:
        tome_core.remove_patch(engine)
    assert rel(out, base) > 1e-4 and patch.report().forwards == 1
    assert tome_core.get_patch(forge) is None
    assert torch.equal(patcher.model.apply_model(x, t, c_crossattn=ctx), base)


# --- models ToMe cannot merge -------------------------------------------------------------------------------------


class FluxLike(nn.Module):
    """A DiT with no UNet transformer blocks (Forge's Flux / SD3 / Chroma engines): attention, but no attn1/attn2."""

    def __init__(self):
        super().__init__()
        self.img_in = nn.Linear(4, 32)
        self.blocks = nn.ModuleList(nn.MultiheadAttention(32, 4, batch_first=True) for _ in range(2))
        self.out = nn.Linear(32, 4)

    def forward(self, x, timestep, context=None, **kwargs):
        b, c, h, w = x.shape
        tokens = self.img_in(x.flatten(2).transpose(1, 2)) + timestep[:, None, None] / 1000
        for block in self.blocks:
            tokens = tokens + block(tokens, tokens, tokens, need_weights=False)[0]
        return self.out(tokens).transpose(1, 2).reshape(b, c, h, w)


def test_a_model_without_transformer_blocks_patches_runs_unchanged_and_says_so():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        flux = FluxLike().eval()
    engine, patcher = _engine(flux)
    x, t, ctx = inputs(2, (8, 12))
    base = patcher.model.apply_model(x, t, c_crossattn=ctx)
    for method in ("merge", "downsample"):
        patch = tome_core.apply_patch(engine, ratio=0.5, merge_crossattn=True, merge_mlp=True, method=method)
        assert tome_core.get_patch(engine) is patch
        assert not any(m._forward_pre_hooks or m._forward_hooks for m in flux.modules())
        assert torch.equal(patcher.model.apply_model(x, t, c_crossattn=ctx), base)
        assert patch.merger is None and patch.report().merge is None
        assert patch.report().notes == (f"nothing merged ({type(engine).__name__} has no UNet transformer blocks)",)
        tome_core.remove_patch(engine)
    assert tome_core.get_patch(engine) is None
