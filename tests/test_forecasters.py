"""The forecast study's higher-order and global fits (``benchmarks.lab.forecasters``, issue 27) and the fidelity benchmark's
price of the calibrated forecast."""

from __future__ import annotations

import pytest
import torch

import tome_core.caching.cache as step_cache
from benchmarks.lab import fidelity as B
from benchmarks.lab import forecasters as F
from benchmarks.lab import modes
from benchmarks.lab import prices as speed
from benchmarks.lab import sampling as S
from benchmarks.lab.anchors import chebyshev_ridge
from benchmarks.lab.trained.loading import load_model
from tome_core.caching.forecast import Forecast


def _fed(forecaster, times, f):
    for t in times:
        forecaster.add(torch.tensor(float(t)), f(t))
    return forecaster


@pytest.mark.parametrize("cls", [F.Taylor, F.Hermite])
def test_taylor_and_hermite_continue_a_straight_trajectory_exactly_at_any_spacing(cls):
    base, slope = torch.randn(2, 4, 3, 3), torch.randn(2, 4, 3, 3)
    line = lambda t: base + slope * (t / 100)  # noqa: E731
    forecaster = _fed(cls(), (900.0, 780.0, 500.0), line)
    torch.testing.assert_close(forecaster.predict(torch.tensor(300.0)), line(300.0), rtol=1e-5, atol=1e-5)


def test_taylor_takes_the_backward_differences_as_derivatives_and_hermite_shifts_the_second_order_term():
    d = [torch.full((1, 2), v) for v in (1.0, 2.0, 5.0)]  # Δ1 = 3, Δ2 = 2
    taylor, hermite = F.Taylor(), F.Hermite()
    for t, x in zip((30.0, 20.0, 10.0), d):
        taylor.add(t, x)
        hermite.add(t, x)
    # x = 1.5 intervals past the last full step: 5 + 3·1.5 + 2·1.5²/2, and Hermite's x² - 1/2 in place of x²
    assert taylor.predict(-5.0)[0, 0].item() == pytest.approx(5 + 4.5 + 2.25)
    assert hermite.predict(-5.0)[0, 0].item() == pytest.approx(5 + 4.5 + (2.25 - 0.5))
    assert F.Taylor().predict(1.0) is None and _fed(F.Taylor(), (30, 20), lambda t: d[0] * t).predict(0.0).sum() == 0


def test_spectrums_fit_is_exact_on_a_polynomial_of_its_degree_and_its_blend_weight_zero_is_linear():
    torch.manual_seed(0)
    c = torch.randn(4, 5)
    cubic = lambda tau: c[0] + c[1] * tau + c[2] * tau**2 + c[3] * tau**3  # noqa: E731
    history = [(tau, cubic(tau)) for tau in (-0.9, -0.7, -0.4, -0.2, 0.0, 0.3)]
    torch.testing.assert_close(chebyshev_ridge(history, 0.5, 3, 0.0), cubic(0.5), rtol=1e-4, atol=1e-4)
    f = lambda t: torch.full((1, 3), float(t) ** 2)  # noqa: E731
    blended, linear = _fed(F.Chebyshev(w=0.0), (900, 700, 500), f), _fed(F.History(), (900, 700, 500), f)
    assert torch.equal(blended.predict(400.0), linear.predict(400.0))
    assert len(_fed(F.Chebyshev(), range(1000, 0, -100), f).points) == 8  # the last 8 full steps


def test_focas_predictor_corrector_steps_on_from_its_last_value_by_the_mean_of_the_local_and_the_full_slopes():
    f = lambda t: torch.full((1, 2), float(t) ** 2)  # noqa: E731
    straight = _fed(F.Trapezoid(), (0.0, 1.0), lambda t: torch.full((1, 2), 3.0 * t))
    assert straight.predict(torch.tensor(2.0))[0, 0].item() == pytest.approx(6.0)  # a line is continued exactly
    tz = _fed(F.Trapezoid(), (0.0, 2.0), f)  # values 0, 4: slope 2
    assert tz.predict(torch.tensor(3.0))[0, 0].item() == pytest.approx(6.0)  # first: linear's, 4 + 2
    assert tz.predict(torch.tensor(4.0))[0, 0].item() == pytest.approx(8.0)  # local (6 - 4) / 1, full 2: 6 + 2
    tz.add(torch.tensor(5.0), f(5.0))  # 25: the local slope runs from the last forecast (8 at 4) to it, 17 per step
    assert tz.predict(torch.tensor(6.0))[0, 0].item() == pytest.approx(25 + 0.5 * (17 + (25 - 4) / 3))
    reused = F.Trapezoid()
    reused.add(0.0, f(0.0))
    assert torch.equal(reused.predict(1.0), f(0.0))  # one full step: reuse, and the next slope is the full steps'
    reused.add(3.0, f(3.0))
    assert reused.predict(torch.tensor(4.0))[0, 0].item() == pytest.approx(9 + 3)
    assert len(straight.points) == 2 and straight.nbytes() == 3 * 2 * 4  # two full steps and one forecast held


