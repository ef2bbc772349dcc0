"""The commands that measure fidelity against plain sampling (``python -m benchmarks.quality.<command>``); see
``benchmarks/README.md``."""
