"""``comfy/samplers.py``, ``comfy/sampler_helpers.py``, ``comfy/sample.py`` and the k-diffusion samplers ComfyUI calls
(3cd7b32f): how a KSampler reaches the model, wrapper by wrapper.

``sample`` -> ``CFGGuider.sample`` (samplers.py:1052-1106): the conds copied, ``model_options`` copied
(``create_model_options_clone``), ``prepare_model_patcher`` (sampler_helpers.py:145-175: the patcher's wrappers and
callbacks merged into ``model_options["transformer_options"]``), then the ``OUTER_SAMPLE`` wrappers around
``outer_sample`` (l.1024-1050): ``prepare_sampling`` (the ``PREPARE_SAMPLING`` wrappers; ``load_models_gpu``: LoRA
weights patched in), ``pre_run``, ``inner_sample`` in a ``try``, ``cleanup`` in its ``finally``. ``inner_sample``
(l.996-1022): ``process_conds`` (extra conds, ControlNets' ``pre_run``), a per-sampling copy of the options with
``transformer_options["sample_sigmas"] = sigmas``, then the ``SAMPLER_SAMPLE`` wrappers around the sampler's
``sample(guider, sigmas, extra_args, callback, noise, latent_image, denoise_mask, disable_pbar)``
(``KSAMPLER.sample``, l.735-754). Each model evaluation: ``KSamplerX0Inpaint`` -> the guider (``PREDICT_NOISE``
wrappers) -> ``sampling_function`` (l.368-385: CFG 1 drops the uncond unless ``disable_cfg1_optimization``) ->
``calc_cond_batch`` (``CALC_COND_BATCH`` wrappers, l.204-209) -> ``_calc_cond_batch`` (l.211-335): cond and uncond
batched as ``[uncond, cond]`` (the reversed index list popped, l.254-283), ``transformer_options`` = the options'
``transformer_options`` merged into a new dict, plus ``cond_or_uncond``, ``uuids``, ``sigmas``; the control computed
first; ``model_function_wrapper(apply_model, {...})`` when set, else ``apply_model``; ``cfg_function`` with the
post-CFG functions (SAG and PAG call ``calc_cond_batch`` again from there).

Samplers: ``euler`` and ``heun`` (k_diffusion/sampling.py:187-209, 265-296; Heun evaluates the model again at the
next sigma). Scheduler ``normal`` (samplers.py:432-455). ``KSampler.set_steps`` (l.1166-1178): ``denoise`` < 1 samples
the last ``steps`` of ``steps / denoise``; ``start_step`` / ``last_step`` slice the sigmas (KSamplerAdvanced).
Left out: areas, masks, hooks, GLIGEN, context windows, memory-based batch splitting, other samplers and schedulers.
"""

from __future__ import annotations

import math
import uuid

import torch

from . import model_management, model_patcher, patcher_extension
from .patcher_extension import WrapperExecutor, WrappersMP


def convert_cond(cond: list) -> list[dict]:
    out = []
    for tensor, options in cond:
        temp = options.copy()
        temp["cross_attn"] = tensor
        temp["model_conds"] = {}
        temp["uuid"] = uuid.uuid4()
        out.append(temp)
    return out


