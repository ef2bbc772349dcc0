"""ToMe during one ComfyUI sampling: the settings the nodes attached to a model patcher, applied to its UNet (and to the
ControlNet models of the conditioning) for the duration of that patcher's sampling only.

- A node validates its settings, clones the model patcher it was given and attaches a :class:`Request` to the clone
  (``set_attachments``; later clones carry it on), with two wrappers under the key ``"tome"``
  (``add_wrapper_with_key``, stackable: nothing of another node's is replaced). The model it was given is untouched,
  so another KSampler on the same checkpoint samples without ToMe.
- ``SAMPLER_SAMPLE`` (inside ``CFGGuider.outer_sample``, after the models are loaded and the ControlNets' ``pre_run``)
  patches the UNet with :func:`tome_core.apply_settings`, and with ``merge_controlnet`` the control models too, runs
  the sampler and removes every patch in a ``finally``: after an interrupt, an error or an OOM nothing is left on the
  modules the patchers share. Then it says in the console what ToMe did and could not do (``ToMe note: ...``).
- ``CALC_COND_BATCH`` (every model evaluation, before the control models and the UNet run) reports the step to the
  patches (:meth:`tome_core.Session.set_progress`): the index of its sigma in ``transformer_options["sample_sigmas"]``
  and the sampler's step count. The cond/uncond streams come from ``transformer_options["cond_or_uncond"]``, which
  the core reads at each UNet call.
- Neighbours: ComfyUI's built-in ``TomePatchModel`` (queries merged at the highest level) is taken over while ours
  merges: its two attn1 patches are left out of this sampling's options (``ToMe replaced built-in ratio``). With
  EasyCache or LazyCache on the model our step cache steps aside: two caches never both run. The core says where
  another patch keeps it from merging (HyperTile, SAG, PAG: :class:`tome_core.Report`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from tome_core import compiling
from tome_core import run as R
from tome_core import settings as S
from tome_core.caching import samplers
from tome_core.caching.correction import why_not_corrected
from tome_core.families import has_transformer_blocks, layout_for
from tome_core.session import Session, apply_settings, find_unet
from tome_core.settings import SettingsError, ToMeSettings

log = logging.getLogger("tome_core")

KEY = "tome"
"""The attachment and wrapper key on the model patcher."""
LATENT_SCALE = 8
"""Pixels per latent cell of SD1/SD2/SDXL (what ``min_size`` is compared with)."""
OTHER_CACHES = {"easycache": "EasyCache", "lazycache": "LazyCache"}
"""Wrapper keys of ComfyUI's built-in step caches (comfy_extras/nodes_easycache.py) and their node names."""


@dataclasses.dataclass(frozen=True)
class Request:
    """What the ToMe nodes of a chain asked for: the ``ToMe`` node's settings, the ``ToMeStepCache`` node's."""

    merge: Mapping[str, Any] | None = None
    cache: Mapping[str, Any] | None = None
    cache_node: str | None = None  # the ToMeStepCache node's id, where the UI shows how the cache ran

    def settings(self) -> ToMeSettings:
        """The validated settings of a sampling with this request: without a ``ToMe`` node the cache alone (ratio 0),
        without a ``ToMeStepCache`` node no cache. Raises :class:`SettingsError` naming the setting."""
        merge = dict(self.merge) if self.merge is not None else {"ratio": 0.0}
        cache = {"cache": True, **self.cache} if self.cache is not None else {}
        return S.from_dict({"enabled": True, **merge, **cache})


