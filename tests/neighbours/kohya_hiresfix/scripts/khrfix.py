"""Double of wcde/sd-webui-kohya-hiresfix ``scripts/khrfix.py`` (05af987, 2023-12-23), written from reading it.

Kohya's "Deep Shrink" for the WebUI: for the first part of the sampling, ``input_blocks[d]`` is swapped (in the UNet's
``ModuleList``) for a ``Scaler`` module that interpolates its input by ``downscale`` before calling the block, and
``output_blocks[-(d + 1)]`` for one that scales by ``upscale`` (l.12-21, 98-111). Two (depth, stop-at) pairs, the
first one that applies wins; with "smooth scaling" the scale moves linearly towards 1 over the steps (l.106-110);
past the stop the original blocks are put back (l.112-114). All from an ``on_cfg_denoiser`` callback added in
``process`` (l.87-117), which compares ``params.sampling_step`` with ``params.total_sampling_steps * stop``;
``postprocess`` puts back any ``Scaler`` left (l.134-140). Left out: the config file (OmegaConf load/save) and the
UI; the arguments keep the real order: enable, only_one_pass, d1, d2, s1, s2, scaler, downscale, upscale,
smooth_scaling, early_out.
"""

import torch
from modules import script_callbacks, scripts


class Scaler(torch.nn.Module):
    def __init__(self, scale, block, scaler):
        super().__init__()
        self.scale = scale
        self.block = block
        self.scaler = scaler

    def forward(self, x, *args):
        x = torch.nn.functional.interpolate(x, scale_factor=self.scale, mode=self.scaler)
        return self.block(x, *args)


DEFAULTS = dict(
    enable=False,
    only_one_pass=True,
    d1=3,
    d2=4,
    s1=0.15,
    s2=0.3,
    scaler="bicubic",
    downscale=0.5,
    upscale=2.0,
    smooth_scaling=True,
    early_out=False,
)


def args(**values):
    """The script's arguments in its order, defaults from its UI (l.41-64) unless given."""
    return [{**DEFAULTS, **values}[name] for name in DEFAULTS]


class KohyaHiresFix(scripts.Script):
    def __init__(self):
        super().__init__()
        self.step_limit = 0

    def title(self):
        return "Kohya Hires.fix"

    def show(self, is_img2img):
        return scripts.AlwaysVisible

    def ui(self, is_img2img):
        import gradio as gr

        return [gr.Checkbox(value=v, visible=False) for v in DEFAULTS.values()]

    def process(self, p, enable, only_one_pass, d1, d2, s1, s2, scaler, downscale, upscale, smooth_scaling, early_out):
        if not enable:
            script_callbacks.remove_current_script_callbacks()
            return
        model = p.sd_model.model.diffusion_model
        s2 = max(s1, s2)
        self.p1 = (s1, d1 - 1)
        self.p2 = (s2, d2 - 1)
        self.step_limit = 0

        def denoiser_callback(params):
            if params.sampling_step < self.step_limit:
                return
            for s, d in (self.p1, self.p2):
                out_d = d if early_out else -(d + 1)
                if params.sampling_step < params.total_sampling_steps * s:
                    if not isinstance(model.input_blocks[d], Scaler):
                        model.input_blocks[d] = Scaler(downscale, model.input_blocks[d], scaler)
                        model.output_blocks[out_d] = Scaler(upscale, model.output_blocks[out_d], scaler)
                    elif smooth_scaling:
                        scale_ratio = params.sampling_step / (params.total_sampling_steps * s)
                        down = min((1 - downscale) * scale_ratio + downscale, 1.0)
                        model.input_blocks[d].scale = down
                        model.output_blocks[out_d].scale = upscale * (downscale / down)
                    return
                elif isinstance(model.input_blocks[d], Scaler) and (self.p1[1] != self.p2[1] or s == self.p2[0]):
                    model.input_blocks[d] = model.input_blocks[d].block
                    model.output_blocks[out_d] = model.output_blocks[out_d].block
            self.step_limit = params.sampling_step if only_one_pass else 0

        script_callbacks.on_cfg_denoiser(denoiser_callback)
        p.extra_generation_params.update(DSHF_s1=s1, DSHF_d1=d1, DSHF_s2=s2, DSHF_d2=d2, DSHF_down=downscale)

    def postprocess(self, p, processed, *args):
        model = p.sd_model.model.diffusion_model
        for blocks in (model.input_blocks, model.output_blocks):
            for i, b in enumerate(blocks):
                if isinstance(b, Scaler):
                    blocks[i] = b.block

    def process_batch(self, p, *args, **kwargs):
        self.step_limit = 0
