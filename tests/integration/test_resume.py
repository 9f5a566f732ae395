"""Runs that survive: a tiny-model run killed (SIGKILL) after step 3's checkpoint, or
stopped by SIGTERM mid-step, and resumed, ends bit-identical to an uninterrupted run —
weights, optimizer state and metrics rows (timings aside) — for RLVR with GRPO, RLVR PPO
with a critic, the agentic pipeline (FrozenLake episodes: the env manager's seeds are
in the checkpoint), SFT (the shuffled sampler's position is in the checkpoint), DPO and
reward-model training, asynchronous RLVR and agentic runs (rollout 1 and 2 policy
versions ahead of training), online DPO (spin: the reference refreshed from the
policy at step 3 is in the checkpoint, and scores steps 4 and 5 of the resumed run) and
PRIME (its implicit PRM, weights and optimizer, is a trained role of the checkpoint).
Damaged checkpoints are skipped — truncated ones by size, same-size corruption by
checksum, and the run resumed from the previous one equals a run that saved only that
one; a checkpoint's actor loads in transformers.

The interrupted runs are subprocesses (``python -m temper train``) so the kill is
real; the reference and resumed runs train in-process (interpreter start-up dominates
a tiny run, and the comparison is the same).
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from killed_runs import kill_at, metric_rows, start_train, wait_for  # tests/ is on the path
from safetensors.torch import load_file

from temper.pipelines.catalog import build_config

pytestmark = pytest.mark.slow

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Fraction of the response's characters that are digits."""
    if not solution_str:
        return 0.0
    return sum(c.isdigit() for c in solution_str) / len(solution_str)
