"""The samplers the cache's correction acts under, as the linear maps they are (issue 53).

A deterministic sampler of k-diffusion's kind (``sample(model, x, sigmas)``, the model a denoiser ``D(x, σ)``) that
calls the model once per step and adds no noise is linear in what the model gave: with ``out_j`` the model's output
at step ``j`` in the form ``D = x − σ·out`` (flow matching's velocity, an epsilon model's noise: what
:func:`.correction.output_is_direction` asks of a host), every input the model sees and the sampler's result are

    x_k = a_k·x_0 + Σ_{j<k} S[k, j]·out_j,        x_end = a·x_0 + Σ_j F[j]·out_j,

with coefficients that depend on the sigmas only: the sampler's own coefficients, its history terms included (DPM++
2M, DEIS, res_multistep and UniPC reuse one to three earlier outputs; UniPC's corrector moves ``x`` after the model
saw it). :func:`linearize` reads ``S`` and ``F`` off the sampler itself: it runs the sampler once on a latent whose
entries are the coefficients (entry 0: ``x_0``; entry ``1 + j``: ``out_j``), with a model that answers step ``j`` by
the unit vector of ``out_j``. Whatever the sampler's formulas, what comes back is its exact linear map; for Euler,
``S[k, j] = F[j] = σ_{j+1} − σ_j``.

**The correction it gives** (:meth:`LinearSampler.carry`). At full step ``n`` the cache knows, for the cached steps
``m`` since the last full one, how far their outputs were off, ``e_m`` (:mod:`.correction`). Had they been right,
every later input and the result would have been ``Σ_m S[k, m]·e_m`` (``F[m]·e_m``) away from where they are. The
outputs from step ``n`` on can still be changed, by ``d_k``: choose them so that every later input and the result
land where they should,

    Σ_{n≤j≤k} T[k, j]·d_j = Σ_m T[k, m]·e_m   for k = n … N−1,  T[k] = S[k + 1] (k < N−1), F (k = N−1),

a triangular system (a step's output moves the next input: ``T[k, k] ≠ 0``), solved step by step:
``d_k = Σ_m W[k, m]·e_m``. Under Euler, ``W[n, m] = (σ_{m+1} − σ_m)/(σ_{n+1} − σ_n)`` and every later ``W`` is 0: the
Euler correction, exactly. Under a multistep sampler the full step's output carries what the cached steps should
have added (through ``x`` and through the history the sampler still holds), and the next few outputs take back what
the full step's own change does through that history; the weights shrink step by step and are dropped below
``1e-4`` of the full step's. The model's answer to the moved inputs is what it is: the cache corrects the sampler's
arithmetic, not the model.

**Which samplers.** :data:`LINEAR` names ComfyUI's samplers that are of this kind (``euler``, ``dpmpp_2m``, ``deis``,
``res_multistep``, ``uni_pc``, ``uni_pc_bh2``, …); :data:`BUILT_IN` are the core's own implementations of them, written
from their papers for hosts that give a name and no function (tested against ComfyUI's own). A host that has the
sampler's function gives it instead (ComfyUI's ``KSAMPLER``, a diffusers scheduler run as one), so what is linearized is
what runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

SamplerFunction = Callable[..., torch.Tensor]
"""k-diffusion's sampler signature: ``sample(model, x, sigmas) -> x``, the model ``model(x, sigma) -> denoised``."""

DROPPED = 1e-4
"""Weights of later outputs below this share of the full step's own are dropped (:meth:`LinearSampler.carry`)."""


@dataclass(frozen=True)
class LinearSampler:
    """A sampler's linear map on one schedule (see the module): ``seen[k, j]`` the weight of step ``j``'s output in
    the input step ``k`` calls the model on, ``final[j]`` in the result (float64)."""

    name: str
    sigmas: tuple[float, ...]
    seen: torch.Tensor
    final: torch.Tensor

    @property
    def steps(self) -> int:
        return len(self.sigmas) - 1

    def target(self, k: int) -> torch.Tensor:
        """``T[k]``: the weights, over the outputs, of what step ``k``'s output first moves — the next input, or at the
        last step the result."""
        return self.seen[k + 1] if k + 1 < self.steps else self.final

    def carry(self, step: int, cached: Sequence[int]) -> dict[int, list[float]]:
        """``W``: per step ``k ≥ step``, the weights over ``cached`` (earlier steps) of what step ``k``'s output carries
        so that every later input and the result are where they would be had each cached output been off by what the
        full step ``step`` finds (see the module). Steps whose weights are all negligible are left out."""
        rows: dict[int, list[float]] = {}
        solved: list[list[float]] = []  # W[step + i]
        scale = None
        for k in range(step, self.steps):
            t = self.target(k).tolist()
            row = [
                (t[m] - sum(t[step + i] * solved[i][c] for i in range(len(solved)))) / t[k]
                for c, m in enumerate(cached)
            ]
            solved.append(row)
            if scale is None:
                scale = max((abs(w) for w in row), default=0.0) or 1.0
            if any(abs(w) >= DROPPED * scale for w in row):
                rows[k] = row
        return rows


