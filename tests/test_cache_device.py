"""``cache_device`` (issue 37): where the step cache keeps the features it carries between steps. ``cpu`` keeps the
forecast's two feature-sized tensors in CPU memory and starts them back to the model's device as each cached pass
begins; the image is the same bits. (On this CPU-only machine both places are the CPU: the copies themselves run on a
GPU only; what is checked here is the bookkeeping, the order and the bits.)"""

from __future__ import annotations

import pytest
import torch
from models import make_unet

import tome_core
from benchmarks.lab.trained import flux
from tome_core.caching import forecast as F
from tome_core.caching.forecast import Forecast
from tome_core.settings import SettingsError


def test_the_setting_is_validated_and_defaults_to_the_models_device():
    assert tome_core.ToMeSettings().cache_device == "model"
    with pytest.raises(SettingsError, match=r"cache_device.*'model', 'cpu'"):
        tome_core.from_dict({"cache_device": "cuda"})


def _unet_run(settings: dict) -> tuple[list[torch.Tensor], tome_core.Session]:
    unet = make_unet("sd15")
    gen = torch.Generator().manual_seed(0)
    x, context = torch.randn(2, 4, 16, 16, generator=gen), torch.randn(2, 7, 64, generator=gen)
    session = tome_core.apply_settings(unet, tome_core.from_dict({"enabled": True, "ratio": 0.0, **settings}))
    outs = []
    with torch.no_grad():
        for i in range(8):
            session.set_progress(i / 8, 8)
            outs.append(unet(x, timesteps=torch.full((2,), 999.0 * (1 - i / 8)), context=context))
            x = x - 0.1 * outs[-1]
    return outs, session


@pytest.mark.parametrize("forecast", ["off", "linear", "calibrated"])
def test_keeping_the_features_on_the_cpu_gives_the_same_bits(forecast):
    cache = {"cache": True, "cache_interval": 3, "cache_forecast": forecast}
    model, kept = _unet_run(cache), _unet_run({**cache, "cache_device": "cpu"})
    assert all(torch.equal(a, b) for a, b in zip(model[0], kept[0]))
    forecasts = [f for s in kept[1].cache._streams.values() for f in s.forecasts]
    assert forecasts and all(f.store == torch.device("cpu") and f.deep.device.type == "cpu" for f in forecasts)
    assert kept[1].cache.cached_bytes() == model[1].cache.cached_bytes()  # the same tensors, kept elsewhere
    tome_core.remove_patch(model[1].root), tome_core.remove_patch(kept[1].root)


def test_a_cached_pass_starts_the_features_back_before_its_first_block_runs(monkeypatch):
    """The copy back is started as the pass begins (before the probe's blocks), and the forecast uses it."""
    order: list[str] = []
    fetch, predict = Forecast.fetch, Forecast.predict
    monkeypatch.setattr(Forecast, "fetch", lambda self: (order.append("fetch"), fetch(self))[1])
    monkeypatch.setattr(Forecast, "predict", lambda self, *a: (order.append("predict"), predict(self, *a))[1])
    model = flux.build(10, seed=3).eval().requires_grad_(False)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    first = model.transformer.transformer_blocks[0]
    first.register_forward_hook(lambda m, a, out: order.append("first block"))  # once the probe's block has run
    settings = {"enabled": True, "ratio": 0.0, "cache": True, "cache_interval": 2, "cache_device": "cpu"}
    session = tome_core.apply_settings(model.transformer, tome_core.from_dict(settings))
    with torch.no_grad():
        for i in range(6):
            session.set_progress(i / 6, 6)
            order.append("call")
            model.transformer(**model.inputs(x, torch.tensor(1 - i / 6), torch.tensor([2, -1])), return_dict=False)
    tome_core.remove_patch(model.transformer)
    calls = " ".join(order).split("call")[1:]
    assert [c.split() for c in calls if "predict" in c] == [["fetch", "first", "block", "predict"]] * 2


def test_kept_and_moved_copy_only_across_devices():
    t = torch.randn(3, 4)
    assert F.kept_on(t, None) is t and F.kept_on(t, torch.device("cpu")) is t and F.moved_to(t, t.device) is t
    assert F.kept_on(None, torch.device("cpu")) is None and F.moved_to(None, t.device) is None


@pytest.mark.parametrize("forecast", ["off", "linear"])
def test_the_benchmarks_held_bytes_are_what_the_cache_holds(forecast, capsys):
    """``benchmarks.speed.cache_device`` derives the real sizes from the tensors' sizes: checked against the cache's own
    count on the small FLUX model (cond and uncond batched: one stream of batch 2; 16 px in patches of width 96)."""
    from benchmarks.speed import cache_device as bench

    model = flux.build(10, seed=3).eval().requires_grad_(False)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    settings = {"enabled": True, "ratio": 0.0, "cache": True, "cache_interval": 3, "cache_forecast": forecast}
    session = tome_core.apply_settings(model.transformer, tome_core.from_dict(settings))
    with torch.no_grad():
        for i in range(5):  # full, cached, cached, full: two full steps known
            session.set_progress(i / 8, 8)
            model.transformer(**model.inputs(x, torch.tensor(1 - i / 8), torch.tensor([2, -1])), return_dict=False)
    held = session.cache.cached_bytes()
    tome_core.remove_patch(model.transformer)
    case = bench.Case("small FLUX", (16 // flux.PATCH) ** 2, 96, 4, 1, 2)
    assert held == bench.held_bytes(case, bench.FORECASTS[forecast]) > 0
    bench.main(["--quick"])
    assert "| tiny | 0.1 MiB" in capsys.readouterr().out
