"""The samplers as linear maps (``tome_core.caching.samplers``, issue 53): what :func:`linearize` reads is the
sampler's exact map, Euler's is the Euler correction's, the carried weights put every later input where it should be,
and the core's own samplers are ComfyUI's (where a ComfyUI checkout is at hand: ``TOME_COMFYUI``)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.lab.samplers import comfy_functions
from tome_core.caching import correction as C
from tome_core.caching import samplers as L


def flow_sigmas(steps: int, shift: float = 3.0, end: float = 0.0) -> list[float]:
    t = torch.linspace(1, 0, steps + 1, dtype=torch.float64)
    sigmas = (shift * t / (1 + (shift - 1) * t)).tolist()
    return [*sigmas[:-1], end]


def run(sample, sigmas: list[float], x0: torch.Tensor, outs: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The inputs the model saw and the result, the model answering step ``k`` with the output ``outs[k]``."""
    seen: list[torch.Tensor] = []

    def model(x, sigma, **kwargs):
        seen.append(x.clone())
        return x - float(torch.as_tensor(sigma).reshape(-1)[0]) * outs[len(seen) - 1]

    return seen, sample(model, x0.clone(), torch.tensor(sigmas, dtype=torch.float64))


@pytest.mark.parametrize("name", sorted(L.BUILT_IN))
@pytest.mark.parametrize("sigmas", [flow_sigmas(8), flow_sigmas(20), flow_sigmas(6, end=0.02)])
def test_the_linear_map_is_the_samplers_own(name, sigmas):
    """Two runs from the same start with other outputs differ, at every input and at the end, by the map's weights
    on the outputs' difference."""
    linear = L.linearize(name, L.BUILT_IN[name], sigmas)
    steps = len(sigmas) - 1
    assert linear.steps == steps and linear.seen.shape == (steps, steps)
    assert torch.all(linear.seen.triu() == 0)  # an input never depends on outputs to come
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 5, generator=gen, dtype=torch.float64)
    a, b = (torch.randn(steps, 2, 5, generator=gen, dtype=torch.float64) for _ in range(2))
    seen_a, end_a = run(L.BUILT_IN[name], sigmas, x0, a)
    seen_b, end_b = run(L.BUILT_IN[name], sigmas, x0, b)
    for k in range(steps):
        assert torch.allclose(seen_a[k] - seen_b[k], torch.einsum("j,jbc->bc", linear.seen[k], a - b), atol=1e-9)
    assert torch.allclose(end_a - end_b, torch.einsum("j,jbc->bc", linear.final, a - b), atol=1e-9)


def test_euler_is_the_euler_correction():
    """Euler's map: every later input takes ``σ_{j+1} − σ_j`` of output ``j``; the carried weights are the Euler
    correction's, all at the full step, bit for bit."""
    sigmas = flow_sigmas(10)
    linear = L.linearize("euler", L.sample_euler, sigmas)
    for k in range(10):
        for j in range(k):
            assert linear.seen[k, j].item() == sigmas[j + 1] - sigmas[j]
    rows = linear.carry(6, [4, 5])
    assert list(rows) == [6]
    assert rows[6] == [(sigmas[m + 1] - sigmas[m]) / (sigmas[7] - sigmas[6]) for m in (4, 5)]


@pytest.mark.parametrize("name", ["dpmpp_2m", "deis", "res_multistep", "uni_pc", "uni_pc_bh2"])
def test_the_carried_weights_put_every_later_input_and_the_result_where_they_should_be(name):
    """``Σ_j T[k, j] d_j = Σ_m T[k, m] e_m`` for every step from the full one on, with ``d`` the carried outputs (the
    weights dropped being below :data:`~tome_core.caching.samplers.DROPPED`); a multistep sampler carries past the
    full step."""
    sigmas = flow_sigmas(20)
    linear = L.linearize(name, L.BUILT_IN[name], sigmas)
    full, cached = 9, [7, 8]
    rows = linear.carry(full, cached)
    assert len(rows) > 1 and min(rows) == full
    e = torch.tensor([0.7, -1.3], dtype=torch.float64)
    d = torch.zeros(20, dtype=torch.float64)
    for k, row in rows.items():
        d[k] = torch.tensor(row, dtype=torch.float64) @ e
    for k in range(full, 20):
        target = linear.target(k)
        assert abs(float(target @ d) - float(target[cached] @ e)) < 1e-3 * float(e.abs().max())


