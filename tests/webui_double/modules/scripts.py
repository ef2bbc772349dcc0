"""Double of modules/scripts.py (WebUI 1.10.1).

Faithful parts (real line numbers in comments):
- ``Script`` has every hook of 1.10.1 with the same signature (~L52-348);
- scripts are registered as ``ScriptClassData(script_class, path, basedir, module)`` for EVERY class in a
  loaded file that subclasses ``Script`` -- imported ones included (``register_scripts_from_module`` ~L497-505);
  modules are loaded under the name ``os.path.basename(path)`` (modules/script_loading.py) and are not put in
  ``sys.modules``; the script's basedir is on ``sys.path`` only while the file loads (~L509-523);
- ``ScriptRunner.initialize_scripts`` instantiates each class, sorts into alwayson/selectable via ``show()``
  (~L578-612); ``setup_ui_for_section``/``create_script_ui`` call ``ui()`` inside a ``gr.Group`` and assign
  ``args_from``/``args_to`` (~L634-703), ``setup_ui`` puts the script dropdown at input 0 (~L708-766);
- hook dispatchers (~L820-996) call only scripts whose CLASS overrides the hook (``create_ordered_callbacks_list``
  ~L792-803: a hook assigned on the instance is ignored), slice ``p.script_args[args_from:args_to]``, and
  catch + report every exception. ``wrap_call`` (~L533) likewise.
Simplified: no extension metadata ordering, no postprocessing (extras tab) scripts, no auto-postprocessing
scripts, no built-in ``modules/processing_scripts`` (in the real UI those -- Sampler, Seed, Refiner -- are
created first, so a real extension's ``args_from`` is > 1).
"""

import importlib.util
import inspect
import os
import re
import sys
from collections import namedtuple
from dataclasses import dataclass

import gradio as gr

from modules import errors, script_callbacks

AlwaysVisible = object()


class MaskBlendArgs:
    def __init__(self, current_latent, nmask, init_latent, mask, blended_latent, denoiser=None, sigma=None):
        self.current_latent = current_latent
        self.nmask = nmask
        self.init_latent = init_latent
        self.mask = mask
        self.blended_latent = blended_latent
        self.denoiser = denoiser
        self.is_final_blend = denoiser is None
        self.sigma = sigma


class PostSampleArgs:
    def __init__(self, samples):
        self.samples = samples


class PostprocessImageArgs:
    def __init__(self, image):
        self.image = image


class PostProcessMaskOverlayArgs:
    def __init__(self, index, mask_for_overlay, overlay_image):
        self.index = index
        self.mask_for_overlay = mask_for_overlay
        self.overlay_image = overlay_image


class PostprocessBatchListArgs:
    def __init__(self, images):
        self.images = images


@dataclass
class OnComponent:
    component: gr.blocks.Block


class Script:
    # class attributes as in the real Script ~L52-97
    name = None
    section = None
    filename = None
    args_from = None
    args_to = None
    alwayson = False
    is_txt2img = False
    is_img2img = False
    tabname = None
    group = None
    create_group = True
    infotext_fields = None
    paste_field_names = None
    api_info = None
    on_before_component_elem_id = None
    on_after_component_elem_id = None
    setup_for_ui_only = False
    controls = None

    def title(self):
        raise NotImplementedError()

    def ui(self, is_img2img):
        pass

    def show(self, is_img2img):
        return True

    def run(self, p, *args):
        pass

    def setup(self, p, *args):
        pass

    def before_process(self, p, *args):
        pass

    def process(self, p, *args):
        pass

    def before_process_batch(self, p, *args, **kwargs):
        pass

    def after_extra_networks_activate(self, p, *args, **kwargs):
        pass

    def process_before_every_sampling(self, p, *args, **kwargs):
        pass

    def process_batch(self, p, *args, **kwargs):
        pass

    def postprocess_batch(self, p, *args, **kwargs):
        pass

    def postprocess_batch_list(self, p, pp: PostprocessBatchListArgs, *args, **kwargs):
        pass

    def on_mask_blend(self, p, mba: MaskBlendArgs, *args):
        pass

    def post_sample(self, p, ps: PostSampleArgs, *args):
        pass

    def postprocess_image(self, p, pp: PostprocessImageArgs, *args):
        pass

    def postprocess_maskoverlay(self, p, ppmo: PostProcessMaskOverlayArgs, *args):
        pass

    def postprocess_image_after_composite(self, p, pp: PostprocessImageArgs, *args):
        pass

    def postprocess(self, p, processed, *args):
        pass

    def before_component(self, component, **kwargs):
        pass

    def after_component(self, component, **kwargs):
        pass

    def on_before_component(self, callback, *, elem_id):
        if self.on_before_component_elem_id is None:
            self.on_before_component_elem_id = []
        self.on_before_component_elem_id.append((elem_id, callback))

    def on_after_component(self, callback, *, elem_id):
        if self.on_after_component_elem_id is None:
            self.on_after_component_elem_id = []
        self.on_after_component_elem_id.append((elem_id, callback))

    def describe(self):
        return ""

    def elem_id(self, item_id):
        # mirrors Script.elem_id ~L334-342
        need_tabname = self.show(True) == self.show(False)
        tabkind = "img2img" if self.is_img2img else "txt2img"
        tabname = f"{tabkind}_" if need_tabname else ""
        title = re.sub(r"[^a-z_0-9]", "", re.sub(r"\s", "_", self.title().lower()))
        return f"script_{tabname}{title}_{item_id}"

    def before_hr(self, p, *args):
        pass


