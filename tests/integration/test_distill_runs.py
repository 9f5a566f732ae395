"""On-policy distillation end to end on tiny models: the student (the tiny test model)
samples, a teacher (another tiny model on the same tokenizer) scores its tokens, and the
student's reverse KL to the teacher on held-out prompts falls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from temper.cli.main import main
from temper.pipelines import run_pipeline as train
from temper.pipelines.catalog import build_config
from temper.utils.tiny import make_tiny_model


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """Another tiny model on the same tokenizer, made confident: its final norm's weight
    ×4 scales its logits, so it prefers a few tokens where the random student is close
    to uniform — a teacher whose distribution is far from the student's."""
    from transformers import AutoModelForCausalLM

    out = make_tiny_model(tmp_path_factory.mktemp("teacher"), hidden_size=32, seed=7)
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        model.model.norm.weight.mul_(4.0)
    model.save_pretrained(out)
    return out


def distill_config(tmp_path, student, teacher, **over):
    cfg = {
        "experiment": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 40,
            "seed": 1,
            "trackers": ["jsonl"],
            "device": "cpu",
        },
        "model": {"path": str(student)},
        "data": {
            "train_files": ["task:arithmetic?n=64&seed=3"],
            "train_batch_size": 8,
            "max_prompt_length": 96,
        },
        "rollout": {"n": 4, "response_length": 16, "temperature": 1.0},
        "actor": {
            "mini_batch_size": 32,
            "micro_batch_size_per_device": 16,
            "optim": {"lr": 2e-3, "weight_decay": 0.0},
        },
        "algorithm": {"adv_estimator": "reinforce"},
        "reward": {"num_workers": 0, "timeout_s": None},
        "distill": {"teachers": {"teacher": {"model_path": str(teacher)}}},
    }
    for section, values in over.items():
        cfg.setdefault(section, {}).update(values)
    return build_config(cfg)


