"""What a patch could not do, counted, and the short phrases a host shows for it (Forge's and the WebUI's
``ToMe note``, ComfyUI's log): :class:`MergeReport`, made by :meth:`tome_core.patch.Patch.report`."""

from __future__ import annotations

from dataclasses import dataclass

from .cache import CacheReport


@dataclass(frozen=True)
class MergeReport:
    """What the patch could not merge, counted since it was applied or :meth:`Patch.reset_report`; the
    host words it (Forge's ``ToMe note``). Counts of blocks are of distinct transformer blocks.

    * ``blocks``: transformer blocks in the patched module; 0 means nothing can be merged (Flux, SD3, Chroma).
    * ``forwards``: forwards of the patched module seen (0 with ``blocks == 0``: no hooks at all).
    * ``attn1_skipped``: blocks that ran inside the step schedule at a level ToMe acts on, with ``attn1`` a
      target (``merge_attn`` or ToDo), whose ``attn1`` module was never called (replaced by another
      extension through Forge's ``patches_replace``: reference-only, StyleAlign, SAG) or is no attention any more
      (another extension's module in its place: Layer Diffuse's attention sharing).
    * ``query_only``: blocks whose ``attn1`` got full-length keys/values other than its input (an
      ``attn1_patch``, e.g. ControlLLLite): only the queries were merged there.
    * ``todo_off``: the same with ``method="downsample"``: keys/values were left as given, no ToDo there.
    * ``unfit``: blocks that ran unmerged because their token count did not fit the latent size (warned).
    * ``aside``: ``(layer, reason, blocks)`` for layers left unmerged because another extension takes them over
      (:func:`tome_core.neighbours.taken_over`: ``"self-attention"`` tiled by Hypertile, patched by ControlNet-LLLite,
      …), counted where ToMe would have changed them.
    * ``cache``: the step cache's report (calls run in full and cached, where it stepped aside), when it is on.
    * ``model``: what the notes call the model (the class of the object the host passed: Forge's engine ``Flux``).
    * ``transformer``: the model is a diffusion transformer the step cache knows (token merging does not act on it:
      ``benchmarks.quality.dit_merge`` measured it losing to the cache at every speed).
    """

    blocks: int
    forwards: int = 0
    attn1_skipped: int = 0
    query_only: int = 0
    todo_off: int = 0
    unfit: int = 0
    aside: tuple[tuple[str, str, int], ...] = ()
    cache: CacheReport | None = None  # the step cache's calls and notes, when it is on
    model: str = "this model"
    merging: bool = True  # merging was asked for (ratio > 0): only then is "nothing merged" a shortfall
    transformer: bool = False

    @property
    def notes(self) -> tuple[str, ...]:
        """Short, host-independent phrases, one per kind of shortfall (empty when there is none)."""
        cache = self.cache.notes if self.cache is not None else ()
        if self.blocks == 0 and not self.merging:
            return cache
        if self.blocks == 0 and self.transformer:
            off = "" if self.cache is not None else ", and it is off"
            return (
                f"nothing merged ({self.model} is a diffusion transformer: only the step cache acts on it{off})",
                *cache,
            )
        if self.blocks == 0:
            return (f"nothing merged ({self.model} has no UNet transformer blocks)", *cache)
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
        return (*(text for count, text in counts if count), *cache)
