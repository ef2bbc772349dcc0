"""The caches DiT users install, on diffusers' FLUX transformer, written from their published descriptions (no code
copied), as anchors for :mod:`benchmarks.quality.dit_fidelity` (issue 26). Each decides per call of the model whether to run
all its blocks, and what to return where it does not:

* **First Block Cache** (ParaAttention's FBCache, Comfy-WaveSpeed): the first double-stream block runs every step;
  where the relative L1 change of its residual against the last computed step's is below the threshold (0.07 and 0.12
  are the values users quote for FLUX), the other blocks are skipped and their last computed residual is added to
  what left the first block. First and last step computed.
* **TeaCache** (TeaCache4FLUX, arXiv 2411.19108): the relative L1 change of the first block's modulated input (its
  adaptive norm of the image tokens) from the step before, rescaled by a polynomial fitted to how much the model's
  output then changes, is accumulated; while the sum stays below the threshold the whole stack of blocks is skipped
  and its last computed residual added to the embedded input. The published polynomial is fitted to FLUX.1-dev
  (:data:`FLUX_POLYNOMIAL`); its authors fit it again for another model, so it also runs with one fitted to the
  model at hand (:func:`fit_teacache`). First and last step computed.
* **TaylorSeer** (arXiv 2503.06923): every ``interval``-th step (and the first ``first`` steps) computed; the steps
  between skip the blocks and take their output from a Taylor expansion in the step index around the last computed
  step, its derivatives the finite differences of the computed steps (orders 1 and 2). Its FLUX defaults: order 1,
  interval 6, the first 3 steps computed. Written here on the blocks' whole residual (the original caches each
  block's attention and MLP outputs; the forecast is the same expansion).
* **FoCa** (Forecast then Calibrate, arXiv 2508.16211, whose paper is not here: written from its abstract and from
  cache-dit's description of its ``FoCaCalibrator``, a BDF2 predictor with a Heun corrector): TaylorSeer's
  schedule; a skipped step's residual is the last value (computed or forecast) stepped on by the trapezoidal mean
  of two slopes per step of the index, the local one (the last two values, so forecasts feed the next forecast) and
  the anchor's (the last two computed steps). cache-dit writes the anchor's slope over the whole gap between them;
  here it is per step, so that both slopes are of one step (equal where the computed steps are consecutive).
* **MagCache** (arXiv 2506.14838): the ratio of the blocks' residual magnitude from one step to the next, calibrated
  per step on a few plain samples (:func:`magnitude_ratios`), is nearly constant until the last steps; a step is
  skipped (the last computed residual reused) while the error it accumulates, the sum of ``|1 - product of the
  ratios since the last computed step|``, stays below the threshold and at most ``k`` steps in a row are skipped; the
  first ``retain`` of the steps are computed.
* **EasyCache** (arXiv 2507.02860; ComfyUI's built-in): at the computed steps, the model's transformation rate
  (the change of its output over the change of its input, from the last two computed steps); a step is skipped while
  the output change this rate predicts from the input's change, relative to the last output and accumulated since
  the last computed step, stays below the threshold; a skipped step returns its input plus the last computed
  step's output-minus-input. Computed before ``start`` and after ``end`` of the steps (ComfyUI's 0.15, 0.95).
* **LazyCache** (ComfyUI's built-in beside EasyCache, read from ``comfy_extras/nodes_easycache.py`` at v0.8.0): the
  same rule one level up, on the guided prediction of the denoised image (cond and uncond together: a skipped step
  runs no model call at all) and on its input, both subsampled every 8th pixel per side; the changes are mean
  absolute differences from the last computed step's (each step adds the predicted one, relative to that step's mean
  absolute prediction, to the sum), the rate is the last computed step's output change over its input change, and
  the prediction of a skipped step is its input plus the last computed one's prediction-minus-input. Here, where the model
  returns both branches' velocities, a skipped step returns for both the velocity that gives that denoised image.

The model's forward is taken apart as diffusers' ``FluxTransformer2DModel.forward`` runs it (embeddings, the
double-stream blocks, the single-stream blocks, the output norm and projection; :func:`embed`, :func:`blocks`,
:func:`head`); a rule that computes every step gives the model's own output bit for bit. Rules run one image (its cond
and uncond batched) at a time, so that each decides for its image.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks.lab.anchors import rel_l1

FLUX_POLYNOMIAL = (4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00, 2.64230861e-01)
"""TeaCache4FLUX's rescaling polynomial (highest power first), published for FLUX.1-dev."""
KINDS = ("full", "first", "skip")
"""What a call cost: all blocks, the outside and the first block (First Block Cache's skip), the outside only (the
skips of TeaCache, TaylorSeer, FoCa, MagCache and EasyCache; EasyCache's skip runs not even the outside, so its price
is a few hundredths of a step high)."""


