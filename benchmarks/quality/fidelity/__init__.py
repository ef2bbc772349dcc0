"""Every mode's fidelity against plain sampling on the trained models: ``python -m benchmarks.quality.fidelity``
(:mod:`benchmarks.quality.fidelity.__main__`), its section and plots (:mod:`benchmarks.quality.fidelity.report`)."""
