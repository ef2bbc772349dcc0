"""Startup helpers that reproduce the WebUI's order of events for tests.

Real order (webui.py / modules/initialize.py / modules/ui.py): load_scripts() -> (model load, on_model_loaded)
-> script_callbacks.before_ui_callback() -> ui.create_ui(): per tab ``initialize_scripts(is_img2img)``,
``prepare_ui()``, sections, ``setup_ui()`` -> api defaults (init_default_script_args calls ui() again).
"""

import os
import sys

import gradio as gr
from modules import errors, script_callbacks, scripts, sd_models, shared

HERE = os.path.dirname(os.path.abspath(__file__))
XYZ_PATH = os.path.join(HERE, "builtin_scripts", "xyz_grid.py")
HYPERTILE_DIR = os.path.join(HERE, "extensions_builtin", "hypertile")
"""the built-in Hypertile (its U-Net part): pass it first in ``extension_dirs``, as built-ins load before extensions"""


def reset_webui():
    """Fresh options/state, no scripts, no callbacks, nothing reported, no token merging calls recorded."""
    shared.reset()
    scripts.reset()
    script_callbacks.clear_callbacks()
    errors.clear()
    sd_models.apply_token_merging_calls.clear()
    sd_models.checkpoints_list.clear()
    sd_models.loaded_models.clear()
    for name in ("modules_forge.forge_version", "modules_forge"):  # a Forge double's, if one was left: A1111 has none
        sys.modules.pop(name, None)


def register_xyz_grid():
    """Load the XYZ double like the real scripts/xyz_grid.py (module named "xyz_grid.py"); returns the module."""
    return scripts.register_script_file(scripts.ScriptFile(scripts.script_path, "xyz_grid.py", XYZ_PATH))


def load_extension(extension_dir):
    """Load every <extension_dir>/scripts/*.py like load_scripts does for an extension."""
    for scriptfile in scripts.list_extension_scripts(extension_dir):
        scripts.register_script_file(scriptfile)


def build_runner(is_img2img=False):
    """initialize_scripts + prepare_ui + setup_ui inside a gr.Blocks, like ui.create_ui does for one tab, with the
    tab's prompt box and paste button (``runner.prompt``, ``runner.paste``) connected to every script's
    infotext_fields as ``connect_paste_params_buttons`` does (the built-in fields are left out)."""
    from modules import infotext_utils

    runner = scripts.scripts_img2img if is_img2img else scripts.scripts_txt2img
    tabname = "img2img" if is_img2img else "txt2img"
    scripts.scripts_current = runner
    runner.initialize_scripts(is_img2img=is_img2img)
    with gr.Blocks() as demo:
        runner.prompt = gr.Textbox(label="Prompt", elem_id=f"{tabname}_prompt")
        runner.paste = gr.Button("↙️", elem_id="paste")
        runner.prepare_ui()
        runner.setup_ui()
        infotext_utils.connect_paste(runner.paste, list(runner.infotext_fields), runner.prompt)
    runner.demo = demo
    scripts.scripts_current = None
    return runner


def start_webui(extension_dirs=(), *, sd_model=None, with_xyz=True):
    """Full startup: reset, load xyz + extensions, load the model, before_ui callbacks, build both runners."""
    reset_webui()
    if with_xyz:
        register_xyz_grid()
    for ext in extension_dirs:
        load_extension(ext)
    if sd_model is not None:
        sd_models.load_model(sd_model)
    script_callbacks.before_ui_callback()
    script_callbacks.ui_settings_callback()  # the settings page: extensions add their options here
    build_runner(False)
    build_runner(True)
    return scripts.scripts_txt2img, scripts.scripts_img2img


def make_txt2img(runner=None, script_args=None, **kwargs):
    """A StableDiffusionProcessingTxt2Img set up like modules/txt2img.py (~L13-50): scripts then script_args
    (this runs setup() hooks). script_args defaults to the UI defaults of every control."""
    from modules import processing

    runner = runner or scripts.scripts_txt2img
    defaults = {
        "prompt": "a cat",
        "negative_prompt": "",
        "steps": 3,
        "width": 64,
        "height": 64,
        "seed": 1,
        "cfg_scale": 7.0,
        "sampler_name": "Euler",
        "do_not_save_samples": True,
        "do_not_save_grid": True,
    }
    defaults.update(kwargs)
    p = processing.StableDiffusionProcessingTxt2Img(**defaults)
    p.scripts = runner
    p.script_args = script_args if script_args is not None else default_script_args(runner)
    return p


def default_script_args(runner):
    """[0] + the current value of every input, as the UI would send them untouched."""
    return [0] + [getattr(c, "value", None) for c in runner.inputs[1:]]
