"""Step-time breakdown of one GRPO config: the local backend vs Ray worker groups.

The same model, data, batch and seed run three ways, in one process after another:

* ``local``: everything in this process (torch engine; HF rollout shares the module);
* ``ray-1``: the actor (torch engine) and the rollout engine as two Ray worker processes
  colocated on one slot — the same math plus Ray's costs: remote calls, moving batches
  through the object store, and a weight sync every step (the rollout holds a copy);
* ``ray-2``: the actor on 2 FSDP2 ranks, the rollout on a slot of its own.

Printed: the median of each ``timing/*_s`` phase over the steps after the first (warm-up),
and each backend's step time as a ratio to ``local``. Every process (driver, workers) uses
``--threads`` torch threads, so the layouts differ only in where the work runs. On a 2-core machine ``ray-2``
over-subscribes the cores (3 worker processes + the driver), so it measures overhead, not
speed-up.

    python benchmarks/ray_overhead.py                  # tiny model, 4 steps each
    python benchmarks/ray_overhead.py --hidden 512 --layers 8 --steps 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PHASES = ("rollout", "reward", "old_log_probs", "ref", "adv", "train", "weight_sync", "step")
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return (sum(map(ord, solution_str)) % 101) / 100
"""


def config(root: Path, model: Path, steps: int, name: str, resources: dict, strategy: str):
    from temper.pipelines.catalog import build_config

    (root / "digits.py").write_text(REWARD)
    return build_config(
        {
            "experiment": {
                "output_dir": str(root / name),
                "max_steps": steps,
                "seed": 0,
                "device": "cpu",
                "trackers": ["jsonl"],
                "save_freq": -1,
            },
            "model": {"path": str(model)},
            "data": {
                "train_files": ["task:arithmetic?n=64&seed=3"],
                "train_batch_size": 4,
                "max_prompt_length": 96,
            },
            "rollout": {"engine": "hf", "n": 4, "response_length": 32},
            "actor": {
                "strategy": strategy,
                "mini_batch_size": 16,
                "micro_batch_size_per_device": 4,
                "use_kl_loss": True,
                "optim": {"lr": 1e-4},
            },
            "reference": {"strategy": strategy},
            "algorithm": {"adv_estimator": "grpo"},
            "reward": {
                "function": "custom",
                "custom_function": {"path": str(root / "digits.py")},
                "num_workers": 1,
            },
            "resources": resources,
        }
    )


def phase_medians(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    return {
        p: statistics.median(r[f"timing/{p}_s"] for r in rows)
        for p in PHASES
        if all(f"timing/{p}_s" in r for r in rows)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of the driver and of each worker"
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)  # the same per process in every layout

    import ray

    from temper.pipelines import run_pipeline as train
    from temper.utils.tiny import make_tiny_model

    root = Path(tempfile.mkdtemp(prefix="temper-ray-bench-"))
    model = make_tiny_model(
        root / "model",
        hidden_size=args.hidden,
        num_layers=args.layers,
        intermediate_size=4 * args.hidden,
    )
    ray_res = {
        "num_cpus": 3,
        "rpc_timeout": 600,
        "system_envs": {"TEMPER_WORKER_THREADS": str(args.threads)},
    }
    layouts = {
        "local": ({"backend": "local"}, "torch"),
        "ray-1": ({"backend": "ray", "devices_per_node": 1, "ray": ray_res}, "torch"),
        "ray-2": (
            {
                "backend": "ray",
                "devices_per_node": 3,
                "actor_train": [0, 1],
                "actor_infer": [2],
                "reference": [0, 1],
                "ray": ray_res,
            },
            "fsdp2",
        ),
    }
    results = {}
    for name, (resources, strategy) in layouts.items():
        train(config(root, model, args.steps, name, resources, strategy))
        results[name] = phase_medians(root / name)
        if ray.is_initialized():
            ray.shutdown()
    base = results["local"]["step"]
    print(
        f"\nmedian seconds per phase over steps 2..{args.steps} (hidden {args.hidden}, "
        f"{args.layers} layers; 16 samples × ≤128 tokens per step)"
    )
    print("phase".ljust(14) + "".join(n.rjust(10) for n in results))
    for p in PHASES:
        cells = [f"{results[n][p]:.3f}" if p in results[n] else "-" for n in results]
        print(p.ljust(14) + "".join(c.rjust(10) for c in cells))
    print(
        "step / local".ljust(14)
        + "".join(f"{r['step'] / base:.2f}x".rjust(10) for r in results.values())
    )


if __name__ == "__main__":
    main()
