"""Double of the script-argument handling of modules/api/api.py (WebUI 1.10.1).

- ``script_name_to_index`` (~L36-40): title().lower() compared with name.lower(); HTTP 422 if absent.
- ``init_default_script_args`` (~L315-333): list of None with [0] = 0, each script's slice filled with the
  ``.value`` of the components returned by calling ``ui()`` AGAIN inside a throwaway ``gr.Blocks``.
- ``init_script_args`` (~L335-361): copy of the defaults; ``alwayson_scripts`` entries are looked up among ALL
  scripts of the runner by case-insensitive title (not found -> 422; selectable -> 422); ``args`` are copied by
  position for min(len(slots), len(args)); extra args are dropped, missing ones keep the defaults; no type checks.
- ``text2imgapi`` (~L432-490) builds the processing object the way the API does (``is_api=True``, scripts, then
  ``script_args`` as a tuple, so ``setup()`` runs with ``is_ui=False``) and returns ``info = processed.js()``.
- ``get_script_info`` (~L300-306) returns each script's ``api_info`` (built at UI creation, see scripts.py).
"""

import gradio as gr

try:
    from fastapi import HTTPException
except ImportError:  # pragma: no cover - fastapi ships with gradio

    class HTTPException(Exception):
        def __init__(self, status_code, detail=None):
            super().__init__(detail)
            self.status_code = status_code
            self.detail = detail


def script_name_to_index(name, scripts):
    try:
        return [script.title().lower() for script in scripts].index(name.lower())
    except Exception as e:
        raise HTTPException(status_code=422, detail=f"Script '{name}' not found") from e


def get_script(script_name, script_runner):
    if script_name is None or script_name == "":
        return None
    return script_runner.scripts[script_name_to_index(script_name, script_runner.scripts)]


def get_selectable_script(script_name, script_runner):
    if script_name is None or script_name == "":
        return None, None
    idx = script_name_to_index(script_name, script_runner.selectable_scripts)
    return script_runner.selectable_scripts[idx], idx


def init_default_script_args(script_runner):
    last_arg_index = 1
    for script in script_runner.scripts:
        last_arg_index = max(last_arg_index, script.args_to)
    script_args = [None] * last_arg_index
    script_args[0] = 0
    with gr.Blocks():
        for script in script_runner.scripts:
            if script.ui(script.is_img2img):
                script_args[script.args_from : script.args_to] = [elem.value for elem in script.ui(script.is_img2img)]
    return script_args


def init_script_args(
    request_alwayson_scripts, script_runner, ui_defaults, *, script_name=None, script_args=None, input_script_args=None
):
    """``request_alwayson_scripts``: the request's ``alwayson_scripts`` dict (or None);
    ``ui_defaults``: the list from init_default_script_args; returns the new list of script args."""
    result = list(ui_defaults)

    if input_script_args is not None:
        for index, value in input_script_args.items():
            result[index] = value

    selectable, selectable_idx = get_selectable_script(script_name, script_runner)
    if selectable:
        result[selectable.args_from : selectable.args_to] = script_args or []
        result[0] = selectable_idx + 1

    if request_alwayson_scripts:
        for name in request_alwayson_scripts:
            script = get_script(name, script_runner)
            if script is None:
                raise HTTPException(status_code=422, detail=f"always on script {name} not found")
            if script.alwayson is False:
                raise HTTPException(
                    status_code=422, detail="Cannot have a selectable script in the always on scripts params"
                )
            if "args" in request_alwayson_scripts[name]:
                args = request_alwayson_scripts[name]["args"]
                for idx in range(min(script.args_to - script.args_from, len(args))):
                    result[script.args_from + idx] = args[idx]
    return result


def get_script_info(*runners):
    res = []
    for runner in runners:
        res += [script.api_info for script in runner.scripts if script.api_info is not None]
    return res


def script_info_entries(script):
    """The ``args`` of a script's /sdapi/v1/script-info entry as plain dicts (label, value, minimum, maximum, step, choices)."""
    if script.api_info is None:
        return []
    return [arg.model_dump() if hasattr(arg, "model_dump") else arg.dict() for arg in script.api_info.args]


def text2imgapi(payload: dict, script_runner=None, default_script_args=None):
    """Run a txt2img request the way Api.text2imgapi does; returns {"images", "parameters", "info"}.

    ``payload`` keys: StableDiffusionProcessingTxt2Img fields plus ``alwayson_scripts``/``script_name``/
    ``script_args``. Images are returned as PIL images (not base64).
    """
    from modules import processing, scripts, shared

    runner = script_runner or scripts.scripts_txt2img
    payload = dict(payload)
    alwayson = payload.pop("alwayson_scripts", None)
    script_name = payload.pop("script_name", None)
    selectable_args = payload.pop("script_args", None)
    payload.pop("send_images", None)
    payload.pop("save_images", None)
    defaults = default_script_args if default_script_args is not None else init_default_script_args(runner)
    args = init_script_args(alwayson, runner, defaults, script_name=script_name, script_args=selectable_args)

    p = processing.StableDiffusionProcessingTxt2Img(
        sd_model=shared.sd_model, do_not_save_samples=True, do_not_save_grid=True, **payload
    )
    p.is_api = True
    p.scripts = runner
    shared.state.begin(job="scripts_txt2img")
    try:
        if script_name:
            p.script_args = args
            processed = runner.run(p, *p.script_args)
        else:
            p.script_args = tuple(args)
            processed = processing.process_images(p)
    finally:
        shared.state.end()
        p.close()
    return {"images": processed.images, "parameters": payload, "info": processed.js()}