HOOK_NAMES = (
    "title",
    "show",
    "ui",
    "run",
    "setup",
    "before_process",
    "process",
    "before_process_batch",
    "after_extra_networks_activate",
    "process_before_every_sampling",
    "process_batch",
    "postprocess_batch",
    "postprocess_batch_list",
    "on_mask_blend",
    "post_sample",
    "postprocess_image",
    "postprocess_maskoverlay",
    "postprocess_image_after_composite",
    "postprocess",
    "before_component",
    "after_component",
    "on_before_component",
    "on_after_component",
    "describe",
    "elem_id",
    "before_hr",
)
"""Every method of the real 1.10.1 Script class (test-only constant)."""


class ScriptBuiltinUI(Script):
    # mirrors ~L351-363
    setup_for_ui_only = True

    def elem_id(self, item_id):
        need_tabname = self.show(True) == self.show(False)
        tabname = ("img2img" if self.is_img2img else "txt2img") + "_" if need_tabname else ""
        return f"{tabname}{item_id}"

    def show(self, is_img2img):
        return AlwaysVisible


script_path = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
current_basedir = script_path


def basedir():
    return current_basedir


ScriptFile = namedtuple("ScriptFile", ["basedir", "filename", "path"])
ScriptClassData = namedtuple("ScriptClassData", ["script_class", "path", "basedir", "module"])
scripts_data = []
postprocessing_scripts_data = []


