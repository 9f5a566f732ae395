"""The Ray backend: the actor trains on 2 FSDP2 ranks (Ray actor processes, gloo), the
rollout engines run on their own ``actor_infer`` ranks, the driver runs the loop
(rewards, advantages); a run resumes on another data-parallel size; a dead worker stops
the run by name."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from temper.pipelines.catalog import build_config

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.ray]

# differs between any two responses, so GRPO advantages are never all 0
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return (sum(map(ord, solution_str)) % 101) / 100
"""


def ray_config(tmp_path, model_dir, **over):
    return build_config(ray_config_dict(tmp_path, model_dir, **over))


def ray_config_dict(tmp_path, model_dir, **over) -> dict:
    """A tiny GRPO run on the Ray backend; ``over`` updates whole sections' keys."""
    reward_file = tmp_path / "digits.py"
    reward_file.write_text(REWARD)
    cfg = {
        "experiment": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 2,
            "seed": 1,
            "device": "cpu",
            "trackers": ["jsonl"],
        },
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": ["task:arithmetic?n=16&seed=3"],
            "train_batch_size": 2,
            "max_prompt_length": 96,
        },
        "rollout": {"engine": "hf", "n": 2, "response_length": 8},
        "actor": {
            "strategy": "fsdp2",
            "mini_batch_size": 4,
            "micro_batch_size_per_device": 2,
            "optim": {"lr": 3e-3, "weight_decay": 0.0},
        },
        "algorithm": {"adv_estimator": "grpo"},
        "reward": {
            "function": "custom",
            "custom_function": {"path": str(reward_file)},
            "num_workers": 1,
        },
        "resources": {
            "backend": "ray",
            "devices_per_node": 2,
            "ray": {"num_cpus": 4, "rpc_timeout": 120},  # one module-wide Ray: room for all
        },
    }
    for section, values in over.items():
        cfg.setdefault(section, {}).update(values)
    return cfg


@pytest.mark.parametrize(
    ("reference", "ulysses"),
    [("fsdp2", 1), ("torch", 1), ("fsdp2", 2)],
    ids=["fsdp2", "torch", "fsdp2-ulysses"],
)
def test_grpo_on_two_fsdp2_ranks_with_a_reference(
    tmp_path, tiny_model_dir, monkeypatch, ray_session, capsys, reference, ulysses
) -> None:
    """The reference is a worker group colocated with the actor (half a bundle each):
    two FSDP2 ranks, or a whole torch replica per device, each on its share of the rows,
    or (ulysses 2) one Ulysses group of two, actor and reference each splitting every
    sequence over both ranks. One mini-batch a step, so the first step's KL is to the
    policy itself: 0."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from transformers import AutoModelForCausalLM

    from temper.pipelines import run_pipeline as train

    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    over = {
        "actor": {"use_kl_loss": True, "ulysses_sequence_parallel_size": ulysses},
        "reference": {"strategy": reference},
    }
    train(ray_config(tmp_path, tiny_model_dir, **over))
    assert "ray: reference ranks 0..1 up" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["actor/grad_norm"] > 0 for r in rows)
    assert rows[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert rows[1]["actor/kl_loss"] > 1e-6
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "actor")
    after = final.state_dict()
    assert config_arch(tmp_path / "run" / "final" / "actor") == ["LlamaForCausalLM"]
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(moved) == len(before)


def test_lora_with_a_kl_loss_takes_the_reference_from_the_actors_ranks(
    tmp_path, tiny_model_dir, monkeypatch, ray_session
) -> None:
    """LoRA on 2 fsdp2 ranks: the reference is the base under the adapters, served by the
    actor's own ranks (no reference group, no second copy): the KL is 0 while the
    adapters are still zero (step 1), then the policy moves away from its base."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from temper.cluster.placement import placement_rows
    from temper.pipelines import run_pipeline as train
    from temper.pipelines.catalog import plan

    over = {
        "model": {"path": str(tiny_model_dir), "lora": {"rank": 4, "alpha": 8}},
        "actor": {"use_kl_loss": True, "optim": {"lr": 3e-2, "weight_decay": 0.0}},
    }
    cfg = ray_config(tmp_path, tiny_model_dir, **over)
    assert [row[0] for row in placement_rows(cfg, plan(cfg))[1:]] == ["actor", "rollout"]
    train(cfg)
    rows = metrics_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["actor/kl_loss"] == 0.0 and rows[1]["actor/kl_loss"] > 0.0


