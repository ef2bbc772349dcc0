"""The commands that time something (``python -m benchmarks.speed.<command>``); see ``benchmarks/README.md``."""
