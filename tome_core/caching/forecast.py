"""What a cached step takes for the deep features: those of the stream's last full step (DeepCache), or their forecast
from the last two full steps (``cache_forecast``).

A :class:`Forecast` follows one stream's deep features across its full steps, each with the sampler time of its call (the
UNet's timestep, kept as the tensor it came in, so that nothing is read back from the device) and, where the caller
has them, the probe: features the cached steps compute live as well (for the UNet, the shallow skip connection into
the first block a cached step runs again; the module knows only tensors, so any block model's live features serve).
From the last full step's features ``d1`` and the change ``d1 - d0`` since the full step before:

* ``off``: ``d1`` itself (bit-identical to DeepCache);
* ``linear``: ``d1 + a (d1 - d0)`` with ``a = (t - t1) / (t1 - t0)``, their extrapolation in the sampler's time: exact
  for features that move linearly in it, whatever the spacing of the steps (Karras' uneven sigmas included);
* ``calibrated``: the same line, but ``a`` is read off the probe, per image of the batch: the least-squares position
  of the live probe ``p`` on the probe's own line, ``a = <p - p1, p1 - p0> / |p1 - p0|²``, kept within [0, 2] (FoCa's
  "forecast, then calibrate", from its description, with the probe as the calibration). Where the sampler moves as
  its times say, ``a`` is about the time's; where it adds fresh noise (ancestral and SDE samplers), the probe's move is
  partly off the line, ``a`` shrinks towards 0 and the forecast towards DeepCache's reuse, instead of extrapolating
  the last step's noise. Without a probe it is ``linear``.

While only one full step is known (the first cached steps of a pass) every forecast is ``d1``. The probe is taken on
every 4th position per side (1/16 of it), so the calibration costs two dot products on a small tensor per cached
step, and nothing is read back from the device.

``cache_device: cpu`` keeps ``d1`` and ``d1 - d0`` (what a forecast holds that is as large as the features) in CPU
memory between steps: copied there without blocking as a full step keeps them (pinned memory, from a GPU), and back
to the features' device as a cached pass begins (:meth:`Forecast.fetch`), ahead of the blocks that run before the
forecast is needed; copies are exact, so the forecast is the same bits. The time and the subsampled probe stay.
"""

from __future__ import annotations

import torch

from ..settings import AUTO, FORECAST_CHOICES

Time = torch.Tensor | float | None
"""A call's sampler time: its timestep (a 0-d tensor on the UNet's device, or a number); None when unknown."""

PROBE_STRIDE = 4
"""The probe's stride per side (its last two dimensions)."""
REACH = (0.0, 2.0)
"""The calibrated forecast's bounds on ``a`` (a cached step lies at most two intervals past the last full one)."""