def process_conds(model, noise, conds: dict) -> dict:
    for k in conds:
        conds[k] = [c.copy() for c in conds[k]]
        for c in conds[k]:
            cross_attn = c["cross_attn"].repeat(noise.shape[0] // c["cross_attn"].shape[0], 1, 1)  # CONDCrossAttn
            c["model_conds"] = {"c_crossattn": cross_attn, **model.extra_conds(noise.shape[0])}
            if "control" in c:
                c["control"].pre_run(model, model.model_sampling.percent_to_sigma)
    return conds


def calc_cond_batch(model, conds, x_in, timestep, model_options):
    executor = WrapperExecutor.new_executor(
        _calc_cond_batch,
        patcher_extension.get_all_wrappers(WrappersMP.CALC_COND_BATCH, model_options, is_model_options=True),
    )
    return executor.execute(model, conds, x_in, timestep, model_options)


def _calc_cond_batch(model, conds, x_in, timestep, model_options):
    out_conds = [torch.zeros_like(x_in) for _ in conds]
    out_counts = [torch.ones_like(x_in) * 1e-37 for _ in conds]
    to_run = [(c, i) for i, cond in enumerate(conds) if cond is not None for c in cond]
    batch = [to_run.pop(j) for j in reversed(range(len(to_run)))]  # l.254-283: [uncond, cond]
    input_x = torch.cat([x_in] * len(batch))
    cond_or_uncond = [i for _, i in batch]
    c = {"c_crossattn": torch.cat([p["model_conds"]["c_crossattn"] for p, _ in batch])}
    if "y" in batch[0][0]["model_conds"]:
        c["y"] = torch.cat([p["model_conds"]["y"] for p, _ in batch])
    control = batch[-1][0].get("control")
    timestep_ = torch.cat([timestep] * len(batch))
    transformer_options = patcher_extension.merge_nested_dicts(
        {}, model_options.get("transformer_options", {}), copy_dict1=False
    )
    transformer_options["cond_or_uncond"] = cond_or_uncond[:]
    transformer_options["uuids"] = [p["uuid"] for p, _ in batch]
    transformer_options["sigmas"] = timestep
    c["transformer_options"] = transformer_options
    if control is not None:
        c["control"] = control.get_control(input_x, timestep_, c, len(cond_or_uncond), transformer_options)
    if "model_function_wrapper" in model_options:
        args = {"input": input_x, "timestep": timestep_, "c": c, "cond_or_uncond": cond_or_uncond}
        output = model_options["model_function_wrapper"](model.apply_model, args).chunk(len(batch))
    else:
        output = model.apply_model(input_x, timestep_, **c).chunk(len(batch))
    for o, index in enumerate(cond_or_uncond):
        out_conds[index] += output[o]
        out_counts[index] += 1.0
    return [out / count for out, count in zip(out_conds, out_counts)]


def cfg_function(model, cond_pred, uncond_pred, cond_scale, x, timestep, model_options, cond=None, uncond=None):
    cfg_result = uncond_pred + (cond_pred - uncond_pred) * cond_scale
    for fn in model_options.get("sampler_post_cfg_function", []):
        args = {
            "denoised": cfg_result,
            "cond": cond,
            "uncond": uncond,
            "cond_scale": cond_scale,
            "model": model,
            "uncond_denoised": uncond_pred,
            "cond_denoised": cond_pred,
            "sigma": timestep,
            "model_options": model_options,
            "input": x,
        }
        cfg_result = fn(args)
    return cfg_result


def sampling_function(model, x, timestep, uncond, cond, cond_scale, model_options, seed=None):
    cfg1 = math.isclose(cond_scale, 1.0) and not model_options.get("disable_cfg1_optimization", False)
    uncond_ = None if cfg1 else uncond
    out = calc_cond_batch(model, [cond, uncond_], x, timestep, model_options)
    return cfg_function(model, out[0], out[1], cond_scale, x, timestep, model_options, cond=cond, uncond=uncond_)


class CFGGuider:
    def __init__(self, model_patcher_: model_patcher.ModelPatcher):
        self.model_patcher = model_patcher_
        self.model_options = model_patcher_.model_options
        self.original_conds: dict = {}
        self.cfg = 1.0

    def set_conds(self, positive, negative):
        self.original_conds = {"positive": convert_cond(positive), "negative": convert_cond(negative)}

    def set_cfg(self, cfg):
        self.cfg = cfg

    def __call__(self, *args, **kwargs):
        return self.outer_predict_noise(*args, **kwargs)

    def outer_predict_noise(self, x, timestep, model_options={}, seed=None):  # noqa: B006
        wrappers = patcher_extension.get_all_wrappers(WrappersMP.PREDICT_NOISE, self.model_options, True)
        return WrapperExecutor.new_class_executor(self.predict_noise, self, wrappers).execute(
            x, timestep, model_options, seed
        )

    def predict_noise(self, x, timestep, model_options={}, seed=None):  # noqa: B006
        return sampling_function(
            self.inner_model,
            x,
            timestep,
            self.conds.get("negative"),
            self.conds.get("positive"),
            self.cfg,
            model_options=model_options,
            seed=seed,
        )

    def inner_sample(self, noise, latent_image, device, sampler, sigmas, denoise_mask, callback, disable_pbar, seed):
        self.conds = process_conds(self.inner_model, noise, self.conds)
        extra_model_options = model_patcher.create_model_options_clone(self.model_options)
        extra_model_options.setdefault("transformer_options", {})["sample_sigmas"] = sigmas
        extra_args = {"model_options": extra_model_options, "seed": seed}
        wrappers = patcher_extension.get_all_wrappers(WrappersMP.SAMPLER_SAMPLE, extra_model_options, True)
        executor = WrapperExecutor.new_class_executor(sampler.sample, sampler, wrappers)
        samples = executor.execute(self, sigmas, extra_args, callback, noise, latent_image, denoise_mask, disable_pbar)
        return self.inner_model.process_latent_out(samples.to(torch.float32))

    def outer_sample(
        self, noise, latent_image, sampler, sigmas, denoise_mask=None, callback=None, disable_pbar=False, seed=None
    ):
        self.inner_model, self.conds, self.loaded_models = prepare_sampling(
            self.model_patcher, noise.shape, self.conds, self.model_options
        )
        try:
            self.model_patcher.pre_run()
            output = self.inner_sample(
                noise, latent_image, None, sampler, sigmas, denoise_mask, callback, disable_pbar, seed
            )
        finally:
            self.model_patcher.cleanup()
        for k in self.conds:
            for c in self.conds[k]:
                if "control" in c:
                    c["control"].cleanup()
        del self.inner_model
        del self.loaded_models
        return output

    def sample(
        self, noise, latent_image, sampler, sigmas, denoise_mask=None, callback=None, disable_pbar=False, seed=None
    ):
        if sigmas.shape[-1] == 0:
            return latent_image
        self.conds = {k: [c.copy() for c in v] for k, v in self.original_conds.items()}
        orig_model_options = self.model_options
        try:
            self.model_options = model_patcher.create_model_options_clone(self.model_options)
            prepare_model_patcher(self.model_patcher, self.model_options)
            wrappers = patcher_extension.get_all_wrappers(WrappersMP.OUTER_SAMPLE, self.model_options, True)
            executor = WrapperExecutor.new_class_executor(self.outer_sample, self, wrappers)
            output = executor.execute(noise, latent_image, sampler, sigmas, denoise_mask, callback, disable_pbar, seed)
        finally:
            self.model_options = orig_model_options
        del self.conds
        return output


def prepare_model_patcher(patcher, model_options: dict) -> None:
    to = model_options["transformer_options"]
    patcher_extension.merge_nested_dicts(to.setdefault("wrappers", {}), patcher.wrappers, copy_dict1=False)
    patcher_extension.merge_nested_dicts(to.setdefault("callbacks", {}), patcher.callbacks, copy_dict1=False)


def prepare_sampling(patcher, noise_shape, conds, model_options=None):
    wrappers = patcher_extension.get_all_wrappers(WrappersMP.PREPARE_SAMPLING, model_options, is_model_options=True)
    return WrapperExecutor.new_executor(_prepare_sampling, wrappers).execute(patcher, noise_shape, conds, model_options)


def _prepare_sampling(patcher, noise_shape, conds, model_options=None):
    model_management.load_models_gpu([patcher])
    return patcher.model, conds, []


class KSamplerX0Inpaint:
    def __init__(self, model, sigmas):
        self.inner_model, self.sigmas = model, sigmas

    def __call__(self, x, sigma, denoise_mask=None, model_options={}, seed=None):  # noqa: B006
        return self.inner_model(x, sigma, model_options=model_options, seed=seed)


def _to_d(x, sigma, denoised):
    return (x - denoised) / sigma.view(sigma.shape + (1,) * (x.ndim - sigma.ndim))


def sample_euler(model, x, sigmas, extra_args=None, callback=None, disable=None):
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        if callback is not None:
            callback({"x": x, "i": i, "sigma": sigmas[i], "denoised": denoised})
        x = x + _to_d(x, sigmas[i] * s_in, denoised) * (sigmas[i + 1] - sigmas[i])
    return x


def sample_heun(model, x, sigmas, extra_args=None, callback=None, disable=None):
    s_in = x.new_ones([x.shape[0]])
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        d = _to_d(x, sigmas[i] * s_in, denoised)
        if callback is not None:
            callback({"x": x, "i": i, "sigma": sigmas[i], "denoised": denoised})
        dt = sigmas[i + 1] - sigmas[i]
        if sigmas[i + 1] == 0:
            x = x + d * dt
        else:
            x_2 = x + d * dt
            d_2 = _to_d(x_2, sigmas[i + 1] * s_in, model(x_2, sigmas[i + 1] * s_in, **extra_args))
            x = x + (d + d_2) / 2 * dt
    return x


def sample_dpmpp_2m(model, x, sigmas, extra_args=None, callback=None, disable=None):
    """DPM-Solver++(2M) in log-sigma time: the second-order mix of this and the last denoised image, first order at
    the first step and onto sigma 0."""
    s_in, last = x.new_ones([x.shape[0]]), None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        if callback is not None:
            callback({"x": x, "i": i, "sigma": sigmas[i], "denoised": denoised})
        t, t_next = -sigmas[i].log(), -sigmas[i + 1].log()
        h = t_next - t
        if last is None or sigmas[i + 1] == 0:
            x = (sigmas[i + 1] / sigmas[i]) * x - torch.expm1(-h) * denoised
        else:
            r = (t - (-sigmas[i - 1].log())) / h
            x = (sigmas[i + 1] / sigmas[i]) * x - torch.expm1(-h) * ((1 + 1 / (2 * r)) * denoised - last / (2 * r))
        last = denoised
    return x


def sample_res_multistep(model, x, sigmas, extra_args=None, callback=None, disable=None):
    """res_multistep without noise: Euler at the first step and onto sigma 0, else the exponential integrator's
    second-order multistep update (phi functions of the log-sigma step, the last denoised image at its relative
    position)."""
    s_in, last = x.new_ones([x.shape[0]]), None
    for i in range(len(sigmas) - 1):
        denoised = model(x, sigmas[i] * s_in, **extra_args)
        if callback is not None:
            callback({"x": x, "i": i, "sigma": sigmas[i], "denoised": denoised})
        if last is None or sigmas[i + 1] == 0:
            x = x + _to_d(x, sigmas[i] * s_in, denoised) * (sigmas[i + 1] - sigmas[i])
        else:
            t, t_next, t_prev = -sigmas[i].log(), -sigmas[i + 1].log(), -sigmas[i - 1].log()
            h = t_next - t
            c2 = (t_prev - t) / h
            phi1 = torch.expm1(-h) / -h
            phi2 = (phi1 - 1) / -h
            x = torch.exp(-h) * x + h * ((phi1 - phi2 / c2) * denoised + (phi2 / c2) * last)
        last = denoised
    return x


def sample_unipc(model, x, sigmas, extra_args=None, callback=None, disable=None):
    """UniPC (bh1, order 3): this double runs the core's own (``tome_core.caching.samplers.sample_uni_pc``, which
    ``tests/test_samplers_linear.py`` holds to ComfyUI's ``comfy/extra_samplers/uni_pc.py`` where ComfyUI is at hand),
    under ComfyUI's function name."""
    from tome_core.caching.samplers import sample_uni_pc

    return sample_uni_pc(lambda v, sigma: model(v, sigma * x.new_ones([x.shape[0]]), **extra_args), x, sigmas)


SAMPLERS = {
    "euler": sample_euler,
    "heun": sample_heun,
    "dpmpp_2m": sample_dpmpp_2m,
    "res_multistep": sample_res_multistep,
    "uni_pc": sample_unipc,
}


class KSAMPLER:
    def __init__(self, sampler_function):
        self.sampler_function = sampler_function

    def max_denoise(self, model_wrap, sigmas) -> bool:
        max_sigma = float(model_wrap.inner_model.model_sampling.sigma_max)
        sigma = float(sigmas[0])
        return math.isclose(max_sigma, sigma, rel_tol=1e-05) or sigma > max_sigma

    def sample(
        self, model_wrap, sigmas, extra_args, callback, noise, latent_image=None, denoise_mask=None, disable_pbar=False
    ):
        extra_args["denoise_mask"] = denoise_mask
        model_k = KSamplerX0Inpaint(model_wrap, sigmas)
        sampling = model_wrap.inner_model.model_sampling
        noise = sampling.noise_scaling(sigmas[0], noise, latent_image, self.max_denoise(model_wrap, sigmas))
        total_steps = len(sigmas) - 1
        k_callback = None if callback is None else (lambda x: callback(x["i"], x["denoised"], x["x"], total_steps))
        samples = self.sampler_function(model_k, noise, sigmas, extra_args=extra_args, callback=k_callback)
        return sampling.inverse_noise_scaling(sigmas[-1], samples)


def normal_scheduler(model_sampling, steps: int) -> torch.Tensor:
    start, end = model_sampling.timestep(model_sampling.sigma_max), model_sampling.timestep(model_sampling.sigma_min)
    timesteps = torch.linspace(float(start), float(end), steps)
    return torch.FloatTensor([*(float(model_sampling.sigma(t)) for t in timesteps), 0.0])


class KSampler:
    def __init__(self, model, steps, sampler=None, scheduler=None, denoise=None, model_options={}):  # noqa: B006
        self.model, self.sampler, self.scheduler, self.model_options = model, sampler, scheduler, model_options
        self.set_steps(steps, denoise)

    def calculate_sigmas(self, steps):
        return normal_scheduler(self.model.get_model_object("model_sampling"), steps)

    def set_steps(self, steps, denoise=None):
        self.steps = steps
        if denoise is None or denoise > 0.9999:
            self.sigmas = self.calculate_sigmas(steps)
        elif denoise <= 0.0:
            self.sigmas = torch.FloatTensor([])
        else:
            self.sigmas = self.calculate_sigmas(int(steps / denoise))[-(steps + 1) :]

    def sample(
        self,
        noise,
        positive,
        negative,
        cfg,
        latent_image=None,
        start_step=None,
        last_step=None,
        force_full_denoise=False,
        callback=None,
        seed=None,
    ):
        sigmas = self.sigmas
        if last_step is not None and last_step < len(sigmas) - 1:
            sigmas = sigmas[: last_step + 1]
            if force_full_denoise:
                sigmas[-1] = 0
        if start_step is not None:
            if start_step < len(sigmas) - 1:
                sigmas = sigmas[start_step:]
            else:
                return latent_image
        sampler = KSAMPLER(SAMPLERS[self.sampler])
        guider = CFGGuider(self.model)
        guider.set_conds(positive, negative)
        guider.set_cfg(cfg)
        return guider.sample(noise, latent_image, sampler, sigmas, callback=callback, seed=seed)
