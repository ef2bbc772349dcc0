"""Higher-order and global forecasts of the deep features, for :mod:`benchmarks.quality.forecast_study` only (issue 27: "compare
with a higher-order or global fit"), each written from its paper's description, none from its code. Each keeps what
:class:`tome_core.caching.forecast.Forecast` keeps per stream and answers the same calls (``add``, ``predict``, ``nbytes``), so the
study runs it on the real step cache in place of ``Forecast``; times are the UNet's timesteps, read back as numbers (a
study may synchronise).

With ``x`` the cached step's distance past the last full step in units of the last interval between full steps, and
``Δ1 = d2 - d1``, ``Δ2`` the backward differences of the last three full steps' deep features per that interval
(``d2 - 2 d1 + d0`` where the three are evenly spaced; from the divided differences where not, so that a straight
trajectory has none):

* **TaylorSeer, order 2** (arXiv 2503.06923): ``d2 + Δ1 x + Δ2 x² / 2``, the differences taken as derivatives per
  interval; with fewer than three full steps, order 1 (our linear forecast);
* **HiCache** (arXiv 2508.16984): the same terms on scaled physicists' Hermite polynomials instead of powers,
  ``H_n(σx) / (2σ)^n`` (monic: ``x`` and ``x² - 1/(2σ²)``), which pulls the second-order term back where ``x`` is
  small (``σ`` is ours: 1);
* **Spectrum** (arXiv 2603.01623): a ridge fit (``lam`` 0.5) of Chebyshev polynomials up to degree 6 of the time over
  the last 8 full steps, blended ``w : 1 - w`` with the linear forecast (its defaults: ``w`` 0.25; and ``w`` 1, the fit
  alone).

* **FoCa's predictor-corrector** (arXiv 2508.16211; its paper is not here: from cache-dit's description of its
  ``FoCaCalibrator``, a BDF2 predictor with a Heun corrector, in the sampler's time): the last value, full or
  forecast, stepped on by the mean of two slopes, the last two full steps' and the local one between the last two
  values, so that each forecast feeds the next and the jump at a full step corrects the ones after it
  (:class:`Trapezoid`; the same rule as the anchor :class:`benchmarks.lab.dit_anchors.FoCa`, on our schedules).

* **ours, calibrated at order 2** (FoCa's "forecast, then calibrate" taken one order further): the live probe
  gives the coefficients of both differences (:class:`CalibratedTaylor`).

Times enter as the timestep (TaylorSeer's and HiCache's ``x`` from it, so uneven spacings are honoured as the linear
forecast honours them); Spectrum maps the timestep to [-1, 1] over 0–1000.
"""

from __future__ import annotations

import contextlib

import torch

import tome_core.caching.cache as step_cache
from benchmarks.lab.anchors import chebyshev_ridge
from tome_core.caching.forecast import subsample


class History:
    """The last ``keep`` full steps' (time, deep features) of one stream; before two are known, the last is reused."""

    keep = 3

    def __init__(self, forecast: str = "linear", store: torch.device | None = None) -> None:
        if store is not None:
            raise ValueError(
                f"cache_device: the study's forecasters keep features where they were made, not on {store}"
            )
        self.points: list[tuple[float, torch.Tensor]] = []

    def fetch(self) -> None:
        """Nothing to bring back: the features stay where they were made (``store`` is None)."""

    def add(self, time, deep: torch.Tensor, probe: torch.Tensor | None = None) -> None:
        if self.points and self.points[-1][1].shape != deep.shape:
            self.points = []
        self.points = [*self.points, (float(time), deep)][-self.keep :]

    @property
    def deep(self) -> torch.Tensor | None:
        return self.points[-1][1] if self.points else None

    def predict(self, time, probe: torch.Tensor | None = None) -> torch.Tensor | None:
        if len(self.points) < 2:
            return self.deep
        (t1, _), (t2, _) = self.points[-2:]
        x = (float(time) - t2) / (t2 - t1) if t2 != t1 else 0.0
        return self.extrapolate(x, float(time))

    def extrapolate(self, x: float, time: float) -> torch.Tensor:
        (_, d1), (_, d2) = self.points[-2:]
        return d2 + x * (d2 - d1)

    def nbytes(self) -> int:
        return sum(d.numel() * d.element_size() for _, d in self.points)


class Taylor(History):
    """TaylorSeer, order 2 (see the module)."""

    def extrapolate(self, x: float, time: float) -> torch.Tensor:
        if len(self.points) < 3:
            return super().extrapolate(x, time)
        (t0, d0), (t1, d1), (t2, d2) = self.points
        if len({t0, t1, t2}) < 3:
            return super().extrapolate(x, time)
        # the second difference per the last interval, from the divided differences (d2 - 2 d1 + d0 where even)
        second = 2 * (t2 - t1) ** 2 / (t2 - t0) * ((d2 - d1) / (t2 - t1) - (d1 - d0) / (t1 - t0))
        return d2 + x * (d2 - d1) + self.second(x) * second

    def second(self, x: float) -> float:
        return x * x / 2


