"""RL step time of one config with each rollout engine (``hf`` vs ``vllm``), in one run.

Trains the config (the quickstart by default) for ``--steps`` steps once per engine,
one after the other in this process, with validation and checkpoints off, and prints the
median of each ``timing/*_s`` phase over the steps after the first (warm-up) and the
step time of each engine as a ratio to ``hf``.

    python benchmarks/step_engines.py                          # quickstart, 6 steps each
    python benchmarks/step_engines.py examples/grpo_native.yaml --steps 4
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from ray_overhead import PHASES, phase_medians  # same folder

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="examples/quickstart.yaml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--engines", default="hf,vllm")
    args = parser.parse_args()
    from temper.pipelines import run_pipeline
    from temper.pipelines.catalog import load_config

    root = Path(tempfile.mkdtemp(prefix="temper-step-engines-"))
    results = {}
    for engine in args.engines.split(","):
        overrides = [
            f"rollout.engine={engine}",
            f"experiment.max_steps={args.steps}",
            f"experiment.output_dir={root / engine}",
            "experiment.val_before_train=false",
            "experiment.test_freq=0",
            "experiment.save_freq=-1",
            "experiment.trackers=[jsonl]",
        ]
        loaded = load_config(args.config, overrides)
        run_pipeline(loaded.config)
        results[engine] = phase_medians(root / engine)
    base = next(iter(results.values()))["step"]
    print(f"\n{args.config}: median seconds per phase over steps 2..{args.steps}")
    print("phase".ljust(14) + "".join(n.rjust(10) for n in results))
    for p in PHASES:
        cells = [f"{results[n][p]:.3f}" if p in results[n] else "-" for n in results]
        print(p.ljust(14) + "".join(c.rjust(10) for c in cells))
    ratios = "".join(f"{r['step'] / base:.2f}x".rjust(10) for r in results.values())
    print(f"{'step / ' + next(iter(results))}".ljust(14) + ratios)


if __name__ == "__main__":
    main()
