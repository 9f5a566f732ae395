"""``temper eval`` on ROLL's RLVR file: ROLL's RLVR rollout pipeline on CPU.

ROLL's shell example ``run_rlvr_rollout_pipeline.sh`` runs ``rlvr_config_8gpus`` through
``start_rlvr_rollout_pipeline.py``; here the same file (ROLL 2026-08) runs through
``temper eval`` with only model, data (a small validation jsonl of two tagged domains),
length, device (one CPU, the ``hf`` engine) and output overrides. The per-tag metrics
ROLL names (``val_correct/<tag>/mean``: the fraction of scores equal to 1) must equal a
hand count of the scores written to ``rollout_scores.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from temper.cli.main import main

pytestmark = pytest.mark.slow

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
ROLL_RLVR = (
    UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus.yaml"
)


def _rows() -> list[dict]:
    def row(tag: str, question: str, truth: str) -> dict:
        messages = json.dumps([{"role": "user", "content": question}])
        return {"id": "0", "tag": tag, "messages": messages, "ground_truth": truth}

    def words(n: int, quantifier: str) -> str:
        return json.dumps(
            {"func_name": "validate_word_constraint", "N": n, "quantifier": quantifier}
        )

    # any 8-token response has at most 100 words and fewer than 50: ifeval scores 1, 0, 1
    return [
        row("deepmath_103k", "What is 2 + 2?", "4"),
        row("deepmath_103k", "What is 3 + 4?", "7"),
        row("ifeval", "Answer in at most 100 words.", words(100, "at most")),
        row("ifeval", "Answer in at least 50 words.", words(50, "at least")),
        row("ifeval", "Say hi in at most 100 words.", words(100, "at most")),
    ]


@pytest.mark.skipif(not ROLL_RLVR.exists(), reason="reference files not beside the checkout")
def test_roll_rlvr_rollout_reports_val_correct_per_tag(tmp_path, tiny_model_dir, capsys):
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    out = tmp_path / "roll"
    overrides = [
        # model
        f"pretrain={tiny_model_dir}",
        f"reward_pretrain={tiny_model_dir}",
        # the file's judge domain (no row of it here) needs a judge with a long context
        "rewards.llm_judge.model_args.model_name_or_path=smollm2:135m-instruct",
        "rewards.llm_judge.model_args.dtype=fp32",
        "rewards.llm_judge.generating_args.max_new_tokens=4",
        # data
        f"validation.data_args.file_name=[{val}]",
        # lengths
        "prompt_length=64",
        "response_length=8",
        # devices and engines: one CPU process, the hf engine
        "num_gpus_per_node=1",
        "actor_train.device_mapping=[0]",
        "actor_infer.device_mapping=[0]",
        "reference.device_mapping=[0]",
        "rewards.llm_judge.device_mapping=[0]",
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "rewards.llm_judge.strategy_args.strategy_name=hf_infer",
        "~rewards.llm_judge.strategy_args.strategy_config",
        # output: the file's directories are its authors'
        f"output_dir={out}",
        f"tracker_kwargs.log_dir={out / 'tensorboard'}",
    ]
    assert main(["check", "--for", "eval", str(ROLL_RLVR), *overrides]) == 0
    assert main(["eval", str(ROLL_RLVR), *overrides]) == 0
    stdout = capsys.readouterr().out
    scored = [json.loads(line) for line in (out / "rollout_scores.jsonl").read_text().splitlines()]
    assert len(scored) == 5  # validation.generating_args.num_return_sequences: 1
    assert {r["data_source"] for r in scored} == {"deepmath_103k", "ifeval"}
    (logged,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged["step"] == 0

    def correct(tag: str | None) -> float:
        rows = [r for r in scored if tag is None or r["data_source"] == tag]
        return sum(r["score"] == 1 for r in rows) / len(rows)

    assert logged["val_correct/all/mean"] == correct(None)
    assert logged["val_correct/deepmath_103k/mean"] == correct("deepmath_103k")
    assert logged["val_correct/ifeval/mean"] == correct("ifeval")
    ifeval = [r["score"] for r in scored if r["data_source"] == "ifeval"]
    assert sorted(ifeval) == [0.0, 1.0, 1.0]  # the word limits above
    assert logged["val_correct/ifeval/mean"] == pytest.approx(2 / 3)
    assert logged["val_correct/all/mean"] == pytest.approx(2 / 5)  # the tiny model's math: 0
    assert logged["val/ifeval/reward_mean"] == pytest.approx(2 / 3)
    assert "time/step_generate" in logged
    assert f"val_correct/all/mean: {correct(None):.4f}" in stdout
    assert "[val step 0 #0] prompt:" in stdout  # ROLL logs its generate examples
    assert not (out / "checkpoints").exists()  # nothing trains, nothing is saved
