"""One GPU: the actor's log-prob pass and update on the ``torch`` and ``megatron`` engines.

The same random Llama (temper's byte tokenizer, so the vocabulary is tiny and the time is
the transformer body's), the same batch, bf16 autocast over fp32 master weights, one
process on ``cuda:0``. The megatron engine uses TransformerEngine's layer spec when TE is
installed, Megatron-Core's local spec otherwise (the line says which).

Reported per engine, after one warm-up: the median of ``--steps`` timed log-prob passes
and updates (``torch.cuda.synchronize`` around each), tokens per second of the update,
and the peak GPU memory allocated; then megatron's times as ratios to torch's from the
same run. Needs CUDA and megatron-core (a lent GPU machine; see scripts/gpu_check.sh).

Model FLOP utilisation (MFU) is measured against the card's own bf16 matmul rate, timed in
the same run (an 8192³ product): the update does ``6·N·T + 6·L·d·S·T`` FLOPs for ``N``
parameters, ``T`` tokens, ``L`` layers of width ``d`` and sequence length ``S`` (causal
attention: half of the ``12·L·d·S`` of full attention), the log-prob pass a third of it.
The engine ``torch+liger`` is the torch engine with ``model.use_liger`` (needs
liger-kernel). ``--profile`` prints the update's heaviest CUDA kernels (torch.profiler) for the first
engine named; ``--host`` prints, for the first engine, where one update waits for the GPU (each
source line that made a synchronising CUDA call, from ``torch.cuda.set_sync_debug_mode``, and how
often) and its heaviest Python functions (cProfile): on a small model the host, not the GPU, sets
the update's time.

    python benchmarks/gpu_engines.py                               # 8 layers × 1024
    python benchmarks/gpu_engines.py --layers 16 --hidden 2048 --samples 32 --seq 1024
    python benchmarks/gpu_engines.py --engines torch torch+liger   # torch first: Liger
                                                                   # patches Llama process-wide
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


def matmul_tflops() -> float:
    """The card's bf16 matmul rate in TFLOP/s: median of ten 8192³ products."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192**3 / timed(lambda: a @ b, 10) / 1e12


def model_flops(params: int, tokens: int, layers: int, hidden: int, seq: int) -> float:
    """FLOPs of one update: ``6·N·T + 6·L·d·S·T`` (forward and backward, causal attention)."""
    return 6 * params * tokens + 6 * layers * hidden * seq * tokens


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


def make_actor(path: str, engine: str, micro: int):
    """``engine``: a strategy, ``+liger`` for ``model.use_liger``."""
    from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
    from temper.roles.actor import Actor
    from temper.training.micro_batching import MicroBatching
    from temper.training.registry import build_engine
    from temper.training.spec import EngineSpec

    strategy, _, extra = engine.partition("+")
    cfg = ActorConfig(
        strategy=strategy,
        micro_batch_size_per_device=micro,
        grad_clip=1.0,
        optim=OptimConfig(lr=1e-5, weight_decay=0.0),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path, use_liger=extra == "liger"),
        device=torch.device("cuda"),
        train=cfg,
        infer_micro=MicroBatching(size=micro),
    )
    return Actor(cfg, build_engine(strategy, spec))


def host_report(update: Callable[[], object]) -> None:
    """Where one ``update()`` blocks on the GPU (synchronising calls by source line) and
    its 15 heaviest Python functions by cumulative time."""
    import collections
    import cProfile
    import pstats
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            update()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = collections.Counter(
        f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)
    )
    print(f"synchronising CUDA calls in one update: {sum(syncs.values())}")
    for where, n in syncs.most_common(25):
        print(f"  {n:5d}  {where}")
    prof = cProfile.Profile()
    prof.enable()
    update()
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


def bench(
    path: str,
    strategy: str,
    batch,
    micro: int,
    steps: int,
    profile: bool = False,
    host: bool = False,
) -> tuple[float, float, int]:
    """Print one engine's line; return its (log-prob, update) median seconds and its
    parameter count."""
    from temper.data.batch import Batch

    torch.cuda.reset_peak_memory_stats()
    actor = make_actor(path, strategy, micro)
    n = sum(p.numel() for _, p in actor.engine.named_weights())
    logp = actor.compute_log_probs(batch)["old_log_probs"]
    train = batch.union(Batch.from_dict({"old_log_probs": logp}))
    fwd = timed(lambda: actor.compute_log_probs(batch), steps)
    upd = timed(lambda: actor.update(train), steps)
    peak = torch.cuda.max_memory_allocated() / 2**30
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            actor.update(train)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15))
    if host:
        host_report(lambda: actor.update(train))
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
    return fwd, upd, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--samples", type=int, default=16, help="samples in the mini-batch")
    p.add_argument("--seq", type=int, default=512, help="prompt + response tokens per sample")
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--engines", nargs="*", default=["torch", "megatron"])
    p.add_argument("--profile", action="store_true", help="top CUDA kernels of one update")
    p.add_argument("--host", action="store_true", help="one update's GPU waits and Python time")
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
    peak = matmul_tflops()
    print(f"bf16 matmul (8192³): {peak:.0f} TFLOP/s")
    results: dict[str, tuple[float, float]] = {}
    for i, strategy in enumerate(args.engines):
        first = i == 0
        fwd, upd, n = bench(
            path,
            strategy,
            batch,
            args.micro,
            args.steps,
            profile=args.profile and first,
            host=args.host and first,
        )
        flops = model_flops(n, tokens, args.layers, args.hidden, args.seq)
        print(
            f"{strategy}: MFU update {flops / upd / 1e12 / peak:.1%}, "
            f"log-probs {flops / 3 / fwd / 1e12 / peak:.1%} of the measured matmul rate"
        )
        results[strategy] = (fwd, upd)
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
