"""The benchmark samplers (issue 27's table): each runs the WebUI's calls — its scheduler, its timesteps, its calls per
step — and the ancestral and SDE samplers take each image's fresh noise from that image's seed alone."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from benchmarks.lab import sampling as S


class Recorder:
    """A denoiser that predicts ``denoised = x / (sigma² + 1)`` (the data of a unit Gaussian) and records its calls."""

    def __init__(self) -> None:
        self.sigmas: list[float] = []

    def eps(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        return (x - self(x, sigma)) / sigma

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        self.sigmas.append(sigma)
        return x / (sigma**2 + 1)


def _noise(n: int = 3) -> torch.Tensor:
    return torch.randn(n, 4, 8, 8, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("sampler", S.SAMPLERS)
def test_every_sampler_calls_the_model_as_the_webui_does_and_reports_every_step(sampler):
    model, progress = Recorder(), []
    out = S.sample(model, _noise(), S.schedule(sampler, 20), sampler, lambda i, n: progress.append((i, n)))
    calls = {"ddim": 19, "dpmpp_sde": 39}.get(sampler, 20)  # DDIM: one call fewer; DPM++ SDE: two per step but the last
    assert len(model.sigmas) == calls and torch.isfinite(out).all()
    assert progress == [(i, len(progress)) for i in range(len(progress))] and len(progress) in (19, 20)
    assert 0.85 < float(out.std()) < 1.15


@pytest.mark.parametrize("sampler", S.SAMPLERS)
def test_every_sampler_converges_to_the_data_of_an_exact_denoiser(sampler):
    # the data of that denoiser is a unit Gaussian: with 100 steps every sampler ends within 5 % of its spread
    noise = torch.randn(64, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    out = S.sample(Recorder(), noise, S.schedule(sampler, 100), sampler)
    assert 0.95 < float(out.std()) < 1.05


def test_the_schedulers_are_the_webuis():
    karras, exponential, discrete = S.schedule("dpmpp_2m", 20), S.schedule("dpmpp_2m_sde", 20), S.schedule("euler", 20)
    assert karras == S.schedule("dpmpp_sde", 20) and len(karras) == len(exponential) == len(discrete) == 21
    assert karras[-1] == exponential[-1] == discrete[-1] == 0.0
    assert math.isclose(karras[0], discrete[0], rel_tol=1e-9) and math.isclose(
        exponential[0], discrete[0], rel_tol=1e-9
    )
    logs = [math.log(s) for s in exponential[:-1]]
    assert all(math.isclose(a - b, logs[0] - logs[1], rel_tol=1e-9) for a, b in itertools.pairwise(logs))
    ddim = S.schedule("ddim", 20)
    assert [round(S.sigma_to_t(s)) for s in ddim] == list(range(951, 0, -50))


def test_ddim_passes_integer_timesteps_and_comfyuis_dpmpp_the_nearest_integer_to_the_webuis():
    def timesteps(sampler: str, integer: bool) -> list[float]:
        seen = []
        unet = lambda x, t, **c: seen.append(t[0].item()) or torch.zeros_like(x)  # noqa: E731
        S.sample(S.CFGDenoiser(unet, {}, 7.0, integer=integer), _noise(1), S.schedule(sampler, 20), sampler)
        return seen

    assert "ddim" in S.INTEGER and timesteps("ddim", True) == [float(t) for t in range(951, 1, -50)]
    webui, comfy = timesteps("dpmpp_2m", False), timesteps("dpmpp_2m_comfy", True)
    assert "dpmpp_2m_comfy" in S.INTEGER and "dpmpp_2m" not in S.INTEGER
    assert comfy == [float(round(t)) for t in webui] and comfy != webui


@pytest.mark.parametrize("sampler", S.STOCHASTIC)
def test_an_image_gets_the_same_fresh_noise_alone_or_in_a_batch_and_another_seed_other_noise(sampler):
    noise, sigmas = _noise(3), S.schedule(sampler, 8)
    batch = S.sample(Recorder(), noise, sigmas, sampler, noise_seeds=[10, 11, 12])
    alone = S.sample(Recorder(), noise[1:2], sigmas, sampler, noise_seeds=[11])
    other = S.sample(Recorder(), noise[1:2], sigmas, sampler, noise_seeds=[99])
    assert torch.allclose(batch[1:2], alone, atol=1e-6)
    assert not torch.allclose(alone, other, atol=1e-3)


def test_an_unknown_sampler_is_named():
    with pytest.raises(ValueError, match="'lms'"):
        S.sample(Recorder(), _noise(), S.schedule("euler", 4), "lms")


def test_the_sampler_table_merges_the_parts_of_a_run_a_later_cell_replacing_the_earlier(tmp_path, monkeypatch):
    from benchmarks.lab import results
    from benchmarks.quality import cache_by_sampler as samplers

    def cell(psnr: float, full: int) -> dict:
        return {"psnr": [psnr, psnr - 1, psnr + 1], "p5": psnr - 2, "p95": psnr + 2, "full": full}

    def other(psnr: float, speed: float) -> dict:
        return cell(psnr, 8) | {"speed": [speed, speed, speed]}

    runs = tmp_path / "runs"
    main = {
        "euler": {
            "deepcache-3": cell(30.0, 8),
            "calibrated-time-3": cell(33.0, 8),
            "fbcache-0.05": other(20.0, 2.06),
            "deepcache-nonuniform-3": other(29.0, 2.0),
            "spectrum": other(40.0, 1.2),  # more faithful, but slower than DeepCache N=3: not at its speed
        }
    }
    part = {"euler": {"calibrated-time-3": cell(35.0, 8)}, "ddim": {"deepcache-3": cell(31.0, 7)}}
    results.save_run_data("samplers-sd15", main, {"seeds": 4, "seconds": 60.0}, runs)
    results.save_run_data("samplers-sd15-b", part, {"seeds": 4, "seconds": 30.0}, runs)
    monkeypatch.setattr(samplers, "RUNS", runs)
    monkeypatch.setattr(samplers, "load_run_data", lambda name: results.load_run_data(name, runs))
    out = tmp_path / "RESULTS.md"
    monkeypatch.setattr(
        samplers, "write_section", lambda text, begin, end: results.write_section(text, begin, end, out)
    )
    samplers.render()
    text = out.read_text(encoding="utf-8")
    # the part's re-run replaced the main cell; the best other family at DeepCache N=3's speed (2.05x), within ±5 %
    assert "| Euler, N=3 | 30.0 (8) | — | 35.0 (8) | 29.0 (DeepCache non-uniform) |" in text
    assert "| DDIM, N=3 | 31.0 (7) | — | — | — |" in text and "4 seeds, 2 min" in text
    assert "| Euler | 29.0, 2.00× | 20.0, 2.06× | 40.0, 1.20× |" in text  # the other families' modes


def test_the_sampler_table_prices_the_other_families_modes_seed_by_seed():
    from benchmarks.lab.prices import priced
    from benchmarks.quality import cache_by_sampler as samplers

    saves = []
    data = samplers.run_layout(
        "sd15", ("euler",), 2, (3,), samplers.FORECASTS[:1], ("fbcache-0.05",), {}, lambda: saves.append(1), str
    )
    row = data["euler"]
    assert set(row) == {"deepcache-3", "fbcache-0.05"} and len(saves) == 2
    mean, slowest, fastest = row["fbcache-0.05"]["speed"]
    assert 1 < slowest <= mean <= fastest and row["deepcache-3"]["full"] == 8
    assert samplers.deepcache_speed("sd15", "euler", 3, row) == priced("sd15", "cache-3", {"full": 8, "partial": 12})
