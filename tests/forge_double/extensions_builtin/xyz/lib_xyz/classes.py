"""Double of Forge Classic's ``extensions-builtin/xyz/lib_xyz/classes.py`` (``classic`` at ``1f95d71``): ``AxisOption``
lives here with ``format_value_add_label`` (from ``lib_xyz.axis_format``) as its default formatter; the grid script
imports only the class, so ``format_value_add_label`` is NOT in the grid module's namespace."""


def format_value_add_label(p, opt, x):
    if type(x) is float:
        x = round(x, 8)
    return f"{opt.label}: {x}"


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