class NotLinear(ValueError):
    """The sampler is not one call per step, or gave no finite linear map."""


def linearize(name: str, sample: SamplerFunction, sigmas: Sequence[float]) -> LinearSampler:
    """The linear map of ``sample`` on ``sigmas`` (see the module), read by running it once on coefficient vectors.
    Raises :class:`NotLinear` where it calls the model other than once per step or gives non-finite weights. The global
    random state is left as it was (a sampler that drew noise is no linear one)."""
    sigmas = [float(s) for s in sigmas]
    steps = len(sigmas) - 1
    width = 1 + 2 * steps + 1
    inputs: list[torch.Tensor] = []

    def model(x: torch.Tensor, sigma: torch.Tensor, **kwargs) -> torch.Tensor:
        call = len(inputs)
        if call + 1 >= width:
            raise NotLinear(f"{name} calls the model more than twice a step")
        inputs.append(x.reshape(-1)[1:].clone())
        out = torch.zeros_like(x)
        out.view(-1)[1 + call] = 1.0
        return x - torch.as_tensor(sigma, dtype=x.dtype).reshape(-1)[0] * out

    for dtype in (torch.float64, torch.float32):  # float32 for a sampler that builds its coefficients so (UniPC)
        inputs.clear()
        x = torch.zeros(1, width, dtype=dtype)
        x[0, 0] = 1.0
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                result = sample(model, x, torch.tensor(sigmas, dtype=dtype)).double()
            break
        except RuntimeError:
            if dtype == torch.float32:
                raise
    if len(inputs) != steps:
        raise NotLinear(f"{name} calls the model {len(inputs)} times in {steps} steps")
    seen = torch.stack([v[:steps] for v in inputs])
    final = result.reshape(-1)[1 : 1 + steps].clone()
    if not (torch.isfinite(seen).all() and torch.isfinite(final).all()):
        raise NotLinear(f"{name} gave non-finite weights")
    return LinearSampler(name, tuple(sigmas), seen, final)


# --- the core's own samplers, by ComfyUI's names ----------------------------------------------------------------


def _direction(x: torch.Tensor, denoised: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    return (x - denoised) / sigma


def sample_euler(model, x: torch.Tensor, sigmas: torch.Tensor, **_) -> torch.Tensor:
    """First-order Euler: ``x ← x + (σ' − σ)·(x − D)/σ``."""
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        x = x + (sigmas[i + 1] - sigmas[i]) * _direction(x, denoised, sigmas[i])
    return x


def _t(sigma: torch.Tensor) -> torch.Tensor:
    return -sigma.log()


def sample_dpmpp_2m(model, x: torch.Tensor, sigmas: torch.Tensor, **_) -> torch.Tensor:
    """DPM-Solver++(2M) (Lu et al. 2022, arXiv 2211.01095) in k-diffusion's form: in ``t = −log σ``, with
    ``h = t' − t`` and ``r = h_last / h``, ``x ← (σ'/σ)·x − (e^{−h} − 1)·[(1 + 1/2r)·D − D_last/2r]``; first order at
    the first step and onto σ' = 0."""
    last = None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        if sigmas[i + 1] == 0:
            x = denoised
        else:
            h = _t(sigmas[i + 1]) - _t(sigmas[i])
            mix = denoised
            if last is not None:
                r = (_t(sigmas[i]) - _t(sigmas[i - 1])) / h
                mix = (1 + 1 / (2 * r)) * denoised - (1 / (2 * r)) * last
            x = (sigmas[i + 1] / sigmas[i]) * x - torch.expm1(-h) * mix
        last = denoised
    return x


def sample_res_multistep(model, x: torch.Tensor, sigmas: torch.Tensor, **_) -> torch.Tensor:
    """The second-order multistep exponential integrator of Zhang et al. (RES, arXiv 2308.02157) without noise: in
    ``t = −log σ``, ``x ← e^{−h}·x + h·(b1·D + b2·D_last)`` with ``c2 = (t_last − t)/h``, ``b1 = φ1(−h) − φ2(−h)/c2``,
    ``b2 = φ2(−h)/c2``; Euler at the first step and onto σ' = 0."""
    last = None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i])
        if last is None or sigmas[i + 1] == 0:
            x = x + (sigmas[i + 1] - sigmas[i]) * _direction(x, denoised, sigmas[i])
        else:
            t, t_next, t_last = _t(sigmas[i]), _t(sigmas[i + 1]), _t(sigmas[i - 1])
            h = t_next - t
            c2 = (t_last - t) / h
            phi1 = torch.expm1(-h) / -h
            phi2 = (phi1 - 1) / -h
            b1, b2 = phi1 - phi2 / c2, phi2 / c2
            x = torch.exp(-h) * x + h * (b1 * denoised + b2 * last)
        last = denoised
    return x