def held_out_reverse_kl(student_dir, teacher_dir, seed: int = 0) -> float:
    """Mean over sampled response tokens of the exact KL(π_student ‖ π_teacher) over the
    vocabulary, on held-out prompts, with responses sampled from the student."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from temper.data.tasks import make_task_rows

    tok = AutoTokenizer.from_pretrained(teacher_dir)
    student = AutoModelForCausalLM.from_pretrained(student_dir).eval()
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    torch.manual_seed(seed)
    total, count = 0.0, 0
    for row in make_task_rows("arithmetic", 16, seed=99):  # not the training rows (seed 3)
        text = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            out = student.generate(
                ids, do_sample=True, max_new_tokens=16, pad_token_id=tok.pad_token_id
            )
            n = ids.shape[1]
            s = torch.log_softmax(student(out).logits[0, n - 1 : -1], -1)
            t = torch.log_softmax(teacher(out).logits[0, n - 1 : -1], -1)
        total += float((s.exp() * (s - t)).sum())
        count += out.shape[1] - n
    return total / count


def read_metrics(path):
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_student_reverse_kl_to_teacher_falls(tmp_path, tiny_model_dir, teacher_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    before = held_out_reverse_kl(tiny_model_dir, teacher_dir)
    train(distill_config(tmp_path, tiny_model_dir, teacher_dir))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 41))
    for key in ("distill/reverse_kl", "distill/teacher/reverse_kl", "timing/teacher_s"):
        assert key in rows[0], key
    after = held_out_reverse_kl(tmp_path / "run" / "final" / "actor", teacher_dir)
    print(f"held-out reverse KL: {before:.4f} -> {after:.4f}")
    first = sum(r["distill/reverse_kl"] for r in rows[:5]) / 5
    last = sum(r["distill/reverse_kl"] for r in rows[-5:]) / 5
    print(f"training reverse KL (mean of 5 steps): {first:.4f} -> {last:.4f}")
    assert after < 0.8 * before
    assert last < first


UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
OPD = UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen3-8B-onpolicy-distill-megatron"


def _roll_rows(path: Path, n: int, seed: int, tags: tuple[str, ...] = ("math_dapo",)) -> Path:
    """``task:arithmetic`` prompts in the file's columns: ``messages`` (a JSON message
    list, as ROLL's data holds it), ``tag`` (``tags`` in turn: the math reward's
    ``math_dapo`` by default), ground truth and (for the code reward) no test cases."""
    from temper.data.tasks import make_task_rows

    rows = make_task_rows("arithmetic", n, seed=seed)
    lines = [
        json.dumps(
            {
                "messages": json.dumps(r["prompt"]),
                "tag": tags[i % len(tags)],
                "ground_truth": r["reward_model"]["ground_truth"],
                "test_cases": "[]",
            }
        )
        for i, r in enumerate(rows)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_roll_onpolicy_distill_file_trains(tmp_path, tiny_model_dir, teacher_dir, monkeypatch):
    """ROLL's on-policy distillation example (2026-08: Qwen3-8B from Qwen3-32B, megatron
    on 16 GPUs): 2 steps on this CPU, its student's batch arithmetic and pure OPD."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "roll-opd"
    train_rows = _roll_rows(tmp_path / "train.jsonl", 64, 5)
    val_rows = _roll_rows(tmp_path / "val.jsonl", 8, 6)
    roles = ("student_train", "student_infer", "teacher")
    overrides = [
        f"pretrain={tiny_model_dir}",  # model
        f"reward_pretrain={tiny_model_dir}",
        f"teacher.model_args.model_name_or_path={teacher_dir}",
        f"student_train.data_args.file_name=[{train_rows}]",  # data
        f"validation.data_args.file_name=[{val_rows}]",
        "rollout_batch_size=8",  # 8 prompts a step instead of 16
        "max_steps=2",  # length
        "prompt_length=96",
        "response_length=8",
        "num_gpus_per_node=1",  # device
        *[f"{role}.device_mapping=list(range(0,1))" for role in roles],
        "student_train.strategy_args.strategy_name=hf_train",
        "~student_train.strategy_args.strategy_config",
        "student_infer.strategy_args.strategy_name=hf_infer",
        "~student_infer.strategy_args.strategy_config",
        "teacher.strategy_args.strategy_name=hf_infer",
        "~teacher.strategy_args.strategy_config",
        "track_with=stdout",
        f"output_dir={out}",  # outputs
        f"checkpoint_config.output_dir={out / 'ckpt'}",
        f"rollout_dump_dir={out / 'rollout_dump'}",  # the file's is relative to the cwd
    ]
    assert main(["train", str(OPD / "onpolicy_distill_config.yaml"), *overrides]) == 0
    rows = [r for r in read_metrics(out) if "distill/reverse_kl" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # pure OPD: the advantage is −opd_kl_coef (1.0) × the per-token KL, nothing else
        assert r["train/advantage_mean"] == pytest.approx(-r["distill/penalty_mean"], abs=1e-6)
        assert r["perf/samples"] == 32  # 8 prompts × num_return_sequences_in_group 4
    assert (out / "final" / "actor" / "model.safetensors").is_file()


@pytest.mark.slow
def test_verl_distillation_command_line_trains(tmp_path, tiny_model_dir, teacher_dir, monkeypatch):
    """verl's GRPO example (2026-01) with verl 0.9's distillation arguments (those of
    ``run_qwen3_8b_fsdp.sh``: k1 policy-gradient OPD without task rewards, clamps; the
    example's KL loss off, as verl drops it without task rewards): 2 steps on CPU."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_upstream_train import _verl
    from upstream_command import script_command

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(
        "verl-2026-01-b178a3c/examples/grpo_trainer/run_qwen2_5_7b_grpo_discrete_prof_npu.sh"
    )
    out = tmp_path / "verl-opd"
    loss = "+distillation.distillation_loss"
    distill = [
        "+distillation.enabled=True",
        f"+distillation.teacher_models.teacher_model.model_path={teacher_dir}",
        f"{loss}.loss_mode=k1",
        f"{loss}.use_policy_gradient=True",
        f"{loss}.use_task_rewards=False",
        f"{loss}.loss_max_clamp=10.0",
        f"{loss}.log_prob_min_clamp=-10.0",
        "actor_rollout_ref.actor.use_kl_loss=False",
    ]
    assert main(["train", str(config), *overrides, *_verl(tiny_model_dir, out), *distill]) == 0
    rows = [r for r in read_metrics(out) if "distill/reverse_kl" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train/advantage_mean"] == pytest.approx(-r["distill/penalty_mean"], abs=1e-6)


@pytest.mark.slow
def test_roll_multi_teacher_file_routes_each_sample_by_tag(
    tmp_path, tiny_model_dir, teacher_dir, monkeypatch
):
    """ROLL's multi-teacher example (math to teacher_32B, code to teacher_14B): 2 steps on
    CPU with half the prompts tagged each way. teacher_14B is given the student's own
    weights, so the KL on the samples routed to it is 0 and on teacher_32B's it is not:
    each sample was scored by the teacher its tag names."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "roll-mopd"
    train_rows = _roll_rows(tmp_path / "train.jsonl", 64, 5, ("math_dapo", "KodCode"))
    val_rows = _roll_rows(tmp_path / "val.jsonl", 8, 6)
    teachers = {"teacher_32B": teacher_dir, "teacher_14B": tiny_model_dir}
    roles = ["student_train", "student_infer", *(f"teacher.{t}" for t in teachers)]
    overrides = [
        f"pretrain={tiny_model_dir}",  # model
        f"reward_pretrain={tiny_model_dir}",
        *(f"teacher.{t}.model_args.model_name_or_path={p}" for t, p in teachers.items()),
        f"student_train.data_args.file_name=[{train_rows}]",  # data
        f"validation.data_args.file_name=[{val_rows}]",
        "rollout_batch_size=4",  # 4 prompts a step instead of 16
        "max_steps=2",  # length
        "prompt_length=96",
        "response_length=8",
        "num_gpus_per_node=1",  # device
        *[f"{role}.device_mapping=list(range(0,1))" for role in roles],
        "student_train.strategy_args.strategy_name=hf_train",
        "student_infer.strategy_args.strategy_name=hf_infer",
        *(f"teacher.{t}.strategy_args.strategy_name=hf_infer" for t in teachers),
        *(f"~{role}.strategy_args.strategy_config" for role in roles if role != "student_infer"),
        "~student_infer.strategy_args.strategy_config",
        "track_with=stdout",
        f"output_dir={out}",  # outputs
        f"checkpoint_config.output_dir={out / 'ckpt'}",
        f"rollout_dump_dir={out / 'rollout_dump'}",  # the file's is relative to the cwd
    ]
    config = OPD / "multi_teacher_onpolicy_distill_config.yaml"
    assert main(["train", str(config), *overrides]) == 0
    rows = [r for r in read_metrics(out) if "distill/reverse_kl" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        routed = r["distill/teacher_32B/samples"] + r["distill/teacher_14B/samples"]
        assert routed == r["perf/samples"] == 32  # 4 prompts × 8: each sample to one teacher
        assert abs(r["distill/teacher_14B/reverse_kl"]) < 1e-3  # the student's own weights
        assert r["distill/teacher_32B/reverse_kl"] > 1e-2
