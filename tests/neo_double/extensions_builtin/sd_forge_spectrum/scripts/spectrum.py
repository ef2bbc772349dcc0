"""Double of upstream Neo's ``extensions-builtin/sd_forge_spectrum`` (Haoming02/sd-webui-forge-classic, branch ``neo``:
``scripts/spectrum.py`` at cd837f4, ``lib_spectrum/forecaster.py`` at 24cdbf2), from reading it.

``process_before_every_sampling(p, enable, w, m, lam, window_size, flex_window, warmup_steps, stop_caching_step)``:
nothing unless enabled, nor with *Skip Early CFG* or NGMS on (it prints why); else ``SpectrumNode.patch(unet, p.steps,
…)`` — a clone with a UNet function wrapper named ``spectrum_unet_wrapper`` — and its arguments in the infotext
(``spec_w`` …). The wrapper, per sampling step (a new timestep; a larger one starts a new run): the model runs during
the warm-up, at the last ``1 - stop_caching_step`` of the steps and on every ``floor(window)``-th step in between (the
window grows by ``flex_window`` at each run there), and on the other steps the model is **not called**: the output is
forecast from the outputs it ran, kept per ``(cond_or_uncond, x.shape)``. The forecast here is the forecaster's Taylor
term (the last output extrapolated from the last two); its ridge-regressed Chebyshev fit (weight ``w``) is left out.
Arguments as the real UI: enable, w 0.25, m 6, lam 0.5, window_size 2, flex_window 0, warmup_steps 6,
stop_caching_step 0.9.
"""

import math

from forge_double.extensions_builtin._builtin import controls
from modules import scripts, shared

runs: list[bool] = []
"""Test-only: per step the wrapper decided, whether the model ran (True) or was forecast (False)."""


def patch(unet, steps, w, m, lam, window_size, flex_window, warmup_steps, stop_caching_step):
    state = {"cnt": 0, "num_cached": 0, "window": float(window_size), "last_t": -1.0, "actual": True, "history": {}}

    def spectrum_unet_wrapper(model_function, kwargs):
        x, timestep, c = kwargs["input"], kwargs["timestep"], kwargs["c"]
        t = float(timestep[0])
        if t > state["last_t"]:  # a new run
            state.update(cnt=0, num_cached=0, window=float(window_size), history={})
            state["last_t"] = -1.0
        if t != state["last_t"]:  # decided once per step
            state["last_t"] = t
            cnt = state["cnt"]
            actual = True
            if cnt >= warmup_steps and not cnt >= int(steps * stop_caching_step):
                actual = (state["num_cached"] + 1) % math.floor(state["window"]) == 0
            if actual:
                if cnt >= warmup_steps:
                    state["window"] += flex_window
                state["num_cached"] = 0
            else:
                state["num_cached"] += 1
            state["actual"] = actual
            state["cnt"] += 1
            runs.append(actual)
        key = (tuple(c.get("transformer_options", {}).get("cond_or_uncond", ())), tuple(x.shape))
        history = state["history"].setdefault(key, [])
        if state["actual"] or not history:
            out = model_function(x, timestep, **c)
            history[:] = [*history[-1:], out]
            return out
        if len(history) < 2:
            return history[-1]
        return history[-1] + (history[-1] - history[-2])

    new = unet.clone()
    new.set_model_unet_function_wrapper(spectrum_unet_wrapper)
    return new


class SpectrumForForge(scripts.Script):
    sorting_priority = 2026

    def title(self):
        return "Spectrum Integrated"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, *args, **kwargs):
        return controls(False, 0.25, 6, 0.5, 2, 0.0, 6, 0.9)

    def process_before_every_sampling(self, p, enable, *args, **kwargs):
        if not enable:
            return
        if shared.opts.skip_early_cond > 0.0 or shared.opts.s_min_uncond > 0.0:
            print('Spectrum does not support "Ignore/Skip Negative Prompt" optimizations...')
            return
        w, m, lam, window_size, flex_window, warmup_steps, stop_caching_step = args
        p.sd_model.forge_objects.unet = patch(
            p.sd_model.forge_objects.unet,
            p.steps,
            w,
            int(m),
            lam,
            int(window_size),
            flex_window,
            int(warmup_steps),
            stop_caching_step,
        )
        names = ("spec_w", "spec_m", "spec_lam", "spec_window_size", "spec_flex_window", "spec_warmup_steps")
        for k, v in zip((*names, "spec_stop_caching_step"), args):
            p.extra_generation_params[k] = v
