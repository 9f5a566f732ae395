"""Stop signals end the run at a step boundary; generation dumps carry what they should."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from temper.data.batch import Batch
from temper.pipelines.dumps import dump_generations, generation_rows
from temper.pipelines.signals import Interrupted, StopSignals


def test_first_signal_is_recorded_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.received == signal.SIGTERM and stop.name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_second_sigint_abandons_at_once():
    with pytest.raises(KeyboardInterrupt), StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.name == "SIGINT"
        os.kill(os.getpid(), signal.SIGINT)


def test_second_sigint_abandons_at_once_when_sigint_was_inherited_ignored():
    # a background job of a non-interactive shell (`cmd &` in a script) starts so: there
    # is no previous handler to fall back to, and the second SIGINT must still stop
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(Interrupted, match="a second SIGINT"), StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGINT)
            assert stop.name == "SIGINT"
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # restored as it was
    finally:
        signal.signal(signal.SIGINT, before)


def test_disabled_leaves_the_handlers_alone():
    before = signal.getsignal(signal.SIGINT)
    with StopSignals(enabled=False):
        assert signal.getsignal(signal.SIGINT) is before


def test_generation_rows_and_dump(tmp_path):
    batch = Batch.from_dict(
        {
            "response_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
            "scores": torch.tensor([1.0, 0.0]),
            "advantages": torch.tensor([[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]),
            "token_level_rewards": torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]),
        },
        {
            "uid": ["a", "a"],
            "data_source": ["arith", "arith"],
            "prompt_text": ["1+1=", "1+1="],
            "response_text": ["2", "3"],
            "ground_truth": ["2", "2"],
        },
    )
    rows = generation_rows(batch, step=7)
    assert rows[0] == {
        "step": 7,
        "uid": "a",
        "data_source": "arith",
        "prompt": "1+1=",
        "response": "2",
        "ground_truth": "2",
        "response_length": 2,
        "score": 1.0,
        "reward": 1.0,
        "advantage": 0.5,
    }
    assert rows[1]["advantage"] == -0.5 and rows[1]["response_length"] == 3
    path = dump_generations(tmp_path / "dumps", 7, rows)
    assert path.name == "7.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