def test_the_study_runs_a_forecaster_on_the_real_step_cache_and_puts_the_caches_own_back():
    model = load_model("sd15")
    noise, labels = B.noise_for(range(2), model.size, model.channels), B.labels_for(range(2), len(model.classes))
    sigmas = S.schedule("euler", 8)
    mode = modes.cached(modes.PLAIN, 2, forecast="linear", schedule="time")
    predicted = []

    class Counted(F.Taylor):
        def predict(self, time, probe=None):
            predicted.append(len(self.points))
            return super().predict(time, probe)

    linear, _ = B.run_sampling(model, mode, noise, labels, sigmas, "euler")
    with F.swapped(Counted):
        taylor, counts = B.run_sampling(model, mode, noise, labels, sigmas, "euler")
    assert step_cache.Forecast is Forecast
    assert 3 in predicted and counts[0]["partial"] == len(predicted)  # order 2 once three full steps are known
    assert not torch.equal(taylor, linear)
    again, _ = B.run_sampling(model, mode, noise, labels, sigmas, "euler")
    assert torch.equal(again, linear)


def test_the_defaults_modes_run_the_defaults_and_are_priced_with_the_calibrated_forecasts_costs():
    defaults = {m.name: m for m in modes.DEFAULTS}
    mode = defaults["cache-3-calibrated-time+todo-2"]
    assert mode.family == "ours" and mode.settings["cache_forecast"] == "calibrated"
    assert mode.settings["cache_schedule"] == "time" and mode.settings["method"] == "downsample"
    assert defaults["cache-adaptive-0.08-10-calibrated"].settings["cache_schedule"] == "adaptive"
    assert modes.MODES["cache-3-linear"].settings["cache_schedule"] == "uniform"  # the earlier runs' modes
    counts = {"full": 8, "partial": 12}
    costs, extra = speed._step_costs("sd15"), speed._extra_costs("sd15")
    full, cached = costs.cost("full", "plain"), costs.cost("cached", "plain")
    for name, (update, predict) in (
        ("cache-3-linear", speed.FORECAST_COSTS["linear"]),
        ("cache-3-calibrated-time", speed.FORECAST_COSTS["calibrated"]),
    ):
        expected = 20 * full / (8 * (full + extra[update]) + 12 * (cached + extra[predict]))
        assert speed.priced("sd15", name, counts) == pytest.approx(expected)
    assert speed.priced("sd15", "cache-3", counts) == pytest.approx(20 * full / (8 * full + 12 * cached))


def test_calibrated_order_2_reads_both_coefficients_off_the_probe_per_image():
    torch.manual_seed(1)
    p = [torch.randn(2, 3, 8, 8) for _ in range(3)]
    d = [torch.randn(2, 5, 8, 8) for _ in range(3)]
    forecaster = F.CalibratedTaylor()
    for t, (deep, probe) in enumerate(zip(d, p)):
        forecaster.add(100.0 - 10 * t, deep, probe)
    first, second = p[2] - p[1], (p[2] - p[1]) - (p[1] - p[0])
    coefficients = torch.tensor([[0.7, -0.3], [1.4, 0.5]])  # per image
    live = p[2] + coefficients[:, 0, None, None, None] * first + coefficients[:, 1, None, None, None] * second
    out = forecaster.predict(75.0, live)
    for i, (a, b) in enumerate(coefficients.tolist()):
        expected = d[2][i] + a * (d[2][i] - d[1][i]) + b * ((d[2][i] - d[1][i]) - (d[1][i] - d[0][i]))
        torch.testing.assert_close(out[i], expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("cls", [c for c in vars(F).values() if isinstance(c, type) and issubclass(c, F.History)])
def test_every_study_forecaster_is_built_as_the_cache_builds_its_own(cls):
    assert cls("linear", None).points == []  # Forecast(forecast, store), with the features kept where they are made
    with pytest.raises(ValueError, match="cache_device"):
        cls("linear", torch.device("meta"))
