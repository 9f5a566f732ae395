"""Reward calls in worker processes: errors, timeouts and crashes are isolated."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from temper.rewards.executor import RewardCall, RewardExecutor
from temper.rewards.worker import FunctionSpec

TIMEOUT_S = 1.0


def args(text: str, truth: str = "4") -> dict[str, object]:
    return {"data_source": "t", "solution_str": text, "ground_truth": truth, "extra_info": None}


@pytest.fixture(scope="module")
def executor() -> Iterator[RewardExecutor]:
    with RewardExecutor(num_workers=2, preload=()) as ex:
        yield ex


def test_builtin_and_custom_in_workers(executor: RewardExecutor, user_reward_file: Path) -> None:
    custom = FunctionSpec("compute_score", str(user_reward_file), {"bonus": 1.0})
    calls = [
        RewardCall(FunctionSpec("arithmetic"), args("#### 4"), TIMEOUT_S),
        RewardCall(custom, args("4"), TIMEOUT_S),
        RewardCall(custom, args("5"), TIMEOUT_S),
    ]
    results = executor.run(calls)
    assert [r.kind for r in results] == ["ok"] * 3
    assert results[0].value["score"] == 1.0
    assert [r.value["score"] for r in results[1:]] == [2.0, 1.0]


def test_raise_hang_and_crash_are_isolated(
    executor: RewardExecutor, user_reward_file: Path
) -> None:
    path = str(user_reward_file)
    calls = [
        RewardCall(FunctionSpec("raises", path), args("x"), TIMEOUT_S),
        RewardCall(FunctionSpec("sleeps", path), args("slow"), TIMEOUT_S),
        RewardCall(FunctionSpec("sleeps", path), args("fast"), TIMEOUT_S),
        RewardCall(FunctionSpec("dies", path), args("x"), TIMEOUT_S),
        RewardCall(FunctionSpec("arithmetic"), args("#### 4"), TIMEOUT_S),
    ]
    start = time.monotonic()
    results = executor.run(calls)
    elapsed = time.monotonic() - start
    assert [r.kind for r in results] == ["error", "timeout", "ok", "crash", "ok"]
    assert results[0].reason == "RuntimeError: boom x"
    assert results[1].reason.startswith("TimeoutError")
    assert "exit code 3" in results[3].reason
    assert elapsed < TIMEOUT_S + 8  # bounded by the timeout (+ worker respawns), not by the sleep
    # the pool still works after killing and replacing workers
    again = executor.run([RewardCall(FunctionSpec("arithmetic"), args("#### 4"), TIMEOUT_S)] * 3)
    assert [r.kind for r in again] == ["ok"] * 3
    assert executor.restarts >= 2


def test_inline_mode_catches_errors(user_reward_file: Path) -> None:
    ex = RewardExecutor(num_workers=0)
    res = ex.run(
        [
            RewardCall(FunctionSpec("raises", str(user_reward_file)), args("y"), TIMEOUT_S),
            RewardCall(FunctionSpec("gsm8k"), args("#### 4"), TIMEOUT_S),
        ]
    )
    assert [r.kind for r in res] == ["error", "ok"]
    assert ex.worker_pids == []


def test_close_stops_workers() -> None:
    ex = RewardExecutor(num_workers=1, preload=())
    assert ex.run([RewardCall(FunctionSpec("arithmetic"), args("4"), TIMEOUT_S)])[0].kind == "ok"
    procs = [w.process for w in ex._workers]
    ex.close()
    assert all(not p.is_alive() for p in procs)
