"""``temper generate`` and ``temper eval`` on CPU.

Generation: verl's generation command lines (an ``examples/generation`` script, the r1
recipe's, which asks for 8 responses a prompt, and verl 0.9's ``main_generation_server``
line on ``ppo_trainer.yaml``) run on the tiny test model with only
these overrides — model, data (a small parquet of chat prompts), length (prompt and
response), device (one CPU, the ``hf`` engine) and output; every other setting
(sampling, batch size, responses per prompt) is the file's. The output parquet holds
each input row's columns, ``n_samples`` responses and their log-probs; a row without a
prompt is reported by file and row and left out.

Evaluation: verl's ``evaluation.yaml`` with a custom reward function file, and a native
config scored by the built-in gsm8k reward, give mean@n and pass@k computed by hand; bad
rows (no responses, a response that is not a string) are reported by file and row.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from upstream_command import UPSTREAM, script_command  # tests/ is on the path

from temper.cli.main import main
from temper.pipelines import run_command
from temper.pipelines.catalog import load_config
from temper.pipelines.preflight import preflight

pytestmark = pytest.mark.slow


def _prompts(path: Path) -> Path:
    """Four chat prompts with verl's columns, and one row without a prompt (row 2)."""
    rows = [
        {
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "data_source": "gsm8k",
            "reward_model": {"ground_truth": str(a + b), "style": "rule"},
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate([(1, 2), (3, 4), (5, 6), (7, 8), (9, 1)])
    ]
    rows[2]["prompt"] = None
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


GENERATION_SCRIPTS = [
    # (script, command index, n_samples the file asks for, whether it asks for log-probs:
    # verl 2026-01's generation.yaml sets rollout.calculate_log_probs false)
    ("verl-2025-06-38d9a88/examples/generation/run_deepseek_v2_lite_math.sh", 0, 1, True),
    ("verl-2025-06-38d9a88/recipe/r1/run_r1_distill_qwen.sh", 0, 8, True),
    ("verl-2026-01-b178a3c/examples/generation/run_deepseek_v2_lite_math.sh", 0, 1, False),
]


@pytest.mark.parametrize(("script", "index", "n", "log_probs"), GENERATION_SCRIPTS)
def test_verl_generation_command_line_writes_responses_and_log_probs(
    tmp_path, tiny_model_dir, monkeypatch, caplog, script, index, n, log_probs
):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(script, index)
    prompts = _prompts(tmp_path / "prompts.parquet")
    out = tmp_path / "gen" / "responses.parquet"
    overrides += [
        f"model.path={tiny_model_dir}",  # model
        f"data.path={prompts}",  # data
        "rollout.prompt_length=64",  # length
        "rollout.response_length=8",
        "trainer.n_gpus_per_node=1",  # device
        "trainer.device=cpu",
        "rollout.tensor_model_parallel_size=1",
        "rollout.name=hf",
        f"data.output_path={out}",  # output
    ]
    with caplog.at_level(logging.WARNING, logger="temper.data"):
        assert main(["generate", str(config), *overrides]) == 0
    assert f"{prompts}:row 2: column 'prompt' is null" in caplog.text  # reported, skipped
    rows = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 3, 4]  # the input's order
    for row in rows:
        assert row["data_source"] == "gsm8k" and row["reward_model"]["style"] == "rule"
        assert len(row["responses"]) == n and all(isinstance(t, str) for t in row["responses"])
        if not log_probs:
            assert "response_log_probs" not in row
            continue
        assert len(row["response_log_probs"]) == n
        for lp in row["response_log_probs"]:
            assert 1 <= len(lp) <= 8  # one per sampled token, at most response_length
            assert all(v <= 0.0 and math.isfinite(v) for v in lp)


SERVER_SCRIPT = "verl-2026-08-1dda039/examples/generation/run_deepseek_llm_7b.sh"


