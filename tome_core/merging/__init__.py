"""Token merging, one of the session's two capabilities: :class:`TokenMerger` (the hooks on a UNet's transformer
blocks), its merge plans (:mod:`.planning`), the merge math (:mod:`.merge`) and the neighbours it steps aside for
(:mod:`.neighbours`)."""

from .merger import TokenMerger
from .planning import Planner

__all__ = ["Planner", "TokenMerger"]
