"""On-policy distillation as a direct gradient term (GKD, ``distill.direct_gradient``) end
to end on tiny models: the student samples, the teacher scores its tokens (or gives its
top-k log-probs), and the divergence is a loss term of the actor's update."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from temper.pipelines import run_pipeline as train

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_distill_runs as opd  # a sibling test module: its teacher, config

teacher_dir = opd.teacher_dir  # the fixture: a confident tiny teacher on the same tokenizer
distill_config, read_metrics = opd.distill_config, opd.read_metrics


def held_out_sequences(student_dir: Path, teacher: Path) -> list[tuple[torch.Tensor, int]]:
    """Responses the initial student samples to held-out prompts, fixed once: the KLs
    before and after training are measured on the same tokens (no resampling noise)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from temper.data.tasks import make_task_rows

    tok = AutoTokenizer.from_pretrained(teacher)
    student = AutoModelForCausalLM.from_pretrained(student_dir).eval()
    torch.manual_seed(0)
    out = []
    for row in make_task_rows("arithmetic", 16, seed=99):  # not the training rows (seed 3)
        text = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        ids = tok(text, return_tensors="pt").input_ids
        with torch.no_grad():
            seq = student.generate(
                ids, do_sample=True, max_new_tokens=16, pad_token_id=tok.pad_token_id
            )
        out.append((seq, ids.shape[1]))
    return out


def held_out_kls(
    student_dir: Path, teacher_path: Path, sequences: list[tuple[torch.Tensor, int]]
) -> tuple[float, float]:
    """Token means of the exact KL(π_student ‖ π_teacher) and KL(π_teacher ‖ π_student)
    over the vocabulary at the response positions of ``sequences``."""
    from transformers import AutoModelForCausalLM

    student = AutoModelForCausalLM.from_pretrained(student_dir).eval()
    teacher = AutoModelForCausalLM.from_pretrained(teacher_path).eval()
    reverse = forward = 0.0
    count = 0
    for seq, n in sequences:
        with torch.no_grad():
            s = torch.log_softmax(student(seq).logits[0, n - 1 : -1], -1)
            t = torch.log_softmax(teacher(seq).logits[0, n - 1 : -1], -1)
        reverse += float((s.exp() * (s - t)).sum())
        forward += float((t.exp() * (t - s)).sum())
        count += seq.shape[1] - n
    return reverse / count, forward / count


def moved(before: Path, after: Path) -> bool:
    a = load_file(str(before / "model.safetensors"))
    b = load_file(str(after / "model.safetensors"))
    return all(not torch.equal(a[k], b[k]) for k in a if k in b)


def gkd_config(tmp_path: Path, student: Path, teacher: Path, **distill):
    return distill_config(
        tmp_path,
        student,
        teacher,
        experiment={"max_steps": 2},
        distill={
            "teachers": {"teacher": {"model_path": str(teacher)}},
            "direct_gradient": True,
            **distill,
        },
    )


@pytest.mark.slow
def test_topk_forward_kl_trains_towards_the_teacher(
    tmp_path, tiny_model_dir, teacher_dir, monkeypatch
):
    """Pure GKD with the teacher's top-8 (verl forward_kl_topk): 2 steps; the advantage is
    0, every parameter moves, the held-out KLs (both directions) do not rise."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    sequences = held_out_sequences(tiny_model_dir, teacher_dir)
    before = held_out_kls(tiny_model_dir, teacher_dir, sequences)
    train(gkd_config(tmp_path, tiny_model_dir, teacher_dir, topk=8, log_prob_min_clamp=-10.0))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train/advantage_abs_max"] == 0.0  # pure: the PG term vanishes
        assert r["actor/loss"] == pytest.approx(r["actor/distill_loss"], rel=1e-5)
        assert r["actor/distill_loss"] > 0.0
    final = tmp_path / "run" / "final" / "actor"
    assert moved(tiny_model_dir, final)
    after = held_out_kls(final, teacher_dir, sequences)
    print(f"held-out KL (reverse, forward): {before} -> {after}")
    assert after[0] <= before[0]
    assert after[1] < before[1]


@pytest.mark.slow
def test_sampled_k3_term_is_added_to_the_task_loss(
    tmp_path, tiny_model_dir, teacher_dir, monkeypatch
):
    """GKD with task rewards (verl use_task_rewards): the k3 estimate on the sampled
    tokens is a loss term beside the REINFORCE loss, and not part of the advantage. With
    one mini-batch a step the update's policy is the sampling one, so the term equals
    the teachers' signal computed from the old log-probs."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    train(gkd_config(tmp_path, tiny_model_dir, teacher_dir, kl_penalty="k3", pure=False))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["actor/distill_loss"] == pytest.approx(r["distill/penalty_mean"], rel=1e-4)
        assert r["actor/loss"] == pytest.approx(r["actor/pg_loss"] + r["actor/distill_loss"])
    assert moved(tiny_model_dir, tmp_path / "run" / "final" / "actor")


@pytest.mark.slow
def test_verl_gkd_command_line_trains(tmp_path, tiny_model_dir, teacher_dir, monkeypatch):
    """verl's GRPO example (2026-01) with verl 0.9's GKD arguments (those of
    ``run_qwen3_8b_megatron.sh``: forward_kl_topk as a direct gradient without task
    rewards, clamps; top-8 here; the example's KL loss off, as verl drops it without
    task rewards): 2 steps on CPU, the term is the whole loss."""
    from test_upstream_train import _verl
    from upstream_command import script_command

    from temper.cli.main import main

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(
        "verl-2026-01-b178a3c/examples/grpo_trainer/run_qwen2_5_7b_grpo_discrete_prof_npu.sh"
    )
    out = tmp_path / "verl-gkd"
    loss = "+distillation.distillation_loss"
    distill = [
        "+distillation.enabled=True",
        f"+distillation.teacher_models.teacher_model.model_path={teacher_dir}",
        f"{loss}.loss_mode=forward_kl_topk",
        f"{loss}.topk=8",
        f"{loss}.use_policy_gradient=False",
        f"{loss}.use_task_rewards=False",
        f"{loss}.loss_max_clamp=10.0",
        f"{loss}.log_prob_min_clamp=-10.0",
        "actor_rollout_ref.actor.use_kl_loss=False",
    ]
    assert main(["train", str(config), *overrides, *_verl(tiny_model_dir, out), *distill]) == 0
    rows = [r for r in read_metrics(out) if "actor/distill_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train/advantage_abs_max"] == 0.0
        assert r["actor/loss"] == pytest.approx(r["actor/distill_loss"], rel=1e-5)
