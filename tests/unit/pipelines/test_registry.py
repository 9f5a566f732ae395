"""``pipeline:`` names a registered pipeline or the user's own code (a module path or a
file): resolved to a ``Pipeline`` record, or refused in one line at ``temper check``."""

from __future__ import annotations

import pytest

from temper.config.errors import ConfigError
from temper.pipelines import PIPELINES, Pipeline, resolve_pipeline
from temper.pipelines.agentic import episode_groups
from temper.pipelines.dpo import dpo_step
from temper.pipelines.prime import prime_step
from temper.pipelines.rl_step import rl_step
from temper.pipelines.sft import sft_step
from temper.pipelines.spin import spin_step

PRODUCER = """
class Echo:
    headline = "val/x"
    total_steps = 1
    def __init__(self, ctx): self.ctx = ctx
    def produce(self, step, timer): ...
    def validate(self, step): ...
    def dump_rows(self, batch, step): return []
    def state_dict(self): return {}
    def load_state_dict(self, state): pass
    def close(self): pass


class Half:
    def produce(self, step, timer): ...

NOT_A_PIPELINE = 3
"""


def test_builtin_records_declare_their_needs():
    assert PIPELINES.primary_names() == [
        "rlvr",
        "agentic",
        "agentic_rollout",
        "sft",
        "dpo",
        "spin",
        "prime",
        "generate",
        "eval",
        "rlvr_rollout",
        "reward_model",
        "distill",
    ]
    agentic = resolve_pipeline("agentic")
    assert agentic.sections == frozenset({"agentic", "distill", "async_training"})
    assert agentic.step_shape is episode_groups
    rlvr = resolve_pipeline("rlvr")
    assert (
        rlvr.sections == frozenset({"distill", "async_training"})
        and rlvr.step is rl_step
        and agentic.step is rl_step
    )
    assert agentic.uses == frozenset({"rollout", "reference", "critic"})
    assert rlvr.uses == agentic.uses | {"reward_model"}  # scores with reward.model
    sft = resolve_pipeline("sft")
    assert sft.step is sft_step and sft.uses == frozenset() and sft.curve == "train/loss"
    assert sft.sections == frozenset({"sft"})
    dpo = resolve_pipeline("dpo")
    assert dpo.step is dpo_step and dpo.uses == frozenset({"reference", "reference_always"})
    assert dpo.sections == frozenset({"dpo"}) and dpo.curve == "train/rewards/margin"
    spin = resolve_pipeline("spin")  # online DPO: generates, scores against a reference
    assert spin.step is spin_step and spin.sections == frozenset({"spin"})
    assert spin.uses == frozenset({"rollout", "reference", "reference_always", "reward_model"})
    assert spin.curve == "train/score_mean"
    prime = resolve_pipeline("prime")  # RL with an implicit PRM trained alongside
    assert prime.step is prime_step and prime.sections == frozenset({"prime"})
    assert prime.uses == frozenset({"rollout", "reference", "prm", "reward_model"})
    assert prime.curve == "train/score_mean"
    distill = resolve_pipeline("distill")  # offline: SFT rows and the teacher's logits
    assert distill.uses == frozenset() and distill.curve == "train/distill_loss"
    assert distill.sections == frozenset({"sft", "kd", "distill"})
    for name in ("rlvr", "agentic", "sft", "dpo", "spin", "prime", "distill"):
        assert resolve_pipeline(name).command == "train" and resolve_pipeline(name).main is None
    generate, evaluate = resolve_pipeline("generate"), resolve_pipeline("eval")
    assert generate.command == "generate" and generate.uses == {"rollout", "no_training"}
    assert evaluate.command == "eval" and evaluate.uses == {"no_policy", "no_training"}
    assert generate.sections == {"generate"} and evaluate.sections == {"evaluate"}
    rm = resolve_pipeline("reward_model")
    assert rm.uses == frozenset({"score_head"}) and rm.sections == frozenset({"rm"})
    assert rm.curve == "train/loss" and rm.step_shape is dpo.step_shape


def test_a_producer_class_in_a_file_gets_the_default_hooks(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(PRODUCER)
    record = resolve_pipeline(f"{path}:Echo")
    assert isinstance(record, Pipeline) and record.build.__name__ == "Echo"
    assert record.sections == frozenset() and record.step is rl_step
    assert record.curve == "train/score_mean"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("Half", "a class without the producer methods validate, dump_rows, state_dict"),
        ("NOT_A_PIPELINE", "is a int, neither a Pipeline record nor a producer class"),
        ("Ech", "defines no 'Ech' (did you mean 'Echo'?)"),
    ],
)
def test_what_is_not_a_pipeline_is_refused_in_one_line(tmp_path, name, says):
    path = tmp_path / "mine.py"
    path.write_text(PRODUCER)
    with pytest.raises(ConfigError) as err:
        resolve_pipeline(f"{path}:{name}")
    assert err.value.key == "pipeline" and says in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_a_file_that_raises_on_import_is_a_config_error(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match=r"pipeline: importing '.*broken.py' raised RuntimeError"):
        resolve_pipeline(f"{path}:X")


def test_a_module_in_the_working_directory_is_found(tmp_path, monkeypatch):
    package = tmp_path / "cwd_pipelines_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(PRODUCER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    record = resolve_pipeline("cwd_pipelines_pkg.mod:Echo")
    assert record.build.__name__ == "Echo"
