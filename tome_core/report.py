"""What a session's capabilities did and could not do, counted, and the short phrases a host shows for it (Forge's and
the WebUI's ``ToMe note``, ComfyUI's log): :class:`Report`, made by :meth:`tome_core.session.Session.report`, holds
token merging's :class:`MergeReport` and the step cache's :class:`CacheReport` side by side."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PassCount:
    """One sampling pass's steps: run in full (any call of the step ran in full), cached (every call cached)."""

    full: int = 0
    cached: int = 0
    skipped: int = 0  # steps that ran no block at all (no schedule of this cache skips a whole step)
    work: float | None = None
    """The work of the model's blocks in the pass, in full steps (a cached step counts as the share of the blocks it
    still runs: :meth:`tome_core.families.Layout.skipped_share`); None where unknown."""

    def to_dict(self) -> dict[str, int]:
        return {"full": self.full, "cached": self.cached, "skipped": self.skipped}

    @property
    def speedup(self) -> float | None:
        """The speed-up of the model's blocks these steps imply: steps over their work; None where unknown."""
        steps = self.full + self.cached + self.skipped
        return steps / self.work if self.work and steps else None

    def __add__(self, other: PassCount) -> PassCount:
        """Two models' counts in one pass (the refiner switched in): their steps and work added."""
        work = None if self.work is None or other.work is None else self.work + other.work
        return PassCount(self.full + other.full, self.cached + other.cached, self.skipped + other.skipped, work)


@dataclass(frozen=True)
class CacheReport:
    """How the step cache ran since it was applied: calls run in full and cached, the steps of each sampling pass, and
    why it stepped aside, if it did."""

    full: int = 0
    cached: int = 0
    notes: tuple[str, ...] = ()
    passes: tuple[PassCount, ...] = ()


@dataclass(frozen=True)
class MergeReport:
    """What token merging could not merge, counted since it was applied or :meth:`Session.reset_report`. Counts of
    blocks are of distinct transformer blocks.

    * ``blocks``: transformer blocks in the patched module.
    * ``attn1_skipped``: blocks that ran inside the step schedule at a level ToMe acts on, with ``attn1`` a
      target (``merge_attn`` or ToDo), whose ``attn1`` module was never called (replaced by another
      extension through Forge's ``patches_replace``: reference-only, StyleAlign, SAG) or is no attention any more
      (another extension's module in its place: Layer Diffuse's attention sharing).
    * ``query_only``: blocks whose ``attn1`` got full-length keys/values other than its input (an
      ``attn1_patch``, e.g. ControlLLLite): only the queries were merged there.
    * ``todo_off``: the same with ``method="downsample"``: keys/values were left as given, no ToDo there.
    * ``unfit``: blocks that ran unmerged because their token count did not fit the latent size (warned).
    * ``aside``: ``(layer, reason, blocks)`` for layers left unmerged because another extension takes them over
      (:func:`tome_core.merging.neighbours.taken_over`: ``"self-attention"`` tiled by Hypertile, patched by
      ControlNet-LLLite, …), counted where ToMe would have changed them.
    """

    blocks: int
    attn1_skipped: int = 0
    query_only: int = 0
    todo_off: int = 0
    unfit: int = 0
    aside: tuple[tuple[str, str, int], ...] = ()

    @property
    def notes(self) -> tuple[str, ...]:
        """Short, host-independent phrases, one per kind of shortfall (empty when there is none)."""
        of = f"of {self.blocks} blocks"
        counts = (
            (
                self.attn1_skipped,
                f"self-attention not merged in {self.attn1_skipped} {of} (attn1 replaced by another extension)",
            ),
            (self.query_only, f"only queries merged in {self.query_only} {of} (an attn1 patch set keys/values)"),
            (self.todo_off, f"no token downsampling in {self.todo_off} {of} (an attn1 patch set keys/values)"),
            (self.unfit, f"{self.unfit} {of} unmerged (token count does not fit the latent size)"),
            *((count, f"{layer} not merged in {count} {of} ({reason})") for layer, reason, count in self.aside),
        )
        return tuple(text for count, text in counts if count)


@dataclass(frozen=True)
class Report:
    """What one session did: its model's forwards, token merging's report and the step cache's, each when it is on.

    * ``model``: what the notes call the model (the class of the object the host passed: Forge's engine ``Flux``).
    * ``forwards``: forwards of the patched module seen (0 where no capability acts: no hooks at all).
    * ``merge``: token merging's shortfalls; None where it does not act (not asked for, or no transformer blocks).
    * ``cache``: the step cache's calls, steps and notes; None when it is off.
    * ``merging``: merging was asked for (ratio > 0): only then is "nothing merged" a shortfall.
    * ``transformer``: the model is a diffusion transformer a family knows (token merging does not act on it:
      ``benchmarks.quality.dit_merge`` measured it losing to the cache at every speed).
    """

    model: str = "this model"
    forwards: int = 0
    merge: MergeReport | None = None
    cache: CacheReport | None = None
    merging: bool = True
    transformer: bool = False

    @property
    def notes(self) -> tuple[str, ...]:
        """Short, host-independent phrases, one per kind of shortfall (empty when there is none)."""
        cache = self.cache.notes if self.cache is not None else ()
        if not self.merging:
            return cache
        if self.merge is None and self.transformer:
            off = "" if self.cache is not None else ", and it is off"
            return (
                f"nothing merged ({self.model} is a diffusion transformer: only the step cache acts on it{off})",
                *cache,
            )
        if self.merge is None:
            return (f"nothing merged ({self.model} has no UNet transformer blocks)", *cache)
        return (*self.merge.notes, *cache)
