"""Per-sample cost of the code reward's sandbox: bwrap vs an unsandboxed subprocess.

Scores the same samples (a stdin/stdout problem with ``--tests`` test cases, one
correct solution per sample) with ``reward.sandbox: bwrap`` and ``reward.sandbox: none``
(a plain subprocess with the same rlimits), alternating the two per round so that drift
of this shared machine hits both alike. Prints the median seconds per sample of each
and the ratio bwrap / none (one process, one run); also the same for a bare
``python -c pass`` execution, which isolates the start-up cost of one sandbox.

    python benchmarks/sandbox_overhead.py                  # 5 rounds × 8 samples × 3 tests
    python benchmarks/sandbox_overhead.py --rounds 10 --tests 10
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from temper.rewards.functions.code import compute_score
from temper.rewards.sandbox import get_sandbox
from temper.rewards.sandbox_api import Limits

SOLUTION = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def tests(n: int) -> dict[str, list[str]]:
    return {
        "inputs": [f"{i} {i * 7}\n" for i in range(n)],
        "outputs": [f"{i * 8}\n" for i in range(n)],
    }


def per_sample(name: str, samples: int, truth: dict, limits: Limits) -> float:
    box = {"name": name, "limits": dataclasses.asdict(limits), "sample_timeout_s": 60.0}
    start = time.perf_counter()
    for _ in range(samples):
        assert compute_score("codecontests", SOLUTION, truth, sandbox=box)["score"] == 1.0
    return (time.perf_counter() - start) / samples


def per_exec(name: str, runs: int, limits: Limits) -> float:
    box = get_sandbox(name)
    start = time.perf_counter()
    for _ in range(runs):
        res = box.run_program("python", {"main.py": "pass"}, "main.py", b"", limits)
        assert res.ok, res.stderr
    return (time.perf_counter() - start) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--samples", type=int, default=8, help="samples per round and sandbox")
    parser.add_argument("--tests", type=int, default=3, help="test cases per sample")
    args = parser.parse_args()
    limits = Limits(wall_time_s=10.0, cpu_time_s=10.0)
    truth = tests(args.tests)
    for name in ("bwrap", "none"):  # warm-up: probe, page cache
        per_sample(name, 2, truth, limits)
    times: dict[str, list[float]] = {"bwrap": [], "none": []}
    execs: dict[str, list[float]] = {"bwrap": [], "none": []}
    for _ in range(args.rounds):
        for name in ("bwrap", "none"):
            times[name].append(per_sample(name, args.samples, truth, limits))
            execs[name].append(per_exec(name, args.samples, limits))
    ratios = [b / n for b, n in zip(times["bwrap"], times["none"])]
    exec_ratios = [b / n for b, n in zip(execs["bwrap"], execs["none"])]
    print(f"{args.rounds} rounds × {args.samples} samples × {args.tests} tests (medians)")
    print(
        f"  per sample  bwrap {statistics.median(times['bwrap']) * 1e3:7.1f} ms   "
        f"none {statistics.median(times['none']) * 1e3:7.1f} ms   "
        f"ratio {statistics.median(ratios):.2f}"
    )
    print(
        f"  per exec    bwrap {statistics.median(execs['bwrap']) * 1e3:7.1f} ms   "
        f"none {statistics.median(execs['none']) * 1e3:7.1f} ms   "
        f"ratio {statistics.median(exec_ratios):.2f}"
    )


if __name__ == "__main__":
    main()
