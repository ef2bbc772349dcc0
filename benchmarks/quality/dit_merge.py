"""Token merging on a diffusion transformer (``python -m benchmarks.quality.dit_merge``; issue 26, item 3): what ToMe-style
merging of FLUX's image tokens saves at FLUX.1's real width, and what it keeps of plain's image on the trained
FLUX-layout model, beside the step cache.

Merging, written from ToMe for SD (arXiv 2303.17604) for FLUX's blocks (diffusers' ``FluxTransformerBlock`` and
``FluxSingleTransformerBlock``), image by image: each block's incoming image tokens plan a bipartite soft matching
(:func:`tome_core.merging.merge.plan_merge`: one destination drawn per 2×2 cell of the token grid, the ``ratio`` × tokens
most similar sources averaged into theirs); the text tokens are never merged; a merged token keeps the RoPE position
of the token it stands for (a destination's or a kept source's own). Where it acts:

* ``attention``: the image tokens entering the block's joint attention (tomesd's default, self-attention only); its
  output is unmerged, the rest of the block (the MLPs; the single-stream block's parallel MLP) runs on every token;
* ``block``: the whole block runs on the merged image tokens; what it added to them (its output minus its merged
  input) is unmerged onto the block's input, so a token the block left alone keeps its own value.

Speed (process CPU time, 1 torch thread, interleaved rounds, medians): one double- and one single-stream block at
FLUX.1's real width (:data:`benchmarks.lab.dit.REAL`: hidden 3072, 4096 image + 512 text tokens), plain and merged.
A step is priced as :mod:`benchmarks.speed.dit_costs` prices it (its run's model outside and forecast), with the merged
blocks' costs. Fidelity: :mod:`benchmarks.quality.dit_fidelity`'s 64 seeds, 20 steps, CFG 4, PSNR/SSIM/class accuracy against
plain's sample; merging alone, our cache alone, and both.

    python -m benchmarks.quality.dit_merge            # the run (about 40 min); writes its RESULTS.md section
    python -m benchmarks.quality.dit_merge --quick    # tiny sizes, 2 seeds, 5 steps, untrained weights: prints only
    python -m benchmarks.quality.dit_merge --render   # the section again from benchmarks/runs/dit-merge.json
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict

import torch
from torch import nn

from benchmarks.lab import dit
from benchmarks.lab.dit import Merge, Prices, prices
from benchmarks.lab.fidelity import labels_for, noise_for
from benchmarks.lab.results import Section, command, run_command, run_meta
from benchmarks.lab.timing import Timer
from benchmarks.lab.trained import data, flux
from benchmarks.lab.trained.loading import load_flux
from benchmarks.lab.trained.metrics import Estimate, bootstrap, psnr_ssim
from tome_core.merging.merge import MergePlan, make_partition, plan_merge

BEGIN, END = "<!-- dit-merge:begin -->", "<!-- dit-merge:end -->"
WHERE = ("attention", "block")
RATIOS = (0.25, 0.5, 0.75)
COMBINED = ((2, 0.5), (3, 0.5))
"""Our cache (the transformers' default: linear forecast, uniform schedule) at interval N with merging at a ratio."""
LARGE = 2 * flux.SIZE
"""The finer token grid (32 × 32 image tokens; the model saw this side in an eighth of its batches): merging alone at
the two smaller ratios and the cache alone."""


class Merging:
    """:class:`Merge` on a diffusers FLUX transformer for a ``with`` block: every block's and (``attention``) its
    attention's ``forward`` wrapped on the instance, unwrapped on exit."""

    def __init__(self, merge: Merge, transformer: nn.Module) -> None:
        self.merge = merge
        self.blocks = [*transformer.transformer_blocks, *transformer.single_transformer_blocks]
        self.generator = torch.Generator().manual_seed(merge.seed)
        self._now: tuple[MergePlan, tuple[torch.Tensor, torch.Tensor], int] | None = None

    def __enter__(self) -> Merging:
        for block in self.blocks:
            block.forward = self._block(block.forward)
            if self.merge.where == "attention":
                block.attn.forward = self._attention(block.attn.forward)
        return self

    def __exit__(self, *exc) -> None:
        for block in self.blocks:
            del block.forward
            if self.merge.where == "attention":
                del block.attn.forward

    def plan(self, x: torch.Tensor) -> MergePlan:
        """The matching of one image's tokens ``x`` (1, N, C) on their square grid."""
        side = math.isqrt(x.shape[1])
        part = make_partition(side, side, 2, 2, self.generator, x.device)
        return plan_merge(x, part, int(x.shape[1] * self.merge.ratio))

    def _block(self, forward):
        def run(hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, joint_attention_kwargs=None):
            outs = [
                self._one(
                    forward,
                    hidden_states[i : i + 1],
                    encoder_hidden_states[i : i + 1],
                    temb[i : i + 1],
                    image_rotary_emb,
                )
                for i in range(hidden_states.shape[0])
            ]
            return torch.cat([t for t, _ in outs]), torch.cat([x for _, x in outs])

        return run

    def _one(self, forward, x, txt, temb, rope):
        plan = self.plan(x)
        merged_rope = positions(rope, txt.shape[1], plan)
        if self.merge.where == "block":
            merged = plan.merge(x)
            txt_out, out = forward(
                hidden_states=merged, encoder_hidden_states=txt, temb=temb, image_rotary_emb=merged_rope
            )
            return txt_out, x + plan.unmerge(out - merged)
        self._now = (plan, merged_rope, txt.shape[1])
        try:
            return forward(hidden_states=x, encoder_hidden_states=txt, temb=temb, image_rotary_emb=rope)
        finally:
            self._now = None

    def _attention(self, forward):
        def run(hidden_states, encoder_hidden_states=None, image_rotary_emb=None, **kwargs):
            plan, rope, text = self._now
            if encoder_hidden_states is not None:  # double stream: the image tokens alone, then the text's
                img, txt = forward(
                    hidden_states=plan.merge(hidden_states),
                    encoder_hidden_states=encoder_hidden_states,
                    image_rotary_emb=rope,
                    **kwargs,
                )
                return plan.unmerge(img), txt
            joint = torch.cat([hidden_states[:, :text], plan.merge(hidden_states[:, text:])], dim=1)
            out = forward(hidden_states=joint, image_rotary_emb=rope, **kwargs)
            return torch.cat([out[:, :text], plan.unmerge(out[:, text:])], dim=1)

        return run


def positions(rope: tuple[torch.Tensor, torch.Tensor], text: int, plan: MergePlan) -> tuple[torch.Tensor, ...]:
    """FLUX's RoPE (cos, sin over the text then the image tokens) for the text and ``plan``'s merged image tokens:
    each keeps its own position (the kept sources', then the destinations')."""
    image = torch.cat([plan.keep_src[0], plan.dst]).to(rope[0].device) + text
    index = torch.cat([torch.arange(text, device=image.device), image])
    return tuple(r.index_select(0, index) for r in rope)


# --- speed at the real width --------------------------------------------------------------------------------------


def measure(
    config: dit.Config, rounds: int, log, device: dit.Device = "cpu", dtype: torch.dtype = torch.float32
) -> dict[str, list[float]]:
    """Seconds of one double and one single block, plain and under every :class:`Merge` (``kind/merge``), on
    ``device`` in ``dtype`` (CUDA: GPU time from events)."""
    device = torch.device(device)
    double, single, kwargs = dit.blocks(config, device, dtype)
    root = nn.Module()
    root.transformer_blocks, root.single_transformer_blocks = nn.ModuleList([double]), nn.ModuleList([single])
    merges = [None, *(Merge(w, r) for w in WHERE for r in RATIOS)]
    seconds: dict[str, list[float]] = {}
    with torch.no_grad():
        for r in range(rounds + 1):  # the first round warms up
            for merge in merges:
                for kind, block in (("double", double), ("single", single)):
                    with Merging(merge, root) if merge else contextlib.nullcontext(), Timer(device) as timer:
                        block(**kwargs)
                    if r:
                        seconds.setdefault(f"{kind}/{merge.name if merge else 'plain'}", []).append(timer.cpu)
            log(f"  {config.name}: round {r}/{rounds} done")
    return seconds


# --- fidelity on the trained model --------------------------------------------------------------------------------


def modes(side: int = flux.SIZE) -> list[tuple[str, Merge | None, dit.Mode | None]]:
    """(name, merging, our cache) of every fidelity run at ``side``: merging alone, the cache alone, both (at
    :data:`LARGE`: see there)."""
    cache = {n: dit.Mode(f"linear-uniform-{n}", "linear", "uniform", n) for n in (2, 3, 4)}
    ratios = RATIOS if side == flux.SIZE else RATIOS[:2]
    out: list[tuple[str, Merge | None, dit.Mode | None]] = [
        (Merge(w, r).name, Merge(w, r), None) for w in WHERE for r in ratios
    ]
    out += [(f"cache-{n}", None, mode) for n, mode in cache.items()]
    if side == flux.SIZE:
        out += [(f"cache-{n}+{Merge(w, r).name}", Merge(w, r), cache[n]) for n, r in COMBINED for w in WHERE]
    return out


def fidelity(seeds: int, steps: int, model: flux.FluxLayout, log, side: int = flux.SIZE) -> dict:
    seed_range = range(seeds)
    noise, labels = noise_for(seed_range, side, flux.CHANNELS), labels_for(seed_range, len(data.CLASSES))
    plain, _ = dit.sample(model, noise, labels, steps)
    out = {"plain": {"accuracy": dit.accuracy(plain, labels).to_json()}}
    for name, merge, mode in modes(side):
        start = time.perf_counter()
        with Merging(merge, model.transformer) if merge else contextlib.nullcontext():
            samples, counts = dit.sample(model, noise, labels, steps, mode)
        psnr, ssim = psnr_ssim(samples, plain)
        out[name] = {
            "merge": None if merge is None else asdict(merge),
            "cache": None if mode is None else mode.interval,
            "psnr": bootstrap(psnr).to_json(),
            "ssim": bootstrap(ssim).to_json(),
            "accuracy": dit.accuracy(samples, labels).to_json(),
            "counts": counts,
        }
        log(f"{side} px, {name}: {out[name]['psnr'][0]:.1f} dB, {counts}, {time.perf_counter() - start:.0f} s")
    return out


# --- the section --------------------------------------------------------------------------------------------------


def _label(row: dict) -> str:
    merge, cache = row["merge"], row["cache"]
    parts = [f"merge {merge['where']} {merge['ratio']:g}"] if merge else []
    return " + ".join([*([f"cache N={cache}"] if cache else []), *parts])


def speed_table(price: Prices) -> list[str]:
    """Each merge's block costs and the speed-up of a full step they give (seconds of whatever clock measured them)."""
    lines = [
        "| merging | double block | single block | full step | speed-up of a step |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in ["plain", *(Merge(w, r).name for w in WHERE for r in RATIOS)]:
        d, s = price.blocks[f"double/{m}"], price.blocks[f"single/{m}"]
        lines.append(f"| {m} | {d:.4f} s | {s:.4f} s | {price.full(m):.3f} s | {price.full() / price.full(m):.2f}× |")
    return lines


def section(data_: dict, meta: dict) -> str:
    config = dit.Config(**data_["config"])
    price = Prices(**data_["prices"])
    lines = [
        BEGIN,
        "## Token merging on a diffusion transformer (`python -m benchmarks.quality.dit_merge`)",
        "",
        f"Speed: one block of each kind at {config.name} (hidden {config.hidden}, {config.image_tokens} image + "
        f"{config.text_tokens} text tokens), diffusers' blocks with random weights; CPU, float32, torch {meta['torch']}, "
        f"{meta['threads']} torch thread(s), {meta['rounds']} interleaved rounds, medians of process CPU time; run "
        f"finished {meta['finished']} and took {meta['seconds'] / 60:.0f} min. A full step: the model's outside "
        f"(`benchmarks.speed.dit_costs`' run) and {config.double} double- plus {config.single} single-stream blocks.",
        "",
        *speed_table(price),
        "",
        f"Fidelity: the trained FLUX-layout model, {meta['seeds']} seeds, {meta['steps']} flow-matching Euler steps, "
        f"CFG {dit.CFG:g}, PSNR/SSIM against plain's sample (mean [bootstrap 95 %]) and class accuracy; "
        "speed-up: the pass priced with the costs above. The cache: linear forecast, uniform schedule (the "
        "transformers' `auto`).",
    ]
    for key, side in (("fidelity", flux.SIZE), ("fidelity-large", LARGE)):
        if key in data_:
            lines += ["", *fidelity_table(data_[key], side, price)]
    return "\n".join([*lines, END])


def fidelity_table(rows: dict, side: int, price: Prices) -> list[str]:
    tokens = (side // flux.PATCH) ** 2
    plain = Estimate.from_json(rows["plain"]["accuracy"]).cell(".0%", 1)
    lines = [
        f"At {side} px ({tokens} image tokens; plain's accuracy {plain}):",
        "",
        "| mode | PSNR (dB) | SSIM | accuracy | full steps | speed-up |",
        "|---|---|---|---|---:|---:|",
    ]
    for row in rows.values():
        if "psnr" not in row:
            continue
        merge = Merge(**row["merge"]).name if row["merge"] else "plain"
        cells = [
            _label(row),
            Estimate.from_json(row["psnr"]).cell(".1f"),
            Estimate.from_json(row["ssim"]).cell(".3f"),
            f"{row['accuracy'][0]:.0%}",
            str(row["counts"]["full"]),
            f"{price.speedup(row['counts'], merge):.2f}×",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> None:
    def measure_all(args) -> tuple[dict, dict]:
        start = time.perf_counter()
        config, rounds = (dit.QUICK, 1) if args.quick else (dit.REAL, args.rounds)
        seconds = measure(config, rounds, print)
        seeds, steps = (2, 5) if args.quick else (dit.SEEDS, dit.STEPS)
        model = flux.build(len(data.CLASSES)).eval() if args.quick else load_flux()
        results = {
            "config": asdict(config),
            "prices": asdict(prices(seconds, config)),
            "seconds": seconds,
            "fidelity": fidelity(seeds, steps, model, print),
            "fidelity-large": fidelity(seeds, steps, model, print, LARGE),
        }
        return results, run_meta(args, rounds, time.perf_counter() - start) | {"seeds": seeds, "steps": steps}

    parser = command(__doc__, quick="", rounds=3, threads=1)
    run_command(parser, Section("dit-merge", BEGIN, END, section), argv, measure_all)


if __name__ == "__main__":
    main()
