"""Quality you can measure: small SD-layout models trained here, and every mode's fidelity against plain sampling.

    from benchmarks.fidelity import load_model, training_data
    m = load_model("sd15")                     # or "sdxl"
    eps = m.unet(x, t, **m.condition(labels))  # labels: LongTensor, -1 = the empty prompt

``python -m benchmarks.fidelity`` is the benchmark; ``python -m benchmarks.fidelity.train`` made the weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
for _path in (str(_ROOT / "tests"), str(_ROOT)):  # tests/models.py: the attention the WebUI runs
    if _path not in sys.path:
        sys.path.insert(0, _path)

from .loading import Model, load_classifier, load_model, training_data  # noqa: E402

__all__ = ["Model", "load_classifier", "load_model", "training_data"]
