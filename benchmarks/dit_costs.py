"""What one step of FLUX.1 costs at its real width, block by block, and what a step cache could save there
(``python -m benchmarks.dit_costs``; issue 26's speed at real width).

    python -m benchmarks.dit_costs            # FLUX.1 at 1024 px on the CPU, one thread (a few minutes)
    python -m benchmarks.dit_costs --quick    # tiny sizes: prints only (CI runs it)
    python -m benchmarks.dit_costs --render   # the section again from benchmarks/runs/dit-costs-cpu.json

The blocks are diffusers' ``FluxTransformerBlock`` (double stream) and ``FluxSingleTransformerBlock`` (single
stream), random weights, built one at a time (FLUX.1's width: hidden 3072 = 24 heads of 128; 4096 image tokens at
1024 px and 512 text tokens). Per round, interleaved (process CPU time, medians):

* ``double``, ``single``: one block's forward;
* ``outside``: everything of the model's forward outside its blocks (embeddings, RoPE, the final norm and
  projection: the model built with no blocks);
* ``forecast`` / ``calibrated``: our linear / calibrated forecast (:class:`tome_core.caching.forecast.Forecast`) of a hidden
  state as large as the joint sequence, and ``calibration``: the calibrated one's update at a full step;
* ``signal``: the relative L1 change of a probe's output (First Block Cache's decision, on every 4th token and
  channel as our adaptive schedule subsamples).

From them: a full step (``outside`` + 19 double + 38 single blocks), a cached step that runs the model's outside
and its first double block as the probe and forecasts the rest, and the 20-step speed-ups of the uniform schedule
at N = 2 … 5 (first and last step full). The same costs at a reduced width are checked against the whole model's
forward at that width (all 57 blocks): the sum of the parts within a few percent of the whole.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from benchmarks.anchors import rel_l1
from benchmarks.results import load_run_data, publish, run_meta, write_section
from benchmarks.timing import Timer
from tome_core.caching.forecast import Forecast

BEGIN, END = "<!-- dit-costs:begin -->", "<!-- dit-costs:end -->"
KINDS = ("double", "single", "outside", "forecast", "calibrated", "calibration", "signal")
INTERVALS = (2, 3, 4, 5)
STEPS = 20
Device = torch.device | str


@dataclass(frozen=True)
class Config:
    """A FLUX-layout model's width and sequence: ``heads`` × ``head_dim`` hidden, image and text tokens, and its
    blocks (FLUX.1: 19 double-stream, 38 single-stream)."""

    name: str
    heads: int
    head_dim: int
    image_tokens: int
    text_tokens: int
    double: int = 19
    single: int = 38

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    def model(self, double: int = 0, single: int = 0) -> torch.nn.Module:
        """``FluxTransformer2DModel`` at this width with ``double`` and ``single`` blocks (random weights)."""
        from diffusers import FluxTransformer2DModel

        rope = (self.head_dim // 8, 7 * self.head_dim // 16, 7 * self.head_dim // 16)  # FLUX.1: 16, 56, 56
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            return FluxTransformer2DModel(
                in_channels=64,
                num_layers=double,
                num_single_layers=single,
                attention_head_dim=self.head_dim,
                num_attention_heads=self.heads,
                joint_attention_dim=4096,
                pooled_projection_dim=768,
                guidance_embeds=True,
                axes_dims_rope=rope,
            ).eval()

    def inputs(self, device: Device = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """The model's inputs for one image: packed latents, text, pooled vector, time, guidance (in ``dtype``),
        positions (float32), on ``device``."""
        gen = torch.Generator().manual_seed(0)
        side = int(self.image_tokens**0.5)
        rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        inputs = {
            "hidden_states": torch.randn(1, self.image_tokens, 64, generator=gen),
            "encoder_hidden_states": torch.randn(1, self.text_tokens, 4096, generator=gen),
            "pooled_projections": torch.randn(1, 768, generator=gen),
            "timestep": torch.tensor([0.6]),
            "guidance": torch.tensor([3.5]),
        }
        return {k: v.to(device, dtype) for k, v in inputs.items()} | {
            "img_ids": torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3).float().to(device),
            "txt_ids": torch.zeros(self.text_tokens, 3, device=device),
        }


REAL = Config("FLUX.1 1024 px", 24, 128, 4096, 512)
CHECK = Config("FLUX.1 layout, hidden 384, 1024 px", 3, 128, 4096, 512)
QUICK = Config("tiny", 2, 32, 64, 8, 2, 3)


@dataclass
class BlockCosts:
    """One configuration's seconds per kind (lists: one per round); ``whole``: the whole model's forward at this
    width, where it was timed (the check)."""

    config: dict
    seconds: dict[str, list[float]] = field(default_factory=dict)
    whole: list[float] = field(default_factory=list)

    def cost(self, kind: str) -> float:
        return statistics.median(self.seconds[kind])

    @property
    def blocks(self) -> Config:
        return Config(**self.config)

    def full_step(self) -> float:
        c = self.blocks
        return self.cost("outside") + c.double * self.cost("double") + c.single * self.cost("single")

    def cached_step(self) -> float:
        """A cached step: the model's outside, the first double block (the probe), the calibrated forecast."""
        return self.cost("outside") + self.cost("double") + self.cost("calibrated")

    def priced(self, counts: dict[str, int]) -> float:
        """The speed-up of a pass whose steps were counted: ours (``full`` with the calibration's update, ``cached``)
        or another cache's (``full``; ``first``: the outside, the first block and the signal; ``skip``: the outside
        and the signal)."""
        full, outside, signal = self.full_step(), self.cost("outside"), self.cost("signal")
        steps = sum(counts.get(k, 0) for k in ("full", "cached", "first", "skip"))
        seconds = counts["full"] * (full + (self.cost("calibration") if "cached" in counts else 0.0))
        seconds += counts.get("cached", 0) * self.cached_step()
        seconds += counts.get("first", 0) * (outside + self.cost("double") + signal)
        seconds += counts.get("skip", 0) * (outside + signal)
        return steps * full / seconds

    def speedup(self, interval: int, steps: int = STEPS) -> float:
        """Ours at ``interval`` on the uniform schedule (first and last step full)."""
        full = len({*range(0, steps, interval), steps - 1})
        return self.priced({"full": full, "cached": steps - full})


