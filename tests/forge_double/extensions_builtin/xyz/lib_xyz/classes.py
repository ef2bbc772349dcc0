"""Double of Forge Classic's ``extensions-builtin/xyz/lib_xyz/classes.py`` (``classic`` at ``1f95d71``): ``AxisOption``
lives here, with ``format_value_add_label`` (from ``lib_xyz.axis_format``) as its default formatter; the grid script
imports only the classes, so ``format_value_add_label`` is NOT in the grid module's namespace.

The classes themselves are those of WebUI 1.10.1's grid, taken from the WebUI double's grid module."""

import importlib.util
import os

_WEBUI_GRID = os.path.join(os.path.dirname(__file__), *[".."] * 4, "webui_double", "builtin_scripts", "xyz_grid.py")


def _webui_grid():
    spec = importlib.util.spec_from_file_location("webui_xyz_grid_for_classic", os.path.normpath(_WEBUI_GRID))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_grid = _webui_grid()
AxisOption = _grid.AxisOption
AxisOptionImg2Img = _grid.AxisOptionImg2Img
AxisOptionTxt2Img = _grid.AxisOptionTxt2Img