def metrics_rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_separate_roles_train_then_resume_on_another_dp_size(
    tmp_path, tiny_model_dir, monkeypatch, capsys, ray_session
) -> None:
    """actor_train on 2 FSDP2 ranks, actor_infer (HF) and the reference each on a device
    of their own: 3 GRPO steps; then the run resumes with the actor on 1 rank (the
    sharded checkpoint is resharded) and trains step 4."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from transformers import AutoModelForCausalLM

    from temper.pipelines import run_pipeline as train

    separate = {
        "actor": {"use_kl_loss": True},
        "reference": {"strategy": "fsdp2"},
        "experiment": {"max_steps": 3, "save_freq": 3},
    }
    train(
        ray_config(
            tmp_path,
            tiny_model_dir,
            **separate,
            resources={
                "devices_per_node": 4,
                "actor_train": [0, 1],
                "actor_infer": [2],
                "reference": [3],
            },
        )
    )
    first = capsys.readouterr().out
    assert "ray: actor ranks 0..1 up" in first and "ray: rollout ranks 0..0 up" in first
    run_dir = tmp_path / "run"
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the rollout ranks sample with the trainer's current weights (synced every step):
    # their log-probs match the actor's recompute on the same tokens
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in rows)
    step3 = run_dir / "checkpoints" / "global_step_3"
    assert (step3 / "actor_train").is_dir()
    separate["experiment"]["max_steps"] = 4
    train(
        ray_config(
            tmp_path,
            tiny_model_dir,
            **separate,
            resources={
                "devices_per_node": 3,
                "actor_train": [0],
                "actor_infer": [1],
                "reference": [2],
            },
        )
    )
    second = capsys.readouterr().out
    assert f"resumed from {step3} at step 3" in second
    assert "ray: actor ranks 0..0 up" in second
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[3]["actor/grad_norm"] > 0 and "actor/kl_loss" in rows[3]
    at3 = AutoModelForCausalLM.from_pretrained(step3 / "actor").state_dict()
    final = AutoModelForCausalLM.from_pretrained(run_dir / "final" / "actor").state_dict()
    assert all(not torch.equal(at3[k], final[k]) for k in at3)  # step 4 moved every weight


def test_ppo_with_a_sequence_parallel_actor_and_critic_resumes_data_parallel(
    tmp_path, tiny_model_dir, monkeypatch, capsys, ray_session
) -> None:
    """PPO (GAE) with the actor and the critic each one Ulysses group over both ranks:
    2 steps, saved; the run resumes with sp 1 (2 data-parallel ranks: the sharded
    checkpoint does not depend on the split) and trains step 3."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from temper.pipelines import run_pipeline as train

    def ppo(sp: int, steps: int) -> dict:
        engine = {"strategy": "fsdp2", "ulysses_sequence_parallel_size": sp}
        return ray_config_dict(
            tmp_path,
            tiny_model_dir,
            actor=engine,
            critic={**engine, "mini_batch_size": 4, "micro_batch_size_per_device": 2},
            algorithm={"adv_estimator": "gae", "lam": 0.95},
            experiment={"max_steps": steps, "save_freq": 2},
        )

    from temper.pipelines.catalog import plan

    cfg = build_config(ppo(2, 2))
    assert (plan(cfg).actor.dp, plan(cfg).critic.dp) == (1, 1)
    train(cfg)
    rows = metrics_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["actor/grad_norm"] > 0 and r["critic/grad_norm"] > 0 for r in rows)
    step2 = tmp_path / "run" / "checkpoints" / "global_step_2"
    capsys.readouterr()
    train(build_config(ppo(1, 3)))
    assert f"resumed from {step2} at step 2" in capsys.readouterr().out
    rows = metrics_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2]["critic/grad_norm"] > 0


def config_arch(path) -> list[str]:
    return json.loads((path / "config.json").read_text())["architectures"]


