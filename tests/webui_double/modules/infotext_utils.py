"""Double of modules/infotext_utils.py (WebUI 1.10.1; old name modules/generation_parameters_copypaste).

- ``quote``/``unquote`` (~L56-70): values containing ',', ':' or a newline are written as JSON strings.
- ``parse_generation_parameters(text, skip_fields=None)`` (~L234-401): the last line is the parameter line
  only if the parameter regex finds >= 3 ``key: value`` pairs in it (otherwise it is part of the prompt);
  ``"quoted"`` values are JSON-unquoted, ``WxH`` values become ``key-1``/``key-2``; the same default keys are
  added (Clip skip "1", Hires resize-1/2 = 0, Hires sampler "Use same sampler", RNG "GPU", ...); fields in
  ``opts.infotext_skip_pasting`` are dropped. ALL parsed values stay strings.
  Left out: style extraction, the "Emphasis" default (needs prompt_parser), hypernet prompt suffix, version
  back-compat flags other than none.
- ``paste_func_updates(paste_fields, text)`` reproduces ``connect_paste``'s inner ``paste_func`` (~L477-518):
  parse, fire ``infotext_pasted`` callbacks (which may edit the dict), then for each ``(component, key)``:
  a callable key is called with the params dict (exceptions reported -> None); None -> ``gr.update()``
  (no change); a ``gr.update`` dict is passed through; otherwise the value is converted with the TYPE OF THE
  COMPONENT'S CURRENT VALUE: bool + "False" -> False, int -> float(v), else ``type(component.value)(v)``
  (so a bool component gets ``bool("anything non-empty") == True``, a component whose value is None gets no
  update because ``NoneType(v)`` fails, a str component gets ``str(v)``), failures -> ``gr.update()``.
- ``connect_paste(button, paste_fields, input_comp)`` registers that function as the button's click listener with
  every field's component as an output, as ``connect_paste`` does (~L477-527; no params.txt fallback, no override
  settings dropdown, no ``recalculate_prompts`` JS); the harness wires each tab's paste button with it.
- ``apply_paste_fields(paste_fields, text_or_params)`` returns ``{component: new_value}`` for the components
  that receive a value (test convenience on top of paste_func_updates).
"""

from __future__ import annotations

import json
import re
import sys

import gradio as gr

from modules import errors, script_callbacks, shared

sys.modules.setdefault("modules.generation_parameters_copypaste", sys.modules[__name__])

re_param = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
re_imagesize = re.compile(r"^(\d+)x(\d+)$")
type_of_gr_update = type(gr.update())


class PasteField(tuple):
    # ~L34-44
    def __new__(cls, component, target, *, api=None):
        return super().__new__(cls, (component, target))

    def __init__(self, component, target, *, api=None):
        super().__init__()
        self.api = api
        self.component = component
        self.label = target if isinstance(target, str) else None
        self.function = target if callable(target) else None


paste_fields: dict[str, dict] = {}


def quote(text):
    if "," not in str(text) and "\n" not in str(text) and ":" not in str(text):
        return text
    return json.dumps(text, ensure_ascii=False)


def unquote(text):
    if len(text) == 0 or text[0] != '"' or text[-1] != '"':
        return text
    try:
        return json.loads(text)
    except Exception:
        return text


def _restore_old_hires_fix_params(res):
    # ~L202-231 (only the 'First pass size' conversion)
    fw, fh = res.get("First pass size-1"), res.get("First pass size-2")
    if fw is None or fh is None:
        return
    fw, fh = int(fw), int(fh)
    width, height = int(res.get("Size-1", 512)), int(res.get("Size-2", 512))
    if fw == 0 or fh == 0:
        return
    res["Size-1"], res["Size-2"] = fw, fh
    res["Hires resize-1"], res["Hires resize-2"] = width, height