def attach(model: Any, part: str, given: Mapping[str, Any], node: str | None = None) -> Any:
    """A clone of the model patcher ``model`` carrying this node's settings (``part``: "merge" or "cache") beside what
    earlier ToMe nodes of the chain asked for (a second node of the same kind replaces the first's), and the wrappers;
    ``node``: the ToMeStepCache node's id. Bad settings raise :class:`SettingsError` (said in the console as ``ToMe
    error``) and nothing is cloned."""
    from comfy.patcher_extension import WrappersMP

    node_id = {"cache_node": node} if part == "cache" else {}
    request = dataclasses.replace(model.get_attachment(KEY) or Request(), **{part: dict(given)}, **node_id)
    try:
        settings = request.settings()
        unet = find_unet(getattr(model, "model", None))
        if settings.caches and unet is not None:
            layout_for(unet, settings.cache_branch)  # the branch must exist in this model (SDXL has 9)
    except SettingsError as error:
        log.error(f"{R.ERROR_KEY}: {error}")
        raise
    patched = model.clone()
    patched.set_attachments(KEY, request)
    for kind, wrapper in ((WrappersMP.SAMPLER_SAMPLE, _sampler_sample), (WrappersMP.CALC_COND_BATCH, _calc_cond_batch)):
        patched.remove_wrappers_with_key(kind, KEY)
        patched.add_wrapper_with_key(kind, KEY, wrapper)
    return patched


# --- one sampling ------------------------------------------------------------------------------------------------


class Sampling:
    """The sessions of one sampling: the UNet's and the control models', removed together."""

    def __init__(self, unet: nn.Module, settings: ToMeSettings, controls: Sequence[nn.Module] = ()):
        self.settings = settings
        self.patches: list[Session] = []
        self._sigmas: tuple[int, list[float]] | None = None  # (id of sample_sigmas, its values)
        try:
            self.patches.append(apply_settings(unet, settings))
            if settings.merge_controlnet and settings.merges:
                merging = settings.replace(cache=False)  # a control model is no UNet to cache
                self.patches += [apply_settings(m, merging) for m in controls]
        except BaseException:
            self.remove()
            raise

    def place(self, sigma: torch.Tensor, sample_sigmas: torch.Tensor | None) -> None:
        """Report the step of a model evaluation at ``sigma`` (its first element) to every patch."""
        if sample_sigmas is None or len(sample_sigmas) < 2:
            return
        if self._sigmas is None or self._sigmas[0] != id(sample_sigmas):
            self._sigmas = (id(sample_sigmas), [float(s) for s in sample_sigmas])
        step, steps = position(float(sigma.flatten()[0]), self._sigmas[1])
        for patch in self.patches:
            patch.set_progress(step / steps, steps)

    def notes(self) -> list[str]:
        """What the patches could not do (each phrase once)."""
        out: list[str] = []
        for patch in self.patches:
            out += [note for note in patch.report().notes if note not in out]
        return out

    def remove(self) -> None:
        for patch in self.patches:
            patch.remove()


def position(sigma: float, sigmas: Sequence[float]) -> tuple[int, int]:
    """``(step, steps)`` of a model evaluation at ``sigma`` in a sampler's schedule ``sigmas`` (descending, the last
    one the end): the last step whose sigma is at least ``sigma``, so a sampler's evaluations between two sigmas
    (Heun, DPM2) belong to the step they start from."""
    steps = len(sigmas) - 1
    step = sum(1 for s in sigmas[1:steps] if s >= sigma * (1 - 1e-5))
    return step, steps


_LIVE: dict[int, Sampling] = {}
"""The sampling of each model sampling now (by the id of ComfyUI's model, ``BaseModel``)."""


def _sampler_sample(executor: Any, guider: Any, sigmas: Any, extra_args: dict, callback: Any, noise: Any, *args, **kw):
    """``WrappersMP.SAMPLER_SAMPLE``: ToMe on for this sampler's run only."""
    request: Request | None = guider.model_patcher.get_attachment(KEY)
    model = guider.inner_model
    unet = find_unet(model)
    if request is None or unet is None:
        return executor(guider, sigmas, extra_args, callback, noise, *args, **kw)
    run, info = R.Run(request.settings()), {}
    options = extra_args.setdefault("model_options", {}).setdefault("transformer_options", {})
    settings = _pass_settings(run, extra_args.get("seed"), noise)
    settings = _beside_compile(
        _beside_windows(settings, extra_args["model_options"], run), extra_args["model_options"], run
    )
    settings = _with_neighbours(settings, options, run, info)  # the built-in taken over only where ours merges
    if settings is None:
        _say(run, info)
        return executor(guider, sigmas, extra_args, callback, noise, *args, **kw)
    try:
        sampling = Sampling(unet, settings, control_models(getattr(guider, "conds", None)))
    except SettingsError as error:  # a setting this model rejects (the nodes checked what they could)
        log.error(f"{R.ERROR_KEY}: {error}")
        raise
    if settings.caches and settings.cache_correction > 0:
        sampling.patches[0].set_sampler(*sampler_of(executor, model, sigmas))
    _LIVE[id(model)] = sampling
    try:
        with compile_limit(extra_args["model_options"], settings):
            return executor(guider, sigmas, extra_args, callback, noise, *args, **kw)
    finally:
        _LIVE.pop(id(model), None)
        run.note(*sampling.notes())
        cache = sampling.patches[0].report().cache
        sampling.remove()
        if cache is not None:
            run.count_cache(cache.passes)
        info = {**R.infotext(settings, used_seed=settings.seed), **info, **run.cache_entries()}
        _say(run, info)
        _show(request.cache_node, run)