def test_a_sampler_that_calls_the_model_twice_a_step_is_no_linear_one():
    def heun(model, x, sigmas, **_):
        for i in range(len(sigmas) - 1):
            d = (x - model(x, sigmas[i])) / sigmas[i]
            x2 = x + (sigmas[i + 1] - sigmas[i]) * d
            d2 = (x2 - model(x2, sigmas[i + 1])) / sigmas[i + 1] if sigmas[i + 1] > 0 else d
            x = x + (sigmas[i + 1] - sigmas[i]) * (d + d2) / 2
        return x

    with pytest.raises(L.NotLinear, match="calls the model 7 times in 4 steps"):
        L.linearize("heun", heun, flow_sigmas(4))


def test_names_and_why_not():
    assert L.name_of("sample_unipc") == "uni_pc" and L.name_of("sample_dpmpp_2m") == "dpmpp_2m"
    assert L.why_not("DPM++ 2M", "dpmpp_2m") is None
    assert L.why_not("Euler", "euler", churn=0.5) == f"the sampler is Euler; {L.ACTS_UNDER}"
    assert L.why_not("Euler a", "euler_ancestral") == f"the sampler is Euler a; {L.ACTS_UNDER}"


COMFY = comfy_functions()


@pytest.mark.skipif(COMFY is None, reason="no ComfyUI checkout (TOME_COMFYUI)")
def test_the_cores_samplers_are_comfyuis():
    """Euler, DPM++ 2M and res_multistep to the bit; DEIS within its quadrature (ComfyUI's 10,000-point sum, ours
    Gauss–Legendre); UniPC within ComfyUI's float32 coefficients. On 4 to 20 steps, ending at 0 or not."""
    for sigmas in (
        flow_sigmas(4),
        flow_sigmas(8),
        flow_sigmas(20),
        [*flow_sigmas(20)[:-2], 0.0],
        flow_sigmas(9, end=0.03),
    ):
        for name in sorted(L.BUILT_IN):
            theirs = L.linearize(name, COMFY[name], sigmas)
            ours = L.linearize(name, L.BUILT_IN[name], sigmas)
            tolerance = 0.0 if name in ("euler", "dpmpp_2m", "res_multistep") else 1e-3
            assert (theirs.seen - ours.seen).abs().max() <= tolerance, (name, len(sigmas))
            assert (theirs.final - ours.final).abs().max() <= tolerance, (name, len(sigmas))


@pytest.mark.parametrize("name", ["dpmpp_2m", "uni_pc", "euler"])
def test_after_more_than_two_cached_steps_a_multistep_sampler_carries_two_thirds(name):
    """A full step after two cached steps carries their errors with the map's weights, its own output and (under a
    multistep sampler) the next one's; after three, two thirds of them under a multistep sampler, all under Euler."""
    sigmas = flow_sigmas(12)
    sampler = L.linearize(name, L.BUILT_IN[name], sigmas)
    head = lambda args, kwargs, image: image  # noqa: E731  (the output layer: its stream as it is)
    zero, residual = torch.zeros(4, dtype=torch.float64), torch.arange(4, dtype=torch.float64)
    for cached in (2, 3):
        correction = C.Correction(1.0)
        correction.full(sigmas[0], zero)
        assert correction.correct(zero, 0, sampler, head) is None  # nothing cached yet
        for step in range(1, cached + 1):
            correction.cached(step, (), {}, zero, torch.float64)
            assert correction.output(zero) is None
        full = cached + 1
        correction.full(sigmas[full], residual)
        carried = correction.correct(zero, full, sampler, head)
        weights = sampler.carry(full, list(range(1, cached + 1)))
        share = C.LONG_SHARE if cached > C.HISTORY_UP_TO and name != "euler" else 1.0
        errors = [C.interpolate([(sigmas[0], zero), (sigmas[full], residual)], sigmas[m]) for m in range(1, full)]
        assert torch.allclose(carried, share * sum(w * e for w, e in zip(weights[full], errors)))
        later = correction.carry(zero, full + 1)
        assert (later is None) == (name == "euler")
        if later is not None:
            assert torch.allclose(later, share * sum(w * e for w, e in zip(weights[full + 1], errors)))