def test_a_late_or_killed_worker_stops_the_run_naming_role_and_rank(
    tmp_path, tiny_model_dir, ray_session
) -> None:
    from temper.cluster.ray import WorkerGroupError
    from temper.cluster.roles import build_ray_roles
    from temper.pipelines.catalog import plan

    cfg = ray_config(tmp_path, tiny_model_dir)
    roles = build_ray_roles(cfg, plan(cfg))
    try:
        group = roles.groups[0]
        # A deadline already past: both ranks are late whatever the machine's load (at
        # 1 ms a warm rank could answer first, and both did now and then). The message
        # names the role, the ranks and what they were asked.
        timeout, group.timeout = group.timeout, 0.0
        late = (
            r"actor rank 0, 1: no answer within resources.ray.rpc_timeout=0s to the call "
            r"set_total_steps \(raise it if that work takes longer\)"
        )
        with pytest.raises(WorkerGroupError, match=late):
            group.call_all("set_total_steps", 10)
        group.timeout = timeout
        os.kill(group.pids[1], signal.SIGKILL)
        with pytest.raises(WorkerGroupError, match=r"actor rank 1: worker process died"):
            group.call_all("set_total_steps", 10)
    finally:
        roles.shutdown()


@pytest.mark.parametrize("ulysses", [1, 2], ids=["dp2", "ulysses2"])
def test_dpo_on_two_fsdp2_ranks(
    tmp_path, tiny_model_dir, monkeypatch, ray_session, ulysses
) -> None:
    """DPO on the Ray backend: each of 2 FSDP2 ranks takes whole pairs (contiguous
    shares), or (ulysses 2) one Ulysses group splits every sequence over both; the
    reference is its own worker group; the ranks' loss is the pairs' mean (log 2 at the
    first step, where the policy is the reference) and every weight moves."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from transformers import AutoModelForCausalLM

    from temper.pipelines import run_pipeline as train

    cfg = ray_config_dict(tmp_path, tiny_model_dir)
    for section in ("rollout", "algorithm", "reward"):
        cfg.pop(section)
    cfg["pipeline"] = "dpo"
    cfg["data"] = {
        "train_files": ["task:arithmetic?n=16&seed=3&pairs=true"],
        "val_files": ["task:arithmetic?n=4&seed=4&pairs=true"],
        "train_batch_size": 4,
    }
    cfg["dpo"] = {"max_length": 128, "beta": 0.5}
    cfg["actor"] = {
        **cfg["actor"],
        "mini_batch_size": 8,
        "ulysses_sequence_parallel_size": ulysses,
    }
    cfg["reference"] = {"strategy": "fsdp2"}
    cfg["experiment"]["test_freq"] = 2
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    train(build_config(cfg))
    rows = metrics_rows(tmp_path / "run")
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["train/loss"] == pytest.approx(0.6931, abs=1e-4)
    assert all(r["train/pairs"] == 4 and "train/rewards/accuracy" in r for r in steps)
    assert any("val/accuracy" in r for r in rows)
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "actor").state_dict()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(moved) == len(before)


def test_spin_refreshes_the_reference_worker_group(
    tmp_path, tiny_model_dir, monkeypatch, ray_session
) -> None:
    """Online DPO on the Ray backend: the actor on 2 FSDP2 ranks, the reference its own
    FSDP2 worker group that every step reloads from the actor's export (ref_update_freq
    1): each step's pairs score against the policy itself (margin 0, loss log 2)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from temper.pipelines import run_pipeline as train

    cfg = ray_config_dict(tmp_path, tiny_model_dir)
    cfg.pop("algorithm")
    cfg["pipeline"] = "spin"
    cfg["spin"] = {"beta": 0.5, "ref_update_freq": 1}
    cfg["reference"] = {"strategy": "fsdp2"}
    cfg["experiment"]["max_steps"] = 3
    train(build_config(cfg))
    steps = [r for r in metrics_rows(tmp_path / "run") if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(r["spin/ref_refreshed"] == 1.0 and r["train/pairs"] == 2 for r in steps)
    for r in steps:
        assert r["train/loss"] == pytest.approx(0.6931, abs=1e-4), r
        assert r["train/rewards/margin"] == pytest.approx(0.0, abs=1e-4), r


def test_prime_trains_its_prm_on_its_own_worker_group(
    tmp_path, tiny_model_dir, monkeypatch, ray_session
) -> None:
    """PRIME on Ray: the actor on 2 FSDP2 ranks and the implicit PRM on its own worker
    group of 2 FSDP2 ranks, colocated with it; the driver composes the PRM's phase (its
    log-probs and updates on the ranks, the batch norm and advantages here). Every PRM
    parameter moves, and the checkpoint holds it as a trained role."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from transformers import AutoModelForCausalLM

    from temper.pipelines import run_pipeline as train

    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    cfg = ray_config_dict(tmp_path, tiny_model_dir)
    cfg.pop("algorithm")
    cfg["pipeline"] = "prime"
    cfg["prime"] = {
        "oversample_factor": 2,
        "prm": {"strategy": "fsdp2", "micro_batch_size_per_device": 2, "optim": {"lr": 1e-3}},
    }
    train(build_config(cfg))
    rows = metrics_rows(tmp_path / "run")
    steps = [r for r in rows if "reward_model/dpo_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["perf/samples"] == 4 and r["reward_model/grad_norm"] > 0 for r in steps)
    ckpt = tmp_path / "run" / "checkpoints" / "global_step_2"
    prm = AutoModelForCausalLM.from_pretrained(ckpt / "reward_model").state_dict()
    moved = [k for k in before if not torch.equal(before[k], prm[k])]
    assert len(moved) == len(before)


def test_distillation_teacher_on_its_own_ray_workers(
    tmp_path, tiny_model_dir, monkeypatch, ray_session
) -> None:
    """On-policy distillation on Ray: the actor on 2 FSDP2 ranks (devices 0, 1), the
    teacher — another tiny model — a worker group of its own on device 1, scoring the
    student's samples with its own weights (not the student's: the KL to it is not 0)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from temper.pipelines import run_pipeline as train
    from temper.utils.tiny import make_tiny_model

    teacher = make_tiny_model(tmp_path / "teacher", hidden_size=32, seed=7)
    over = {
        "algorithm": {"adv_estimator": "reinforce"},
        "reference": {"strategy": "fsdp2"},
        "resources": {
            "backend": "ray",
            "devices_per_node": 2,
            "reference": [1],
            "ray": {"num_cpus": 4, "rpc_timeout": 120},
        },
        "distill": {"teachers": {"tutor": {"model_path": str(teacher)}}},
    }
    train(ray_config(tmp_path, tiny_model_dir, **over))
    rows = metrics_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["distill/tutor/samples"] == 4  # every sample: the teacher lists no tags
        assert r["train/advantage_mean"] == pytest.approx(-r["distill/penalty_mean"], abs=1e-6)
        assert r["timing/teacher_s"] > 0
        assert abs(r["distill/tutor/reverse_kl"]) > 1e-3


