"""Doubles of ComfyUI's built-in nodes that patch a model (``comfy_extras/*.py`` at 3cd7b32f)."""