class Hermite(Taylor):
    """HiCache's scaled Hermite basis at order 2 (see the module)."""

    sigma = 1.0

    def second(self, x: float) -> float:
        return (x * x - 1 / (2 * self.sigma**2)) / 2


class Chebyshev(History):
    """Spectrum's Chebyshev ridge fit over the last 8 full steps, blended with the linear forecast (see the module)."""

    keep, degree, lam = 8, 6, 0.5

    def __init__(self, forecast: str = "linear", store: torch.device | None = None, w: float = 0.25) -> None:
        super().__init__(forecast, store)
        self.w = w

    def extrapolate(self, x: float, time: float) -> torch.Tensor:
        linear = super().extrapolate(x, time)
        history = [(t / 1000 * 2 - 1, d) for t, d in self.points]
        return (1 - self.w) * linear + self.w * chebyshev_ridge(history, time / 1000 * 2 - 1, self.degree, self.lam)


class Trapezoid(History):
    """FoCa's predictor-corrector (see the module): keeps the last two full steps and the last two values."""

    keep = 2

    def __init__(self, forecast: str = "linear", store: torch.device | None = None) -> None:
        super().__init__(forecast, store)
        self.values: list[tuple[float, torch.Tensor]] = []  # the last two values (full or forecast along a line)

    def add(self, time, deep: torch.Tensor, probe: torch.Tensor | None = None) -> None:
        on_line = len(self.values) == 2 and self.values[-1][1] is not self.deep
        if not on_line:  # after reuse only, the value before this full step is the last full step's
            self.values = self.points[-1:]
        super().add(time, deep, probe)
        self.values = [*self.values, self.points[-1]][-2:] if len(self.points) == 2 else self.points[-1:]

    def extrapolate(self, x: float, time: float) -> torch.Tensor:
        (t1, d1), (t2, d2) = self.points
        (ta, va), (tb, vb) = self.values
        slope = (d2 - d1) / (t2 - t1)
        local = (vb - va) / (tb - ta) if tb != ta else slope
        out = vb + (time - tb) * 0.5 * (local + slope)
        self.values = [self.values[-1], (time, out)]
        return out

    def nbytes(self) -> int:
        held = {id(d): d for _, d in [*self.points, *self.values]}
        return sum(d.numel() * d.element_size() for d in held.values())


class CalibratedTaylor(History):
    """Ours, calibrated at order 2: the live probe's change since the last full step, projected (least squares, per
    image) onto the probe's own two backward differences, gives both coefficients, which then move the deep features
    along theirs: ``d2 + a Δ1 + b Δ2`` (``a`` within [0, 2], ``|b|`` at most 2); order 1 (our calibrated forecast)
    while fewer than three full steps are known."""

    def add(self, time, deep: torch.Tensor, probe: torch.Tensor | None = None) -> None:
        if self.points and self.points[-1][1].shape != deep.shape:
            self.points = []
        self.points = [*self.points, (float(time), deep, subsample(probe).clone())][-self.keep :]

    @property
    def deep(self) -> torch.Tensor | None:
        return self.points[-1][1] if self.points else None

    def predict(self, time, probe: torch.Tensor | None = None) -> torch.Tensor | None:
        if len(self.points) < 2 or probe is None:
            return self.deep
        live = subsample(probe)
        (_, d1, p1), (_, d2, p2) = self.points[-2:]
        moved, first = live - p2, p2 - p1
        if len(self.points) < 3:
            a = _solve(moved, [first])[0].clamp(0, 2)
            return d2 + _per_image(a, d2) * (d2 - d1)
        (_, d0, p0) = self.points[0]
        a, b = _solve(moved, [first, first - (p1 - p0)])
        a, b = _per_image(a.clamp(0, 2), d2), _per_image(b.clamp(-2, 2), d2)
        return d2 + a * (d2 - d1) + b * ((d2 - d1) - (d1 - d0))

    def nbytes(self) -> int:
        return sum(d.numel() * d.element_size() + p.numel() * p.element_size() for _, d, p in self.points)


@contextlib.contextmanager
def swapped(factory):
    """While inside, the step cache follows each stream's deep features with ``factory(forecast)`` (None: its own)."""
    original = step_cache.Forecast
    step_cache.Forecast = factory or original
    try:
        yield
    finally:
        step_cache.Forecast = original


def _solve(target: torch.Tensor, basis: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per image (first dimension), the least-squares coefficients of ``target ≈ Σ c_i basis_i`` (a tiny ridge keeps a
    degenerate basis finite)."""
    flat = torch.stack([b.flatten(1) for b in basis], dim=1)  # (B, k, n)
    gram = flat @ flat.transpose(1, 2)
    gram = gram + 1e-6 * gram.diagonal(dim1=1, dim2=2).mean(-1).clamp_min(1e-12)[:, None, None] * torch.eye(len(basis))
    rhs = flat @ target.flatten(1).unsqueeze(-1)
    return list(torch.linalg.solve(gram, rhs).squeeze(-1).unbind(1))


def _per_image(c: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return c.reshape(-1, *[1] * (like.dim() - 1)).to(like.dtype)