def parse_generation_parameters(x: str, skip_fields: list[str] | None = None):
    if skip_fields is None:
        skip_fields = shared.opts.infotext_skip_pasting

    res = {}
    prompt = ""
    negative_prompt = ""
    done_with_prompt = False

    *lines, lastline = x.strip().split("\n")
    if len(re_param.findall(lastline)) < 3:
        lines.append(lastline)
        lastline = ""

    for line in lines:
        line = line.strip()
        if line.startswith("Negative prompt:"):
            done_with_prompt = True
            line = line[16:].strip()
        if done_with_prompt:
            negative_prompt += ("" if negative_prompt == "" else "\n") + line
        else:
            prompt += ("" if prompt == "" else "\n") + line

    for k, v in re_param.findall(lastline):
        try:
            if v[0] == '"' and v[-1] == '"':
                v = unquote(v)
            m = re_imagesize.match(v)
            if m is not None:
                res[f"{k}-1"] = m.group(1)
                res[f"{k}-2"] = m.group(2)
            else:
                res[k] = v
        except Exception:
            print(f'Error parsing "{k}: {v}"')

    res["Prompt"] = prompt
    res["Negative prompt"] = negative_prompt

    if "Clip skip" not in res:
        res["Clip skip"] = "1"
    if "Hires resize-1" not in res:  # both set together, like the real (~L315-317)
        res["Hires resize-1"] = 0
        res["Hires resize-2"] = 0
    for key, value in [
        ("Hires sampler", "Use same sampler"),
        ("Hires schedule type", "Use same scheduler"),
        ("Hires checkpoint", "Use same checkpoint"),
        ("Hires prompt", ""),
        ("Hires negative prompt", ""),
        ("Mask mode", "Inpaint masked"),
        ("Masked content", "original"),
        ("Inpaint area", "Whole picture"),
        ("Masked area padding", 32),
    ]:
        if key not in res:
            res[key] = value
    _restore_old_hires_fix_params(res)

    for key, value in [
        ("RNG", "GPU"),
        ("Schedule type", "Automatic"),
        ("Schedule max sigma", 0),
        ("Schedule min sigma", 0),
        ("Schedule rho", 0),
        ("VAE Encoder", "Full"),
        ("VAE Decoder", "Full"),
        ("FP8 weight", "Disable"),
    ]:
        if key not in res:
            res[key] = value
    if "Cache FP16 weight for LoRA" not in res and res["FP8 weight"] != "Disable":
        res["Cache FP16 weight for LoRA"] = False
    if "Refiner switch by sampling steps" not in res:
        res["Refiner switch by sampling steps"] = False

    for key in skip_fields:
        res.pop(key, None)

    return res


def paste_func_updates(paste_fields, prompt):
    """The list of gr.update dicts the real paste button returns for ``paste_fields`` (one per field)."""
    params = parse_generation_parameters(prompt)
    script_callbacks.infotext_pasted_callback(prompt, params)
    return _updates_from_params(paste_fields, params)


def _updates_from_params(paste_fields, params):
    res = []
    for output, key in paste_fields:
        if callable(key):
            try:
                v = key(params)
            except Exception:
                errors.report(f"Error executing {key}", exc_info=True)
                v = None
        else:
            v = params.get(key, None)

        if v is None:
            res.append(gr.update())
        elif isinstance(v, type_of_gr_update):
            res.append(v)
        else:
            try:
                valtype = type(output.value)
                if valtype is bool and v == "False":
                    val = False
                elif valtype is int:
                    val = float(v)
                else:
                    val = valtype(v)
                res.append(gr.update(value=val))
            except Exception:
                res.append(gr.update())
    return res


def connect_paste(button, paste_fields, input_comp):
    def paste_func(prompt):
        return paste_func_updates(paste_fields, prompt)

    button.click(fn=paste_func, inputs=[input_comp], outputs=[x[0] for x in paste_fields], show_progress=False)


def apply_paste_fields(paste_fields, text_or_params):
    """{component: value} for every field whose paste produces a value (a str is parsed and the
    infotext_pasted callbacks run, as on a real paste; a dict is used as already-parsed params)."""
    if isinstance(text_or_params, str):
        updates = paste_func_updates(paste_fields, text_or_params)
    else:
        updates = _updates_from_params(paste_fields, text_or_params)
    out = {}
    for (component, _), update in zip(paste_fields, updates):
        if isinstance(update, dict) and "value" in update:
            out[component] = update["value"]
    return out