def load_module(path):
    """Like modules/script_loading.py load_module: module named after the file's basename, not in sys.modules."""
    spec = importlib.util.spec_from_file_location(os.path.basename(path), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def register_script_file(scriptfile: ScriptFile):
    """Load one script file the way load_scripts does (~L509-524); errors while loading are reported, not raised."""
    global current_basedir
    syspath = sys.path
    try:
        if scriptfile.basedir != script_path:
            sys.path = [scriptfile.basedir, *sys.path]
        current_basedir = scriptfile.basedir
        module = load_module(scriptfile.path)
        for script_class in module.__dict__.values():
            if inspect.isclass(script_class) and issubclass(script_class, Script):
                scripts_data.append(ScriptClassData(script_class, scriptfile.path, scriptfile.basedir, module))
        return module
    except Exception:
        errors.report(f"Error loading script: {scriptfile.filename}", exc_info=True)
    finally:
        sys.path = syspath
        current_basedir = script_path


def list_extension_scripts(extension_dir):
    """Files of <extension>/scripts/*.py, sorted by name, like Extension.list_files + list_scripts (~L393-468)."""
    folder = os.path.join(extension_dir, "scripts")
    return [
        ScriptFile(extension_dir, name, os.path.join(folder, name))
        for name in sorted(os.listdir(folder))
        if name.lower().endswith(".py") and os.path.isfile(os.path.join(folder, name))
    ]


def load_scripts(script_files=()):
    """Mirror of load_scripts (~L487-530): clears registries and callbacks, loads files, makes fresh runners."""
    global scripts_txt2img, scripts_img2img
    scripts_data.clear()
    postprocessing_scripts_data.clear()
    script_callbacks.clear_callbacks()
    for scriptfile in script_files:
        register_script_file(scriptfile)
    scripts_txt2img = ScriptRunner()
    scripts_img2img = ScriptRunner()


def wrap_call(func, filename, funcname, *args, default=None, **kwargs):
    # mirrors wrap_call ~L533-539
    try:
        return func(*args, **kwargs)
    except Exception:
        errors.report(f"Error calling: {filename}/{funcname}", exc_info=True)
    return default


class ScriptRunner:
    def __init__(self):
        self.scripts = []
        self.selectable_scripts = []
        self.alwayson_scripts = []
        self.titles = []
        self.title_map = {}
        self.infotext_fields = []
        self.paste_field_names = []
        self.inputs = [None]
        self.callback_map = {}
        self.on_before_component_elem_id = {}
        self.on_after_component_elem_id = {}

    def initialize_scripts(self, is_img2img):
        # mirrors ~L578-612 (without auto-postprocessing scripts)
        self.scripts.clear()
        self.alwayson_scripts.clear()
        self.selectable_scripts.clear()

        for script_data in scripts_data:
            try:
                script = script_data.script_class()
            except Exception:
                errors.report(f"Error # failed to initialize Script {script_data.module}: ", exc_info=True)
                continue

            script.filename = script_data.path
            script.is_txt2img = not is_img2img
            script.is_img2img = is_img2img
            script.tabname = "img2img" if is_img2img else "txt2img"

            visibility = script.show(script.is_img2img)
            if visibility == AlwaysVisible:
                self.scripts.append(script)
                self.alwayson_scripts.append(script)
                script.alwayson = True
            elif visibility:
                self.scripts.append(script)
                self.selectable_scripts.append(script)

        self.callback_map.clear()
        self.apply_on_before_component_callbacks()

    def apply_on_before_component_callbacks(self):
        for script in self.scripts:
            on_before = script.on_before_component_elem_id or []
            on_after = script.on_after_component_elem_id or []
            for elem_id, callback in on_before:
                self.on_before_component_elem_id.setdefault(elem_id, []).append((callback, script))
            for elem_id, callback in on_after:
                self.on_after_component_elem_id.setdefault(elem_id, []).append((callback, script))
            on_before.clear()
            on_after.clear()

    def create_script_ui(self, script):
        script.args_from = len(self.inputs)
        script.args_to = len(self.inputs)
        try:
            self.create_script_ui_inner(script)
        except Exception:
            errors.report(f"Error creating UI for {script.name}: ", exc_info=True)

    def create_script_ui_inner(self, script):
        # mirrors ~L644-687: ui() result becomes the script's slice of inputs; api_info from control fields
        from modules.api import models as api_models

        controls = wrap_call(script.ui, script.filename, "ui", script.is_img2img)
        script.controls = controls
        if controls is None:
            return

        script.name = wrap_call(script.title, script.filename, "title", default=script.filename).lower()

        api_args = []
        for control in controls:
            control.custom_script_source = os.path.basename(script.filename)
            arg_info = api_models.ScriptArg(label=control.label or "")
            for field in ("value", "minimum", "maximum", "step"):
                v = getattr(control, field, None)
                if v is not None:
                    setattr(arg_info, field, v)
            choices = getattr(control, "choices", None)
            if choices is not None:
                arg_info.choices = [x[0] if isinstance(x, tuple) else x for x in choices]
            api_args.append(arg_info)

        script.api_info = api_models.ScriptInfo(
            name=script.name, is_img2img=script.is_img2img, is_alwayson=script.alwayson, args=api_args
        )

        if script.infotext_fields is not None:
            self.infotext_fields += script.infotext_fields
        if script.paste_field_names is not None:
            self.paste_field_names += script.paste_field_names

        self.inputs += controls
        script.args_to = len(self.inputs)

    def setup_ui_for_section(self, section, scriptlist=None):
        if scriptlist is None:
            scriptlist = self.alwayson_scripts
        for script in scriptlist:
            if script.alwayson and script.section != section:
                continue
            if script.create_group:
                with gr.Group(visible=script.alwayson) as group:
                    self.create_script_ui(script)
                script.group = group
            else:
                self.create_script_ui(script)

    def prepare_ui(self):
        self.inputs = [None]

    def setup_ui(self):
        # mirrors ~L708-766 (the dropdown's change events and visibility callbacks are left out)
        all_titles = [wrap_call(s.title, s.filename, "title") or s.filename for s in self.scripts]
        self.title_map = {title.lower(): s for title, s in zip(all_titles, self.scripts)}
        self.titles = [
            wrap_call(s.title, s.filename, "title") or f"{s.filename} [error]" for s in self.selectable_scripts
        ]

        self.setup_ui_for_section(None)

        dropdown = gr.Dropdown(
            label="Script", elem_id="script_list", choices=["None", *self.titles], value="None", type="index"
        )
        self.inputs[0] = dropdown

        self.setup_ui_for_section(None, self.selectable_scripts)

        self.infotext_fields.append((dropdown, lambda x: gr.update(value=x.get("Script", "None"))))
        self.apply_on_before_component_callbacks()
        return self.inputs

    def run(self, p, *args):
        # mirrors ~L768-784: selected script index is args[0]
        script_index = args[0]
        if script_index == 0 or script_index is None:
            return None
        script = self.selectable_scripts[script_index - 1]
        if script is None:
            return None
        return script.run(p, *args[script.args_from : script.args_to])

    def list_scripts_for_method(self, method_name):
        if method_name in ("before_component", "after_component"):
            return self.scripts
        return self.alwayson_scripts

    def ordered_scripts(self, method_name):
        # mirrors ordered_callbacks/create_ordered_callbacks_list ~L792-818 incl. the length-keyed cache
        script_list = self.list_scripts_for_method(method_name)
        cached = self.callback_map.get(method_name)
        if cached is None or cached[0] != len(script_list):
            chosen = [
                s for s in script_list if getattr(s.__class__, method_name, None) != getattr(Script, method_name, None)
            ]
            cached = (len(script_list), chosen)
            self.callback_map[method_name] = cached
        return list(cached[1])

    def _dispatch(self, method_name, p, *lead, **kwargs):
        for script in self.ordered_scripts(method_name):
            try:
                script_args = p.script_args[script.args_from : script.args_to]
                getattr(script, method_name)(p, *lead, *script_args, **kwargs)
            except Exception:
                errors.report(f"Error running {method_name}: {script.filename}", exc_info=True)

    # ~L820-996: one dispatcher per hook, same call shapes as the real ones
    def before_process(self, p):
        self._dispatch("before_process", p)

    def process(self, p):
        self._dispatch("process", p)

    def process_before_every_sampling(self, p, **kwargs):
        self._dispatch("process_before_every_sampling", p, **kwargs)

    def before_process_batch(self, p, **kwargs):
        self._dispatch("before_process_batch", p, **kwargs)

    def after_extra_networks_activate(self, p, **kwargs):
        self._dispatch("after_extra_networks_activate", p, **kwargs)

    def process_batch(self, p, **kwargs):
        self._dispatch("process_batch", p, **kwargs)

    def postprocess(self, p, processed):
        self._dispatch("postprocess", p, processed)

    def postprocess_batch(self, p, images, **kwargs):
        # the real passes images as a keyword AFTER the script args (~L876-882)
        self._dispatch("postprocess_batch", p, images=images, **kwargs)

    def postprocess_batch_list(self, p, pp: PostprocessBatchListArgs, **kwargs):
        self._dispatch("postprocess_batch_list", p, pp, **kwargs)

    def post_sample(self, p, ps: PostSampleArgs):
        self._dispatch("post_sample", p, ps)

    def on_mask_blend(self, p, mba: MaskBlendArgs):
        self._dispatch("on_mask_blend", p, mba)

    def postprocess_image(self, p, pp: PostprocessImageArgs):
        self._dispatch("postprocess_image", p, pp)

    def postprocess_maskoverlay(self, p, ppmo: PostProcessMaskOverlayArgs):
        self._dispatch("postprocess_maskoverlay", p, ppmo)

    def postprocess_image_after_composite(self, p, pp: PostprocessImageArgs):
        self._dispatch("postprocess_image_after_composite", p, pp)

    def before_hr(self, p):
        self._dispatch("before_hr", p)

    def setup_scrips(self, p, *, is_ui=True):
        # (sic) the real name is setup_scrips (~L987-996)
        for script in self.ordered_scripts("setup"):
            if not is_ui and script.setup_for_ui_only:
                continue
            try:
                script.setup(p, *p.script_args[script.args_from : script.args_to])
            except Exception:
                errors.report(f"Error running setup: {script.filename}", exc_info=True)

    def before_component(self, component, **kwargs):
        for callback, script in self.on_before_component_elem_id.get(kwargs.get("elem_id"), []):
            try:
                callback(OnComponent(component=component))
            except Exception:
                errors.report(f"Error running on_before_component: {script.filename}", exc_info=True)
        for script in self.ordered_scripts("before_component"):
            try:
                script.before_component(component, **kwargs)
            except Exception:
                errors.report(f"Error running before_component: {script.filename}", exc_info=True)

    def after_component(self, component, **kwargs):
        for callback, script in self.on_after_component_elem_id.get(getattr(component, "elem_id", None), []):
            try:
                callback(OnComponent(component=component))
            except Exception:
                errors.report(f"Error running on_after_component: {script.filename}", exc_info=True)
        for script in self.ordered_scripts("after_component"):
            try:
                script.after_component(component, **kwargs)
            except Exception:
                errors.report(f"Error running after_component: {script.filename}", exc_info=True)

    def script(self, title):
        return self.title_map.get(title.lower())


scripts_txt2img: ScriptRunner = ScriptRunner()
scripts_img2img: ScriptRunner = ScriptRunner()
scripts_current: ScriptRunner = None


def reset():
    """Test-only: empty registries, fresh runners (does not clear script_callbacks)."""
    global scripts_txt2img, scripts_img2img, scripts_current
    scripts_data.clear()
    postprocessing_scripts_data.clear()
    scripts_txt2img = ScriptRunner()
    scripts_img2img = ScriptRunner()
    scripts_current = None
