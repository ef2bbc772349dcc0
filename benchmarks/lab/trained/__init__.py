"""Quality you can measure: small SD-layout models trained here, and every mode's fidelity against plain sampling.

    from benchmarks.lab.trained import load_model, training_data
    m = load_model("sd15")                     # or "sdxl"
    eps = m.unet(x, t, **m.condition(labels))  # labels: LongTensor, -1 = the empty prompt

``python -m benchmarks.quality.fidelity`` is the benchmark; ``python -m benchmarks.lab.trained.train`` made the weights.
"""

from __future__ import annotations

from .loading import Model, load_classifier, load_model, training_data

__all__ = ["Model", "load_classifier", "load_model", "training_data"]
