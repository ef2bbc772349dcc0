"""Train one of the small SD-layout models (or the classifier that judges their samples), seeded and reproducible.

    python -m benchmarks.lab.trained.train --model sd15         # ~52 min on one core of the 2-core machine
    python -m benchmarks.lab.trained.train --model sdxl         # ~52 min (both at once: one core each)
    python -m benchmarks.lab.trained.train --model classifier   # a few minutes
    python -m benchmarks.lab.trained.train --model sd15 --steps 3 --out /tmp/x   # a smoke run (CI)
    python -m benchmarks.lab.trained.train --model flux --state flux.state        # resumable (see --state)
    python -m benchmarks.lab.trained.train --model wan --state wan.state          # the video model, resumable
    python -m benchmarks.lab.trained.train --model wan-long --state long.state    # fine-tuned from it to 4,096 tokens

UNets: ε-prediction on SD's 1000-step scaled-linear DDPM schedule (timesteps uniform, MSE on ε), label dropout
10 % (the empty prompt, so classifier-free guidance works), AdamW with a warm-up and cosine decay, gradient
clipping, and an exponential moving average of the weights, which is what is shipped (in float16). Every eighth
batch is drawn at twice the side (a quarter of the images), so that sampling at 2× is in the training
distribution. Each batch is drawn from ``data.draw`` with a seed derived from the step: the run is a pure
function of its arguments. Writes ``weights/<model>.safetensors`` and the model card ``weights/<model>.md``.

With ``--state FILE`` a run keeps its whole state there (weights, EMA, optimiser, random generator, losses, time
spent) every ``--save-every`` steps, and a run started with an existing FILE continues from it: stopped and resumed
any number of times, it ends with the same weights, bit for bit, as a run never stopped (the model card's time is the
sum of the pieces').
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from . import architectures as M
from . import data, flux, wan
from .classifier import Classifier
from .loading import load_wan

DEFAULT_STEPS = {"sd15": 2300, "sdxl": 2800, "flux": 16000, "wan": 30000, "wan-long": 1500, "classifier": 1500}
BIG_EVERY = 8  # every 8th step: side x2, batch / 4 (the same number of pixels)
LABEL_DROPOUT = 0.1
WARMUP, EMA = 100, 0.999
IMAGES_PER_CLIP = 4  # the Wan-layout model's image batches: 4 images for each clip of a video batch


@dataclass(frozen=True)
class Recipe:
    """A model's learning rate (AdamW, warm-up, cosine to 10 %) and batch size (images at the trained side)."""

    lr: float = 5e-4
    batch: int = 16
    ema: float = EMA


RECIPES = {
    "flux": Recipe(lr=2e-3, batch=32),
    "wan": Recipe(lr=2e-3, batch=8),
    "wan-long": Recipe(lr=3e-4, batch=2, ema=0.995),
}
"""Where a model's recipe is not the UNets' (:class:`Recipe`'s defaults): the transformers, adaLN-Zero, take a four
times higher rate, the FLUX-layout model twice the batch, the Wan-layout model clips of 8 frames; its long-clip
fine-tune a lower rate than the UNets', 2 clips of 16 frames at 64 px, and a shorter average for its shorter run."""
LONG_IMAGES = 16  # the long-clip fine-tune's image batches: 16 images at 64 px (256 tokens each)
LONG_IMAGE_STEPS = 500
"""The long-clip fine-tune's first steps: images alone (the digit's new scale, learnt in a few hundred steps at a
tenth of a clip batch's cost: 59 % of 64-px images recognised after the committed run's 500 steps, 25 % before; 64
seeds), then clips and images in turn."""


def recipe_of(name: str) -> Recipe:
    return RECIPES.get(name, Recipe())


SAVE_EVERY = 250


class StateMismatch(ValueError):
    """The state in ``--state`` is another run's."""


@dataclass(frozen=True)
class Resumable:
    """Where a run keeps its state (``path``), how often, and what it must match to continue from it."""

    path: Path
    run: dict  # model, steps, seed, recipe: a state of another run is refused
    every: int = SAVE_EVERY

    def load(self) -> dict | None:
        if not self.path.exists():
            return None
        state = torch.load(self.path, weights_only=False)
        for key, value in self.run.items():
            if state["run"].get(key) != value:
                raise StateMismatch(
                    f"--state {self.path}: {key} {state['run'].get(key)!r} in the saved run, {value!r} asked for"
                )
        return state

    def save(self, state: dict) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        torch.save({"run": self.run, **state}, temporary)
        temporary.replace(self.path)  # never a half-written state


