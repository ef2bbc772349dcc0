"""Token reduction inside a transformer's attention, a capability beside the step cache and token merging: every
query kept, attention over fewer keys and values (:mod:`.kv`)."""

from . import kv

__all__ = ["kv"]
