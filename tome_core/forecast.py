"""What a cached step takes for the deep features: those of the stream's last full step (DeepCache), or their forecast
from the last two full steps (``cache_forecast``).

A :class:`Track` follows one stream's deep features across its full steps, each with the sampler time of its call (the
UNet's timestep, kept as the tensor it came in, so that nothing is read back from the device). ``off`` returns the last
full step's features themselves (bit-identical to DeepCache); ``linear`` extrapolates them in that time from the last
two full steps, ``d + (t - t1) * (d1 - d0) / (t1 - t0)``: exact for features that move linearly in the sampler's time,
whatever the spacing of the steps (Karras' uneven sigmas included), and the last features unchanged while only one full
step is known (the first cached steps of a pass).
"""

from __future__ import annotations

import torch

from .settings import FORECAST_CHOICES

Time = torch.Tensor | float | None
"""A call's sampler time: its timestep (a 0-d tensor on the UNet's device, or a number); None when unknown."""


class Track:
    """One stream's deep features over its full steps, and their forecast at a cached step's time."""

    def __init__(self, forecast: str) -> None:
        if forecast not in FORECAST_CHOICES:
            raise ValueError(f"forecast {forecast!r}: one of {FORECAST_CHOICES}")
        self.forecast = forecast
        self.time: torch.Tensor | None = None  # the last full step's time (0-d, float32, on the features' device)
        self.deep: torch.Tensor | None = None  # its deep features
        self.slope: torch.Tensor | None = None  # their change per unit of time since the full step before (linear)

    def add(self, time: Time, deep: torch.Tensor) -> None:
        """A full step's deep features (a copy the caller no longer changes) at its sampler time."""
        now = _as_time(time, deep)
        self.slope = None
        if self.forecast == "linear" and now is not None and self.time is not None and self.deep.shape == deep.shape:
            span = now - self.time
            self.slope = (deep - self.deep) / span.where(span != 0, torch.inf)  # no time passed: no slope
        self.time, self.deep = now, deep

    def predict(self, time: Time) -> torch.Tensor | None:
        """The deep features for a cached step at ``time``: the last full step's (``off``, no slope yet, or no time),
        else their linear forecast; None before any full step."""
        now = None if self.deep is None else _as_time(time, self.deep)
        if self.slope is None or now is None:
            return self.deep
        return self.deep + self.slope * (now - self.time)

    def nbytes(self) -> int:
        """Bytes held (the last deep features and, for ``linear``, their slope)."""
        return sum(t.numel() * t.element_size() for t in (self.deep, self.slope) if t is not None)


def _as_time(time: Time, like: torch.Tensor) -> torch.Tensor | None:
    """``time`` as a 0-d float32 tensor on ``like``'s device (a tensor already there is not copied)."""
    if time is None:
        return None
    return torch.as_tensor(time, dtype=torch.float32, device=like.device).reshape(())
