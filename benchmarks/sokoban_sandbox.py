"""Per-step cost of ``sokoban_sandbox`` (one sandboxed run per step) vs in-process ``sokoban``.

Plays the same episodes (seeds, random moves) with the in-process env, the sandboxed env
in bubblewrap (``reward.sandbox: bwrap``) and in a plain subprocess (``none``),
alternating them per round so that drift of this shared machine hits all alike. Prints
the median seconds per step (a reset counts as a step) of each and the ratios to the
in-process env (one process, one run).

    python benchmarks/sokoban_sandbox.py                 # 5 rounds × 4 episodes × 10 steps
    python benchmarks/sokoban_sandbox.py --rounds 10
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from temper.envs import TextEnv, make_env
from temper.rewards.sandbox_api import SandboxChoice

MOVES = ["Up", "Down", "Left", "Right"]


def build(kind: str) -> TextEnv:
    if kind == "in-process":
        return make_env("sokoban")
    env = make_env("sokoban_sandbox")
    env.use_sandbox(SandboxChoice(kind))
    return env


def per_step(env: TextEnv, episodes: int, steps: int, seed: int) -> float:
    rng = random.Random(seed)
    calls, start = 0, time.perf_counter()
    for episode in range(episodes):
        env.reset(seed + episode)
        calls += 1
        for _ in range(steps):
            _, _, terminated, truncated, info = env.step(rng.choice(MOVES))
            calls += 1
            assert "env_error" not in info, info
            if terminated or truncated:
                break
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=4, help="episodes per round and env")
    parser.add_argument("--steps", type=int, default=10, help="steps per episode at most")
    args = parser.parse_args()
    kinds = ("in-process", "bwrap", "none")
    envs = {k: build(k) for k in kinds}
    for env in envs.values():  # warm-up: the sandbox probe, the page cache
        per_step(env, 1, 2, 0)
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for k in kinds:
            times[k].append(per_step(envs[k], args.episodes, args.steps, 1000 * r))
    base = statistics.median(times["in-process"])
    for k in kinds:
        t = statistics.median(times[k])
        print(f"{k:>10}: {t * 1e3:8.3f} ms/step  ×{t / base:8.1f} in-process")


if __name__ == "__main__":
    main()
