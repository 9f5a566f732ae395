"""On-policy distillation end to end on tiny models: the student (the tiny test model)
samples, a teacher (another tiny model on the same tokenizer) scores its tokens, and the
student's reverse KL to the teacher on held-out prompts falls."""

from __future__ import annotations

import json

import pytest
import torch

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
