"""Double of Forge Classic's grid script ``extensions-builtin/xyz/scripts/xyz_grid.py`` (``classic`` at ``1f95d71``):
module "xyz_grid.py", ``axis_options`` (l.35, from ``lib_xyz.builtins``), ``AxisOption`` imported from
``lib_xyz.classes`` and no ``format_value_add_label`` here. ``run_cell`` is the per-cell procedure of ``run``
(a shallow ``copy(p)``, the axis' ``apply``, ``process_images`` l.649)."""

from copy import copy

from lib_xyz.classes import AxisOption, AxisOptionImg2Img, AxisOptionTxt2Img  # noqa: F401 (the module's namespace)
from modules import errors, scripts
from modules.processing import Processed, process_images


def apply_field(field):
    def fun(p, x, xs):
        setattr(p, field, x)

    return fun


axis_options = [
    AxisOption("Nothing", str, lambda p, x, xs: None),
    AxisOption("Seed", int, apply_field("seed")),
    AxisOption("Steps", int, apply_field("steps")),
]


class XYZ(scripts.Script):
    def title(self):
        return "X/Y/Z Plot"

    def ui(self, is_img2img):
        return []


def run_cell(p, axis_option, value, xs=None):
    """One cell of the grid for a single axis, as in the WebUI double's grid."""
    pc = copy(p)
    pc.styles = pc.styles[:]
    axis_option.apply(pc, value, xs if xs is not None else [value])
    try:
        return process_images(pc)
    except Exception as e:
        errors.display(e, "generating image for xyz plot")
        return Processed(p, [], p.seed, "")