def _vp_time(sigma: float) -> float:
    """DEIS's variance-preserving time of a VE noise level ``sigma`` (:data:`_VP`: its β-schedule, fit to σ 0.002–80)."""
    beta_min, beta_d = _VP
    return (math.sqrt(beta_min**2 + 2 * beta_d * math.log(sigma * sigma + 1)) - beta_min) / beta_d


def _vp_schedule(sigma_min: float = 0.002, sigma_max: float = 80.0, epsilon: float = 1e-3) -> tuple[float, float]:
    beta_d = 2 * (math.log(sigma_min**2 + 1) / epsilon - math.log(sigma_max**2 + 1)) / (epsilon - 1)
    return math.log(sigma_max**2 + 1) - 0.5 * beta_d, beta_d


_VP = _vp_schedule()


def _deis_weight(nodes: Sequence[float], j: int, lo: float, hi: float) -> float:
    """∫_lo^hi w(τ)·L_j(τ) dτ in DEIS's VP time: ``L_j`` the Lagrange basis polynomial of node ``j`` over ``nodes``,
    ``w = −½ (d log α/dτ) / √(α(1 − α))`` the exponential integrator's weight of the noise prediction (Gauss–Legendre,
    64 points)."""
    beta_min, beta_d = _VP
    points, weights = _GAUSS
    total = 0.0
    for p, w in zip(points, weights):
        tau = lo + (hi - lo) * (p + 1) / 2
        log_alpha = -0.5 * tau * tau * beta_d - tau * beta_min
        alpha = math.exp(log_alpha)
        integrand = 0.5 * (tau * beta_d + beta_min) / math.sqrt(alpha * (1 - alpha))
        basis = math.prod((tau - nodes[k]) / (nodes[j] - nodes[k]) for k in range(len(nodes)) if k != j)
        total += w * integrand * basis
    return total * (hi - lo) / 2


def _gauss(n: int) -> tuple[list[float], list[float]]:
    import numpy

    points, weights = numpy.polynomial.legendre.leggauss(n)
    return points.tolist(), weights.tolist()


_GAUSS = _gauss(64)


def sample_deis(model, x: torch.Tensor, sigmas: torch.Tensor, max_order: int = 3, **_) -> torch.Tensor:
    """DEIS (Zhang & Chen 2022, arXiv 2204.13902), its "tAB" form: the noise prediction ``(x − D)/σ`` extrapolated by
    the polynomial, in the VP time of each σ, through this step's and up to ``max_order − 1`` earlier ones and
    integrated against the exponential integrator's weight; Euler at the first step and onto σ' = 0."""
    s = sigmas.tolist()
    times = [_vp_time(v) if v > 0 else 0.0 for v in s]
    kept: list[torch.Tensor] = []  # the noise predictions, newest last
    for i in range(len(s) - 1):
        denoised = model(x, sigmas[i])
        d = _direction(x, denoised, sigmas[i])
        order = 1 if s[i + 1] <= 0 else min(max_order, i + 1)
        if order == 1:
            x = x + (sigmas[i + 1] - sigmas[i]) * d
        else:
            nodes = [times[i - j] for j in range(order)]  # this step's, then the earlier ones
            history = [d, *reversed(kept[-(order - 1) :])]
            x = x + sum(_deis_weight(nodes, j, times[i], times[i + 1]) * history[j] for j in range(order))
        kept = [*kept, d][-(max_order - 1) :]
    return x


