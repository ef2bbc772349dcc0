"""The lab's trained diffusion transformers as the DiT commands take them (``--model``): the FLUX-layout image model
and the Wan-layout video model, each with its noise, its weights (trained, or random for quick runs and tests) and the
real model whose width prices a pass (:class:`benchmarks.lab.dit.BlockCosts` from
:mod:`benchmarks.speed.dit_costs`' run, :class:`benchmarks.lab.wan21.ChainCosts` from
:mod:`benchmarks.speed.wan_costs`')."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType

import torch

from benchmarks.lab.dit import BlockCosts, Trained
from benchmarks.lab.fidelity import labels_for, noise_for
from benchmarks.lab.results import Section, load_run_data
from benchmarks.lab.trained import data, flux, loading, wan
from benchmarks.lab.wan21 import ChainCosts


@dataclass(frozen=True)
class Subject:
    """A trained DiT of the lab: ``name`` (its ``--model``), ``title`` and model ``card`` (for the results' text),
    its ``module`` (:mod:`~benchmarks.lab.trained.flux` or :mod:`~benchmarks.lab.trained.wan`), ``frames`` of a
    sample (None: an image), ``load(path)`` of its weights, ``transformer`` (diffusers' class), ``schedule`` (its
    sampling schedule, in words), ``width`` (the real model whose width prices a pass) with its costs' command, run
    and record."""

    name: str
    title: str
    module: ModuleType
    frames: int | None
    load: Callable[..., Trained]
    transformer: str
    schedule: str
    width: str
    costs_command: str
    costs_run: str
    costs_type: type[BlockCosts]
    side: int = 0
    """A sample's side in pixels where it is not the module's trained one (``SIZE``)."""

    @property
    def unit(self) -> str:
        """What one sample is: an image or a clip."""
        return "image" if self.frames is None else "clip"

    @property
    def card(self) -> str:
        return f"benchmarks/lab/trained/weights/{self.name}.md"

    @property
    def heading(self) -> str:
        """The title at a sentence's start."""
        return self.title[0].upper() + self.title[1:]

    @property
    def option(self) -> str:
        """The command-line option that picks this subject (with its leading space): none for FLUX, the default."""
        return "" if self.name == "flux" else f" --model {self.name}"

    def stamped(self, meta: dict) -> dict:
        """A run's ``meta`` naming this subject (FLUX's runs, older than the option, name none)."""
        return meta if self.name == "flux" else {**meta, "model": self.name}

    def run_name(self, command: str) -> str:
        """A command's run on this subject: ``command`` itself on FLUX (the first subject), ``command-<name>`` else."""
        return command if self.name == "flux" else f"{command}-{self.name}"

    def markers(self, command: str) -> tuple[str, str, str]:
        """The command's run on this subject (:meth:`run_name`) and its RESULTS.md markers."""
        run = self.run_name(command)
        return run, f"<!-- {run}:begin -->", f"<!-- {run}:end -->"

    def noise(self, seeds: range) -> torch.Tensor:
        return noise_for(seeds, self.side or self.module.SIZE, self.module.CHANNELS, self.frames)

    def labels(self, seeds: range) -> torch.Tensor:
        return labels_for(seeds, len(data.CLASSES))

    def random(self) -> Trained:
        """The model with its library's initialisation, not trained (quick runs and tests)."""
        return self.module.build(len(data.CLASSES)).eval().requires_grad_(False)

    def costs(self) -> BlockCosts:
        """The real model's costs, from its costs command's CPU run."""
        return self.costs_type(**load_run_data(self.costs_run)[0][0])

    def priced(self, counts: dict[str, int]) -> float | None:
        """A pass's speed-up at the real model's width (:meth:`BlockCosts.priced`), or None without its costs' run."""
        try:
            return self.costs().priced(counts)
        except FileNotFoundError:
            return None


SUBJECTS = {
    "flux": Subject(
        "flux",
        "the trained FLUX-layout model",
        flux,
        None,
        loading.load_flux,
        "FluxTransformer2DModel",
        "FLUX.1's schedule",
        "FLUX.1's real width",
        "benchmarks.speed.dit_costs",
        "dit-costs-cpu",
        BlockCosts,
    ),
    "wan": Subject(
        "wan",
        "the trained Wan-layout video model",
        wan,
        wan.FRAMES,
        loading.load_wan,
        "WanTransformer3DModel",
        f"Wan 2.1's schedule (shift {wan.SHIFT:g})",
        "Wan 2.1 1.3B's real width (480p, 81 frames)",
        "benchmarks.speed.wan_costs",
        "wan-costs-cpu",
        ChainCosts,
    ),
}


SUBJECTS[wan.LONG_NAME] = replace(
    SUBJECTS["wan"],
    name=wan.LONG_NAME,
    title="the trained long-clip Wan-layout video model",
    frames=wan.LONG_FRAMES,
    load=loading.load_wan_long,
    side=wan.LONG_SIZE,
)
"""The same architecture fine-tuned to 4,096 tokens a clip (:data:`benchmarks.lab.trained.wan.LONG_NAME`), priced as
the Wan-layout model."""


def of_run(meta: dict) -> Subject:
    """The subject a run's ``meta`` names (:meth:`Subject.stamped`)."""
    return SUBJECTS[meta.get("model", "flux")]


def add_model_option(parser: argparse.ArgumentParser) -> None:
    """A DiT command's ``--model``: which trained subject it measures."""
    parser.add_argument("--model", choices=sorted(SUBJECTS), default="flux", help="the trained DiT (default: flux)")


def section_of(command: str, render: Callable[[object, dict], str]) -> Callable[[argparse.Namespace], Section]:
    """A DiT command's section (``render``) on the subject its ``--model`` names (for :func:`run_command`)."""
    return lambda args: Section(*SUBJECTS[args.model].markers(command), render)
