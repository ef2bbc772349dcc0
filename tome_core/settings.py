"""The one settings record: every knob's default, bounds, label, infotext key and element id.

The WebUI script derives its UI, its API argument list (positional *and* dict form), its infotext and
its XYZ axes from :data:`FIELDS`; the core reads the same record. Field order is the positional API
order and is append-only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

MaxDownsample = int | Literal["auto"]
DOWNSAMPLE_CHOICES: tuple[str, ...] = ("1", "2", "4", "8", "auto")
METHOD_CHOICES: tuple[str, ...] = ("merge", "downsample")
FORECAST_CHOICES: tuple[str, ...] = ("off", "linear", "calibrated", "auto")
SCHEDULE_CHOICES: tuple[str, ...] = ("uniform", "adaptive", "time", "early", "auto")
CACHE_DEVICE_CHOICES: tuple[str, ...] = ("model", "cpu")
AUTO = "auto"
"""The value of ``cache_forecast`` / ``cache_schedule`` that the model's family resolves (:meth:`ToMeSettings.resolved`):
the one measured best on its kind of model."""


class SettingsError(ValueError):
    """A setting is unknown, of the wrong type or out of range. The message names field, value and range."""

    def __init__(self, name: str, value: Any, allowed: str):
        self.name, self.value, self.allowed = name, value, allowed
        super().__init__(f"ToMe setting '{name}' = {value!r} is invalid: allowed {allowed}")


@dataclass(frozen=True)
class FieldSpec:
    """How one setting is typed, bounded, shown and recorded."""

    kind: Literal["bool", "int", "float", "choice"]
    label: str
    infotext: str
    hint: str
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    choices: tuple[str, ...] = ()
    axis: str = ""
    """The XYZ axis label after ``[ToMe] ``; published labels never change (saved grids name them): the label's
    first wording, kept when the label is shortened. Empty: the label."""
    method: str | None = None
    """The only ``method`` that reads this setting (the UI greys the control out for the other); None: both."""

    def number(self, value: float) -> str:
        """A bound or value as a person reads it: integers as integers (never ``4.29497e+09``)."""
        return str(int(value)) if self.kind == "int" or float(value).is_integer() else f"{value:g}"

    def allowed(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        kind = "an integer" if self.kind == "int" else "a number"
        return f"{kind} from {self.number(self.minimum)} to {self.number(self.maximum)}"


def _spec(default: Any, **kwargs: Any) -> Any:
    return field(default=default, metadata={"spec": FieldSpec(**kwargs)})


@dataclass(frozen=True)
class ToMeSettings:
    """Validated, immutable ToMe settings. Build with :meth:`from_dict` / :meth:`from_args` at a boundary."""

    enabled: bool = _spec(
        False,
        kind="bool",
        label="ToMe",
        infotext="ToMe",
        hint="Merge redundant tokens in the UNet's transformer blocks for this generation.",
        axis="Enabled",
    )
    ratio: float = _spec(
        0.5,
        kind="float",
        label="Merge ratio",
        infotext="ToMe ratio",
        minimum=0.0,
        maximum=0.95,
        step=0.01,
        hint="Fraction of tokens merged away before self-attention: higher is faster and less faithful; 0.3-0.5 for the first pass. At most 1 - 1/(stride x * stride y). Not used by the downsample method.",
        method="merge",
    )
    max_downsample: MaxDownsample = _spec(
        "auto",
        kind="choice",
        label="Max downsample",
        infotext="ToMe max downsample",
        choices=DOWNSAMPLE_CHOICES,
        hint="Merge (or downsample) in the UNet levels downsampled at most this much. auto: the highest-resolution level that has transformer blocks (1 for SD1/SD2, 2 for SDXL).",
    )
    sx: int = _spec(
        2,
        kind="int",
        label="Stride x",
        infotext="ToMe stride x",
        minimum=1,
        maximum=8,
        step=1,
        hint="Width of the cells that each keep one destination token. Larger strides allow higher ratios (at most 1 - 1/(stride x * stride y)).",
        method="merge",
    )
    sy: int = _spec(
        2,
        kind="int",
        label="Stride y",
        infotext="ToMe stride y",
        minimum=1,
        maximum=8,
        step=1,
        hint="Height of the cells that each keep one destination token. Larger strides allow higher ratios (at most 1 - 1/(stride x * stride y)).",
        method="merge",
    )
    use_rand: bool = _spec(
        True,
        kind="bool",
        label="Random destinations",
        infotext="ToMe random",
        hint="Pick each cell's destination token at random (reproducible from the seed) instead of the top-left one.",
        method="merge",
    )
    seed: int = _spec(
        -1,
        kind="int",
        label="Random seed",
        infotext="ToMe seed",
        minimum=-1,
        maximum=2**32 - 1,
        step=1,
        hint="Seed of the random destinations; -1 (the default) derives it from the image seed.",
        axis="Random seed (-1 = image seed)",
        method="merge",
    )
    merge_attn: bool = _spec(
        True,
        kind="bool",
        label="Merge self-attention",
        infotext="ToMe merge attn",
        hint="Merge tokens before self-attention (the main speed-up).",
        method="merge",
    )
    merge_crossattn: bool = _spec(
        False,
        kind="bool",
        label="Merge cross-attention",
        infotext="ToMe merge crossattn",
        hint="Also merge before cross-attention (little gain, some quality loss).",
        method="merge",
    )
    merge_mlp: bool = _spec(
        False,
        kind="bool",
        label="Merge MLP",
        infotext="ToMe merge mlp",
        hint="Also merge before the feed-forward layer (little gain, noticeable quality loss).",
        method="merge",
    )
    hires_ratio: float = _spec(
        0.0,
        kind="float",
        label="Hires. fix ratio",
        infotext="ToMe hires ratio",
        minimum=0.0,
        maximum=0.95,
        step=0.01,
        hint="Merge ratio of the hires. fix pass, where ToMe gains most; 0 (the default) uses the merge ratio. At most 1 - 1/(stride x * stride y).",
        axis="Hires. fix ratio (0 = same)",
        method="merge",
    )
    min_size: int = _spec(
        0,
        kind="int",
        label="Minimum size (px)",
        infotext="ToMe min size",
        minimum=0,
        maximum=8192,
        step=8,
        hint="Token merging stays off for a pass whose shorter image side is below this many pixels (e.g. 768: only the hires. fix pass is merged; the step cache still runs); 0 (the default): always on. The gain is nil around 512 px.",
        axis="Minimum size (px, 0 = always)",
    )

    merge_controlnet: bool = _spec(
        True,
        kind="bool",
        label="Merge in ControlNet",
        infotext="ToMe ControlNet",
        hint="Also merge tokens inside the active ControlNet models, with the same settings.",
        axis="Merge in ControlNet models",
    )
    method: str = _spec(
        "merge",
        kind="choice",
        label="Method",
        infotext="ToMe method",
        choices=METHOD_CHOICES,
        hint="merge: the paper's token merging (ratio, strides, random destinations, merge targets, plan reuse). downsample: keep every query, downsample keys and values by the downsample factor (ToDo); faster and more faithful, recommended for SDXL and 1024 px and more.",
    )
    downsample_factor: int = _spec(
        2,
        kind="int",
        label="Downsample factor",
        infotext="ToMe downsample factor",
        minimum=1,
        maximum=8,
        step=1,
        hint="downsample method only: keys and values are subsampled by this factor per side at the highest-resolution level with transformer blocks, halved per level below it.",
        axis="Key/value downsample factor",
        method="downsample",
    )
    start: float = _spec(
        0.0,
        kind="float",
        label="Start (fraction of steps)",
        infotext="ToMe start",
        minimum=0.0,
        maximum=1.0,
        step=0.01,
        hint="ToMe is active from this fraction of the sampling steps on (0: from the first step).",
        axis="Start at (fraction of steps)",
    )
    end: float = _spec(
        1.0,
        kind="float",
        label="End (fraction of steps)",
        infotext="ToMe end",
        minimum=0.0,
        maximum=1.0,
        step=0.01,
        hint="ToMe is active until this fraction of the sampling steps (e.g. 0.7: off for the last 30%, which draw fine detail).",
        axis="End at (fraction of steps)",
    )
    share_plan: bool = _spec(
        False,
        kind="bool",
        label="Share plan per level",
        infotext="ToMe share plan",
        hint="Compute the merge plan once per UNet level and forward, and reuse it in that level's other blocks (faster, slightly less faithful).",
        axis="Share plan within a level",
        method="merge",
    )
    plan_interval: int = _spec(
        1,
        kind="int",
        label="Plan interval (steps)",
        infotext="ToMe plan interval",
        minimum=1,
        maximum=20,
        step=1,
        hint="Recompute the merge plans every this many sampling steps and reuse them in between (1: every step, exact).",
        axis="Recompute plan every N steps",
        method="merge",
    )

    cache: bool = _spec(
        False,
        kind="bool",
        label="Step cache (DeepCache)",
        infotext="ToMe cache",
        hint="Reuse the UNet's deep features between steps (DeepCache): every N-th step runs in full, the steps between run only the shallowest skip branch (on FLUX, Chroma and Wan: the first block, and the later blocks' residual is forecast). Stacks with token merging; with ratio 0 it runs alone. Under Euler a and the SDE samplers (fresh noise every step) any step cache changes the image much more: use interval 2 there, or leave it off.",
        axis="Step cache",
    )
    cache_interval: int = _spec(
        3,
        kind="int",
        label="Cache interval (steps)",
        infotext="ToMe cache interval",
        minimum=1,
        maximum=10,
        step=1,
        hint="Run the full UNet every this many steps and reuse its deep features in between (1: every step is full, no caching). Higher is faster and less faithful.",
        axis="Cache interval",
    )
    cache_branch: int = _spec(
        0,
        kind="int",
        label="Cache branch",
        infotext="ToMe cache branch",
        minimum=0,
        maximum=11,
        step=1,
        hint="The skip branch that keeps running on cached steps: 0 (the default) is the shallowest and fastest; deeper branches run more of the UNet (more faithful, slower). SD1/SD2 have 12 branches, SDXL 9. On a diffusion transformer it is the number of blocks a cached step still runs, minus one (FLUX and Chroma: of the double-stream blocks).",
    )
    cache_start: float = _spec(
        0.0,
        kind="float",
        label="Cache start (fraction)",
        infotext="ToMe cache start",
        minimum=0.0,
        maximum=1.0,
        step=0.01,
        hint="Cached steps may occur from this fraction of the sampling on; before it every step is full (the first step always is).",
        axis="Cache start (fraction of steps)",
    )
    cache_end: float = _spec(
        1.0,
        kind="float",
        label="Cache end (fraction)",
        infotext="ToMe cache end",
        minimum=0.0,
        maximum=1.0,
        step=0.01,
        hint="Cached steps may occur until this fraction of the sampling; after it every step is full (the last step always is).",
        axis="Cache end (fraction of steps)",
    )
    hires_cache_interval: int = _spec(
        0,
        kind="int",
        label="Hires. fix cache interval",
        infotext="ToMe hires cache interval",
        minimum=0,
        maximum=10,
        step=1,
        hint="Cache interval of the hires. fix pass; 0 (the default) uses the cache interval.",
        axis="Hires. fix cache interval (0 = same)",
    )
    cache_forecast: str = _spec(
        AUTO,
        kind="choice",
        label="Cache forecast",
        infotext="ToMe cache forecast",
        choices=FORECAST_CHOICES,
        hint="What cached steps use for the deep features. auto (the default): calibrated on UNets (SD1, SD2, SDXL), linear on diffusion transformers (FLUX, Chroma, Wan), each the one measured best there. calibrated: their extrapolation from the last two full steps, to the place on that line the live shallow features say (more faithful than DeepCache at the same speed, also under Euler a and the SDE samplers). linear: the same line, placed by the sampler's time (loses to DeepCache under Euler a and the SDE samplers). off: the last full step's, unchanged (DeepCache).",
    )
    cache_schedule: str = _spec(
        AUTO,
        kind="choice",
        label="Cache schedule",
        infotext="ToMe cache schedule",
        choices=SCHEDULE_CHOICES,
        hint="auto (the default): time on UNets, uniform on diffusion transformers (their flow-matching schedules bunch the time where the image forms least). time: full steps spread evenly in the sampler's time, on average one every cache interval (the same as uniform on Euler's, DDIM's and UniPC's spacing; under the Karras and exponential schedules of DPM++ they go where the image forms). uniform: a full step every cache interval (DeepCache). early: the same number of full steps with the second one step sooner (at cache interval - 1, then every cache interval), where the steps before it have no forecast yet (from cache interval 3): on the trained transformers the worst image kept up to 9 dB more, the mean -2.4 to +1.5 dB (not measured on UNets). adaptive: also a full step as soon as the UNet's input strays from its forecast by more than the cache threshold; the cache interval is then the longest run without one.",
    )
    cache_threshold: float = _spec(
        0.08,
        kind="float",
        label="Cache threshold",
        infotext="ToMe cache threshold",
        minimum=0.0,
        maximum=1.0,
        step=0.005,
        hint="adaptive schedule only: how far (relative L1) the UNet's input may stray from its forecast before a full step; lower is more faithful and slower, 0 makes every step full.",
    )
    cache_device: str = _spec(
        "model",
        kind="choice",
        label="Cache device",
        infotext="ToMe cache device",
        choices=CACHE_DEVICE_CHOICES,
        hint="Where the cache keeps what it carries between steps (the skipped blocks' result and its change: two per stream, about 0.8 GB each for Wan 14B at 720p x 81 frames). model (the default): on the model's device. cpu: in CPU memory, copied back (non-blocking) as each cached step begins; the same image, less GPU memory, a copy per cached step.",
    )
    cache_correction: float = _spec(
        0.75,
        kind="float",
        label="Cache correction",
        infotext="ToMe cache correction",
        minimum=0.0,
        maximum=1.0,
        step=0.05,
        hint="Diffusion transformers under Euler and the linear multistep samplers (DPM++ 2M, DEIS, res_multistep, UniPC; ComfyUI, Forge Neo, diffusers): at each full step the cached steps since the last one are re-estimated from the full steps around them, and the full step's output (under a multistep sampler, also the next few) carries this much of the difference. 0.75 (the default) kept more than the uncorrected cache at every cache interval on the FLUX and Wan layouts measured under Euler, within 0.3 dB of the best gain (1 at cache interval 3); 0: off. Under ancestral and SDE samplers, on UNets, or where the host does not give its sampler (A1111, Forge), it stays off; quietly at the default, with a ToMe note at any other value. It keeps three full steps' deep features and each cached step's shallow ones until the next full step (with cache device cpu, in CPU memory).",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, coerce(f.name, getattr(self, f.name)))
        self.check_ratio(self.ratio, "ratio")
        self.check_ratio(self.hires_ratio, "hires_ratio")
        if self.end <= self.start:
            raise SettingsError("end", self.end, f"greater than start ({self.start:g}) and at most 1")
        if self.cache_end <= self.cache_start:
            raise SettingsError(
                "cache_end", self.cache_end, f"greater than cache_start ({self.cache_start:g}) and at most 1"
            )

    # --- derived values -------------------------------------------------------------------------
    @property
    def ratio_cap(self) -> float:
        """The largest ratio these settings' strides allow."""
        return ratio_cap(self.sx, self.sy)

    @property
    def merges(self) -> bool:
        """Whether token merging changes anything: a ratio above 0 with a merge target, or ToDo with a factor
        above 1 (``ratio = 0`` with the step cache on gives the cache alone)."""
        if self.method == "downsample":
            return self.downsample_factor > 1
        return self.ratio > 0 and (self.merge_attn or self.merge_crossattn or self.merge_mlp)

    @property
    def caches(self) -> bool:
        """Whether the step cache is on and can skip anything (an interval of 1 makes every step full)."""
        return self.cache and self.cache_interval > 1

    def check_ratio(self, value: float, name: str) -> None:
        if value > self.ratio_cap + 1e-9:
            raise SettingsError(
                name, value, f"at most 1 - 1/(sx*sy) = {self.ratio_cap:.4g} for strides {self.sx}x{self.sy}"
            )

    def replace(self, **changes: Any) -> ToMeSettings:
        """A validated copy with some fields changed."""
        return from_dict({**to_dict(self), **changes})

    def resolved(self, forecast: str, schedule: str) -> ToMeSettings:
        """These settings with ``auto`` in ``cache_forecast`` / ``cache_schedule`` resolved to a model family's choice."""
        return self.replace(
            cache_forecast=forecast if self.cache_forecast == AUTO else self.cache_forecast,
            cache_schedule=schedule if self.cache_schedule == AUTO else self.cache_schedule,
        )