def embed(t: nn.Module, kw: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
    """The image and text streams, the time embedding and RoPE, as the model's forward makes them."""
    temb = t.time_text_embed(kw["timestep"].to(kw["hidden_states"].dtype) * 1000, kw["pooled_projections"])
    rope = t.pos_embed(torch.cat((kw["txt_ids"], kw["img_ids"]), dim=0))
    return t.x_embedder(kw["hidden_states"]), t.context_embedder(kw["encoder_hidden_states"]), temb, rope


def blocks(t: nn.Module, img, txt, temb, rope, double: slice = slice(None), single: bool = True) -> tuple:
    """The double-stream blocks in ``double``, then (``single``) every single-stream block: the streams after them."""
    for block in t.transformer_blocks[double]:
        txt, img = block(hidden_states=img, encoder_hidden_states=txt, temb=temb, image_rotary_emb=rope)
    for block in t.single_transformer_blocks if single else ():
        txt, img = block(hidden_states=img, encoder_hidden_states=txt, temb=temb, image_rotary_emb=rope)
    return img, txt


def head(t: nn.Module, img: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
    return t.proj_out(t.norm_out(img, temb))


class DiTRule:
    """One rule on one transformer: its forward replaced on the instance while applied (:meth:`apply`,
    :meth:`remove`), told the step as the WebUI tells our patch (:meth:`set_progress`); what each call cost is kept
    (:meth:`counts`)."""

    def __init__(self) -> None:
        self.transformer: nn.Module | None = None
        self.step, self.steps = 0, 1
        self.kinds: list[str] = []
        self.residual: torch.Tensor | None = None  # every block's residual at the last step they ran

    def apply(self, transformer: nn.Module) -> DiTRule:
        self.transformer = transformer
        transformer.forward = self._forward
        return self

    def remove(self) -> None:
        if self.transformer is not None:
            del self.transformer.__dict__["forward"]
            self.transformer = None

    def set_progress(self, fraction: float, steps: int) -> None:
        self.step, self.steps = round(fraction * steps), steps

    def at_step(self, step: int, steps: int) -> None:
        """A sampler's progress callback: step ``step`` of ``steps`` begins."""
        self.set_progress(step / steps, steps)

    def counts(self) -> dict[str, int]:
        return {kind: self.kinds.count(kind) for kind in KINDS}

    @property
    def edge(self) -> bool:
        """The first or the last step: computed by every rule here."""
        return self.step == 0 or self.step >= self.steps - 1

    def _forward(self, return_dict: bool = False, **kw: Any) -> tuple[torch.Tensor]:
        t = self.transformer
        img, txt, temb, rope = embed(t, kw)
        return (head(t, self.call(img, txt, temb, rope), temb),)

    def call(self, img, txt, temb, rope) -> torch.Tensor:
        """The image stream that enters the output norm (every block computed here)."""
        return self.computed(img, txt, temb, rope)

    def computed(self, img, txt, temb, rope) -> torch.Tensor:
        """Every block run: the image stream after them; their residual kept for the steps that reuse it."""
        self.kinds.append("full")
        out = blocks(self.transformer, img, txt, temb, rope)[0]
        self.residual = out - img
        return out

    def reused(self, img: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """No block run: the embedded input plus ``residual`` (default: the last computed step's)."""
        self.kinds.append("skip")
        return img + (self.residual if residual is None else residual)


class FirstBlockCache(DiTRule):
    """First Block Cache (see the module)."""

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold
        self.first: torch.Tensor | None = None  # the first block's residual at the last computed step
        self.rest: torch.Tensor | None = None  # the other blocks' residual there

    def call(self, img, txt, temb, rope) -> torch.Tensor:
        t = self.transformer
        after, txt = blocks(t, img, txt, temb, rope, slice(0, 1), single=False)
        first = after - img
        if not self.edge and self.first is not None and rel_l1(first, self.first) < self.threshold:
            self.kinds.append("first")
            return after + self.rest
        self.kinds.append("full")
        out = blocks(t, after, txt, temb, rope, slice(1, None))[0]
        self.first, self.rest = first, out - after
        return out


class TeaCache(DiTRule):
    """TeaCache (see the module); ``polynomial``: highest power first."""

    def __init__(self, threshold: float, polynomial=FLUX_POLYNOMIAL) -> None:
        super().__init__()
        self.threshold, self.rescale = threshold, np.poly1d(polynomial)
        self.previous: torch.Tensor | None = None  # the last step's modulated input
        self.accumulated = 0.0

    def call(self, img, txt, temb, rope) -> torch.Tensor:
        t = self.transformer
        modulated = t.transformer_blocks[0].norm1(img, emb=temb)[0]
        change = None if self.previous is None else rel_l1(modulated, self.previous)
        self.previous = modulated
        if not self.edge and change is not None and self.residual is not None:
            self.accumulated += float(self.rescale(change))
            if self.accumulated < self.threshold:
                return self.reused(img)
        self.accumulated = 0.0
        return self.computed(img, txt, temb, rope)


class Periodic(DiTRule):
    """TaylorSeer's schedule: the first ``first`` steps, every ``interval``-th after the last computed one and the
    last step computed; :meth:`forecast` gives a skipped step's residual once :meth:`update` has been told one."""

    def __init__(self, interval: int, first: int = 3) -> None:
        super().__init__()
        self.interval, self.first = interval, first
        self.last = 0  # the step of the last computed one
        self.ready = False

    def call(self, img, txt, temb, rope) -> torch.Tensor:
        since = self.step - self.last
        if not self.edge and self.step >= self.first and self.ready and since % self.interval:
            return self.reused(img, self.forecast(since))
        out = self.computed(img, txt, temb, rope)
        self.update(self.residual, self.step)
        self.last, self.ready = self.step, True
        return out

    def update(self, residual: torch.Tensor, step: int) -> None:
        raise NotImplementedError

    def forecast(self, since: int) -> torch.Tensor:
        raise NotImplementedError


class TaylorSeer(Periodic):
    """TaylorSeer (see the module): ``order`` 1 or 2."""

    def __init__(self, interval: int, order: int = 1, first: int = 3) -> None:
        super().__init__(interval, first)
        self.order = order
        self.derivatives: list[torch.Tensor] = []  # the residual and its finite differences per step, last computed

    def update(self, residual: torch.Tensor, step: int) -> None:
        """A computed step's residual: it and its finite differences up to ``order`` (per step of the index)."""
        gap, new = max(step - self.last, 1), [residual]
        for k in range(min(self.order, len(self.derivatives))):
            new.append((new[k] - self.derivatives[k]) / gap)
        self.derivatives, self.last = new, step

    def forecast(self, since: int) -> torch.Tensor:
        """The residual ``since`` steps after the last computed one: the Taylor expansion."""
        return sum(d * since**k / math.factorial(k) for k, d in enumerate(self.derivatives))


class FoCa(Periodic):
    """FoCa (see the module): a skipped step steps the residual on from the last two values, computed or forecast,
    by the trapezoidal mean of their slope and the last two computed steps' slope (per step of the index)."""

    def __init__(self, interval: int, first: int = 3) -> None:
        super().__init__(interval, first)
        self.recent: list[torch.Tensor] = []  # the last two steps' residuals, computed or forecast
        self.anchor: torch.Tensor | None = None  # the slope between the last two computed steps, per step
        self.computed_last: torch.Tensor | None = None

    def update(self, residual: torch.Tensor, step: int) -> None:
        if self.computed_last is not None:
            self.anchor = (residual - self.computed_last) / max(step - self.last, 1)
        self.computed_last = residual
        self.recent = [*self.recent[-1:], residual]

    def forecast(self, since: int) -> torch.Tensor:
        """The residual one step after the last value (each skipped step, in order, steps it on by one)."""
        if len(self.recent) < 2:
            return self.recent[-1]
        local = self.recent[1] - self.recent[0]
        nxt = self.recent[1] + (local if self.anchor is None else 0.5 * (local + self.anchor))
        self.recent = [self.recent[1], nxt]
        return nxt


class MagCache(DiTRule):
    """MagCache (see the module); ``ratios``: the calibrated magnitude ratio of each step to the one before."""

    def __init__(self, threshold: float, ratios: list[float], k: int = 5, retain: float = 0.2) -> None:
        super().__init__()
        self.threshold, self.ratios, self.k, self.retain = threshold, ratios, k, retain
        self.ratio, self.skipped, self.error = 1.0, 0, 0.0

    def call(self, img, txt, temb, rope) -> torch.Tensor:
        if not self.edge and self.residual is not None and self.step >= self.retain * self.steps:
            ratio = self.ratio * self.ratios[min(self.step, len(self.ratios) - 1)]
            error = self.error + abs(1.0 - ratio)
            if error < self.threshold and self.skipped < self.k:
                self.ratio, self.error, self.skipped = ratio, error, self.skipped + 1
                return self.reused(img)
        self.ratio, self.skipped, self.error = 1.0, 0, 0.0
        return self.computed(img, txt, temb, rope)


class EasyCache(DiTRule):
    """EasyCache (see the module), on the model's input and output."""

    def __init__(self, threshold: float, start: float = 0.15, end: float = 0.95) -> None:
        super().__init__()
        self.threshold, self.start, self.end = threshold, start, end
        self.inputs: list[torch.Tensor] = []  # the last two computed steps' inputs and outputs
        self.outputs: list[torch.Tensor] = []
        self.previous: torch.Tensor | None = None  # the input of the step before
        self.accumulated = 0.0

    def _forward(self, return_dict: bool = False, **kw: Any) -> tuple[torch.Tensor]:
        x, previous = kw["hidden_states"], self.previous
        self.previous = x
        window = self.start * self.steps <= self.step < self.end * self.steps
        if window and not self.edge and previous is not None and len(self.inputs) == 2:
            rate = rel_l1(self.outputs[1], self.outputs[0]) / max(rel_l1(self.inputs[1], self.inputs[0]), 1e-12)
            self.accumulated += rate * rel_l1(x, previous)
            if self.accumulated < self.threshold:
                self.kinds.append("skip")
                return (x + (self.outputs[1] - self.inputs[1]),)
        self.accumulated = 0.0
        out = DiTRule._forward(self, **kw)[0]
        self.inputs, self.outputs = [*self.inputs[-1:], x], [*self.outputs[-1:], out]
        return (out,)


class LazyCache(DiTRule):
    """LazyCache (see the module) on the batched cond and uncond call of one image, guidance ``cfg``."""

    def __init__(self, threshold: float, cfg: float, side: int, start: float = 0.15, end: float = 0.95) -> None:
        super().__init__()
        self.threshold, self.cfg, self.side, self.start, self.end = threshold, cfg, side, start, end
        self.x_prev: torch.Tensor | None = None  # the last computed step's input, subsampled
        self.out_prev: torch.Tensor | None = None  # its denoised prediction, subsampled
        self.out_norm: torch.Tensor | None = None  # the mean absolute value of that prediction, whole
        self.rate: torch.Tensor | None = None  # its output change over its input change
        self.diff: torch.Tensor | None = None  # its denoised prediction minus its input, whole
        self.accumulated = 0.0

    def _sub(self, x: torch.Tensor) -> torch.Tensor:
        from benchmarks.lab.trained.flux import unpack

        return unpack(x, self.side, self.side)[..., ::8, ::8]

    def _forward(self, return_dict: bool = False, **kw: Any) -> tuple[torch.Tensor]:
        x, sigma = kw["hidden_states"], kw["timestep"].reshape(-1, 1, 1)
        x_sub = self._sub(x[:1])
        change = None if self.x_prev is None else (x_sub - self.x_prev).abs().mean()
        window = self.start * self.steps <= self.step < self.end * self.steps
        if window and not self.edge and change is not None and self.rate is not None:
            self.accumulated += float(self.rate * change / self.out_norm)
            if self.accumulated < self.threshold:
                self.kinds.append("skip")
                return ((-self.diff / sigma[:1]).expand_as(x),)  # x - sigma v = x + diff, in both branches
            self.accumulated = 0.0
        out = DiTRule._forward(self, **kw)[0]
        cond, uncond = out.chunk(2)
        denoised = x[:1] - sigma[:1] * (uncond + self.cfg * (cond - uncond))
        out_sub = self._sub(denoised)
        if self.out_prev is not None and change is not None:
            self.rate = (out_sub - self.out_prev).abs().mean() / change
        self.x_prev, self.out_prev, self.out_norm = x_sub, out_sub, denoised.abs().mean()
        self.diff = denoised - x[:1]
        return (out,)


class Recorder(DiTRule):
    """Computes every step and records, per step, the first block's modulated input, the model's output (the data
    TeaCache's polynomial is fitted to) and the mean magnitude of the blocks' residual (MagCache's)."""

    def __init__(self) -> None:
        super().__init__()
        self.modulated: list[torch.Tensor] = []
        self.outputs: list[torch.Tensor] = []
        self.magnitudes: list[float] = []

    def _forward(self, return_dict: bool = False, **kw: Any) -> tuple[torch.Tensor]:
        t = self.transformer
        img, txt, temb, rope = embed(t, kw)
        self.modulated.append(t.transformer_blocks[0].norm1(img, emb=temb)[0])
        after = blocks(t, img, txt, temb, rope)[0]
        self.magnitudes.append(float((after - img).abs().mean()))
        out = head(t, after, temb)
        self.outputs.append(out)
        self.kinds.append("full")
        return (out,)


def magnitude_ratios(recorders: list[Recorder]) -> list[float]:
    """MagCache's calibration: per step, the mean over plain runs of the residual's magnitude over the step before's
    (1 at the first step)."""
    ratios = np.array([[1.0] + [m[i] / m[i - 1] for i in range(1, len(m))] for m in (r.magnitudes for r in recorders)])
    return [float(r) for r in ratios.mean(axis=0)]


def fit_teacache(recorders: list[Recorder], degree: int = 4) -> tuple[float, ...]:
    """TeaCache's rescaling polynomial fitted as its authors fit it: the relative L1 change of the model's output from
    step to step against that of the modulated input, over plain runs (``recorders``), least squares."""
    x, y = [], []
    for r in recorders:
        for i in range(1, len(r.outputs)):
            x.append(rel_l1(r.modulated[i], r.modulated[i - 1]))
            y.append(rel_l1(r.outputs[i], r.outputs[i - 1]))
    return tuple(float(c) for c in np.polyfit(np.array(x), np.array(y), degree))
