"""Actor step time: the single-process torch engine vs FSDP2 on N gloo ranks (CPU).

Each rank gets ``--samples`` samples of ``--prompt + --response`` tokens, so N ranks do
N× the single process's work per step (weak scaling): the ideal FSDP2 time equals the
single-process time, and the difference is the cost of sharding (all-gather /
reduce-scatter over gloo) plus contention for the machine's cores.

    python benchmarks/fsdp2_step.py                      # tiny model, 2 ranks
    python benchmarks/fsdp2_step.py --model smollm2 --prompt 96 --response 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from temper.cluster.process_group import spawn_ranks
from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def make_batch(n: int, prompt: int, response: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ones = torch.ones(n, prompt, dtype=torch.long)
    rmask = torch.ones(n, response, dtype=torch.long)
    return Batch.from_dict(
        {
            "prompt_ids": torch.randint(0, 200, (n, prompt), generator=g),
            "prompt_mask": ones,
            "response_ids": torch.randint(0, 200, (n, response), generator=g),
            "response_mask": rmask,
            "advantages": torch.randn(n, 1, generator=g).expand(n, response).contiguous(),
            "old_log_probs": torch.zeros(n, response),
        }
    )


def make_actor(path: str, strategy: str, micro: int) -> Actor:
    cfg = ActorConfig(micro_batch_size_per_device=micro, optim=OptimConfig(lr=1e-6))
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=micro),
    )
    return Actor(cfg, build_engine(strategy, spec))


def time_steps(actor: Actor, batch: Batch, steps: int) -> list[float]:
    actor.update(batch)  # warm-up (allocations, first all-gathers)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        actor.update(batch)
        times.append(time.perf_counter() - start)
    return times


def _rank(rank: int, world: int, path: str, args: argparse.Namespace) -> list[float]:
    batch = make_batch(args.samples, args.prompt, args.response, seed=rank)
    return time_steps(make_actor(path, "fsdp2", args.micro), batch, args.steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny, smollm2, or a model directory")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--samples", type=int, default=4, help="samples per rank")
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--response", type=int, default=32)
    p.add_argument("--micro", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = p.parse_args()
    if args.model == "tiny":
        from temper.utils.tiny import make_tiny_model

        path = str(make_tiny_model("/tmp/temper-bench-tiny"))
    elif args.model == "smollm2":
        from temper.utils.smollm2 import ensure_smollm2

        path = str(ensure_smollm2())
    else:
        path = args.model
    torch.set_num_threads(args.threads)
    single = time_steps(
        make_actor(path, "torch", args.micro),
        make_batch(args.samples, args.prompt, args.response, seed=0),
        args.steps,
    )
    per_rank = spawn_ranks(_rank, args.ranks, path, args, threads=args.threads)
    fsdp = [max(ts) for ts in zip(*per_rank)]  # a step ends when its slowest rank does
    tokens = args.samples * (args.prompt + args.response)
    print(f"model {args.model}: {tokens} tokens per process per step, {args.threads} thread(s)")
    print(f"torch  1 process : {statistics.median(single):.3f} s/step")
    print(
        f"fsdp2  {args.ranks} ranks   : {statistics.median(fsdp):.3f} s/step "
        f"({args.ranks}× the samples)"
    )


if __name__ == "__main__":
    main()