def ratio_cap(sx: int, sy: int) -> float:
    """The largest ratio ``sx x sy`` strides allow: every cell keeps one destination."""
    return 1.0 - 1.0 / (sx * sy)


FIELDS: tuple[dataclasses.Field, ...] = dataclasses.fields(ToMeSettings)
NAMES: tuple[str, ...] = tuple(f.name for f in FIELDS)


def spec(name: str) -> FieldSpec:
    """The :class:`FieldSpec` of one field."""
    return _BY_NAME[name].metadata["spec"]


_BY_NAME = {f.name: f for f in FIELDS}


def coerce(name: str, value: Any) -> Any:
    """Check one value against its field and return it in canonical type. Raises :class:`SettingsError`."""
    s = spec(name)
    if s.kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value in ("True", "False", "true", "false"):
            return value.lower() == "true"
        raise SettingsError(name, value, s.allowed())
    if s.kind == "choice":
        text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
        if isinstance(value, float) and value.is_integer():
            text = str(int(value))
        if text not in s.choices:
            raise SettingsError(name, value, s.allowed())
        return text if not text.isdigit() else int(text)
    # numbers: reject bools and non-numeric strings; ints must be integral
    number: float
    if isinstance(value, bool):
        raise SettingsError(name, value, s.allowed())
    if isinstance(value, (int, float)):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise SettingsError(name, value, s.allowed()) from None
    else:
        raise SettingsError(name, value, s.allowed())
    if not math.isfinite(number) or not (s.minimum <= number <= s.maximum):
        raise SettingsError(name, value, s.allowed())
    if s.kind == "int":
        if float(number) != int(number):
            raise SettingsError(name, value, s.allowed())
        return int(number)
    return float(number)