def test_verl_09_generation_server_command_line_writes_n_responses(
    tmp_path, tiny_model_dir, monkeypatch, caplog
):
    """verl 0.9's ``main_generation_server`` line (``ppo_trainer.yaml``) under ``temper
    generate``: 3 responses a prompt (the script's own ``N_SAMPLES``, as a user runs it),
    sampled with the file's temperature, top-k and top-p; the output is the server's:
    each input row and its ``responses``, no log-probs."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(SERVER_SCRIPT, env={"N_SAMPLES": "3"})
    assert config.name == "ppo_trainer.yaml"
    prompts = _prompts(tmp_path / "prompts.parquet")
    out = tmp_path / "gen" / "responses.parquet"
    overrides += [
        f"actor_rollout_ref.model.path={tiny_model_dir}",  # model
        f"data.train_files={prompts}",  # data
        "actor_rollout_ref.rollout.prompt_length=64",  # length
        "actor_rollout_ref.rollout.response_length=8",
        "trainer.n_gpus_per_node=1",  # device
        "trainer.device=cpu",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=hf",
        f"data.output_path={out}",  # output
    ]
    with caplog.at_level(logging.WARNING, logger="temper.data"):
        assert main(["generate", str(config), *overrides]) == 0
    assert f"{prompts}:row 2: column 'prompt' is null" in caplog.text  # reported, skipped
    rows = pq.read_table(out).to_pylist()
    assert [r["extra_info"]["index"] for r in rows] == [0, 1, 3, 4]  # the input's order
    for row in rows:
        assert set(row) == {"prompt", "data_source", "reward_model", "extra_info", "responses"}
        assert len(row["responses"]) == 3 and all(isinstance(t, str) for t in row["responses"])
    assert any(len(set(r["responses"])) > 1 for r in rows)  # sampled, not greedy copies


def _score_file(tmp_path: Path) -> Path:
    """A custom reward function in verl's signature: 1 for the exact answer, else 0."""
    path = tmp_path / "exact.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0 if solution_str.strip() == ground_truth else 0.0\n"
    )
    return path


def test_verl_evaluation_config_gives_pass_at_k_by_hand(tmp_path):
    """Three prompts of two sources, four responses each; correct: a 2/4 and 4/4, b 1/4."""
    rows = [
        {"data_source": "a", "reward_model": {"ground_truth": "x"}, "responses": list("xyxz")},
        {"data_source": "a", "reward_model": {"ground_truth": "y"}, "responses": list("yyyy")},
        {"data_source": "b", "reward_model": {"ground_truth": "q"}, "responses": list("zzqz")},
    ]
    data = tmp_path / "responses.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    config = UPSTREAM / "verl-2025-06-38d9a88/verl/trainer/config/evaluation.yaml"
    overrides = [f"data.path={data}", f"custom_reward_function.path={_score_file(tmp_path)}"]
    loaded = load_config(config, overrides)
    preflight(loaded.config, loaded.plan)
    metrics = run_command(loaded.config, "eval")["metrics"]
    expected = {
        # a: mean of (0.5, 1); pass@2 = (1 − C(2,2)/C(4,2), 1) = (5/6, 1)
        "a/mean@n": 0.75,
        "a/pass@1": 0.75,
        "a/pass@2": (5 / 6 + 1) / 2,
        "a/pass@4": 1.0,
        # b: 1 of 4; pass@2 = 1 − C(3,2)/C(4,2) = 1/2
        "b/mean@n": 0.25,
        "b/pass@1": 0.25,
        "b/pass@2": 0.5,
        "b/pass@4": 1.0,
        "all/mean@n": (0.5 + 1 + 0.25) / 3,
        "all/pass@2": (5 / 6 + 1 + 0.5) / 3,
        "all/prompts": 3.0,
        "all/responses": 12.0,
    }
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value), key
    assert metrics["reward_failures"] == 0.0 and metrics["skipped_rows"] == 0.0


def _eval_config(tmp_path: Path, data: Path, **data_keys: str) -> Path:
    cfg = {
        "pipeline": "eval",
        "data": dict(data_keys),
        "evaluate": {"files": [str(data)], "output_path": str(tmp_path / "metrics.json")},
    }
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_native_eval_scores_with_the_built_in_reward_and_reports_bad_rows(tmp_path, caplog, capsys):
    """gsm8k rows scored by the built-in reward (auto, by data source): "#### 5" is right,
    "#### 4" wrong; a row without responses and one whose response is a number are
    reported by file and line and skipped."""
    lines = [
        {
            "data_source": "gsm8k",
            "reward_model": {"ground_truth": "5"},
            "responses": ["#### 5", "#### 4"],
        },
        {"data_source": "gsm8k", "reward_model": {"ground_truth": "5"}},
        {"data_source": "gsm8k", "reward_model": {"ground_truth": "5"}, "responses": [5, "#### 5"]},
    ]
    data = tmp_path / "responses.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in lines))
    config = _eval_config(tmp_path, data)
    with caplog.at_level(logging.WARNING, logger="temper.data"):
        assert main(["eval", str(config)]) == 0
    assert f"{data}:line 2: no responses: the row has no 'responses' column" in caplog.text
    assert f"{data}:line 3: response 0 of column 'responses' is a int, not a string" in caplog.text
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["gsm8k/mean@n"] == pytest.approx(0.5)
    assert metrics["gsm8k/pass@1"] == pytest.approx(0.5)
    assert metrics["gsm8k/pass@2"] == pytest.approx(1.0)
    assert metrics["skipped_rows"] == 2.0
    table = capsys.readouterr().out
    assert "data source" in table and "gsm8k" in table and "pass@2" in table

    strict = _eval_config(tmp_path, data, bad_rows="error")
    assert main(["eval", str(strict)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:line 2: no responses" in err
