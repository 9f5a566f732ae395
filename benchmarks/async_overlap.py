"""Seconds per RL step, synchronous vs the rollout k policy versions ahead, in one run.

Trains one config (``examples/arithmetic_hard.yaml`` by default: SmolLM2-135M, GRPO,
32 responses a step) for ``--steps`` steps once per schedule in ``--ks``, each as its own
``temper train`` process, with validation and checkpoints off. A schedule is ``k`` (the
fixed schedule, k versions ahead; 0 = synchronous), ``sk`` (streaming groups, k versions
at most, ``async_training.mode=streaming``; ``--chunk`` prompts a generation call) or
``skpN`` (streaming with partial rollout, N-token segments). It prints per schedule
the median step time over the steps after ``--warmup``, its ratio to the first, and the
median overlap (``perf/rollout_overlap``: the rollout busy during the trainer's work,
over the shorter of the two) and idle times (``timing/rollout_wait_s``: the trainer
waiting; ``timing/rollout_idle_s``: the rollout waiting).

Placement (``--backend``):

* ``ray``: two CPU slots, the trainer on slot 0 and the rollout engine on slot 1
  (``resources.actor_train [0]``, ``actor_infer [1]``), each worker one thread;
* ``local``: one process, the rollout on a worker thread beside the trainer (the
  Hugging Face engine holds its own copy of the weights when k > 0).

    python benchmarks/async_overlap.py                            # ray, 0,1,2,s2, 8 steps
    python benchmarks/async_overlap.py --backend local --ks 0,1 --steps 6
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PLACEMENT = {
    "ray": [
        "resources.backend=ray",
        "resources.devices_per_node=2",
        "resources.actor_train=[0]",
        "resources.actor_infer=[1]",
        "resources.ray.num_cpus=2",
    ],
    "local": ["resources.backend=local"],
}


def schedule(label: str, chunk: int) -> list[str]:
    """The ``async_training`` overrides of a schedule label (module docstring)."""
    match = re.fullmatch(r"(s?)(\d+)(?:p(\d+))?", label)
    if match is None:
        sys.exit(f"bad schedule {label!r}: use k, sk or skpN (e.g. 0, 1, s2, s2p32)")
    streaming, k, segment = match.group(1), int(match.group(2)), match.group(3)
    out = [f"async_training.staleness={k}"]
    if streaming:
        out += ["async_training.mode=streaming", f"async_training.stream_chunk={chunk}"]
    if segment:
        out.append(f"async_training.partial_rollout_segment={segment}")
    return out


def run(
    config: str, label: str, chunk: int, backend: str, steps: int, engine: str, out: Path
) -> list[dict]:
    overrides = [
        *schedule(label, chunk),
        f"experiment.max_steps={steps}",
        f"experiment.output_dir={out}",
        "experiment.val_before_train=false",
        "experiment.test_freq=0",
        "experiment.save_freq=-1",
        "experiment.save_every_minutes=null",
        "experiment.trackers=[jsonl]",
        *([f"rollout.engine={engine}"] if engine else []),
        *PLACEMENT[backend],
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1" if backend == "ray" else os.environ.get("OMP_NUM_THREADS", "2"),
    }
    cmd = [sys.executable, "-m", "temper", "train", config, *overrides]
    log = out.with_suffix(".log")
    start = time.monotonic()
    with log.open("w") as fh:
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        sys.exit(f"{label}: temper train exited {rc}; see {log}")
    print(f"{label}: {steps} steps in {time.monotonic() - start:.0f} s (log {log})", flush=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def median(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="examples/arithmetic_hard.yaml")
    parser.add_argument("--backend", choices=sorted(PLACEMENT), default="ray")
    parser.add_argument(
        "--ks", default="0,1,2,s2", help="schedules: k (fixed), sk (streaming), skpN (partial)"
    )
    parser.add_argument("--chunk", type=int, default=0, help="streaming prompts per call")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out")
    parser.add_argument(
        "--engine", default="", help="rollout.engine override (default: the config's)"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the runs' directories (checkpoints: GBs)"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="temper-async-"))
    table = {}
    for k in args.ks.split(","):
        try:
            rows = run(
                args.config, k, args.chunk, args.backend, args.steps, args.engine, root / f"k{k}"
            )
        finally:  # each run writes checkpoints; a few schedules fill a disk
            if not args.keep:
                shutil.rmtree(root / f"k{k}", ignore_errors=True)
        kept = [r for r in rows if r["step"] > args.warmup]
        table[k] = {
            "step_s": median(kept, "timing/step_s"),
            "overlap": median(kept, "perf/rollout_overlap"),
            "trainer_wait_s": median(kept, "timing/rollout_wait_s"),
            "rollout_idle_s": median(kept, "timing/rollout_idle_s"),
            "score": statistics.mean(r["train/score_mean"] for r in rows),
        }
    base = next(iter(table.values()))["step_s"]
    print(
        f"\n{args.config}, backend {args.backend}: medians over steps {args.warmup + 1}..{args.steps}"
    )
    print(
        f"{'k':>5} {'s/step':>8} {'ratio':>7} {'overlap':>8} {'trainer wait s':>15} {'rollout idle s':>15} {'score':>7}"
    )
    for k, t in table.items():
        print(
            f"{k:>5} {t['step_s']:>8.2f} {t['step_s'] / base:>6.2f}x {t['overlap']:>8.2f} "
            f"{t['trainer_wait_s']:>15.2f} {t['rollout_idle_s']:>15.2f} {t['score']:>7.3f}"
        )


if __name__ == "__main__":
    main()
