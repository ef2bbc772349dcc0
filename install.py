"""Run by the WebUI at start-up (``launch.py`` executes every extension's ``install.py``).

ToMe needs nothing the WebUI does not already provide: its core, ``tome_core``, is vendored in this
extension's folder and uses only torch. So this file installs nothing and never touches torch,
xformers or gradio; it only tells the user when the WebUI is older than the oldest one we support.
"""

import sys

MINIMUM_PYTHON = (3, 10)

if sys.version_info < MINIMUM_PYTHON:
    print(
        f"[ToMe] needs Python {MINIMUM_PYTHON[0]}.{MINIMUM_PYTHON[1]}+ (the WebUI 1.7+ requirement); it will not load."
    )
