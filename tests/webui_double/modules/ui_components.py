"""Double of modules/ui_components.py (WebUI 1.10.1) on real gradio 3.41.2.

``InputAccordion(value, **kwargs)`` (~L88-145) is a ``gr.Checkbox`` subclass: the checkbox itself is hidden
(``visible=False``, elem_id ``<id>-checkbox``) and a ``gr.Accordion`` (elem_id ``<id>``, label, ``open=value``,
class ``input-accordion``) is created next to it and kept as ``.accordion``; ``with InputAccordion(...) as acc``
enters the accordion and yields the checkbox, whose value (bool) is what ui() returns and the script receives.
``.extra()`` returns a ``gr.Column`` placed in the accordion's label. Without an elem_id the id is
``input-accordion-<n>`` from a class counter. The JS sync (``inputAccordionChecked``) is registered as in the real.

On gradio 4 the module stands for Forge's, which is the same code behind Forge's gradio_extensions shims (imported
first, as Forge does; the classes opt out of gradio's ``.pyi`` writing like Forge's). Forge's ``InputAccordion`` is a
factory around ``InputAccordionImpl(gr.Checkbox)`` whose ``setup=False`` makes a plain checkbox: gradio 4 rebuilds a
component from an update's kwargs (``postprocess_data``), without the value. The ``setup`` parameter here does the
same (``InputAccordionImpl``); ``InputAccordion(value, **kwargs)`` is the class on gradio 3, Forge's factory on 4.
"""

import gradio as gr

from modules import gradio_extensions


class FormComponent:
    webui_do_not_create_gradio_pyi_thank_you = True

    def get_expected_parent(self):
        return gr.components.Form


class ToolButton(FormComponent, gr.Button):
    def __init__(self, *args, **kwargs):
        classes = kwargs.pop("elem_classes", [])
        super().__init__(*args, elem_classes=["tool", *classes], **kwargs)

    def get_block_name(self):
        return "button"


class FormRow(FormComponent, gr.Row):
    def get_block_name(self):
        return "row"


class FormColumn(FormComponent, gr.Column):
    def get_block_name(self):
        return "column"


class FormGroup(FormComponent, gr.Group):
    def get_block_name(self):
        return "group"


class FormHTML(FormComponent, gr.HTML):
    def get_block_name(self):
        return "html"


class DropdownMulti(FormComponent, gr.Dropdown):
    def __init__(self, **kwargs):
        super().__init__(multiselect=True, **kwargs)

    def get_block_name(self):
        return "dropdown"


class InputAccordionImpl(gr.Checkbox):
    webui_do_not_create_gradio_pyi_thank_you = True
    global_index = 0

    def __init__(self, value=None, setup=False, **kwargs):
        if not setup:  # gradio 4 rebuilds a component from its update's kwargs: then it is a plain checkbox
            super().__init__(value=value, **kwargs)
            return
        accordion_id = kwargs.get("elem_id")
        if accordion_id is None:
            accordion_id = f"input-accordion-{InputAccordionImpl.global_index}"
            InputAccordionImpl.global_index += 1
        self.accordion_id = accordion_id

        super().__init__(value, **{**kwargs, "elem_id": f"{accordion_id}-checkbox", "visible": False})

        self.change(
            fn=None, _js='function(checked){ inputAccordionChecked("' + accordion_id + '", checked); }', inputs=[self]
        )

        self.accordion = gr.Accordion(
            **{
                **kwargs,
                "elem_id": accordion_id,
                "label": kwargs.get("label", "Accordion"),
                "elem_classes": ["input-accordion"],
                "open": value,
            }
        )

    def extra(self):
        return gr.Column(elem_id=self.accordion_id + "-extra", elem_classes="input-accordion-extra", min_width=0)

    def __enter__(self):
        self.accordion.__enter__()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.accordion.__exit__(exc_type, exc_val, exc_tb)

    def get_block_name(self):
        return "checkbox"


if gradio_extensions.GRADIO_4:

    def InputAccordion(value=None, **kwargs):  # Forge: a factory
        return InputAccordionImpl(value=value, setup=True, **kwargs)

else:

    class InputAccordion(InputAccordionImpl):  # A1111 1.10.1: the class itself
        def __init__(self, value, **kwargs):
            super().__init__(value, setup=True, **kwargs)
