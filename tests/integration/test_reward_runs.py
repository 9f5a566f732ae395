"""Rewards in real runs: failing rewards stop the run; an LLM judge (SmolLM2) scores a
3-step run; ROLL's upstream RLVR file trains 2 steps with its five reward domains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from temper.cli.main import main
from temper.pipelines import run_pipeline
from temper.pipelines.catalog import load_config

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "upstream"  # in-repo copies
ROLL_RLVR = REFERENCE / "roll-v0/qwen2.5-7B-rlvr_megatron/rlvr_config.yaml"


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _native(tmp_path: Path, model: str, data: Path, **reward) -> Path:
    cfg = {
        "experiment": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 3,
            "trackers": ["jsonl"],
        },
        "model": {"path": model},
        "data": {"train_files": [str(data)], "train_batch_size": 2, "max_prompt_length": 64},
        "rollout": {"n": 2, "response_length": 6},
        "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 4},
        "algorithm": {"adv_estimator": "grpo"},
        "reward": {"num_workers": 1, **reward},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_rewards_failing_on_most_samples_stop_the_run(tmp_path, tiny_model_dir, capsys):
    """A reward function that raises on every sample (something the pre-flight cannot see:
    it imports the function, it does not score): the run stops after
    reward.max_failed_steps (2) such steps, with one line naming source and reason."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} + 1 = ?"}) + "\n" for i in range(8)))
    fn = tmp_path / "broken_reward.py"
    fn.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    raise KeyError('answer_key')\n"
    )
    path = _native(tmp_path, str(tiny_model_dir), data, custom_function={"path": str(fn)})
    assert main(["train", str(path)]) == 1
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert line.startswith("error: rewards failed on 4/4 samples in 2 training steps in a row")
    assert "data_source 'unknown'" in line and "KeyError" in line
    assert "reward.max_failed_steps=2" in line and "Traceback" not in err
    assert [r["step"] for r in metrics(tmp_path / "run")] == [1]  # step 2 never finished


@pytest.mark.slow
def test_a_judge_scored_run_trains_3_steps_with_smollm2(tmp_path, tiny_model_dir):
    data = tmp_path / "qa.jsonl"
    rows = [("What is 2 + 3?", "5"), ("Capital of France?", "Paris")] * 2
    data.write_text(
        "".join(json.dumps({"prompt": q, "data_source": "qa", "answer": a}) + "\n" for q, a in rows)
    )
    judge = {"model_path": "smollm2:135m-instruct", "max_new_tokens": 4}
    path = _native(tmp_path, str(tiny_model_dir), data, function="llm_judge", judge=judge)
    loaded = load_config(path, [])
    run_pipeline(loaded.config)
    steps = [r for r in metrics(tmp_path / "run") if "train/score_mean" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["train/reward_failures"] == 0 for r in steps)  # every verdict parsed
    assert all(0.0 <= r["train/score_mean"] <= 1.0 for r in steps)


# ROLL's five domains, rows shaped like ROLL's own data files (messages, tag, ground truth,
# and for code: case_type / test_cases / test_case_function)
def _roll_rows() -> dict[str, list[dict]]:
    def row(tag: str, question: str, truth: str, **extra: str) -> dict:
        messages = json.dumps([{"role": "user", "content": question}])
        base = {"id": "0", "tag": tag, "messages": messages, "ground_truth": truth}
        return {**base, "case_type": "", "test_cases": "", "test_case_function": "", **extra}

    test = json.dumps([{"assert_code": "def test_add():\n    assert add(1, 2) == 3\n"}])
    return {
        "code": [row("KodCode", "Write add(a, b).", "", case_type="pytest", test_cases=test)],
        "judge": [row("RLVR", "Capital of France?", "Paris")],
        "math": [row("deepmath_103k", "What is 2 + 2?", "4")],
        "ifeval": [
            row("ifeval", "Answer in lowercase.", json.dumps({"func_name": "validate_lowercase"}))
        ],
        "crossthinkqa": [row("crossthinkqa", "Pick B. (A) x (B) y", "B")],
    }


