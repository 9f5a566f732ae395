"""The user's own parts, selected by config: a training engine and a rollout engine
registered from this test module, and a pipeline defined in a module outside ``temper/``
named by its dotted path — each trains, through ``temper train``. And ``temper train``
derives the run's plan once."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from temper.cli.main import main
from temper.config.catalog import ONE_PROCESS
from temper.rollout.registry import ROLLOUT_ENGINES, register_rollout_engine
from temper.training.registry import ENGINES, register_engine
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

BUILT: dict[str, int] = {"engine": 0, "rollout": 0}


class CountingTorchEngine(TorchEngine):
    """The torch engine, counted: a stand-in for a researcher's own engine."""

    def __init__(self, spec: EngineSpec) -> None:
        BUILT["engine"] += 1
        super().__init__(spec)


def counting_hf(rollout_cfg: Any, model_cfg: Any, **kwargs: Any) -> Any:
    BUILT["rollout"] += 1
    return ROLLOUT_ENGINES.get("hf").build(rollout_cfg, model_cfg, **kwargs)


@pytest.fixture
def plugins(monkeypatch):
    """The two registrations, into copies of the registries (gone after the test)."""
    import temper.rollout.registry as rollout_registry
    import temper.training.registry as training_registry

    monkeypatch.setattr(training_registry, "ENGINES", ENGINES.copy())
    monkeypatch.setattr(rollout_registry, "ROLLOUT_ENGINES", ROLLOUT_ENGINES.copy())
    register_engine("counting_torch", CountingTorchEngine, needs=frozenset({ONE_PROCESS}))
    register_rollout_engine("counting_hf", counting_hf)


REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))
"""


def write_config(tmp_path: Path, model_dir: Path, **sections: dict[str, Any]) -> Path:
    reward = tmp_path / "digits.py"
    reward.write_text(REWARD)
    data: dict[str, Any] = {
        "experiment": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 2,
            "seed": 1,
            "trackers": ["jsonl"],
        },
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": ["task:arithmetic?n=32&seed=3"],
            "train_batch_size": 2,
            "max_prompt_length": 96,
        },
        "rollout": {"n": 2, "response_length": 8},
        "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 4},
        "reward": {
            "function": "custom",
            "custom_function": {"path": str(reward)},
            "num_workers": 1,
        },
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def steps(tmp_path: Path) -> list[int]:
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


@pytest.mark.slow
def test_registered_engines_are_selected_by_config(tmp_path, tiny_model_dir, plugins):
    before = dict(BUILT)
    path = write_config(
        tmp_path,
        tiny_model_dir,
        actor={"strategy": "counting_torch", "mini_batch_size": 4},
        rollout={"engine": "counting_hf", "n": 2, "response_length": 8},
    )
    assert main(["check", str(path)]) == 0
    assert main(["train", str(path)]) == 0
    assert steps(tmp_path) == [1, 2]
    assert BUILT["engine"] == before["engine"] + 1 and BUILT["rollout"] == before["rollout"] + 1


PIPELINE = '''
"""A researcher's pipeline: the RLVR producer, with one more metric of its own."""

from temper.pipelines import Pipeline
from temper.pipelines.rlvr import PIPELINE as RLVR, RLVRProducer


class MyProducer(RLVRProducer):
    def produce(self, step, timer):
        batch, metrics = super().produce(step, timer)
        metrics["mine/samples"] = float(len(batch))
        return batch, metrics


MY_PIPELINE = Pipeline(build=MyProducer, check=RLVR.check, preflight=RLVR.preflight)
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A package outside ``temper/`` on the path, as ``pip install -e`` would put it."""
    package = tmp_path / "userpkg" / "my_research"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "pipelines.py").write_text(textwrap.dedent(PIPELINE))
    monkeypatch.syspath_prepend(str(tmp_path / "userpkg"))
    yield "my_research.pipelines"
    for name in [m for m in sys.modules if m.startswith("my_research")]:
        del sys.modules[name]


@pytest.mark.slow
def test_a_pipeline_from_the_users_module_trains_by_dotted_path(
    tmp_path, tiny_model_dir, user_module, capsys
):
    path = write_config(tmp_path, tiny_model_dir)
    text = yaml.safe_load(path.read_text())
    text["pipeline"] = f"{user_module}:MY_PIPELINE"
    path.write_text(yaml.safe_dump(text))
    assert main(["check", str(path), "--config-only"]) == 0
    assert main(["train", str(path)]) == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["mine/samples"] == 4.0 for r in rows)


def test_a_typo_in_the_pipeline_path_fails_at_check_in_one_line(
    tmp_path, tiny_model_dir, user_module, capsys
):
    path = write_config(tmp_path, tiny_model_dir)
    for wrong, says in (
        (f"{user_module}:MY_PIPELNE", "defines no 'MY_PIPELNE' (did you mean 'MY_PIPELINE'?)"),
        ("my_researh.pipelines:MY_PIPELINE", "cannot import my_researh.pipelines"),
        (f"{tmp_path}/nope.py:X", "does not exist"),
        ("rlvrr", "unknown pipeline 'rlvrr' (did you mean 'rlvr'?)"),
    ):
        assert main(["check", str(path), f"pipeline={wrong}", "--config-only"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("config error: pipeline: ") and says in err, err
        assert "\n" not in err


@pytest.mark.slow
def test_train_derives_the_plan_once(tmp_path, tiny_model_dir, monkeypatch):
    """One plan per ``temper train``: validation derives it; pre-flight, placement, the
    roles and the LR schedules read it."""
    import temper.config.validate as validate

    calls = []
    real = validate.derive

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(validate, "derive", counting)
    path = write_config(tmp_path, tiny_model_dir)
    assert main(["train", str(path)]) == 0
    assert steps(tmp_path) == [1, 2]
    assert len(calls) == 1


def test_derive_has_one_caller():
    """Nothing derives the plan but validation (the count above sees every call)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "temper"
    callers = sorted(
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "derive"
    )
    assert callers == ["config/validate.py"], callers


@pytest.mark.slow
def test_the_custom_pipeline_example_trains_and_resumes_its_curriculum(
    tmp_path, tiny_model_dir, monkeypatch
):
    """examples/custom_pipeline.yaml (a producer in examples/custom_pipeline.py, named by
    file path) trains on the tiny model; its curriculum state is in the checkpoint."""
    import torch

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the path is repo-relative
    run = tmp_path / "run"
    over = [
        f"model.path={tiny_model_dir}",
        "rollout.engine=hf",
        "data.max_prompt_length=160",  # the tiny tokenizer spells most characters alone
        f"experiment.output_dir={run}",
        "experiment.max_steps=2",
        "experiment.val_before_train=false",
        "experiment.test_freq=2",
        "experiment.save_freq=1",
    ]
    assert main(["train", "examples/custom_pipeline.yaml", *over]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["curriculum/level"] == 1.0
    assert "val/accuracy" in rows[-1] and "val/level3/accuracy" in rows[-1]
    state = torch.load(
        run / "checkpoints" / "global_step_2" / "trainer_state.pt", weights_only=True
    )
    assert state["producer"]["level"] == 1 and len(state["producer"]["recent"]) == 2
