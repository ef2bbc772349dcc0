"""``comfy_api`` (3cd7b32f): only ``torch_helpers``' compile wrapper (see ``torch_helpers/__init__.py``)."""