def blocks(
    config: Config,
    device: Device = "cpu",
    dtype: torch.dtype = torch.float32,
    outside: torch.nn.Module | None = None,
    inputs: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.nn.Module, torch.nn.Module, dict[str, torch.Tensor]]:
    """One double- and one single-stream block at ``config``'s width (random weights), and the keyword arguments the
    model hands its blocks for :meth:`Config.inputs`: the image and text streams, the time embedding, the RoPE; all
    on ``device`` in ``dtype``. ``outside`` and ``inputs``: the model without blocks and its inputs, where the caller
    has them already."""
    inputs = config.inputs(device, dtype) if inputs is None else inputs
    outside = config.model().to(device, dtype) if outside is None else outside
    with torch.no_grad():
        temb = outside.time_text_embed(
            inputs["timestep"] * 1000, inputs["guidance"] * 1000, inputs["pooled_projections"]
        )
        kwargs = {
            "hidden_states": outside.x_embedder(inputs["hidden_states"]),
            "encoder_hidden_states": outside.context_embedder(inputs["encoder_hidden_states"]),
            "temb": temb,
            "image_rotary_emb": outside.pos_embed(torch.cat([inputs["txt_ids"], inputs["img_ids"]])),
        }
    one = config.model(double=1, single=1).to(device, dtype)
    return one.transformer_blocks[0], one.single_transformer_blocks[0], kwargs


