"""What the Forge built-in doubles share: hidden controls with the real defaults (the tests set the values by the
script's ``args_from``), and the step fraction the built-ins compute in their ``on_cfg_denoiser`` callbacks."""

import gradio as gr


def controls(*defaults):
    """One hidden component per argument, holding the real UI's default."""
    out = []
    for value in defaults:
        if isinstance(value, bool):
            out.append(gr.Checkbox(value=value, visible=False))
        elif isinstance(value, str):
            out.append(gr.Textbox(value=value, visible=False))
        else:
            out.append(gr.Number(value=value, visible=False))
    return out
