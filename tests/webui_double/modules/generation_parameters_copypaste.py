"""Old name of modules/infotext_utils.py (the real one registers this alias in sys.modules, ~L14)."""
from modules.infotext_utils import *
from modules.infotext_utils import (  # noqa: F401
    apply_paste_fields,
    parse_generation_parameters,
    paste_func_updates,
    quote,
    unquote,
)