def from_dict(values: dict[str, Any]) -> ToMeSettings:
    """Settings from a (partial) dict of field names; missing keys take defaults, unknown keys are rejected."""
    if not isinstance(values, dict):
        raise SettingsError("args", values, "a dict of setting names to values")
    unknown = sorted(set(values) - set(NAMES), key=str)
    if unknown:
        raise SettingsError(str(unknown[0]), values[unknown[0]], "a known setting name: " + ", ".join(NAMES))
    return ToMeSettings(**values)


def from_args(args: list[Any] | tuple[Any, ...]) -> ToMeSettings:
    """Settings from the script's positional arguments, or from one dict given as the first argument.

    A dict in the first slot (the API form ``{"args": [{...}]}``) is used alone: the later slots then
    hold the UI defaults that the WebUI filled in.
    """
    if args and isinstance(args[0], dict):
        return from_dict(args[0])
    if len(args) > len(NAMES):
        raise SettingsError("args", list(args), f"at most {len(NAMES)} positional values ({', '.join(NAMES)})")
    return from_dict(dict(zip(NAMES, args)))


def to_dict(settings: ToMeSettings) -> dict[str, Any]:
    """All fields by name."""
    return {name: getattr(settings, name) for name in NAMES}


def to_args(settings: ToMeSettings) -> list[Any]:
    """All fields in positional API order."""
    return [getattr(settings, name) for name in NAMES]


DEFAULTS = ToMeSettings()