def sampler_of(executor: Any, model: Any, sigmas: Any) -> tuple[str | None, list[float] | None, Any, str | None]:
    """What ``cache_correction`` needs of this sampling (:meth:`tome_core.Session.set_sampler`): the sampler's name,
    its sigmas and its own function (``executor.class_obj``, a ``KSAMPLER``: ``sampler_function`` with its
    ``extra_options``) where it is a linear one (:data:`tome_core.caching.samplers.LINEAR`: ``euler`` without
    ``s_churn``, ``dpmpp_2m``, ``deis``, ``res_multistep``, ``uni_pc``, ``uni_pc_bh2``, …) and the model's output is the
    step's direction (``denoised = x − σ·out``: flow-matching and epsilon models, not v-prediction nor EDM), else
    Nones and why not."""
    sampler = getattr(executor, "class_obj", None)
    function = getattr(sampler, "sampler_function", None)
    name = samplers.name_of(str(getattr(function, "__name__", type(sampler).__name__)))
    options = dict(getattr(sampler, "extra_options", None) or {})
    churn = float(options.get("s_churn", 0.0))
    why_not = why_not_corrected(name, name, churn, getattr(model, "model_sampling", None))
    if why_not:
        return None, None, None, why_not

    def sample(model: Any, x: Any, sigmas: Any) -> Any:
        return function(model, x, sigmas, extra_args={}, callback=None, disable=True, **options)

    return name, [float(s) for s in sigmas], sample, None


COMPILED_RECOMPILE_LIMIT = 64
"""Dynamo's recompile limit while the cache samples a compiled model (KJNodes' compile nodes set the same)."""


def compile_limit(model_options: Mapping[str, Any], settings: ToMeSettings) -> contextlib.AbstractContextManager:
    """Where the model is compiled (ComfyUI's ``TorchCompileModel`` and KJNodes' nodes keep their kwargs at
    ``model_options["torch_compile_kwargs"]``) and the cache is on: dynamo's recompile limit raised to
    :data:`COMPILED_RECOMPILE_LIMIT` for this sampling. The cache's decisions run out of the graph
    (:mod:`tome_core.compiling`), so a compiled whole model breaks its graph at each skipped module and dynamo compiles
    the modules one by one: one graph per module class and shape, which a UNet's levels take past the default of 8
    (an SD1.5 ResBlock: 14), after which they would run uncompiled, quietly. Once compiled, no graph is made again."""
    if not settings.caches or "torch_compile_kwargs" not in model_options:
        return contextlib.nullcontext()
    import torch._dynamo

    config = torch._dynamo.config
    name = next((n for n in ("recompile_limit", "cache_size_limit") if hasattr(config, n)), None)  # renamed in 2.7
    if name is None:
        return contextlib.nullcontext()
    return config.patch(**{name: max(int(getattr(config, name)), COMPILED_RECOMPILE_LIMIT)})


def _calc_cond_batch(executor: Any, model: Any, conds: Any, x_in: Any, timestep: Any, model_options: dict, *a, **kw):
    """``WrappersMP.CALC_COND_BATCH``: the step of this evaluation, reported before the control models and the UNet
    run."""
    sampling = _LIVE.get(id(model))
    if sampling is not None:
        sampling.place(timestep, model_options.get("transformer_options", {}).get("sample_sigmas"))
    return executor(model, conds, x_in, timestep, model_options, *a, **kw)


