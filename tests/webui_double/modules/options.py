"""Double of modules/options.py (WebUI 1.10.1): OptionInfo, Options, options_section.

Behaviour kept from the real file:
- ``opts.<key>`` reads ``opts.data[key]``, falling back to the registered default (``__getattr__`` ~L140-151);
- ``opts.<key> = v`` writes ``opts.data`` only for registered keys (``__setattr__`` ~L92-138);
- ``opts.set(key, v, is_api=..., run_callbacks=...)`` returns False when unchanged, raises KeyError for an
  unregistered key (it indexes ``data_labels[key]``), runs ``onchange`` (``set`` ~L153-179);
- ``opts.get_default(key)`` returns the registered default or None (~L181-188);
- ``opts.add_option(key, info)`` registers and seeds ``data`` (~L256-260), as extensions do in on_ui_settings.
Freezing flags, saving/loading and the settings UI are left out.
"""

from typing import ClassVar


class OptionInfo:
    # mirrors modules/options.py OptionInfo ~L13-58 (same constructor arguments, chainable helpers)
    def __init__(
        self,
        default=None,
        label="",
        component=None,
        component_args=None,
        onchange=None,
        section=None,
        refresh=None,
        comment_before="",
        comment_after="",
        infotext=None,
        restrict_api=False,
        category_id=None,
    ):
        self.default = default
        self.label = label
        self.component = component
        self.component_args = component_args
        self.onchange = onchange
        self.section = section
        self.category_id = category_id
        self.refresh = refresh
        self.do_not_save = False
        self.comment_before = comment_before
        self.comment_after = comment_after
        self.infotext = infotext
        self.restrict_api = restrict_api

    def link(self, label, url):
        self.comment_before += f"[<a href='{url}' target='_blank'>{label}</a>]"
        return self

    def js(self, label, js_func):
        self.comment_before += f"[<a onclick='{js_func}(); return false'>{label}</a>]"
        return self

    def info(self, info):
        self.comment_after += f"<span class='info'>({info})</span>"
        return self

    def html(self, html):
        self.comment_after += html
        return self

    def needs_restart(self):
        self.comment_after += " <span class='info'>(requires restart)</span>"
        return self

    def needs_reload_ui(self):
        self.comment_after += " <span class='info'>(requires Reload UI)</span>"
        return self


def options_section(section_identifier, options_dict):
    # mirrors modules/options.py options_section ~L67-75
    for info in options_dict.values():
        if len(section_identifier) == 2:
            info.section = section_identifier
        elif len(section_identifier) == 3:
            info.section = section_identifier[0:2]
            info.category_id = section_identifier[2]
    return options_dict


_builtin_fields = {"data_labels", "data", "restricted_opts", "typemap"}


class Options:
    typemap: ClassVar[dict] = {int: float}

    def __init__(self, data_labels, restricted_opts=None):
        self.data_labels = data_labels
        self.data = {k: v.default for k, v in data_labels.items() if not v.do_not_save}
        self.restricted_opts = restricted_opts or set()

    def __setattr__(self, key, value):
        if key in _builtin_fields:
            return super().__setattr__(key, value)
        if self.data is not None and (key in self.data or key in self.data_labels):
            info = self.data_labels.get(key)
            if info is not None and info.do_not_save:
                return
            comp_args = info.component_args if info else None
            if isinstance(comp_args, dict) and comp_args.get("visible", True) is False:
                raise RuntimeError(f"not possible to set '{key}' because it is restricted")
            self.data[key] = value
            return
        return super().__setattr__(key, value)

    def __getattr__(self, item):
        if item in _builtin_fields:
            return super().__getattribute__(item)
        data = self.__dict__.get("data")
        if data is not None and item in data:
            return data[item]
        labels = self.__dict__.get("data_labels", {})
        if item in labels:
            return labels[item].default
        return super().__getattribute__(item)

    def set(self, key, value, is_api=False, run_callbacks=True):
        old = self.data.get(key, None)
        if old == value:
            return False
        option = self.data_labels[key]  # KeyError for unknown keys, like the real one
        if option.do_not_save:
            return False
        if is_api and option.restrict_api:
            return False
        try:
            setattr(self, key, value)
        except RuntimeError:
            return False
        if run_callbacks and option.onchange is not None:
            try:
                option.onchange()
            except Exception as e:
                from modules import errors

                errors.display(e, f"changing setting {key} to {value}")
                setattr(self, key, old)
                return False
        return True

    def get_default(self, key):
        info = self.data_labels.get(key)
        return None if info is None else info.default

    def add_option(self, key, info):
        self.data_labels[key] = info
        if key not in self.data and not info.do_not_save:
            self.data[key] = info.default

    def same_type(self, x, y):
        if x is None or y is None:
            return True
        return self.typemap.get(type(x), type(x)) == self.typemap.get(type(y), type(y))
