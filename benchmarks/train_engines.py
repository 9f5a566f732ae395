"""One mini-batch update of the same model and data on each training engine (CPU, gloo).

Engines: ``torch`` (1 process), ``fsdp2`` (N ranks), DeepSpeed ZeRO-2, ZeRO-3 and ZeRO-3
with optimizer + parameter offload (N ranks). The mini-batch is the same for all: the
single process takes it whole, N ranks take 1/N each (strong scaling). Each engine runs
in fresh processes (forked from this one, so every rank starts from the same imported
state), builds its engine, makes one warm-up update, then ``--steps`` timed ones.

Reported per engine, as ratios to ``torch`` from the same run (the machine is shared):

* step time: median over the timed updates of the slowest rank's time;
* peak RSS per rank: the largest rank's peak resident memory (``ru_maxrss``);
* RSS growth per rank: peak minus the rank's resident memory before it built the engine
  (model, optimizer state, gradients, activations, communication buffers). DeepSpeed is
  imported before the ranks fork, so its modules (~0.2 GB per process, a fixed cost
  shown in the ``import deepspeed`` line) are in every engine's starting memory alike.

On a CPU, ZeRO offload moves nothing off a device (the weights already live in host
memory), so its cost here is DeepSpeed's extra host buffers and copies, not a saving.

    python benchmarks/train_engines.py                    # a 19M-parameter random Llama
    python benchmarks/train_engines.py --model smollm2 --prompt 64 --response 64
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from typing import Any

import torch
from fsdp2_step import make_batch  # next to this file

from temper.cluster.process_group import spawn_ranks
from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.roles.actor import Actor
from temper.training.deepspeed_engine import import_deepspeed
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# the zero_optimization sections of ROLL's deepspeed_zero2.yaml / deepspeed_zero3.yaml
# (2025-06), as a ROLL user runs them ("auto" buckets sized from hidden_size)
ZERO2 = {
    "stage": 2,
    "allgather_partitions": True,
    "allgather_bucket_size": 1.0e9,
    "overlap_comm": True,
    "reduce_scatter": True,
    "reduce_bucket_size": 5.0e8,
    "contiguous_gradients": True,
}
ZERO3 = {
    "stage": 3,
    "overlap_comm": True,
    "contiguous_gradients": True,
    "sub_group_size": 1.0e9,
    "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": 1.0e9,
    "stage3_max_reuse_distance": 1.0e9,
}
OFFLOAD = {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}
ENGINES: dict[str, tuple[str, dict[str, Any]]] = {
    "torch": ("torch", {}),
    "fsdp2": ("fsdp2", {}),
    "deepspeed zero2": ("deepspeed", {"zero_optimization": ZERO2}),
    "deepspeed zero3": ("deepspeed", {"zero_optimization": ZERO3}),
    "deepspeed zero3+offload": ("deepspeed", {"zero_optimization": {**ZERO3, **OFFLOAD}}),
}


def rss_mb() -> float:
    """This process's resident memory now (MB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _rank(rank: int, world: int, path: str, name: str, args: argparse.Namespace) -> dict:
    strategy, ds = ENGINES[name]
    start_rss = rss_mb()
    cfg = ActorConfig(
        strategy=strategy,  # type: ignore[arg-type]
        micro_batch_size_per_device=args.micro,
        deepspeed=ds,
        optim=OptimConfig(lr=1e-6),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=args.micro),
    )
    actor = Actor(cfg, build_engine(strategy, spec))
    whole = make_batch(args.samples, args.prompt, args.response, seed=0)
    n = args.samples // world
    mine = whole.slice(rank * n, (rank + 1) * n)
    actor.update(mine)  # warm-up: allocations, first gathers
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        actor.update(mine)
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"times": times, "peak": peak, "growth": peak - start_rss}


def measure(path: str, name: str, args: argparse.Namespace) -> dict[str, float]:
    world = 1 if name == "torch" else args.ranks
    ranks = spawn_ranks(_rank, world, path, name, args, threads=args.threads)
    step = statistics.median(max(ts) for ts in zip(*(r["times"] for r in ranks)))
    return {
        "ranks": world,
        "step": step,
        "peak": max(r["peak"] for r in ranks),
        "growth": max(r["growth"] for r in ranks),
    }


def model_path(name: str) -> str:
    if name == "smollm2":
        from temper.utils.smollm2 import ensure_smollm2

        return str(ensure_smollm2())
    if name == "medium":
        from temper.utils.tiny import make_tiny_model

        return str(
            make_tiny_model(
                "/tmp/temper-bench-medium", hidden_size=512, num_layers=6, intermediate_size=1376
            )
        )
    return name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="medium", help="medium (19M random Llama), smollm2, or a dir")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--samples", type=int, default=8, help="samples in the mini-batch")
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--response", type=int, default=64)
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--engines", nargs="*", default=list(ENGINES), choices=list(ENGINES))
    args = p.parse_args()
    if args.samples % args.ranks:
        p.error("--samples must be a multiple of --ranks")
    path = model_path(args.model)
    torch.set_num_threads(args.threads)
    before = rss_mb()
    import_deepspeed(torch.device("cpu"))
    imported = rss_mb() - before
    results = {name: measure(path, name, args) for name in args.engines}
    base = results.get("torch") or next(iter(results.values()))
    tokens = args.samples * (args.prompt + args.response)
    print(
        f"model {args.model}: one update of {args.samples} samples ({tokens} tokens), "
        f"micro-batch {args.micro}, {args.threads} thread(s) per process"
    )
    print(f"import deepspeed: +{imported:.0f} MB resident in this process (each rank inherits it)")
    head = f"{'engine':<24} {'ranks':>5} {'step s':>7} {'×':>5} {'peak RSS MB':>11} {'×':>5}"
    print(head + f" {'RSS growth MB':>13} {'×':>5}")
    for name, r in results.items():
        print(
            f"{name:<24} {r['ranks']:>5} {r['step']:>7.3f} {r['step'] / base['step']:>5.2f} "
            f"{r['peak']:>11.0f} {r['peak'] / base['peak']:>5.2f} "
            f"{r['growth']:>13.0f} {r['growth'] / base['growth']:>5.2f}"
        )


if __name__ == "__main__":
    main()
