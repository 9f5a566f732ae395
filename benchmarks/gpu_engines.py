"""One GPU: the actor's log-prob pass and update on the ``torch`` and ``megatron`` engines.

The same random Llama (temper's byte tokenizer, so the vocabulary is tiny and the time is
the transformer body's), the same batch, bf16 autocast over fp32 master weights, one
process on ``cuda:0``. The megatron engine uses TransformerEngine's layer spec when TE is
installed, Megatron-Core's local spec otherwise (the line says which).

Reported per engine, after one warm-up: the median of ``--steps`` timed log-prob passes
and updates (``torch.cuda.synchronize`` around each), tokens per second of the update,
and the peak GPU memory allocated; then megatron's times as ratios to torch's from the
same run. Needs CUDA and megatron-core (a lent GPU machine; see scripts/gpu_check.sh).

    python benchmarks/gpu_engines.py                               # 8 layers × 1024
    python benchmarks/gpu_engines.py --layers 16 --hidden 2048 --samples 32 --seq 1024
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def timed(fn: Callable[[], object], steps: int) -> float:
    """Median seconds of ``steps`` calls of ``fn`` after one warm-up call."""
    fn()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_batch(samples: int, seq: int):
    from temper.data.batch import Batch

    g = torch.Generator().manual_seed(0)
    prompt, response = seq // 4, seq - seq // 4
    return Batch.from_dict(
        {
            "prompt_ids": torch.randint(0, 256, (samples, prompt), generator=g),
            "prompt_mask": torch.ones(samples, prompt, dtype=torch.long),
            "response_ids": torch.randint(0, 256, (samples, response), generator=g),
            "response_mask": torch.ones(samples, response, dtype=torch.long),
            "advantages": torch.randn(samples, response, generator=g),
        }
    )


def make_actor(path: str, strategy: str, micro: int):
    from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
    from temper.roles.actor import Actor
    from temper.training.micro_batching import MicroBatching
    from temper.training.registry import build_engine
    from temper.training.spec import EngineSpec

    cfg = ActorConfig(
        strategy=strategy,
        micro_batch_size_per_device=micro,
        grad_clip=1.0,
        optim=OptimConfig(lr=1e-5, weight_decay=0.0),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cuda"),
        train=cfg,
        infer_micro=MicroBatching(size=micro),
    )
    return Actor(cfg, build_engine(strategy, spec))


def bench(path: str, strategy: str, batch, micro: int, steps: int) -> tuple[float, float]:
    """Print one engine's line; return its (log-prob, update) median seconds."""
    from temper.data.batch import Batch

    torch.cuda.reset_peak_memory_stats()
    actor = make_actor(path, strategy, micro)
    n = sum(p.numel() for _, p in actor.engine.named_weights())
    logp = actor.compute_log_probs(batch)["old_log_probs"]
    train = batch.union(Batch.from_dict({"old_log_probs": logp}))
    fwd = timed(lambda: actor.compute_log_probs(batch), steps)
    upd = timed(lambda: actor.update(train), steps)
    peak = torch.cuda.max_memory_allocated() / 2**30
    spec = ""
    if strategy == "megatron":
        engine: Any = actor.engine  # the megatron engine's build says which layer spec
        spec = " (TE spec)" if engine.built.use_te else " (local spec)"
    tokens = batch["response_ids"].numel() + batch["prompt_ids"].numel()
    print(
        f"{strategy}{spec}: {n / 1e6:.0f}M params; log-probs {fwd * 1e3:.1f} ms, "
        f"update {upd * 1e3:.1f} ms ({tokens / upd:,.0f} tokens/s), peak {peak:.2f} GiB",
        flush=True,
    )
    return fwd, upd


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--samples", type=int, default=16, help="samples in the mini-batch")
    p.add_argument("--seq", type=int, default=512, help="prompt + response tokens per sample")
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--engines", nargs="*", default=["torch", "megatron"])
    args = p.parse_args()
    from temper.utils.tiny import make_tiny_model

    path = str(
        make_tiny_model(
            Path(tempfile.mkdtemp(prefix="temper-gpu-engines-")) / "model",
            hidden_size=args.hidden,
            num_layers=args.layers,
            num_heads=args.hidden // 64,
            num_kv_heads=max(1, args.hidden // 256),
            intermediate_size=args.hidden * 4,
            max_position_embeddings=args.seq,
        )
    )
    batch = make_batch(args.samples, args.seq)
    tokens = args.samples * args.seq
    print(
        f"{torch.cuda.get_device_name()}; {args.layers} layers × {args.hidden}, batch {tokens} tokens"
    )
    results: dict[str, tuple[float, float]] = {}
    for strategy in args.engines:
        results[strategy] = bench(path, strategy, batch, args.micro, args.steps)
        torch.cuda.empty_cache()
    if "torch" in results:
        base = results["torch"]
        for strategy, (fwd, upd) in results.items():
            if strategy != "torch":
                print(
                    f"{strategy}/torch: log-probs {fwd / base[0]:.2f}×, update {upd / base[1]:.2f}×"
                )


if __name__ == "__main__":
    main()