def _batch_seed(seed: int, step: int) -> int:
    return seed * 1_000_003 + step


def _lr(step: int, steps: int, lr: float) -> float:
    if step < WARMUP:
        return lr * (step + 1) / WARMUP
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / max(1, steps - WARMUP))))


def train_unet(
    name: str, steps: int, seed: int, log, partial: Path | None = None, state: Resumable | None = None
) -> tuple[dict[str, torch.Tensor], dict]:
    """The EMA weights (float16) after ``steps`` steps, and the run's figures; every 500 steps the EMA so far is
    written to ``partial`` (to look at samples while it trains)."""
    arch = M.ARCHITECTURES[name]
    unet, conditioner = M.build(arch, len(data.CLASSES), seed)
    ab = M.alphas_cumprod().float()

    def loss(model: nn.Module, x0: torch.Tensor, labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        t = torch.randint(M.TIMESTEPS, (len(x0),), generator=gen)
        noise = torch.randn(x0.shape, generator=gen)
        a = ab[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        return (model["unet"](xt, t, **model["conditioner"](labels)) - noise).pow(2).mean()

    model = nn.ModuleDict({"unet": unet, "conditioner": conditioner})
    draw = _images(arch.size, recipe_of(name).batch, seed)
    return _train(model, loss, draw, steps, seed, log, partial, state, recipe_of(name))


def _rectified_flow(model: nn.Module, x0: torch.Tensor, labels: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The transformers' loss: the velocity ``ε − x₀`` at a logit-normal time σ, for images or clips."""
    sigma = torch.sigmoid(torch.randn(len(x0), generator=gen))
    noise = torch.randn(x0.shape, generator=gen)
    s = sigma.view(-1, *[1] * (x0.dim() - 1))
    return (model((1 - s) * x0 + s * noise, sigma, labels) - (noise - x0)).pow(2).mean()


def train_flux(
    steps: int, seed: int, log, partial: Path | None = None, state: Resumable | None = None
) -> tuple[dict[str, torch.Tensor], dict]:
    """The FLUX-layout model (:mod:`.flux`) by rectified flow: the velocity ``ε − x₀`` at a logit-normal time σ."""
    model = flux.zero_start(flux.build(len(data.CLASSES), seed))
    draw = _images(flux.SIZE, recipe_of(flux.NAME).batch, seed)
    return _train(model, _rectified_flow, draw, steps, seed, log, partial, state, recipe_of(flux.NAME))


def train_wan(
    steps: int, seed: int, log, partial: Path | None = None, state: Resumable | None = None
) -> tuple[dict[str, torch.Tensor], dict]:
    """The Wan-layout video model (:mod:`.wan`) by rectified flow, on images and videos jointly as Wan was trained:
    every other batch clips of :data:`.wan.FRAMES` frames, the others :data:`IMAGES_PER_CLIP` times as many images
    (one-frame clips)."""
    model = wan.zero_start(wan.build(len(data.CLASSES), seed))
    batch = recipe_of(wan.NAME).batch

    def draw(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if step % 2:
            x, labels = data.draw(batch * IMAGES_PER_CLIP, wan.SIZE, _batch_seed(seed, step))
            return x.unsqueeze(2), labels
        return data.draw_clips(batch, wan.SIZE, wan.FRAMES, _batch_seed(seed, step))

    return _train(model, _rectified_flow, draw, steps, seed, log, partial, state, recipe_of(wan.NAME))


def train_wan_long(
    steps: int, seed: int, log, partial: Path | None = None, state: Resumable | None = None
) -> tuple[dict[str, torch.Tensor], dict]:
    """The long-clip Wan-layout model (:data:`.wan.LONG_NAME`): the shipped Wan-layout model fine-tuned by rectified
    flow to clips of :data:`.wan.LONG_FRAMES` frames at :data:`.wan.LONG_SIZE` px (4,096 tokens), its positions
    interpolated (:data:`.wan.LONG_ROPE_SCALE`): the first :data:`LONG_IMAGE_STEPS` batches :data:`LONG_IMAGES`
    images at that side (one-frame clips: the digit's new scale at a sixteenth of the cost), then every other one."""
    model = wan.interpolate_positions(load_wan(), wan.LONG_ROPE_SCALE).requires_grad_(True)
    batch = recipe_of(wan.LONG_NAME).batch

    def draw(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if step < LONG_IMAGE_STEPS or step % 2:
            x, labels = data.draw(LONG_IMAGES, wan.LONG_SIZE, _batch_seed(seed, step))
            return x.unsqueeze(2), labels
        return data.draw_clips(batch, wan.LONG_SIZE, wan.LONG_FRAMES, _batch_seed(seed, step))

    return _train(model, _rectified_flow, draw, steps, seed, log, partial, state, recipe_of(wan.LONG_NAME))


def _images(size: int, batch: int, seed: int):
    """The step's batch of images: every :data:`BIG_EVERY`th a quarter as many at twice the side."""

    def draw(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        big = step % BIG_EVERY == BIG_EVERY - 1
        return (
            data.draw(batch // 4, 2 * size, _batch_seed(seed, step))
            if big
            else data.draw(batch, size, _batch_seed(seed, step))
        )

    return draw


@torch.enable_grad()  # whatever the caller's mode
def _train(
    model: nn.Module,
    loss_of,
    draw,
    steps: int,
    seed: int,
    log,
    partial: Path | None,
    state: Resumable | None,
    recipe: Recipe,
):
    """The training loop every model shares: the step's batch ``draw(step)`` (drawn from a seed derived from the step),
    label dropout, AdamW with warm-up and cosine decay, clipping, EMA; ``loss_of(model, x0, labels, generator)``;
    continued from ``state`` where it holds one, and kept there as it goes."""
    model = model.train()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    losses: list[float] = []
    first, spent = 0, {"seconds": 0.0, "cpu_seconds": 0.0}  # time spent by the pieces before this one
    saved = state.load() if state is not None else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        ema.load_state_dict(saved["ema"])
        opt.load_state_dict(saved["optimizer"])
        gen.set_state(saved["generator"])
        first, losses, spent = saved["step"], saved["losses"], saved["spent"]
        log(f"continuing from {state.path} at step {first}/{steps}")
    start, cpu = time.perf_counter(), time.process_time()

    def elapsed() -> dict[str, float]:
        return {
            "seconds": spent["seconds"] + time.perf_counter() - start,
            "cpu_seconds": spent["cpu_seconds"] + time.process_time() - cpu,
        }

    for step in range(first, steps):
        x0, labels = draw(step)
        drop = torch.rand(len(labels), generator=gen) < LABEL_DROPOUT
        labels = torch.where(drop, torch.full_like(labels, -1), labels)
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, recipe.lr)
        loss = loss_of(model, x0, labels, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        decay = min(recipe.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 1 - decay)
        losses.append(loss.item())
        if step % 100 == 99 or step == steps - 1:
            recent = sum(losses[-100:]) / len(losses[-100:])
            log(f"step {step + 1}/{steps}  loss {recent:.4f}  {elapsed()['seconds']:.0f} s")
        if partial is not None and step % 500 == 499:
            save_file({k: v.half() for k, v in ema.state_dict().items()}, str(partial))
        if state is not None and (step % state.every == state.every - 1 or step == steps - 1):
            state.save(
                {
                    "step": step + 1,
                    "model": model.state_dict(),
                    "ema": ema.state_dict(),
                    "optimizer": opt.state_dict(),
                    "generator": gen.get_state(),
                    "losses": losses,
                    "spent": elapsed(),
                }
            )
    tail = losses[-200:]
    stats = {
        "steps": steps,
        **{k: round(v, 1) for k, v in elapsed().items()},
        "final_loss": round(sum(tail) / len(tail), 5),
    }
    return {k: v.half() for k, v in ema.state_dict().items()}, stats


def train_classifier(steps: int, seed: int, log) -> tuple[dict[str, torch.Tensor], dict]:
    """The judge of the samples: a small CNN on the same distribution (at the trained side; larger images are
    reduced to it)."""
    net = Classifier(len(data.CLASSES)).train()
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
    start = time.perf_counter()
    losses: list[float] = []
    for step in range(steps):
        x, labels = data.draw(64, 32, _batch_seed(seed + 7, step))
        for group in opt.param_groups:
            group["lr"] = 2e-3 * 0.5 * (1 + math.cos(math.pi * step / steps))
        loss = nn.functional.cross_entropy(net(x), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 100 == 99 or step == steps - 1:
            log(f"step {step + 1}/{steps}  loss {sum(losses[-100:]) / len(losses[-100:]):.4f}")
    net.eval()
    x, labels = data.draw(2000, 32, seed + 99)  # held out: a seed no training batch used
    with torch.no_grad():
        accuracy = (net(x).argmax(1) == labels).float().mean().item()
    tail = losses[-200:]
    stats = {
        "steps": steps,
        "seconds": round(time.perf_counter() - start, 1),
        "final_loss": round(sum(tail) / len(tail), 5),
        "held_out_accuracy": round(accuracy, 4),
    }
    return {k: v.half() for k, v in net.state_dict().items()}, stats


def model_card(name: str, stats: dict, seed: int, threads: int) -> str:
    r = recipe_of(name)
    schedule = (
        f"batch {r.batch} at {{size}} px (every {BIG_EVERY}th batch {r.batch // 4} at {{twice}} px), label dropout "
        f"{LABEL_DROPOUT:.0%}, AdamW lr {r.lr:g} (warm-up {WARMUP}, cosine to 10 %), clip 1.0, EMA {EMA} (shipped, float16)"
    )
    if name == "classifier":
        what = (
            "A small CNN (`benchmarks/lab/trained/classifier.py`) that recognises the digit in a "
            "32 px image of the training distribution; the fidelity benchmark's judge of class accuracy and its "
            "feature space for the KID-style distance."
        )
        arch = "conv 32-64-128 (3×3, GroupNorm, SiLU, stride-2 down), global average pool → 128-d features → 10 logits"
        recipe = f"AdamW lr 2e-3 cosine, batch 64, {stats['steps']} steps; held-out accuracy {stats['held_out_accuracy']:.1%}"
    elif name == flux.NAME:
        layout = flux.__doc__.split("\n\n")[0].split("(issue 26): ", 1)[1]
        what = " ".join(f"The `{name}` model of `benchmarks/lab/trained/flux.py` (issue 26): {layout}".split())
        arch = f"diffusers `FluxTransformer2DModel` {json.dumps(flux.CONFIG)}, {flux.PATCH}×{flux.PATCH} patches of RGB pixels, adaLN-Zero, text {flux.TEXT_DIM} ({M.CONTEXT_TOKENS} tokens per label) and a pooled vector {flux.TEXT_DIM}"
        recipe = "rectified flow (velocity ε − x₀ at a logit-normal time σ), " + schedule.format(
            size=flux.SIZE, twice=2 * flux.SIZE
        )
    elif name == wan.LONG_NAME:
        what = (
            f"The `{name}` model (issue 52): the `{wan.NAME}` model (`benchmarks/lab/trained/wan.py`) fine-tuned from "
            f"its shipped weights to clips of {wan.LONG_FRAMES} frames at {wan.LONG_SIZE} px: {wan.LONG_FRAMES} × "
            f"{wan.LONG_SIZE // 4} × {wan.LONG_SIZE // 4} = {wan.LONG_FRAMES * (wan.LONG_SIZE // 4) ** 2} tokens a clip."
        )
        arch = f"diffusers `WanTransformer3DModel` {json.dumps(wan.CONFIG)}, as `{wan.NAME}`"
        recipe = (
            f"from `{wan.NAME}`'s shipped weights with its RoPE positions read at {wan.LONG_ROPE_SCALE:g} steps on every "
            f"axis (position interpolation), rectified flow: {LONG_IMAGE_STEPS} batches of {LONG_IMAGES} images at "
            f"{wan.LONG_SIZE} px, then batches of {r.batch} clips of {wan.LONG_FRAMES} frames at {wan.LONG_SIZE} px and "
            f"of {LONG_IMAGES} images in turn, label dropout "
            f"{LABEL_DROPOUT:.0%}, AdamW lr {r.lr:g} (warm-up {WARMUP}, cosine to 10 %), clip 1.0, EMA {r.ema} (shipped, float16)"
        )
    elif name == wan.NAME:
        layout = wan.__doc__.split("\n\n")[0].split("(issue 36): ", 1)[1]
        what = " ".join(f"The `{name}` model of `benchmarks/lab/trained/wan.py` (issue 36): {layout}".split())
        arch = f"diffusers `WanTransformer3DModel` {json.dumps(wan.CONFIG)}, RGB pixels, the time's modulation and the output at zero, text {wan.TEXT_DIM} ({M.CONTEXT_TOKENS} tokens per label) by cross-attention"
        recipe = (
            f"rectified flow (velocity ε − x₀ at a logit-normal time σ), images and videos jointly (as Wan): "
            f"batches of {r.batch} clips of {wan.FRAMES} frames at {wan.SIZE} px and of {IMAGES_PER_CLIP * r.batch} "
            f"images (one-frame clips) in turn, label dropout {LABEL_DROPOUT:.0%}, AdamW lr {r.lr:g} (warm-up {WARMUP}, cosine to 10 %), "
            f"clip 1.0, EMA {EMA} (shipped, float16)"
        )
    else:
        a = M.ARCHITECTURES[name]
        layout = " ".join(M.__doc__.split("* ``" + name + "``: ")[1].split("\n*")[0].split())
        what = f"The `{name}` model of `benchmarks/lab/trained/architectures.py`: {layout}"
        arch = (
            f"ldm `UNetModel` {json.dumps(a.unet)}, depths {list(a.depths) or 'as built'}, context {a.context_dim} ({M.CONTEXT_TOKENS} tokens per label)"
            + (f", adm {a.adm_dim}" if a.adm_dim else "")
        )
        recipe = "ε-prediction, SD's scaled-linear 1000-step schedule, " + schedule.format(
            size=a.size, twice=2 * a.size
        )
    return "\n".join(
        [
            f"# Model card: `{name}`",
            "",
            what,
            "",
            f"- Data: `benchmarks/lab/trained/data.py` — digits 0–9 ({len(data.FONTS)} of matplotlib's bundled fonts) over "
            f"dimmed crops of {len(data.PHOTOS)} photographs bundled in scikit-image, drawn afresh for every batch "
            "from a seed derived from the step"
            + (
                " (clips: the digit moving one way, the photograph panning another)."
                if name in (wan.NAME, wan.LONG_NAME)
                else "."
            ),
            f"- Architecture: {arch}.",
            f"- Training: {recipe}.",
            f"- Steps: {stats['steps']}; time: {stats.get('cpu_seconds', stats['seconds']) / 60:.1f} min of CPU time with "
            f"{threads} torch thread(s) on the 2-core machine ({stats['seconds'] / 60:.1f} min of wall time, the other "
            "core and this one shared with other work); final loss (mean of the last 200 steps): "
            f"{stats['final_loss']:.4f}.",
            f"- Reproduce: `python -m benchmarks.lab.trained.train --model {name} --seed {seed}`.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", required=True, choices=[*M.ARCHITECTURES, flux.NAME, wan.NAME, wan.LONG_NAME, "classifier"]
    )
    parser.add_argument("--steps", type=int, help="default: " + ", ".join(f"{k} {v}" for k, v in DEFAULT_STEPS.items()))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=M.WEIGHTS, help="folder for the weights and the model card")
    parser.add_argument("--partial", type=Path, help="write the EMA so far here every 500 steps")
    parser.add_argument(
        "--state", type=Path, help="keep the run's whole state here as it goes, and continue from it if it exists"
    )
    parser.add_argument("--save-every", type=int, default=SAVE_EVERY, help="steps between two saves of --state")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    M.install_attention()
    steps = args.steps or DEFAULT_STEPS[args.model]

    def log(text: str) -> None:
        print(f"[{args.model}] {text}", flush=True)

    r = recipe_of(args.model)
    recipe = {
        "lr": r.lr,
        "warmup": WARMUP,
        "ema": r.ema,
        "batch": r.batch,
        "big_every": BIG_EVERY,
        "dropout": LABEL_DROPOUT,
    }
    if args.model == wan.NAME:
        recipe["images_per_clip"] = IMAGES_PER_CLIP
    if args.model == wan.LONG_NAME:
        recipe.update(images=LONG_IMAGES, image_steps=LONG_IMAGE_STEPS, rope_scale=wan.LONG_ROPE_SCALE)
    run = {"model": args.model, "steps": steps, "seed": args.seed, "recipe": recipe}
    state = None if args.state is None else Resumable(args.state, run, args.save_every)
    if args.model == "classifier":
        if state is not None:
            parser.error("--state: the classifier trains in a few minutes and is not resumable")
        weights, stats = train_classifier(steps, args.seed, log)
    else:
        try:  # a state of another run is refused as it is read, before the first step
            if args.model == flux.NAME:
                weights, stats = train_flux(steps, args.seed, log, args.partial, state)
            elif args.model == wan.NAME:
                weights, stats = train_wan(steps, args.seed, log, args.partial, state)
            elif args.model == wan.LONG_NAME:
                weights, stats = train_wan_long(steps, args.seed, log, args.partial, state)
            else:
                weights, stats = train_unet(args.model, steps, args.seed, log, args.partial, state)
        except StateMismatch as error:
            parser.error(str(error))
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(args.out / f"{args.model}.safetensors"), metadata={"stats": json.dumps(stats)})
    (args.out / f"{args.model}.md").write_text(model_card(args.model, stats, args.seed, args.threads), encoding="utf-8")
    log(f"wrote {args.out / (args.model + '.safetensors')}: {stats}")


if __name__ == "__main__":
    main()
