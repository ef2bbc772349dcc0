"""Double of Forge's modules/gradio_extensions.py: what lets WebUI code written for gradio 3 run on gradio 4.40.

On gradio 3 (A1111 1.10.1, Forge Classic) nothing happens here. On gradio 4, as Forge does (l.85-180):
- classes that set ``webui_do_not_create_gradio_pyi_thank_you`` get no ``.pyi`` file written beside their source
  (gradio's ComponentMeta writes one for every component class), and ``component_meta.updateable`` is the
  identity (Forge: "this function is broken");
- every event listener of a component accepts gradio 3's ``_js=`` and passes it on as ``js=`` (``EventWrapper``).
Left out: the tooltip kwarg, dropping unknown constructor kwargs with a warning, ``gr.Box``, ``Dependency.then(_js=)``
and the before/after_component callbacks.
"""

from __future__ import annotations

import functools

import gradio as gr

GRADIO_4 = int(gr.__version__.split(".")[0]) >= 4


def _install() -> None:
    import gradio.component_meta as meta

    create_pyi = meta.create_or_modify_pyi

    def create_or_modify_pyi(component_class, class_name, events):
        if not hasattr(component_class, "webui_do_not_create_gradio_pyi_thank_you"):
            create_pyi(component_class, class_name, events)

    meta.create_or_modify_pyi = create_or_modify_pyi
    meta.updateable = lambda fn: fn

    def accept_js(listener):
        @functools.wraps(listener)
        def call(*args, **kwargs):
            if "_js" in kwargs:
                kwargs["js"] = kwargs.pop("_js")
            return listener(*args, **kwargs)

        return call

    for name in set(gr.components.__all__ + gr.layouts.__all__):
        cls = getattr(gr, name, None)
        for event in getattr(cls, "EVENTS", None) or []:
            event_name = str(getattr(event, "event_name", event))
            listener = cls.__dict__.get(event_name)
            if listener is not None and not getattr(listener, "_webui_accepts_js", False):
                wrapped = accept_js(listener)
                wrapped._webui_accepts_js = True
                setattr(cls, event_name, wrapped)


if GRADIO_4:
    _install()
