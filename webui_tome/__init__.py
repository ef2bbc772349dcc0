"""The WebUI adapter (A1111, Forge, Forge Classic, Forge Neo): what only those hosts need, beside ``scripts/tome.py``
which wires it up — the script's arguments, registry, XYZ axes and hints (:mod:`.extension`), the control models of
Mikubill's and Forge's ControlNet (:mod:`.controlnet`, :mod:`.forge_controlnet`) and Neo's own step caches
(:mod:`.forge_caches`). The engine is ``tome_core``, which imports no host."""