def measure(
    config: Config, rounds: int, log, whole: bool = False, device: Device = "cpu", dtype: torch.dtype = torch.float32
) -> BlockCosts:
    """Seconds of every kind at ``config``, ``rounds`` interleaved rounds after a warm-up (``whole``: the whole model's
    forward too), on ``device`` in ``dtype`` (CUDA: GPU time from events)."""
    device = torch.device(device)
    inputs = config.inputs(device, dtype)
    outside = config.model().to(device, dtype)
    double, single, block_kwargs = blocks(config, device, dtype, outside, inputs)
    gen = torch.Generator().manual_seed(1)
    tokens = config.image_tokens + config.text_tokens
    states = [torch.randn(1, tokens, config.hidden, generator=gen).to(device, dtype) for _ in range(3)]
    linear, calibrated = Forecast("linear"), Forecast("calibrated")
    for i in range(2):
        linear.add(torch.tensor(0.9 - 0.1 * i), states[i])
        calibrated.add(torch.tensor(0.9 - 0.1 * i), states[i], states[i])

    def calibration() -> None:
        fresh = Forecast("calibrated")
        fresh.time, fresh.deep, fresh.probe = torch.tensor(0.8, device=device), states[0], calibrated.probe
        fresh.add(torch.tensor(0.7), states[2], states[2])

    def signal() -> None:
        rel_l1(states[2][..., ::4, ::4], states[1][..., ::4, ::4])

    work = {
        "double": lambda: double(**block_kwargs),
        "single": lambda: single(**block_kwargs),
        "outside": lambda: outside(**inputs, return_dict=False),
        "forecast": lambda: linear.predict(torch.tensor(0.7)),
        "calibrated": lambda: calibrated.predict(torch.tensor(0.7), states[2]),
        "calibration": calibration,
        "signal": signal,
    }
    model = config.model(config.double, config.single).to(device, dtype) if whole else None
    out = BlockCosts(asdict(config))
    with torch.no_grad():
        for fn in work.values():
            fn()  # warm-up
        for r in range(rounds):
            for kind in KINDS:
                with Timer(device) as timer:
                    work[kind]()
                out.seconds.setdefault(kind, []).append(timer.cpu)
            if model is not None:
                with Timer(device) as timer:
                    model(**inputs, return_dict=False)
                out.whole.append(timer.cpu)
            log(f"  {config.name}: round {r + 1}/{rounds} done")
    return out


def section(results: list[BlockCosts], meta: dict) -> str:
    lines = [
        BEGIN,
        "## FLUX.1 at its real width, block by block (`python -m benchmarks.dit_costs`)",
        "",
        f"CPU, float32, torch {meta['torch']}, {meta['threads']} torch thread(s); {meta['rounds']} interleaved rounds, "
        f"medians; run finished {meta['finished']} and took {meta['seconds'] / 60:.0f} min. diffusers' FLUX blocks with "
        "random weights, one image; seconds of process CPU time, and as a fraction of a full step (the model's outside "
        "and all its double- and single-stream blocks: FLUX.1's 19 and 38).",
        "",
        *tables(results),
        END,
    ]
    return "\n".join(lines)


def tables(results: list[BlockCosts]) -> list[str]:
    """The costs and the speed-ups derived from them (seconds of whatever clock measured them)."""
    lines = [
        "| configuration | full step | " + " | ".join(KINDS) + " |",
        "|---|---:|" + "---:|" * len(KINDS),
    ]
    for r in results:
        full = r.full_step()
        cells = [f"{r.cost(k):.4f} s ({r.cost(k) / full:.4f})" for k in KINDS]
        lines.append(f"| {r.blocks.name} | {full:.1f} s | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Derived: a cached step (the outside, the first double block as the probe, the calibrated forecast) and the "
        f"{STEPS}-step speed-up of the uniform schedule at N (first and last step full); where the whole model was "
        "timed at that width, the sum of its parts against it.",
        "",
        "| configuration | cached step | " + " | ".join(f"N={n}" for n in INTERVALS) + " | parts / whole |",
        "|---|---:|" + "---:|" * (len(INTERVALS) + 1),
    ]
    for r in results:
        check = f"{r.full_step() / statistics.median(r.whole):.3f}" if r.whole else "—"
        speeds = " | ".join(f"{r.speedup(n):.2f}×" for n in INTERVALS)
        lines.append(f"| {r.blocks.name} | {r.cached_step() / r.full_step():.4f} | {speeds} | {check} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--render", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.render:
        data, meta = load_run_data("dit-costs-cpu")
        return write_section(section([BlockCosts(**d) for d in data], meta), BEGIN, END)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rounds = 2 if args.quick else args.rounds
    plan = ((QUICK, True),) if args.quick else ((REAL, False), (CHECK, True))
    results = [measure(config, rounds, print, whole) for config, whole in plan]
    meta = run_meta(args, rounds, time.perf_counter() - start)
    text = section(results, meta)
    publish("dit-costs-cpu", text, [vars(r) for r in results], meta, BEGIN, END, keep=not args.quick)


if __name__ == "__main__":
    main()
