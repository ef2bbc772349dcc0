"""ToMe for ComfyUI: the adapter between ComfyUI's model patcher and the engine, ``tome_core`` (which knows no host).

``nodes`` holds the two nodes, ``inputs`` derives their inputs from the settings record, ``sampling`` applies the
settings for the duration of a sampling through ComfyUI's wrappers. ComfyUI itself is imported only when a node runs,
so this package imports anywhere (the tests run it in ``tests/comfy_double``).
"""

from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
