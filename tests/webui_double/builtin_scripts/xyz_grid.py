"""Double of scripts/xyz_grid.py (WebUI 1.10.1), loaded by harness.register_xyz_grid() through
modules.scripts.register_script_file, so the module is named "xyz_grid.py" and
``Script.__module__ == "xyz_grid.py"`` like the real one (that is how extensions find it at on_before_ui time).

Kept: ``apply_field``, ``apply_override`` (writes ``p.override_settings[field]``; boolean parses "true"),
``boolean_choice``, ``format_value``, ``format_value_add_label``, ``format_nothing``, ``do_nothing``,
``confirm_range``, ``AxisOption(label, type, apply, format_value=format_value_add_label, confirm=None, cost=0.0,
choices=None, prepare=None)`` and the Img2Img/Txt2Img variants (~L213-231), the built-in axes that matter here
(incl. "Token merging ratio" / "Token merging ratio high-res" ~L136-137), and the per-cell procedure of ``run``
(~L707-776) as ``run_cell``: a SHALLOW ``copy(p)`` (so ``extra_generation_params`` and ``override_settings``
dicts are shared with p and with the other cells), ``styles`` copied, axis ``apply(pc, x, xs)``, then
``process_images(pc)`` inside try/except that only displays the error and returns an empty Processed.
Left out: the grid drawing, value ranges syntax, the gradio UI (ui() returns no controls).
"""

from copy import copy

from modules import errors, scripts, shared
from modules.processing import Processed, process_images
from modules.shared import opts, state


def apply_field(field):
    def fun(p, x, xs):
        setattr(p, field, x)

    return fun


def apply_override(field, boolean: bool = False):
    def fun(p, x, xs):
        if boolean:
            x = x.lower() == "true"
        p.override_settings[field] = x

    return fun


def boolean_choice(reverse: bool = False):
    def choice():
        return ["False", "True"] if reverse else ["True", "False"]

    return choice


def format_value_add_label(p, opt, x):
    if type(x) is float:
        x = round(x, 8)
    return f"{opt.label}: {x}"


def format_value(p, opt, x):
    if type(x) is float:
        x = round(x, 8)
    return x


def format_value_join_list(p, opt, x):
    return ", ".join(x)


def do_nothing(p, x, xs):
    pass


def format_nothing(p, opt, x):
    return ""


def confirm_range(min_val, max_val, axis_label):
    def confirm_range_fun(p, xs):
        for x in xs:
            if not (max_val >= x >= min_val):
                raise ValueError(f'{axis_label} value "{x}" out of range [{min_val}, {max_val}]')

    return confirm_range_fun


class AxisOption:
    def __init__(
        self,
        label,
        type,
        apply,
        format_value=format_value_add_label,
        confirm=None,
        cost=0.0,
        choices=None,
        prepare=None,
    ):
        self.label = label
        self.type = type
        self.apply = apply
        self.format_value = format_value
        self.confirm = confirm
        self.cost = cost
        self.prepare = prepare
        self.choices = choices


class AxisOptionImg2Img(AxisOption):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.is_img2img = True


class AxisOptionTxt2Img(AxisOption):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.is_img2img = False


axis_options = [
    AxisOption("Nothing", str, do_nothing, format_value=format_nothing),
    AxisOption("Seed", int, apply_field("seed")),
    AxisOption("Var. seed", int, apply_field("subseed")),
    AxisOption("Var. strength", float, apply_field("subseed_strength")),
    AxisOption("Steps", int, apply_field("steps")),
    AxisOptionTxt2Img("Hires steps", int, apply_field("hr_second_pass_steps")),
    AxisOption("CFG Scale", float, apply_field("cfg_scale")),
    AxisOptionImg2Img("Image CFG Scale", float, apply_field("image_cfg_scale")),
    AxisOptionImg2Img("Denoising", float, apply_field("denoising_strength")),
    AxisOption("Token merging ratio", float, apply_override("token_merging_ratio")),
    AxisOption("Token merging ratio high-res", float, apply_override("token_merging_ratio_hr")),
]


def parse_axis_values(opt, text):
    """Comma-separated values converted with opt.type, then opt.confirm(p=None, values) (no range syntax)."""
    values = [opt.type(v.strip()) for v in text.split(",") if v.strip() != ""]
    if opt.confirm:
        opt.confirm(None, values)
    return values


def run_cell(p, axis_option, value, xs=None):
    """One cell of the grid, as the real ``cell()`` (~L707-730) does it for a single axis."""
    if shared.state.interrupted or state.stopping_generation:
        return Processed(p, [], p.seed, "")

    pc = copy(p)
    pc.styles = pc.styles[:]
    axis_option.apply(pc, value, xs if xs is not None else [value])

    try:
        res = process_images(pc)
    except Exception as e:
        errors.display(e, "generating image for xyz plot")
        res = Processed(p, [], p.seed, "")
    return res


def run_axis(p, axis_option, values):
    """All cells of one axis in order, restoring opts afterwards like SharedSettingsStackHelper (~L780-792)."""
    saved = dict(opts.data)
    try:
        return [run_cell(p, axis_option, v, values) for v in values]
    finally:
        opts.data.clear()
        opts.data.update(saved)


class Script(scripts.Script):
    def title(self):
        return "X/Y/Z plot"

    def ui(self, is_img2img):
        self.current_axis_options = [x for x in axis_options if type(x) is AxisOption or x.is_img2img == is_img2img]
        return []