@pytest.mark.slow
@pytest.mark.skipif(not ROLL_RLVR.exists(), reason="reference files not beside the checkout")
def test_roll_upstream_rlvr_trains_2_steps_with_its_five_domains(tmp_path, tiny_model_dir):
    files = []
    for name, rows in _roll_rows().items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows * 4))
        files.append(path.name)
    domains = ("math_rule", "code_sandbox", "llm_judge", "crossthinkqa", "ifeval")
    overrides = [
        # model
        f"pretrain={tiny_model_dir}",
        f"reward_pretrain={tiny_model_dir}",
        "rewards.llm_judge.model_args.model_name_or_path=smollm2:135m-instruct",
        "rewards.llm_judge.model_args.dtype=fp32",
        "actor_train.model_args.flash_attn=sdpa",  # no FlashAttention on CPU
        "rewards.llm_judge.generating_args.max_new_tokens=4",
        # data
        f"actor_train.data_args.dataset_dir={tmp_path}",
        f"actor_train.data_args.file_name=[{','.join(files)}]",
        *[f"actor_train.data_args.domain_interleave_probs.{d}=0.2" for d in domains],
        "~validation",
        # lengths and batch
        "prompt_length=64",
        "response_length=8",
        "rollout_batch_size=10",
        "num_return_sequences_in_group=2",
        "actor_train.training_args.per_device_train_batch_size=2",
        "actor_train.training_args.gradient_accumulation_steps=2",
        "max_steps=2",
        f"output_dir={tmp_path / 'roll'}",
        # the file's checkpoint and tensorboard dirs are absolute paths of its authors'
        f"checkpoint_config.output_dir={tmp_path / 'roll' / 'checkpoints'}",
        f"tracker_kwargs.log_dir={tmp_path / 'roll' / 'tensorboard'}",
        # the tiny policy's groups all score alike, so ROLL's difficulty_mask drops every
        # one and the update crashes on an empty batch (issue 15 makes that a skipped
        # step); until then the mask is off here
        "difficulty_mask=false",
        # devices and engines: one CPU process
        "num_gpus_per_node=1",
        "actor_train.device_mapping=[0]",
        "actor_infer.device_mapping=[0]",
        "reference.device_mapping=[0]",
        "rewards.llm_judge.device_mapping=[0]",
        "actor_train.strategy_args.strategy_name=hf_train",
        "~actor_train.strategy_args.strategy_config",
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "reference.strategy_args.strategy_name=hf_infer",
        "~reference.strategy_args.strategy_config",
    ]
    loaded = load_config(ROLL_RLVR, overrides)
    assert sorted(r.function for r in loaded.config.reward.routes.values()) == sorted(
        ["code", "crossthinkqa", "ifeval", "llm_judge", "math"]
    )
    run_pipeline(loaded.config)
    steps = [
        r for r in metrics(Path(loaded.config.experiment.output_dir)) if "train/score_mean" in r
    ]
    assert [r["step"] for r in steps] == [1, 2]
    # rule rewards never fail on these rows; SmolLM2 (4 tokens) may give a verdict with
    # neither YES nor NO, which is recorded as that sample's failure
    assert all(r["train/reward_failures"] <= 4 for r in steps)
    scored = {k.split("/")[1] for r in steps for k in r if k.startswith("reward/")}
    assert scored == {"KodCode", "RLVR", "deepmath_103k", "ifeval", "crossthinkqa"}


@pytest.mark.slow
@pytest.mark.ray
def test_the_judge_is_its_own_ray_role(tmp_path, tiny_model_dir, capsys):
    """On the Ray backend the judge runs in its own worker group, on resources.reward."""
    pytest.importorskip("ray")
    data = tmp_path / "qa.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": "2 + 3?", "data_source": "qa", "answer": "5"}) + "\n"
            for _ in range(4)
        )
    )
    judge = {"model_path": "smollm2:135m-instruct", "max_new_tokens": 4}
    path = _native(tmp_path, str(tiny_model_dir), data, function="llm_judge", judge=judge)
    overrides = [
        "experiment.max_steps=2",
        "experiment.device=cpu",
        "rollout.engine=hf",
        "resources.backend=ray",
        "resources.devices_per_node=2",
        "resources.actor_train=[0]",
        "resources.reward=[1]",
        "resources.ray.num_cpus=4",
    ]
    loaded = load_config(path, overrides)
    run_pipeline(loaded.config)
    assert "ray: judge ranks 0..0 up" in capsys.readouterr().out
    steps = [r for r in metrics(tmp_path / "run") if "train/score_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["train/reward_failures"] == 0 for r in steps)