def _pass_settings(run: R.Run, image_seed: int | None, noise: Any) -> ToMeSettings | None:
    """This sampling's settings: the seed actually used (the noise seed for -1) and ``min_size`` against the image's
    shorter side (below it the cache alone, or nothing)."""
    settings = run.pass_settings(image_seed, hires=False)
    height, width = (int(n) * LATENT_SCALE for n in noise.shape[-2:])
    if not run.too_small(width, height):
        return settings
    run.note(f"pass {width}x{height} is below the minimum size {run.settings.min_size} px: not merged")
    return settings.replace(ratio=0.0, method="merge") if settings.caches else None


def _with_neighbours(settings: ToMeSettings | None, options: dict, run: R.Run, info: dict) -> ToMeSettings | None:
    """Settings beside the other speed-ups on this model: the built-in ``TomePatchModel`` taken over while ours merges
    (its ratio in ``info``, as the WebUI's infotext says it); our cache off beside EasyCache / LazyCache. None when
    nothing is left for ToMe to do."""
    if settings is None:
        return None
    if settings.merges:
        replaced = take_over_builtin(options.get("patches", {}))
        if replaced is not None:
            info[R.BUILTIN_KEY] = replaced
    wrappers = options.get("wrappers", {})
    others = [name for key, name in OTHER_CACHES.items() if any(key in by_key for by_key in wrappers.values())]
    if others and settings.caches:
        run.note(f"step cache off: {others[0]} already skips steps (two caches never both run)")
        settings = settings.replace(cache=False)
    return _anything_left(settings)


def _anything_left(settings: ToMeSettings) -> ToMeSettings | None:
    """``settings`` where ToMe still has something to do (merging or caching), else None: the sampling runs without
    ToMe."""
    return settings if settings.merges or settings.caches else None


MOVING_WINDOWS = ("standard_uniform", "looped_uniform")
"""ComfyUI's context schedules whose windows move every step: both offset their windows by
``round(frames * ordered_halving(step))`` (comfy/context_windows.py:395, 417), so a window's frames rarely come back
at the next steps (looped: 2-16% of windows; standard, whose windows rolling past the end are shifted back: 50-68%,
and the number of windows changes). ``standard_static`` and ``batched`` give the same windows every step."""


OLD_TORCH_NOTE = (
    "step cache off: the model is compiled (torch.compile), which needs torch 2.6 or newer beside the cache"
)
COMPILED_NOTE = (
    "token merging off: the model is compiled (torch.compile), and merging would break its graphs in every block"
)


def _beside_compile(settings: ToMeSettings | None, model_options: Mapping[str, Any], run: R.Run) -> ToMeSettings | None:
    """Token merging off on a compiled model (``model_options["torch_compile_kwargs"]``: ComfyUI's ``TorchCompileModel``
    and KJNodes' compile nodes): its hooks at each attention layer run out of any graph, so the graph breaks inside
    every block and dynamo compiles the host's attention code per block until its recompile limit, after which it runs
    uncompiled, quietly. The step cache, which breaks the graph only between blocks, stays on where this torch can keep
    its decisions out of the graph (:data:`tome_core.compiling.SUPPORTED`: 2.6 and newer), else it stands aside too."""
    if settings is None or "torch_compile_kwargs" not in model_options:
        return settings
    if settings.merges:
        run.note(COMPILED_NOTE)
        settings = settings.replace(ratio=0.0, method="merge")
    if settings.caches and not compiling.SUPPORTED:
        run.note(OLD_TORCH_NOTE)
        settings = settings.replace(cache=False)
    return _anything_left(settings)


def _beside_windows(settings: ToMeSettings | None, model_options: Mapping[str, Any], run: R.Run) -> ToMeSettings | None:
    """Our cache off under context windows that move every step (``ContextWindowsManual`` /
    ``WanContextWindowsManual`` put their handler at ``model_options["context_handler"]``, its schedule's ``name``):
    the cache keys a window's calls by their number in the step and the frames they cover, and those do not come back.
    Windows that stay (static, batched) are cached, each window its own stream."""
    if settings is None or not settings.caches:
        return settings
    handler = model_options.get("context_handler")
    name = getattr(getattr(handler, "context_schedule", None), "name", None)
    if name not in MOVING_WINDOWS:
        return settings
    run.note(f"step cache off: context windows {name} move every step")
    return _anything_left(settings.replace(cache=False))


