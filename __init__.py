"""ComfyUI's entry point: cloned into ``ComfyUI/custom_nodes/<any name>/``, this repository is imported as a package
and its node mappings are read. The nodes are ``comfy_tome``'s; this file only hands them on.

``comfy_tome`` and ``tome_core`` are top-level packages of this repository, as the WebUI script imports them (the
WebUI puts an extension's folder on ``sys.path`` while loading it); ComfyUI does not, so the folder is appended to
``sys.path`` (last: nothing of ComfyUI's or another node's is shadowed). pytest imports this file on its own.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.append(_HERE)

from comfy_tome import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS  # noqa: E402

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
