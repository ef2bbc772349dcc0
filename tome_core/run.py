"""What one generation asked for and what happened, in any host: the run record (:class:`Run`: the settings of each
sampling pass, the notes, the cache's steps) and the infotext it writes (the WebUI's and Forge's image parameters,
ComfyUI's console line), with the paste-back that reads it again. Derived from the settings record."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import settings as S
from .report import PassCount
from .settings import SettingsError, ToMeSettings

ERROR_KEY = "ToMe error"
NOTE_KEY = "ToMe note"
BUILTIN_KEY = "ToMe replaced built-in ratio"
CACHE_STEPS_KEY = "ToMe cache steps"
CACHE_SPEED_KEY = "ToMe cache speed-up"


def seed_for(settings: ToMeSettings, image_seed: int | None) -> int:
    """The seed actually used: the setting, or the image seed where the setting is -1."""
    if settings.seed >= 0 or image_seed is None:
        return max(settings.seed, 0)
    return int(image_seed) % 2**32


@dataclass
class Run:
    """What one generation (one XYZ cell) asked for and what happened."""

    settings: ToMeSettings
    hires_pending: bool = False  # before_hr was called; the next sampling is the hires pass
    current: ToMeSettings | None = None  # the sampling pass's settings while its model is patched
    refined: bool = False  # the refiner has been switched in (the host's infotext says so)
    notes: list[str] = field(default_factory=list)
    pass_name: str = "first"  # the sampling pass patched now: "first" or "hires"
    cache_steps: dict[str, PassCount] = field(default_factory=dict)  # per pass of this batch: the cache's steps

    def pass_settings(self, image_seed: int | None, hires: bool) -> ToMeSettings:
        """Settings for one sampling pass: the hires ratio and cache interval in the hires pass, the seed actually
        used."""
        s = self.settings
        ratio = s.hires_ratio if hires and s.hires_ratio > 0 else s.ratio
        interval = s.hires_cache_interval if hires and s.hires_cache_interval > 0 else s.cache_interval
        return s.replace(ratio=ratio, cache_interval=interval, seed=seed_for(s, image_seed))

    def too_small(self, width: int, height: int) -> bool:
        return 0 < min(width, height) < self.settings.min_size

    def note(self, *texts: str) -> None:
        """Add what ToMe could not do (each text once, in order)."""
        self.notes.extend(t for t in texts if t not in self.notes)

    def count_cache(self, counts: Iterable[PassCount]) -> None:
        """Add what the step cache ran to the current pass (the refiner's model, switched in mid-pass, adds its part)."""
        for c in counts:
            old = self.cache_steps.get(self.pass_name)
            self.cache_steps[self.pass_name] = c if old is None else old + c

    @property
    def cache_steps_text(self) -> str | None:
        """The ``ToMe cache steps`` infotext value, e.g. ``8 full, 12 cached; hires 4 full, 6 cached``; None when the
        step cache ran no step."""
        parts = []
        for name, c in self.cache_steps.items():
            text = f"{c.full} full, {c.cached} cached" + (f", {c.skipped} skipped" if c.skipped else "")
            parts.append(text if name == "first" else f"{name} {text}")
        return "; ".join(parts) or None

    @property
    def cache_speed_text(self) -> str | None:
        """The ``ToMe cache speed-up`` infotext value: what the cached steps imply for the model's blocks, e.g.
        ``2.21x; hires 1.85x`` (estimated from the blocks' work: :meth:`tome_core.families.Layout.skipped_share`);
        None when no pass cached a step."""
        parts = []
        for name, c in self.cache_steps.items():
            if c.cached and c.speedup is not None:
                text = f"{c.speedup:.2f}x"
                parts.append(text if name == "first" else f"{name} {text}")
        return "; ".join(parts) or None

    def cache_entries(self) -> dict[str, str]:
        """The ``ToMe cache steps`` and ``ToMe cache speed-up`` entries (infotext, console line) where there is
        something to say."""
        entries = {CACHE_STEPS_KEY: self.cache_steps_text, CACHE_SPEED_KEY: self.cache_speed_text}
        return {key: text for key, text in entries.items() if text is not None}

    @property
    def note_text(self) -> str | None:
        """The ``ToMe note`` infotext value, or None when there is nothing to say."""
        return "; ".join(self.notes) if self.notes else None


ALWAYS_WITH_CACHE = ("cache_forecast", "cache_schedule", "cache_correction")
"""Written whenever the cache is on, default or not: their defaults changed once, so an image says what it ran."""
EARLIER_CACHE = {"cache_schedule": "uniform", "cache_correction": "0"}
"""What an infotext with the cache on but without these keys ran (made before the keys were always written): the
uniform schedule, no correction (off by default until issue 36 measured it), and the forecast ``linear`` if it has
``ToMe cache steps`` (issue 23's version), else ``off``."""


def records_seed(settings: ToMeSettings) -> bool:
    """Whether the infotext gets the seed actually used: the random partition is on and something is merged (the
    cache alone draws no partition)."""
    return settings.use_rand and settings.merges


def infotext(settings: ToMeSettings, used_seed: int | None) -> dict[str, Any]:
    """Infotext entries for an enabled run: ``ToMe: True`` and every field that differs from its default (with the
    cache on, its forecast and schedule whatever they are); the seed actually used whenever the random partition is
    on and something is merged."""
    out: dict[str, Any] = {S.spec("enabled").infotext: True}
    for name in S.NAMES:
        if name == "enabled":
            continue
        value = getattr(settings, name)
        if name == "seed" and settings.use_rand and used_seed is not None:
            if not records_seed(settings):
                continue
            value = used_seed
        elif name in ALWAYS_WITH_CACHE and settings.cache:
            pass
        elif value == getattr(S.DEFAULTS, name):
            continue
        out[S.spec(name).infotext] = value
    return out


def fill_pasted(params: dict[str, Any]) -> None:
    """Complete pasted infotext params in place so that every control is restored: a ToMe infotext gets
    the defaults it omitted (an older one with the cache on, the forecast and schedule it ran: :data:`EARLIER_CACHE`);
    one without ToMe turns ToMe off."""
    enabled_key = S.spec("enabled").infotext
    if enabled_key not in params:
        params[enabled_key] = "False"
        return
    if str(params.get(S.spec("cache").infotext)) == "True":
        forecast = "linear" if CACHE_STEPS_KEY in params else "off"
        for name, value in {"cache_forecast": forecast, **EARLIER_CACHE}.items():
            params.setdefault(S.spec(name).infotext, value)
    for name in S.NAMES:
        key = S.spec(name).infotext
        params.setdefault(key, str(getattr(S.DEFAULTS, name)))


def describe_error(error: Exception) -> str:
    return str(error) if isinstance(error, SettingsError) else f"ToMe: {type(error).__name__}: {error}"