def take_over_builtin(patches: dict) -> float | None:
    """Leave ComfyUI's ``TomePatchModel`` patches out of this sampling's ``patches`` (a per-sampling copy); its ratio,
    or None when it is not there."""
    ratio = None
    for name in ("attn1_patch", "attn1_output_patch"):
        kept = [p for p in patches.get(name, ()) if not _builtin_tome(p)]
        for p in patches.get(name, ()):
            if _builtin_tome(p) and ratio is None:
                ratio = _closure_value(p, "ratio")
        if name in patches and len(kept) != len(patches[name]):
            if kept:
                patches[name] = kept
            else:
                del patches[name]  # the block then runs as without any attn1 patch
    return ratio


def _builtin_tome(fn: Any) -> bool:
    """ComfyUI's TomePatchModel patches: the closures ``tomesd_m`` / ``tomesd_u`` of ``TomePatchModel.execute``
    (comfy_extras/nodes_tomesd.py; the module is loaded under its file path, so its qualified name tells)."""
    qualname = getattr(fn, "__qualname__", "")
    return qualname.startswith("TomePatchModel.") and qualname.rsplit(".", 1)[-1] in ("tomesd_m", "tomesd_u")


def _closure_value(fn: Any, name: str) -> float:
    """A number a closure holds (the built-in's ratio); NaN when it is not readable."""
    try:
        cell = fn.__closure__[fn.__code__.co_freevars.index(name)]
        return float(cell.cell_contents)
    except (AttributeError, ValueError, TypeError, IndexError):
        return float("nan")


def control_models(conds: Mapping[str, Any] | None) -> list[nn.Module]:
    """The ControlNet models with transformer blocks in a sampling's conditioning (``ControlNetApplyAdvanced`` puts a
    ``ControlBase`` chain at each cond's ``"control"``; a ControlLora's model exists from ``pre_run`` on). T2I adapters
    (no ``control_model``) and models without transformer blocks run as they are."""
    out: list[nn.Module] = []
    for entries in (conds or {}).values():
        for cond in entries or ():
            control = cond.get("control") if isinstance(cond, dict) else None
            while control is not None:
                module = getattr(control, "control_model", None)
                if (
                    isinstance(module, nn.Module)
                    and all(module is not m for m in out)
                    and has_transformer_blocks(module)
                ):
                    out.append(module)
                control = getattr(control, "previous_controlnet", None)
    return out


def _show(node: str | None, run: R.Run) -> None:
    """How the cache ran, as the text under the ToMeStepCache node (ComfyUI's ``PromptServer.send_progress_text``,
    server.py:1214, as its own image nodes do): the steps, the speed-up they imply, the notes. Nothing without a
    server (a script) or a node id."""
    lines = [
        f"{key}: {value}"
        for key, value in (
            (R.CACHE_STEPS_KEY, run.cache_steps_text),
            (R.CACHE_SPEED_KEY, run.cache_speed_text),
            (R.NOTE_KEY, run.note_text),
        )
        if value
    ]
    server = getattr(sys.modules.get("server"), "PromptServer", None)
    instance = getattr(server, "instance", None)
    if node is None or instance is None or not lines:
        return
    try:
        instance.send_progress_text("\n".join(lines), node)
    except Exception as error:  # the UI's text is a courtesy: never fail a sampling for it
        log.warning(f"ToMe: could not show the cache's steps on its node: {error}")


def _say(run: R.Run, info: Mapping[str, Any]) -> None:
    """The console lines of one sampling: what the WebUI would write in the infotext (``ToMe: True``, the settings
    that differ from their defaults, the seed used), how the cache ran, and the notes."""
    if info:
        log.info(", ".join(f"{key}: {value}" for key, value in info.items()))
    if run.note_text:
        log.info(f"{R.NOTE_KEY}: {run.note_text}")
