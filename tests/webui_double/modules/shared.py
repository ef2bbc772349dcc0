"""Double of modules/shared.py (WebUI 1.10.1).

``opts``, ``state``, ``cmd_opts`` and ``sd_model`` are module globals like the real ones (~L30-50).
Note that ``StableDiffusionProcessing.sd_model`` is a property returning ``shared.sd_model``
(modules/processing.py ~L261-267): tests must assign ``shared.sd_model``.
Call ``reset()`` between tests; it mutates ``opts``/``state`` in place so ``from modules.shared import opts``
bindings stay valid.
"""

import sys
import types

from modules import options, shared_options, shared_state

cmd_opts = types.SimpleNamespace(
    disable_nan_check=False,
    no_half=False,
    no_half_vae=False,
    no_prompt_history=False,
    hide_ui_dir_config=False,
    freeze_settings=False,
    api_auth=None,
    api=False,
    nowebui=False,
    lowvram=False,
    medvram=False,
    data_dir=".",
)

OptionInfo = options.OptionInfo
options_section = options.options_section

opts = options.Options(shared_options.templates())
state = shared_state.State()

sd_model = None
"""the loaded model (tests assign a tiny_models.TinySdModel here, or use sd_models.load_model)"""

# ~L55-64
latent_upscale_default_mode = "Latent"
latent_upscale_modes = {
    "Latent": {"mode": "bilinear", "antialias": False},
    "Latent (antialiased)": {"mode": "bilinear", "antialias": True},
    "Latent (bicubic)": {"mode": "bicubic", "antialias": False},
    "Latent (bicubic antialiased)": {"mode": "bicubic", "antialias": True},
    "Latent (nearest)": {"mode": "nearest", "antialias": False},
    "Latent (nearest-exact)": {"mode": "nearest-exact", "antialias": False},
}
sd_upscalers = []
"""no pixel-space upscalers in the double: hires fix must use a latent upscaler"""

parallel_processing_allowed = True
progress_print_out = sys.stdout
demo = None


class _TotalTQDM:
    def __init__(self):
        self.total = 0
        self.updates = 0

    def update(self):
        self.updates += 1

    def updateTotal(self, new_total):
        self.total = new_total

    def clear(self):
        self.total = 0
        self.updates = 0


total_tqdm = _TotalTQDM()


def reset():
    """Test-only: restore default options, a clean state and no model."""
    global sd_model
    fresh = options.Options(shared_options.templates())
    opts.data_labels = fresh.data_labels
    opts.data = fresh.data
    state.reset()
    total_tqdm.clear()
    sd_model = None
