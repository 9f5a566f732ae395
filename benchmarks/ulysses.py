"""Ulysses sequence parallelism: one long sequence on one process vs split over SP ranks.

What Ulysses buys is memory: each rank of a group holds ``1/sp`` of every sequence's
activations, so a sequence too long for one device fits on ``sp``. Measured per actor
update on one sample of ``--prompt + --response`` tokens:

* **saved-for-backward bytes per rank**: the activations autograd keeps between the
  forward and the backward (every tensor saved by an op, counted once per storage;
  parameters and their views are left out — they are the same in every layout). On
  GPU also ``torch.cuda.max_memory_allocated``.
* **step time** of the update, single process vs the group (the group's ranks share
  this machine's cores; the all-to-alls and the output gather are extra work).

    python benchmarks/ulysses.py                          # tiny model, SP 2, 2048 tokens
    python benchmarks/ulysses.py --model smollm2 --prompt 512 --response 512
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from temper.cluster.process_group import spawn_ranks
from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def make_batch(prompt: int, response: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    return Batch.from_dict(
        {
            "prompt_ids": torch.randint(0, 200, (1, prompt), generator=g),
            "prompt_mask": torch.ones(1, prompt, dtype=torch.long),
            "response_ids": torch.randint(0, 200, (1, response), generator=g),
            "response_mask": torch.ones(1, response, dtype=torch.long),
            "advantages": torch.ones(1, response),
            "old_log_probs": torch.zeros(1, response),
        }
    )


def make_actor(path: str, strategy: str, sp: int) -> Actor:
    cfg = ActorConfig(
        micro_batch_size_per_device=1,
        ulysses_sequence_parallel_size=sp,
        optim=OptimConfig(lr=1e-6),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cuda" if torch.cuda.is_available() else "cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
    )
    return Actor(cfg, build_engine(strategy, spec))


def _is_parameter(t: torch.Tensor) -> bool:
    base = t._base if t._base is not None else t
    return base.is_leaf and base.requires_grad


@contextmanager
def saved_bytes(out: list[int]) -> Iterator[None]:
    """Append the bytes of the non-parameter storages autograd saves inside the block."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not _is_parameter(t):
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield
    out.append(sum(seen.values()))


def measure(actor: Actor, batch: Batch, steps: int) -> dict[str, Any]:
    actor.update(batch)  # warm-up
    times, saved = [], []
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        start = time.perf_counter()
        with saved_bytes(saved):
            actor.update(batch)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
    return {"s": statistics.median(times), "saved": max(saved), "peak": peak}


def _rank(rank: int, world: int, path: str, args: argparse.Namespace) -> dict[str, Any]:
    actor = make_actor(path, "fsdp2", world)  # the ranks are one group
    return measure(actor, make_batch(args.prompt, args.response), args.steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny, smollm2, or a model directory")
    p.add_argument("--sp", type=int, default=2, help="ranks per sequence")
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--response", type=int, default=1024)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = p.parse_args()
    if args.model == "tiny":
        from temper.utils.tiny import make_tiny_model

        path = str(make_tiny_model("/tmp/temper-bench-tiny-long", max_position_embeddings=8192))
    elif args.model == "smollm2":
        from temper.utils.smollm2 import ensure_smollm2

        path = str(ensure_smollm2())
    else:
        path = args.model
    torch.set_num_threads(args.threads)
    batch = make_batch(args.prompt, args.response)
    one = measure(make_actor(path, "torch", 1), batch, args.steps)
    ranks = spawn_ranks(_rank, args.sp, path, args, threads=args.threads)
    group = {
        "s": max(r["s"] for r in ranks),
        "saved": max(r["saved"] for r in ranks),
        "peak": max((r["peak"] or 0) for r in ranks) or None,
    }
    tokens = args.prompt + args.response
    print(f"model {args.model}: one sample of {tokens} tokens, {args.threads} thread(s)/process")
    for name, m in (("torch, 1 process     ", one), (f"fsdp2, Ulysses sp={args.sp}", group)):
        peak = f", peak {m['peak'] / 2**20:.1f} MiB" if m["peak"] else ""
        print(f"{name}: {m['s']:.3f} s/step, saved {m['saved'] / 2**20:.1f} MiB/rank{peak}")
    print(
        f"ratio sp/1: time {group['s'] / one['s']:.2f}x, "
        f"saved activations {group['saved'] / one['saved']:.2f}x per rank"
    )


if __name__ == "__main__":
    main()
