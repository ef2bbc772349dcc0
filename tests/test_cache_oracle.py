"""The step cache is DeepCache: against the ``deepcache==0.1.1`` package's ``DeepCacheSDHelper`` (uniform schedule)
on a diffusers ``UNet2DConditionModel`` that carries the same weights (converted with diffusers' own ldm → diffusers
converter), every step of a whole Euler + CFG sampling run matches ours — on the ldm UNet, and on that diffusers UNet
itself (:class:`tome_core.families.DiffusersUNet`) — for branch 0 and deeper branches and
intervals 2, 3 and 5, on the SD1.5 layout and the SDXL layout. ``deepcache`` and ``diffusers`` are oracles only."""

from __future__ import annotations

import pytest
import torch
from models import make_unet, rel

import tome_core
from benchmarks.lab import sampling as S

diffusers = pytest.importorskip("diffusers")
deepcache = pytest.importorskip("DeepCache")

from diffusers import UNet2DConditionModel  # noqa: E402
from diffusers.loaders.single_file_utils import (  # noqa: E402
    convert_ldm_unet_checkpoint,
    create_unet_diffusers_config_from_ldm,
)

HEADS = 2
LAYOUTS = {
    "sd15": dict(attention_resolutions=[4, 2, 1], channel_mult=[1, 2, 4, 4], transformer_depth=1),
    "sdxl": dict(attention_resolutions=[4, 2], channel_mult=[1, 2, 4], transformer_depth=2),
}


def ldm_and_diffusers(layout: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The tests' ldm UNet (random weights) and a diffusers UNet converted from its state dict by diffusers."""
    unet = make_unet(layout, num_heads=HEADS)
    cfg = LAYOUTS[layout]
    params = dict(
        in_channels=4,
        out_channels=4,
        model_channels=32,
        num_res_blocks=2,
        num_heads=HEADS,
        context_dim=64,
        use_linear_in_transformer=layout == "sdxl",
        **cfg,
    )
    original = {
        "model": {
            "params": {
                "unet_config": {"params": params},
                "first_stage_config": {"params": {"ddconfig": {"ch_mult": [1, 2, 4, 4]}}},
            }
        }
    }
    checkpoint = {f"model.diffusion_model.{k}": v for k, v in unet.state_dict().items()}
    config = create_unet_diffusers_config_from_ldm(original, checkpoint, image_size=256)
    theirs = UNet2DConditionModel(**config)
    theirs.load_state_dict(convert_ldm_unet_checkpoint(checkpoint, config), strict=True)
    return unet, theirs.eval().requires_grad_(False)


class _Scheduler:
    def __init__(self, timesteps: list[float]):
        self.timesteps = torch.tensor(timesteps)


class _Pipe:
    """What ``DeepCacheSDHelper`` reads of a pipeline: ``unet`` and ``scheduler.timesteps`` (it finds the step by the
    timestep's index there)."""

    def __init__(self, unet, timesteps):
        self.unet, self.scheduler = unet, _Scheduler(timesteps)


def sample_steps(forward, noise, sigmas, progress=None) -> list[torch.Tensor]:
    """Euler + CFG 7 (cond and uncond batched, ``forward(x, t) -> eps`` for both halves); each step's guided ε."""
    seen = []
    x = noise * sigmas[0]
    steps = len(sigmas) - 1
    for i in range(steps):
        if progress is not None:
            progress(i, steps)
        sigma = sigmas[i]
        t = torch.tensor(S.sigma_to_t(sigma), dtype=torch.float32)
        with torch.no_grad():
            cond, uncond = forward(torch.cat([x, x]) / (sigma**2 + 1) ** 0.5, t).chunk(2)
        eps = uncond + 7.0 * (cond - uncond)
        seen.append(eps)
        x = x + eps * (sigmas[i + 1] - sigma)
    return seen


@pytest.fixture(scope="module", params=list(LAYOUTS))
def pair(request):
    return request.param, *ldm_and_diffusers(request.param)


def inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(1, 4, 16, 16, generator=gen), torch.randn(2, 7, 64, generator=gen)


def test_the_converted_unet_is_the_same_model(pair):
    _, ours, theirs = pair
    x, ctx = inputs()
    t = torch.tensor([601.0, 601.0])
    with torch.no_grad():
        assert (
            rel(theirs(torch.cat([x, x]), t, encoder_hidden_states=ctx).sample, ours(torch.cat([x, x]), t, ctx)) < 1e-5
        )


@pytest.mark.parametrize("on", ["ldm", "diffusers"])
@pytest.mark.parametrize("branch, interval", [(0, 2), (0, 3), (0, 5), (1, 3), (3, 2), (3, 5)])
def test_every_step_matches_deepcache(pair, branch, interval, on):
    """Ours on the ldm UNet (the WebUI's, Forge's, ComfyUI's) and on the very diffusers UNet DeepCache ran on."""
    _, ldm, theirs = pair
    steps = 2 * interval + 1  # the last step is a full one in both (ours always makes it full)
    sigmas = S.discrete_sigmas(steps)
    noise, ctx = inputs(interval + branch)
    timesteps = [S.sigma_to_t(s) for s in sigmas[:-1]]
    helper = deepcache.DeepCacheSDHelper(pipe=_Pipe(theirs, timesteps))
    helper.set_params(cache_interval=interval, cache_branch_id=branch, skip_mode="uniform")
    helper.enable()
    try:
        expected = sample_steps(lambda x, t: theirs(x, t, encoder_hidden_states=ctx).sample, noise, sigmas)
    finally:
        helper.disable()
    ours = ldm if on == "ldm" else theirs
    run = (lambda x, t: ldm(x, t.expand(2), ctx)) if on == "ldm" else lambda x, t: theirs(x, t, ctx).sample
    patch = tome_core.apply_patch(
        ours, ratio=0.0, cache=True, cache_interval=interval, cache_branch=branch, cache_forecast="off"
    )
    try:
        got = sample_steps(run, noise, sigmas, lambda i, n: patch.set_progress(i / n, n))
        report = patch.report().cache
    finally:
        tome_core.remove_patch(ours)
    full = len(range(0, steps, interval))
    assert (report.full, report.cached) == (full, steps - full)
    errors = [rel(a, b) for a, b in zip(got, expected)]
    assert len(errors) == steps and max(errors) < 1e-5, errors
    plain = sample_steps(run, noise, sigmas)
    assert rel(got[-1], plain[-1]) > 1e-4  # the cache changed something: the comparison is not plain vs plain