'''
STEPS = 6
ALGOS = (
    "grpo",
    "gae",
    "agentic",
    "sft",
    "dpo",
    "distill",
    "kd",
    "reward_model",
    "grpo_k1",
    "agentic_k2",
    "spin",
    "prime",
)
#: Asynchronous runs (the rollout ahead of training by k versions): the batches ahead are
#: in the checkpoint, so the resumed run trains on the very batches the uninterrupted one did.
AHEAD = {"grpo_k1": ("grpo", 1), "agentic_k2": ("agentic", 2)}


LAKE = {
    "env_type": "frozen_lake",
    "max_turns": 2,
    "max_tokens_per_turn": 8,
    "env_config": {"size": 3, "is_slippery": True},  # slips: the env RNG must replay too
}


def _agentic_config() -> dict:
    """Agentic REINFORCE on FrozenLake, with a KL loss (so a reference runs too)."""
    cfg = {
        "pipeline": "agentic",
        "experiment": {
            "max_steps": STEPS,
            "seed": 2,
            "deterministic": True,  # bit-identical on a GPU too (atomic-add kernels)
            "save_freq": 3,
            "trackers": ["jsonl"],
            "test_freq": 3,
        },
        "data": {"max_prompt_length": 300},
        "rollout": {"response_length": 8, "max_model_len": 360},
        "actor": {
            "mini_batch_size": 4,
            "micro_batch_size_per_device": 4,
            "optim": {"lr": 3e-3},
            "use_kl_loss": True,
        },
        "algorithm": {"adv_estimator": "reinforce"},
        "agentic": {
            "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["T"]},
            "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["T"]},
            "custom_envs": {"T": LAKE},
            "reward_normalization": {"grouping": "batch", "method": "identity"},
        },
    }
    return cfg


def _sft_config() -> dict:
    """Supervised fine-tuning on arithmetic answers, shuffled: the sampler's position is
    the producer's state."""
    return {
        "pipeline": "sft",
        "experiment": {
            "max_steps": STEPS,
            "seed": 4,
            "save_freq": 3,
            "trackers": ["jsonl"],
            "test_freq": 3,
            "deterministic": True,
        },
        "data": {
            "train_files": ["task:arithmetic?n=32&seed=3&response=true"],
            "val_files": ["task:arithmetic?n=4&seed=9&response=true"],
            "train_batch_size": 4,
        },
        "sft": {"max_length": 128},
        "actor": {"micro_batch_size_per_device": 2, "optim": {"lr": 3e-3}},
    }


def _dpo_config() -> dict:
    """DPO on arithmetic pairs, shuffled: the sampler's position is the producer's state;
    the reference is rebuilt from the model on resume, the actor from the checkpoint."""
    return {
        "pipeline": "dpo",
        "experiment": {
            "max_steps": STEPS,
            "seed": 5,
            "save_freq": 3,
            "trackers": ["jsonl"],
            "test_freq": 3,
            "deterministic": True,
        },
        "data": {
            "train_files": ["task:arithmetic?n=32&seed=3&pairs=true"],
            "val_files": ["task:arithmetic?n=4&seed=9&pairs=true"],
            "train_batch_size": 4,
        },
        "dpo": {"max_length": 128, "beta": 0.5},
        "actor": {"micro_batch_size_per_device": 2, "optim": {"lr": 1e-3}},
    }


def _reward_model_config() -> dict:
    """A reward model on the same pairs: the scorer (backbone and head) and its
    optimizer are in the checkpoint, the sampler's position is the producer's state."""
    cfg = _dpo_config()
    del cfg["dpo"]
    return {**cfg, "pipeline": "reward_model", "rm": {"max_length": 128}}


def _config(tmp: Path, model_dir: Path, algo: str) -> dict:
    if algo == "sft_bf16":  # bf16 master weights: AdamW's state is bf16 too
        cfg = _config(tmp, model_dir, "sft")
        cfg["actor"] = {**cfg["actor"], "master_dtype": "bf16"}
        build_config(cfg)
        return cfg
    if algo in AHEAD:
        base, k = AHEAD[algo]
        cfg = {**_config(tmp, model_dir, base), "async_training": {"staleness": k}}
        build_config(cfg)
        return cfg
    if algo in ("sft", "dpo", "reward_model"):
        pick = {"sft": _sft_config, "dpo": _dpo_config, "reward_model": _reward_model_config}
        cfg = pick[algo]()
        cfg["model"] = {"path": str(model_dir)}
        build_config(cfg)
        return cfg
    if algo == "kd":  # offline distillation: SFT rows, a frozen teacher's top-k logits
        from temper.utils.tiny import make_tiny_model

        cfg = {**_sft_config(), "pipeline": "distill", "model": {"path": str(model_dir)}}
        teacher = make_tiny_model(tmp / "kd-teacher", hidden_size=32, seed=7)
        cfg["distill"] = {"teachers": {"default": {"model_path": str(teacher)}}}
        cfg["kd"] = {"objective": "js_divergence", "topk": 8, "loss_weight": 0.7}
        build_config(cfg)
        return cfg
    if algo == "agentic":
        cfg = _agentic_config()
        cfg["model"] = {"path": str(model_dir)}
        build_config(cfg)
        return cfg
    reward_file = tmp / "digits.py"
    reward_file.write_text(REWARD)
    cfg = {
        "experiment": {
            "max_steps": STEPS,
            "seed": 1,
            "deterministic": True,
            "save_freq": 3,
            "trackers": ["jsonl"],
            "test_freq": 3,
        },
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": ["task:arithmetic?n=32&seed=3"],
            "val_files": ["task:arithmetic?n=4&seed=9"],
            "train_batch_size": 2,
            "max_prompt_length": 96,
        },
        "rollout": {"n": 4, "response_length": 8, "temperature": 1.0},
        "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 4, "optim": {"lr": 3e-3}},
        "algorithm": {"adv_estimator": "reinforce" if algo == "distill" else algo},
        "reward": {"function": "custom", "custom_function": {"path": str(reward_file)}},
    }
    if algo == "distill":  # on-policy distillation from another tiny model (frozen teacher)
        from temper.utils.tiny import make_tiny_model

        teacher = make_tiny_model(tmp / "teacher", hidden_size=32, seed=7)
        cfg["distill"] = {"teachers": {"teacher": {"model_path": str(teacher)}}}
    cfg["reward"]["num_workers"] = 1
    if algo == "spin":  # online DPO: 2 prompts × 2 responses, 2 pairs, refreshed at 3 and 6
        del cfg["algorithm"]
        cfg["pipeline"] = "spin"
        cfg["rollout"]["n"] = 2
        cfg["spin"] = {"beta": 0.5, "ref_update_freq": 3}
        build_config(cfg)
        return cfg
    if algo == "prime":  # PRIME: 4 prompts drawn, 2 kept by accuracy; the PRM trains
        del cfg["algorithm"]
        cfg["pipeline"] = "prime"
        cfg["prime"] = {
            "oversample_factor": 2,
            "filter_accuracy": True,
            "accuracy_lower_bound": 0.05,
            "accuracy_upper_bound": 0.9,
            "prm": {"micro_batch_size_per_device": 4, "optim": {"lr": 1e-3}},
        }
        build_config(cfg)
        return cfg
    if algo == "gae":
        cfg["algorithm"].update({"lam": 0.95, "use_kl_in_reward": True})
        cfg["algorithm"]["kl_ctrl"] = {"type": "adaptive", "kl_coef": 0.01}
        cfg["critic"] = {"mini_batch_size": 4, "micro_batch_size_per_device": 4}
    else:
        cfg["algorithm"]["reward_norm"] = "running"  # running statistics must resume too
    build_config(cfg)  # fail here, not in the subprocess
    return cfg


def _start(cfg: dict, out: Path, tmp: Path) -> tuple[subprocess.Popen, Path]:
    cfg = {**cfg, "experiment": {**cfg["experiment"], "output_dir": str(out)}}
    return start_train(cfg, out.name, tmp, env={"TEMPER_CACHE": str(tmp / "cache")})


def _train(cfg: dict, out: Path) -> dict:
    """Train in this process (resume_mode auto picks up what ``out`` holds)."""
    from temper.pipelines import run_pipeline as train

    return train(build_config({**cfg, "experiment": {**cfg["experiment"], "output_dir": str(out)}}))


def _finish(proc: subprocess.Popen, log: Path, expect: int = 0) -> None:
    rc = proc.wait(timeout=300)
    assert rc == expect, log.read_text()[-3000:]


def _train_curve(out: Path, curve: str) -> list[float]:
    """The run's curve as logged (RL's train/score_mean, DPO's train/rewards/margin, SFT's
    train/loss, …: the summary's ``curve``)."""
    return [r[curve] for r in metric_rows(out) if r["step"] > 0]


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))} for r in rows]


def _assert_same_run(a: Path, b: Path, steps: int = STEPS) -> None:
    """Same final weights, same step-6 optimizer/critic state, same metrics rows."""
    wa = load_file(str(a / "final" / "actor" / "model.safetensors"))
    wb = load_file(str(b / "final" / "actor" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "final weights differ"
    ck_a, ck_b = (
        a / "checkpoints" / f"global_step_{steps}",
        b / "checkpoints" / f"global_step_{steps}",
    )
    for part in ("actor_train", "critic_train", "reward_model_train"):
        if not (ck_a / part).is_dir():
            continue
        ta, tb = (
            load_file(str(ck_a / part / "engine" / "model.safetensors")),
            load_file(str(ck_b / part / "engine" / "model.safetensors")),
        )
        assert all(torch.equal(ta[k], tb[k]) for k in ta), part
        sa = torch.load(ck_a / part / "engine" / "state.pt", weights_only=True)["optimizer"]
        sb = torch.load(ck_b / part / "engine" / "state.pt", weights_only=True)["optimizer"]
        for k in sa["state"]:
            for name, value in sa["state"][k].items():
                assert torch.equal(value, sb["state"][k][name]), (part, k, name)
    ra, rb = _comparable(metric_rows(a)), _comparable(metric_rows(b))
    assert [r["step"] for r in ra] == list(range(1, steps + 1))
    assert ra == rb


class _ReferenceRuns(dict):
    """Uninterrupted reference runs by algorithm, each made when a test first asks for it
    (so a test of one algorithm does not train the others)."""

    def __init__(self, tmp: Path, model_dir: Path) -> None:
        super().__init__()
        self.tmp, self.model_dir = tmp, model_dir

    def __missing__(self, algo: str) -> tuple[dict, Path]:
        cfg = _config(self.tmp, self.model_dir, algo)
        out = self.tmp / f"{algo}-full"
        _train(cfg, out)
        # experiment.deterministic is the run's: closing it gives the process back its own
        assert not torch.are_deterministic_algorithms_enabled()
        self[algo] = (cfg, out)
        return cfg, out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    """Uninterrupted reference runs, one per algorithm, each made once."""
    tmp = tmp_path_factory.mktemp("resume")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEMPER_CACHE", str(tmp / "cache"))
        yield tmp, _ReferenceRuns(tmp, tiny_model_dir)


@pytest.mark.parametrize("algo", ALGOS)
def test_sigkill_after_step3_checkpoint_then_resume_is_bit_identical(runs, algo, capsys):
    tmp, made = runs
    cfg, full = made[algo]
    out = tmp / f"{algo}-killed"
    proc, log = _start(cfg, out, tmp)
    kill_at(out / "checkpoints" / "global_step_3" / "manifest.json", proc, log, timeout=240)
    assert not (out / "final").exists()
    summary = _train(cfg, out)  # resume_mode: auto
    assert f"resumed from {out / 'checkpoints'}" in capsys.readouterr().out
    assert summary["steps"] == STEPS and summary["stopped_by"] is None
    assert summary["curve_values"] == _train_curve(full, summary["curve"])
    _assert_same_run(full, out)


def test_bf16_master_weights_resume_bit_identically(runs, capsys):
    """actor.master_dtype bf16: the checkpoint holds bf16 weights and bf16 AdamW moments,
    a run killed after step 3 and resumed equals the uninterrupted one, and the final
    Hugging Face directory is written in bf16."""
    tmp, made = runs
    cfg, full = made["sft_bf16"]
    engine = full / "checkpoints" / "global_step_3" / "actor_train" / "engine"
    weights = load_file(str(engine / "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
    moments = torch.load(engine / "state.pt", weights_only=True)["optimizer"]["state"]
    assert {m["exp_avg"].dtype for m in moments.values()} == {torch.bfloat16}
    final = load_file(str(full / "final" / "actor" / "model.safetensors"))
    assert {w.dtype for w in final.values()} == {torch.bfloat16}
    out = tmp / "sft_bf16-killed"
    proc, log = _start(cfg, out, tmp)
    kill_at(out / "checkpoints" / "global_step_3" / "manifest.json", proc, log, timeout=240)
    _train(cfg, out)
    assert f"resumed from {out / 'checkpoints'}" in capsys.readouterr().out
    _assert_same_run(full, out)


def test_sigkill_with_time_based_saves_only_resumes_bit_identically(runs, capsys):
    """No save_freq (its default), a recovery checkpoint whenever save_every_minutes
    passed — here every step: a SIGKILL after step 3 loses nothing before it, the
    resumed run equals the uninterrupted one (where the clock puts a save changes no
    number), and the recovery checkpoints are gone once the last step's is written."""
    tmp, made = runs
    cfg, full = made["grpo"]
    exp = {**cfg["experiment"], "save_freq": -1, "save_every_minutes": 1e-9}
    cfg = {**cfg, "experiment": exp}
    out = tmp / "grpo-clock"
    proc, log = _start(cfg, out, tmp)
    kill_at(out / "checkpoints" / "global_step_3" / "manifest.json", proc, log, timeout=240)
    assert "recovery: the next checkpoint replaces it" in (tmp / f"{out.name}.log").read_text()
    summary = _train(cfg, out)
    assert f"resumed from {out / 'checkpoints'}" in capsys.readouterr().out
    assert summary["steps"] == STEPS
    _assert_same_run(full, out)
    assert [p.name for p in (out / "checkpoints").glob("global_step_*")] == [f"global_step_{STEPS}"]


@pytest.mark.parametrize("algo", ALGOS)
def test_sigterm_mid_step_saves_exits_143_and_resumes_identically(runs, algo):
    tmp, made = runs
    cfg, full = made[algo]
    out = tmp / f"{algo}-term"
    proc, log = _start(cfg, out, tmp)
    wait_for(lambda: any(r.get("step") == 1 for r in metric_rows(out)), proc, log, timeout=240)
    proc.send_signal(signal.SIGTERM)  # during step 2 (or 3): finish it, save, stop
    _finish(proc, log, expect=128 + signal.SIGTERM)
    log = (tmp / f"{out.name}.log").read_text()
    assert "SIGTERM: finishing this step" in log and "stopped by SIGTERM" in log
    saved = sorted((out / "checkpoints").glob("global_step_*"))
    assert saved and not (out / "final").exists()
    stopped_at = max(int(p.name.rsplit("_", 1)[1]) for p in saved)
    assert stopped_at < STEPS and metric_rows(out)[-1]["step"] == stopped_at
    _train(cfg, out)
    _assert_same_run(full, out)


def test_truncated_checkpoint_is_skipped_by_auto_resume(runs, tmp_path):
    import shutil

    from temper.pipelines.checkpointing import find_resume_checkpoint

    _tmp, made = runs
    cfg, full = made["grpo"]
    out = tmp_path / "copy"
    shutil.copytree(full / "checkpoints", out / "checkpoints")
    step_dir = out / "checkpoints" / f"global_step_{STEPS}"
    weights = step_dir / "actor_train" / "engine" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    conf = build_config({**cfg, "experiment": {**cfg["experiment"], "output_dir": str(out)}})
    assert find_resume_checkpoint(conf, out) == out / "checkpoints" / "global_step_3"


def test_resume_after_a_same_size_corruption_equals_a_run_that_saved_only_the_previous(
    runs, tmp_path, monkeypatch, capsys
):
    """One byte of the newest checkpoint's weights flipped (its size kept, so sizes cannot
    tell): the checksums do, the run resumes from the previous checkpoint with one line,
    and ends bit-identical to a run whose only checkpoint was that one — and to the
    uninterrupted run."""
    import shutil

    tmp, made = runs
    cfg, full = made["grpo"]
    monkeypatch.setenv("TEMPER_CACHE", str(tmp / "cache"))
    damaged, only = tmp_path / "damaged", tmp_path / "only3"
    for out, steps in ((damaged, (3, STEPS)), (only, (3,))):
        for step in steps:
            name = f"global_step_{step}"
            shutil.copytree(full / "checkpoints" / name, out / "checkpoints" / name)
        shutil.copy(full / "metrics.jsonl", out / "metrics.jsonl")
    weights = damaged / "checkpoints" / f"global_step_{STEPS}" / "actor_train" / "engine"
    data = bytearray((weights / "model.safetensors").read_bytes())
    data[-5] ^= 0x80  # the sign bit of a weight (little-endian fp32)
    (weights / "model.safetensors").write_bytes(bytes(data))
    _train(cfg, damaged)
    err = capsys.readouterr().err
    ckpts = damaged / "checkpoints"
    assert (
        f"resume: {ckpts / f'global_step_{STEPS}'} is damaged (actor_train/engine/"
        f"model.safetensors: checksum mismatch); resuming from {ckpts / 'global_step_3'}"
    ) in err.splitlines()
    _train(cfg, only)
    _assert_same_run(only, damaged)
    _assert_same_run(full, damaged)


def test_checkpoint_actor_loads_in_transformers_with_the_trainers_log_probs(runs, monkeypatch):
    from transformers import AutoModelForCausalLM

    from temper.data import next_prompt_batch
    from temper.pipelines import resolve_pipeline
    from temper.pipelines.build import build_run
    from temper.pipelines.catalog import plan
    from temper.pipelines.rlvr import RLVRProducer

    tmp, made = runs
    cfg, full = made["grpo"]
    monkeypatch.setenv("TEMPER_CACHE", str(tmp / "cache"))
    ckpt = full / "checkpoints" / "global_step_3"
    exp = {
        **cfg["experiment"],
        "output_dir": str(tmp / "probe"),
        "resume_mode": "resume_path",
        "resume_from_path": str(ckpt),
    }
    conf = build_config({**cfg, "experiment": exp})
    run = build_run(conf, resolve_pipeline(conf.pipeline), plan(conf))
    try:
        assert run.step == 3
        producer = run.producer
        assert isinstance(producer, RLVRProducer)
        batch = run.rollout.generate(
            next_prompt_batch(producer.train_data, producer.sampler), producer.train_sampling
        )
        batch = batch.select([0])
        trainer = run.roles.actor.compute_log_probs(batch)["old_log_probs"][0]
        # model.dtype auto: fp32 on CPU, bf16 autocast on a GPU
        fp32 = run.roles.actor.engine.device.type == "cpu"
    finally:
        run.close()
    prompt = batch["prompt_ids"][0][batch["prompt_mask"][0] > 0]
    n = int(batch["response_mask"][0].sum())
    response = batch["response_ids"][0][:n]
    hf = AutoModelForCausalLM.from_pretrained(ckpt / "actor").eval()
    with torch.no_grad():
        logits = hf(torch.cat([prompt, response])[None].long()).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    expected = logp.gather(-1, response.long()[:, None]).squeeze(-1)
    tol = 1e-5 if fp32 else 5e-2
    torch.testing.assert_close(trainer[:n].float(), expected, atol=tol, rtol=tol)


def test_lora_run_extended_past_its_end_equals_the_longer_run(
    tmp_path, tiny_model_dir, monkeypatch
):
    """LoRA checkpoints hold the adapters; raising max_steps (a harmless change) goes on."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    cfg = _config(tmp_path, tiny_model_dir, "grpo")
    cfg["model"]["lora"] = {"rank": 4, "alpha": 8}
    cfg["experiment"].update({"test_freq": -1, "save_freq": -1, "max_steps": 4})
    _train(cfg, tmp_path / "long")
    short = {**cfg, "experiment": {**cfg["experiment"], "max_steps": 2}}
    _train(short, tmp_path / "extended")
    assert (tmp_path / "extended" / "final" / "actor" / "lora_adapter").is_dir()
    _train(cfg, tmp_path / "extended")
    _assert_same_run(tmp_path / "long", tmp_path / "extended", steps=4)
    adapters = [
        load_file(str(tmp_path / run / "final/actor/lora_adapter/adapter_model.safetensors"))
        for run in ("long", "extended")
    ]
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])


def test_run_dumps_generations_and_shows_validation_samples(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """rollout_data_dir / validation_data_dir get <step>.jsonl; log_val_generations prints;
    profile_steps writes a torch.profiler trace of the listed step."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    cfg = _config(tmp_path, tiny_model_dir, "grpo")
    cfg["experiment"].update(
        {
            "max_steps": 2,
            "test_freq": 2,
            "val_before_train": True,
            "log_val_generations": 2,
            "rollout_data_dir": str(tmp_path / "rollouts"),
            "validation_data_dir": str(tmp_path / "val"),
            "profile_steps": [2],
        }
    )
    _train(cfg, tmp_path / "run")
    out = capsys.readouterr().out
    assert "[val step 0 #0] prompt:" in out and "[val step 2 #1]" in out
    assert "[val step 0 #2]" not in out
    for step in (1, 2):
        rows = [
            json.loads(x)
            for x in (tmp_path / "rollouts" / f"{step}.jsonl").read_text().splitlines()
        ]
        assert len(rows) == 8 and {r["step"] for r in rows} == {step}
        assert {"prompt", "response", "score", "reward", "advantage", "uid"} <= set(rows[0])
        for uid in {r["uid"] for r in rows}:  # GRPO: advantages of a group sum to ~0
            assert abs(sum(r["advantage"] for r in rows if r["uid"] == uid)) < 1e-4
    val = {p.name for p in (tmp_path / "val").iterdir()}
    assert val == {"0.jsonl", "2.jsonl"}
    vrows = [json.loads(x) for x in (tmp_path / "val" / "0.jsonl").read_text().splitlines()]
    assert len(vrows) == 4 and all("advantage" not in r for r in vrows)
    metrics = metric_rows(tmp_path / "run")
    assert metrics[0]["step"] == 0 and "val/arithmetic/reward_mean" in metrics[0]
    trace = json.loads((tmp_path / "run" / "profile" / "step_2.json").read_text())
    assert trace["traceEvents"] and not (tmp_path / "run" / "profile" / "step_1.json").exists()
    table = (tmp_path / "run" / "profile" / "step_2.txt").read_text()
    for phase in ("rollout", "reward", "train", "weight_sync"):
        assert f"phase/{phase}" in table
    assert "aten::mm" in table
