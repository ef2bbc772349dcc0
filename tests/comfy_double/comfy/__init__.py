"""The double of ComfyUI's ``comfy`` package (ComfyUI 3cd7b32f): see ``tests/comfy_double/README.md``."""
