"""Per-step cost of ``sokoban_sandbox`` (one sandboxed run per step) vs in-process ``sokoban``.

Plays the same episodes (seeds, random moves) with the in-process env, the sandboxed env
in bubblewrap (``reward.sandbox: bwrap``) and in a plain subprocess (``none``),
alternating them per round so that drift of this shared machine hits all alike. Prints
the median seconds per step (a reset counts as a step) of each and the ratios to the
in-process env (one process, one run). Then a group's reset (``--group`` envs dealt one
new seed, as the env manager deals a group): the reply of the first reset reused by the
others (``sokoban_sandbox._RESETS``) against every env running its own.

    python benchmarks/sokoban_sandbox.py                 # 5 rounds × 4 episodes × 10 steps
    python benchmarks/sokoban_sandbox.py --rounds 10
    python benchmarks/sokoban_sandbox.py --group 16      # a group of 16 envs per seed
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from temper.envs import TextEnv, make_env, sokoban_sandbox
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


def group_reset(group: int, seed: int, reuse: bool) -> float:
    """Seconds for ``group`` bubblewrap envs to reset to ``seed`` (a seed not dealt
    before); ``reuse``: the first reset's reply serves the others."""
    envs = [build("bwrap") for _ in range(group)]
    start = time.perf_counter()
    for env in envs:
        if not reuse:
            sokoban_sandbox._RESETS.clear()
        env.reset(seed)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=4, help="episodes per round and env")
    parser.add_argument("--steps", type=int, default=10, help="steps per episode at most")
    parser.add_argument("--group", type=int, default=8, help="envs of a group (one seed)")
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
    shared, own = [], []
    for r in range(args.rounds):  # seeds no round above dealt
        shared.append(group_reset(args.group, 10**6 + 2 * r, reuse=True))
        own.append(group_reset(args.group, 10**6 + 2 * r + 1, reuse=False))
    a, b = statistics.median(shared), statistics.median(own)
    print(
        f"a group of {args.group} resets (bwrap): {a * 1e3:.0f} ms with the first reply reused, "
        f"{b * 1e3:.0f} ms each env running its own (×{b / a:.1f})"
    )


if __name__ == "__main__":
    main()