class Forecast:
    """One stream's deep features over its full steps, and their forecast at a cached step (see the module)."""

    def __init__(self, forecast: str, store: torch.device | None = None) -> None:
        if forecast not in FORECAST_CHOICES or forecast == AUTO:
            raise ValueError(f"forecast {forecast!r}: one of {FORECAST_CHOICES} but {AUTO!r} (a family resolves it)")
        self.forecast = forecast
        self.store = store  # where the features and their change are kept between steps (None: where they were made)
        self.device: torch.device | None = None  # where they were made, and are wanted back
        self._fetched: tuple[torch.Tensor, torch.Tensor | None] | None = None  # both back there, for the next predict
        self.time: torch.Tensor | None = None  # the last full step's time (0-d, float32, on the features' device)
        self.deep: torch.Tensor | None = None  # its deep features
        self.change: torch.Tensor | None = None  # their change since the full step before (not off)
        self.span: torch.Tensor | None = None  # the time between those two full steps
        self.probe: torch.Tensor | None = None  # the last full step's probe, subsampled (calibrated)
        self.probe_change: torch.Tensor | None = None  # its change since the full step before

    def add(self, time: Time, deep: torch.Tensor, probe: torch.Tensor | None = None) -> None:
        """A full step's deep features (a copy the caller no longer changes) at its sampler time, with its probe."""
        now = _as_time(time, deep.device)
        # a copy: a view would keep the caller's whole tensor (the entry block's input) alive until the next full step
        probe = subsample(probe).clone() if self.forecast == "calibrated" and probe is not None else None
        previous, change = moved_to(self.deep, deep.device), None
        self.span = self.probe_change = None
        if self.forecast != "off" and previous is not None and previous.shape == deep.shape:
            change = deep - previous
            if now is not None and self.time is not None:
                self.span = now - self.time
            if probe is not None and self.probe is not None and self.probe.shape == probe.shape:
                self.probe_change = probe - self.probe
        self.time, self.probe, self.device, self._fetched = now, probe, deep.device, None
        self.deep, self.change = kept_on(deep, self.store), kept_on(change, self.store)

    def fetch(self) -> None:
        """A cached pass begins: with the features kept elsewhere (``store``), start copying them back to their
        device, so that :meth:`predict` finds them there."""
        if self.store is not None and self.deep is not None and self.device is not None:
            self._fetched = (moved_to(self.deep, self.device), moved_to(self.change, self.device))

    def predict(self, time: Time, probe: torch.Tensor | None = None) -> torch.Tensor | None:
        """The deep features for a cached step at ``time`` (with its live ``probe``); None before any full step."""
        if self._fetched is None:
            self.fetch()
        deep, change = self._fetched or (self.deep, self.change)
        self._fetched = None
        if change is None or deep is None:
            return deep
        if self.probe_change is not None and probe is not None and probe.shape[-2:] == deep.shape[-2:]:
            live = subsample(probe)
            if live.shape == self.probe.shape:
                return deep + _position(live - self.probe, self.probe_change) * change
        now = None if self.span is None else _as_time(time, deep.device)
        if now is None:
            return deep
        a = (now - self.time) / self.span.where(self.span != 0, torch.inf)  # no time passed: no slope
        return deep + a * change

    def nbytes(self) -> int:
        """Bytes held: the last deep features, their change and (calibrated) the subsampled probe and its change."""
        held = (self.deep, self.change, self.probe, self.probe_change)
        return sum(t.numel() * t.element_size() for t in held if t is not None)


def subsample(x: torch.Tensor) -> torch.Tensor:
    """The probe as the calibrated forecast reads it: every :data:`PROBE_STRIDE`-th position of its last two
    dimensions, in float32."""
    return x[..., ::PROBE_STRIDE, ::PROBE_STRIDE].float()


def _position(moved: torch.Tensor, line: torch.Tensor) -> torch.Tensor:
    """Per image (first dimension), the least-squares ``a`` of ``moved ≈ a * line``, within :data:`REACH` (0 where
    the line has no length), shaped to broadcast over that image's features."""
    dims = tuple(range(1, moved.dim()))
    along = (moved * line).sum(dims)
    length = (line * line).sum(dims)
    a = (along / length.where(length > 0, torch.inf)).clamp(*REACH)
    return a.reshape(-1, *[1] * (moved.dim() - 1))


def _as_time(time: Time, device: torch.device) -> torch.Tensor | None:
    """``time`` as a 0-d float32 tensor on ``device`` (a tensor already there is not copied)."""
    if time is None:
        return None
    return torch.as_tensor(time, dtype=torch.float32, device=device).reshape(())


def kept_on(t: torch.Tensor | None, store: torch.device | None) -> torch.Tensor | None:
    """``t`` where it is kept between steps: as it is (no ``store``, or already there), else a copy on ``store`` made
    without blocking (into pinned memory from a GPU, so the copy runs in the stream's order, without a sync)."""
    if t is None or store is None or t.device == store:
        return t
    if t.is_cuda and store.type == "cpu":
        kept = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return kept.copy_(t, non_blocking=True)
    return t.to(store)


def moved_to(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """``t`` on ``device``: itself where it is there, else a copy started without blocking."""
    return t if t is None or t.device == device else t.to(device, non_blocking=True)
