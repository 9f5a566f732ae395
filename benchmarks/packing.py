"""Training micro-step time: padded vs packed vs auto (``model.use_remove_padding``).

One micro-step is the torch engine's training forward of a micro-batch (log-probs and
entropy of the response tokens) plus the backward of a policy-gradient loss; no optimizer
step (the same for every layout). Layouts:

* ``padded``: ``use_remove_padding: false`` (left-padded prompts ‖ right-padded responses,
  trimmed to the micro-batch's longest);
* ``dense``: every micro-batch as one row, attention by sdpa under the row's dense
  ``(T, T)`` prefix-tree mask (the masked path, and temper's packed path before the
  segment kernel);
* ``packed``: every micro-batch as one row, attention by the segment kernel
  (``temper.training.segment_attention``: two SDPA calls per layer over the row's
  prompts and responses, the default with sdpa);
* ``auto``: the default — per micro-batch, the layout the cost model predicts is cheaper
  (``temper.training.packing.model_cost``).

Length distributions (prompt + response tokens per sample, ``--rows`` per micro-batch):
``short`` uniform in [2, 16], ``long`` uniform in [8, 128], ``skewed`` one sample of 128
and the rest in [2, 16]; ``short-even`` [13, 16] and ``long-even`` [112, 128], where little
padding is left to remove and the dense ``T²`` mask of a packed row costs more; ``grpo``
groups of 4 samples sharing a 35-token prompt, responses uniform in [96, 128] (a prompt
shared by its group is packed once). Each mode runs the same ``--batches`` micro-batches per
distribution, ``--repeats`` times; the best total is reported, as ms per micro-step and
as a ratio to ``padded`` from the same run (the machine may be shared).

    python benchmarks/packing.py                   # a 19M-parameter random Llama, 1 thread
    python benchmarks/packing.py --model smollm2   # SmolLM2-135M
    python benchmarks/packing.py --calibrate       # measure CPU_ATTENTION_WEIGHT (3 fits)
    python benchmarks/packing.py --device cuda --rows 32   # one GPU, bf16 autocast
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.training.micro_batching import MicroBatching
from temper.training.packing import (
    MASKED_KERNELS,
    LayoutCost,
    block_causal_mask,
    measure_layout_cost,
    model_cost,
)
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PAD = 0
GRPO_PROMPT, GRPO_GROUP = 35, 4
DISTRIBUTIONS = {
    "short": lambda g, n: torch.randint(2, 17, (n,), generator=g).tolist(),
    "long": lambda g, n: torch.randint(8, 129, (n,), generator=g).tolist(),
    "skewed": lambda g, n: [128, *torch.randint(2, 17, (n - 1,), generator=g).tolist()],
    "short-even": lambda g, n: torch.randint(13, 17, (n,), generator=g).tolist(),
    "long-even": lambda g, n: torch.randint(112, 129, (n,), generator=g).tolist(),
    "grpo": lambda g, n: (GRPO_PROMPT + torch.randint(96, 129, (n,), generator=g)).tolist(),
}


def model_path(name: str) -> str:
    if name == "smollm2":
        from temper.utils.smollm2 import ensure_smollm2

        return str(ensure_smollm2())
    # hidden, layers, ffn, heads, kv heads
    sizes = {"medium": (512, 6, 1376, 4, 2), "large": (2048, 16, 5504, 32, 8)}
    if name in sizes:
        from temper.utils.tiny import make_tiny_model

        hidden, layers, ffn, heads, kv = sizes[name]
        return str(
            make_tiny_model(
                f"/tmp/temper-bench-{name}",
                hidden_size=hidden,
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=kv,
                intermediate_size=ffn,
            )
        )
    return name


def make_batch(lengths: list[int], vocab: int, g: torch.Generator, grpo: bool = False) -> Batch:
    """Left-padded prompts (half of each sample, rounded up; ``grpo``: 35 tokens, the same
    within each group of 4) ‖ right-padded responses."""
    halves = [GRPO_PROMPT if grpo else (n + 1) // 2 for n in lengths]
    pl = torch.tensor(halves)
    rl = torch.tensor(lengths) - pl
    P, R, B = int(pl.max()), max(int(rl.max()), 1), len(lengths)
    pm = (torch.arange(P)[None] >= P - pl[:, None]).long()
    rm = (torch.arange(R)[None] < rl[:, None]).long()
    ids = torch.randint(1, vocab, (B, P + R), generator=g)
    if grpo:  # every row of a group carries its first row's prompt
        first = torch.arange(B) // GRPO_GROUP * GRPO_GROUP
        ids[:, :P] = ids[first, :P]
    return Batch.from_dict(
        {
            "prompt_ids": torch.where(pm > 0, ids[:, :P], PAD),
            "prompt_mask": pm,
            "response_ids": torch.where(rm > 0, ids[:, P:], PAD),
            "response_mask": rm,
            "advantages": (torch.randn(B, 1, generator=g) * rm).contiguous(),
        }
    )


def make_engine(path: str, mode: str, rows: int, device: str = "cpu") -> TorchEngine:
    spec = EngineSpec(
        model=ModelConfig(path=path, use_remove_padding=mode != "padded"),
        device=torch.device(device),
        train=ActorConfig(micro_batch_size_per_device=rows, optim=OptimConfig(lr=1e-6)),
        infer_micro=MicroBatching(size=rows),
    )
    engine = TorchEngine(spec)
    if mode == "dense":  # back to transformers' sdpa: the packed row gets its dense mask
        engine.model.set_attn_implementation("sdpa")
    if mode in ("packed", "dense"):
        engine._layout_cost = lambda: LayoutCost(per_token=1.0, per_pair=0.0)  # type: ignore[method-assign]
    engine.model.train()
    return engine


@torch.no_grad()
def timed_forward(engine: TorchEngine, rows: int, length: int) -> None:
    """One no-grad forward of ``rows × length`` random tokens under a dense causal 4-D
    mask (the calibration's unit of work)."""
    vocab = int(engine.model.config.vocab_size)
    gen = torch.Generator().manual_seed(rows * 1000 + length)
    dev = engine.device
    ids = torch.randint(0, vocab, (rows, length), generator=gen).to(dev)
    impl = engine._attn_impl()
    mask = None
    if impl in MASKED_KERNELS:
        additive = engine.compute_dtype if impl == "eager" else None
        one = block_causal_mask(torch.tensor([length]), additive_dtype=additive).to(dev)
        mask = one.expand(rows, 1, length, length)
    positions = torch.arange(length, device=dev).expand(rows, -1)
    with engine._autocast():
        engine._logits({"input_ids": ids, "attention_mask": mask, "position_ids": positions}, 1)
    sync()  # the caller's clock reads finished GPU work


def calibrate(engine: TorchEngine, fits: int) -> None:
    """Fit seconds = c0 + c_tok·tokens + c_pair·pairs on timed forwards; print the implied
    attention weight (c_pair / c_tok relative to the config's FLOPs per pair / per token)."""
    flops = model_cost(engine.model.config, varlen=True)  # weight 1: raw FLOPs
    for i in range(fits):
        cost = measure_layout_cost(lambda r, n: timed_forward(engine, r, n))
        weight = (cost.per_pair / max(cost.per_token, 1e-30)) / (flops.per_pair / flops.per_token)
        print(
            f"fit {i + 1}: {cost.per_token:.3g} s/token, {cost.per_pair:.3g} s/pair -> "
            f"attention weight {weight:.2f}"
        )


def micro_step(engine: TorchEngine, mb: Batch) -> None:
    out = engine._run(mb, temperature=1.0, with_entropy=True, entropy_grad=False)
    dev = out["log_probs"].device
    mask, adv = mb["response_mask"].to(dev), mb["advantages"].to(dev)
    loss = (-adv * out["log_probs"] * mask).sum() / mask.sum().clamp(min=1)
    loss.backward()


def sync() -> None:
    """Wait for queued GPU work, so the clock reads finished steps."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_mode(engine: TorchEngine, batches: list[Batch], repeats: int) -> float:
    """Best over ``repeats`` of the seconds per micro-step over ``batches``."""
    micro_step(engine, batches[0])  # warm-up (and auto's calibration)
    best = float("inf")
    for _ in range(repeats):
        engine.model.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        for mb in batches:
            micro_step(engine, mb)
        sync()
        best = min(best, (time.perf_counter() - t0) / len(batches))
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        default="medium",
        help="medium (19M random Llama), large (~0.8B), smollm2, or a dir",
    )
    p.add_argument("--rows", type=int, default=8, help="samples per micro-batch")
    p.add_argument("--batches", type=int, default=6, help="micro-batches per distribution")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu or cuda (bf16 autocast)")
    p.add_argument("--calibrate", action="store_true", help="measure the attention weight")
    p.add_argument("--dists", nargs="*", default=list(DISTRIBUTIONS), choices=list(DISTRIBUTIONS))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    path = model_path(args.model)
    if args.calibrate:
        # the constant prices a dense masked row: transformers' sdpa, not the segment kernel
        calibrate(make_engine(path, "dense", args.rows, args.device), fits=3)
        return
    engines = {
        m: make_engine(path, m, args.rows, args.device)
        for m in ("padded", "dense", "packed", "auto")
    }
    cost = engines["auto"]._layout_cost()
    vocab = int(engines["padded"].model.config.vocab_size)
    print(
        f"model {args.model}, {args.rows} rows per micro-batch, {args.threads} thread(s); "
        f"cost model: {cost.per_token:.3g} FLOP/token, {cost.per_pair:.3g} weighted FLOP/pair"
    )
    print(
        f"{'lengths':10} {'padded ms':>10} {'dense ms':>9} {'packed ms':>10} {'auto ms':>8} "
        f"{'dense/padded':>13} {'packed/padded':>14} {'auto/padded':>12} {'auto packs':>11}"
    )
    for name in args.dists:
        draw = DISTRIBUTIONS[name]
        g = torch.Generator().manual_seed(0)
        grpo = name == "grpo"
        batches = [make_batch(draw(g, args.rows), vocab, g, grpo=grpo) for _ in range(args.batches)]
        before = engines["auto"].layouts["packed"]
        times = {m: time_mode(e, batches, args.repeats) for m, e in engines.items()}
        runs = 1 + args.repeats * len(batches)  # the warm-up runs batches[0] once
        packs = (engines["auto"].layouts["packed"] - before) / runs
        pad = times["padded"]
        print(
            f"{name:10} {pad * 1e3:10.1f} {times['dense'] * 1e3:9.1f} "
            f"{times['packed'] * 1e3:10.1f} {times['auto'] * 1e3:8.1f} "
            f"{times['dense'] / pad:13.2f} {times['packed'] / pad:14.2f} "
            f"{times['auto'] / pad:12.2f} {packs:11.0%}"
        )


if __name__ == "__main__":
    main()