def test_verl_generation_over_two_devices_runs_one_engine_per_device(
    tmp_path, tiny_model_dir, monkeypatch, ray_session
) -> None:
    """verl's generation script on ``n_gpus_per_node=2``: the ``actor_infer`` worker group
    of two ``hf`` engines on Ray, each generating half of every call's prompts; greedy, the
    rows equal those of one engine in this process, in the input's order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from temper.cli.main import main
    from temper.pipelines.catalog import load_config

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from upstream_command import script_command

    config, script = script_command(
        "verl-2025-06-38d9a88/examples/generation/run_deepseek_v2_lite_math.sh"
    )
    prompts = tmp_path / "prompts.parquet"
    rows = [{"prompt": [{"role": "user", "content": f"{a} + {a} ="}]} for a in range(6)]
    pq.write_table(pa.Table.from_pylist(rows), prompts)
    outputs = {}
    for devices in (2, 1):
        out = tmp_path / f"on{devices}.parquet"
        overrides = [
            *script,
            f"model.path={tiny_model_dir}",  # model
            f"data.path={prompts}",  # data
            "rollout.prompt_length=64",  # length
            "rollout.response_length=6",
            f"trainer.n_gpus_per_node={devices}",  # device
            "trainer.device=cpu",
            "rollout.tensor_model_parallel_size=1",
            "rollout.name=hf",
            "+ray_init.num_cpus=4",
            f"data.output_path={out}",  # output
            "rollout.temperature=0",  # greedy: the two placements must agree
        ]
        cfg = load_config(config, overrides, command="generate").config
        assert cfg.resources.backend == ("ray" if devices == 2 else "local")
        assert main(["generate", str(config), *overrides]) == 0
        outputs[devices] = pq.read_table(out).to_pylist()
    assert len(outputs[2]) == 6
    assert [r["responses"] for r in outputs[2]] == [r["responses"] for r in outputs[1]]
    assert [r["prompt"] for r in outputs[2]] == [r["prompt"] for r in rows]
    for two, one in zip(outputs[2], outputs[1], strict=True):  # batch-shape float noise
        assert two["response_log_probs"][0] == pytest.approx(one["response_log_probs"][0], abs=1e-5)
