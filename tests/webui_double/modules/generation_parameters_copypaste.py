"""Old name of modules/infotext_utils.py (the real one registers this alias in sys.modules, ~L14)."""

import sys

from modules import infotext_utils

sys.modules[__name__] = infotext_utils