def _unipc(model, x: torch.Tensor, sigmas: torch.Tensor, variant: str, order: int = 3) -> torch.Tensor:
    """UniPC (Zhao et al. 2023, arXiv 2302.04867), multistep, predicting the data, with its corrector UniC at every
    step but the last, ``order`` capped by the steps and lowered towards the end; in the variance-preserving form of
    the VE schedule ``σ`` (``α = 1/√(1 + σ²)``, ``λ = −log σ``), the last σ 0 taken as 0.001. ``variant``: ``bh1``
    (``B(h) = h``) or ``bh2`` (``B(h) = e^h − 1``)."""
    s = sigmas.tolist()
    if s[-1] == 0:
        s[-1] = 0.001
    steps = len(s) - 1
    order = min(order, len(s) - 2)
    alpha = [1 / math.sqrt(1 + v * v) for v in s]
    lam = [-math.log(v) for v in s]

    def data(xv: torch.Tensor, i: int) -> torch.Tensor:  # the model's data prediction at the VP latent xv
        return model(xv / alpha[i], sigmas.new_tensor(s[i]))

    xv = x * alpha[0]
    outputs, times = [data(xv, 0)], [0]
    for step in range(1, steps + 1):
        k = min(order, step, steps + 1 - step)  # lower order at the start and towards the end
        i0, i = times[-1], step
        h = lam[i] - lam[i0]
        rks, d1s = [], []
        for back in range(1, k):
            j = times[-1 - back]
            rk = (lam[j] - lam[i0]) / h
            rks.append(rk)
            d1s.append((outputs[-1 - back] - outputs[-1]) / rk)
        rks.append(1.0)
        hh = -h  # predicting the data
        h_phi_1 = math.expm1(hh)
        b_h = hh if variant == "bh1" else h_phi_1
        h_phi_k = h_phi_1 / hh - 1
        factorial = 1
        r_rows, b = [], []
        for n in range(1, k + 1):
            r_rows.append([r ** (n - 1) for r in rks])
            b.append(h_phi_k * factorial / b_h)
            factorial *= n + 1
            h_phi_k = h_phi_k / hh - 1 / factorial
        r_mat, b_vec = torch.tensor(r_rows, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
        base = (alpha[i] * math.exp(-lam[i]) / (alpha[i0] * math.exp(-lam[i0]))) * xv - alpha[i] * h_phi_1 * outputs[-1]
        predicted = base
        if d1s:
            if k == 2:
                rhos_p = torch.tensor([0.5], dtype=torch.float64)
            else:
                rhos_p = torch.linalg.solve(r_mat[:-1, :-1], b_vec[:-1])
            predicted = base - alpha[i] * b_h * sum(float(rhos_p[c]) * d1s[c] for c in range(len(d1s)))
        if step == steps:  # the last step: no corrector, no model call
            xv = predicted
            break
        new = data(predicted, i)
        rhos_c = torch.tensor([0.5], dtype=torch.float64) if k == 1 else torch.linalg.solve(r_mat, b_vec)
        corr = sum(float(rhos_c[c]) * d1s[c] for c in range(len(d1s))) if d1s else 0
        xv = base - alpha[i] * b_h * (corr + float(rhos_c[-1]) * (new - outputs[-1]))
        outputs, times = [*outputs, new][-order:], [*times, i][-order:]
    return xv / alpha[-1]


def sample_uni_pc(model, x: torch.Tensor, sigmas: torch.Tensor, **_) -> torch.Tensor:
    return _unipc(model, x, sigmas, "bh1")


def sample_uni_pc_bh2(model, x: torch.Tensor, sigmas: torch.Tensor, **_) -> torch.Tensor:
    return _unipc(model, x, sigmas, "bh2")


BUILT_IN: dict[str, SamplerFunction] = {
    "euler": sample_euler,
    "dpmpp_2m": sample_dpmpp_2m,
    "deis": sample_deis,
    "res_multistep": sample_res_multistep,
    "uni_pc": sample_uni_pc,
    "uni_pc_bh2": sample_uni_pc_bh2,
}
"""The core's own samplers by ComfyUI's names (see the module)."""

LINEAR = frozenset(BUILT_IN) | {"ipndm", "ipndm_v", "lms", "gradient_estimation"}
"""The samplers (by ComfyUI's names, :func:`name_of`) that are linear, one call per step, without noise: a host may
give their functions to :func:`linearize`."""

_NAMES = {"sample_unipc": "uni_pc", "sample_unipc_bh2": "uni_pc_bh2"}


def name_of(function: str) -> str:
    """The sampler's name (ComfyUI's) of a k-diffusion sampler function's ``__name__`` (ComfyUI's and the WebUI's:
    ``sample_dpmpp_2m`` → ``dpmpp_2m``, ``sample_unipc`` → ``uni_pc``)."""
    return _NAMES.get(function, function.removeprefix("sample_"))


def why_not(shown: str, name: str, churn: float = 0.0) -> str | None:
    """Why the correction cannot act under a host's sampler (``shown``: as the host shows it; ``name``:
    :func:`name_of` its function; ``churn``: Euler's ``s_churn``, which adds noise), or None where it can."""
    if name not in LINEAR or churn > 0:
        return f"the sampler is {shown}; {ACTS_UNDER}"
    return None


ACTS_UNDER = "the correction acts under linear samplers (euler, dpmpp_2m, deis, res_multistep, uni_pc and the like)"
"""The end of the note where a sampler is no linear one."""
