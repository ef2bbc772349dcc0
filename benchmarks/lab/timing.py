"""Timing the benchmarks share: the device and dtype they run in, a model made ready for it, and a timer.

On a CPU, process CPU time (and wall time); on CUDA, GPU time from events around the timed block, which also
records the peak memory allocated inside it.
"""

from __future__ import annotations

import time

import torch


def device_and_dtype() -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.float16
    return torch.device("cpu"), torch.float32


def prepare(unet: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """``unet`` on ``device`` in ``dtype``; in a half type, ldm's GroupNorm32 keeps float32 weights (it normalises
    its input in float32) and every other module, the transformers' plain GroupNorm included, takes ``dtype``:
    CUDA's group norm wants its input and weights in one dtype."""
    from ldm.modules.diffusionmodules.util import GroupNorm32

    unet = unet.to(device)
    if dtype != torch.float32:
        unet = unet.to(dtype)
        unet.dtype = dtype  # ldm's use_fp16 flag, for any half type
        for m in unet.modules():
            if isinstance(m, GroupNorm32):
                m.float()
        unet.time_embed.register_forward_pre_hook(lambda m, args: (args[0].to(dtype),))
    return unet


class Timer:
    """Times the ``with`` block: on CUDA with events, synchronising only at its start and end (and recording
    the peak memory allocated inside it); on a CPU with process CPU time and wall time."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = self.wall = 0.0
        self.peak_bytes: int | None = None

    def __enter__(self) -> Timer:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()
        self._c0, self._w0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            start, end = self._events
            end.record()
            end.synchronize()
            self.cpu = self.wall = start.elapsed_time(end) / 1000  # GPU time of the block
            self.peak_bytes = torch.cuda.max_memory_allocated()
        else:
            self.cpu, self.wall = time.process_time() - self._c0, time.perf_counter() - self._w0
