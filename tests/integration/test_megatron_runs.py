"""Whole runs on the megatron engine (CPU, gloo):

* the ROLL seed-shaped example (``megatron_train`` actor, ``megatron_infer`` reference,
  tensor parallelism 2) trains 3 GRPO steps on the Ray backend with an HF rollout whose
  log-probs match the trainer's (weights synced from the TP shards every step);
* an upstream verl Megatron command line (2026-01 snapshot) trains 2 steps (one device,
  local backend), and with Megatron-Bridge's LoRA section on (the reference is the actor
  with its adapters off; the rollout gets merged weights);
* PPO with a Megatron actor and critic on the local backend (one-rank world, in process)
  is killed with SIGKILL after a checkpoint and resumes to the uninterrupted run's
  weights, optimizer state and metrics.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import torch
from killed_runs import kill_at, metric_rows, start_train  # tests/ is on the path

pytest.importorskip("megatron.core")
from temper.cluster.placement import placement_rows
from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config, load_config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TASK = "task:arithmetic?n=64&seed=5"
VERL = Path(__file__).resolve().parents[1] / "data" / "upstream" / "verl-2026-01-b178a3c"
VERL_LINE = VERL / "examples/tuning/32b/qwen2_32B_grpo_8_h20_megatron_vllm.sh"
# A tiny random model's 12-token answers almost never solve an arithmetic row, so the math
# rule scores whole groups 0 and GRPO's advantages give no gradient: whether a 2-step run
# moves every tensor would hang on the seed's luck. The ROLL runs add an entropy bonus
# (ROLL's own key: a gradient for every tensor whatever the rewards); the verl runs score
# with verl's custom_reward_function, the fraction of digits (REWARD, dense).
ENTROPY = "entropy_loss_coef=0.01"


def _train_rows(out: Path) -> list[dict]:
    return [r for r in metric_rows(out) if "train/reward_mean" in r]


def _run(path: Path, overrides: list[str], placement: dict | None = None) -> Path:
    loaded = load_config(path, overrides)
    if placement is not None:  # what `temper check` prints, role -> (devices, ranks, dp, engine)
        rows = placement_rows(loaded.config, loaded.plan)[1:]
        assert {r[0]: (r[1], r[3], r[4], r[5]) for r in rows} == placement
    run_pipeline(loaded.config)
    return Path(loaded.config.experiment.output_dir)


# ----------------------------------------------------------------------- Ray, TP=2


@pytest.mark.ray
def test_roll_megatron_example_grpo_with_tp2_actor_and_reference(
    tmp_path, tiny_model_dir, monkeypatch, ray_session
):
    """examples/roll_megatron.yaml with model, data, length and device overrides only
    (fp32 on CPU; HF generation: vLLM's CPU build has no kernel for the tiny model's
    head size): 3 steps, every parameter moves, rollout log-probs = trainer log-probs
    (weights gathered from the TP=2 shards and synced every step)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from safetensors.torch import load_file

    out = tmp_path / "roll"
    overrides = [
        f"pretrain={tiny_model_dir}",
        f"reward_pretrain={tiny_model_dir}",
        f"actor_train.data_args.file_name=[{TASK}]",
        f"validation.data_args.file_name={TASK}",
        "prompt_length=96",
        "response_length=12",
        "rollout_batch_size=2",
        "actor_train.training_args.per_device_train_batch_size=2",
        "actor_train.training_args.gradient_accumulation_steps=4",
        "max_steps=3",
        "eval_steps=3",
        f"output_dir={out}",
        "actor_train.model_args.dtype=fp32",
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        ENTROPY,
    ]
    placement = {
        "actor": ("0,1", "2", "1", "megatron"),
        "rollout": ("0,1", "2", "2", "hf"),
        "reference": ("0,1", "2", "1", "megatron"),
    }
    _run(ROOT / "examples" / "roll_megatron.yaml", overrides, placement)
    rows = _train_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in rows)
    assert all("actor/kl" in r for r in rows)
    assert all(r["actor/grad_norm"] > 0 for r in rows)
    before = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    after = load_file(str(out / "final" / "actor" / "model.safetensors"))
    assert set(after) == set(before) - {"lm_head.weight"}  # tied: HF ties it on load
    assert all(not torch.equal(before[k], after[k]) for k in after)


@pytest.mark.ray
@pytest.mark.parametrize(
    "split", ["pipeline_model_parallel_size", "context_parallel_size"], ids=["pp2", "cp2"]
)
def test_roll_megatron_example_trains_with_two_pipeline_stages_or_cp_ranks(
    tmp_path, tiny_model_dir, monkeypatch, ray_session, split: str
):
    """The same example with the actor and reference as two pipeline stages (PP=2,
    TP=1) of the tied tiny model — or two context-parallel ranks (CP=2), each running
    its share of every sequence: 2 steps, rollout log-probs = trainer log-probs (the
    weights gathered into one HF model at each sync), every parameter of the final HF
    directory moved."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from safetensors.torch import load_file

    out = tmp_path / "roll-split"
    pp = {"tensor_model_parallel_size": 1, split: 2}
    overrides = [
        f"pretrain={tiny_model_dir}",
        f"reward_pretrain={tiny_model_dir}",
        f"actor_train.data_args.file_name=[{TASK}]",
        f"validation.data_args.file_name={TASK}",
        "prompt_length=96",
        "response_length=12",
        "rollout_batch_size=2",
        "actor_train.training_args.per_device_train_batch_size=2",
        "actor_train.training_args.gradient_accumulation_steps=4",
        "max_steps=2",
        "eval_steps=2",
        f"output_dir={out}",
        "actor_train.model_args.dtype=fp32",
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        ENTROPY,
        *(f"actor_train.strategy_args.strategy_config.{k}={v}" for k, v in pp.items()),
        *(f"reference.strategy_args.strategy_config.{k}={v}" for k, v in pp.items()),
    ]
    placement = {
        "actor": ("0,1", "2", "1", "megatron"),
        "rollout": ("0,1", "2", "2", "hf"),
        "reference": ("0,1", "2", "1", "megatron"),
    }
    _run(ROOT / "examples" / "roll_megatron.yaml", overrides, placement)
    rows = _train_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in rows)
    assert all("actor/kl" in r for r in rows)
    before = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    after = load_file(str(out / "final" / "actor" / "model.safetensors"))
    assert set(after) == set(before) - {"lm_head.weight"}
    assert all(not torch.equal(before[k], after[k]) for k in after)


def verl_command_line(sh: Path) -> tuple[str, list[str]]:
    """``(config name, key=value overrides)`` of the ``verl.trainer.main_ppo`` call in
    ``sh``; overrides whose value is a shell variable are dropped (the test sets them)."""
    text = sh.read_text()
    call = text[text.index("verl.trainer.main_ppo") :].replace("\\\n", " ").split("\n")[0]
    name, args = "", []
    for token in shlex.split(call)[1:]:
        if token.startswith("--config-name"):
            name = token.split("=", 1)[1]
        elif "=" in token and not token.startswith("-") and "$" not in token:
            args.append(token)
    return name, args


def test_upstream_verl_megatron_command_line_trains_two_steps(
    tmp_path, tiny_model_dir, monkeypatch, megatron_in_process
):
    """verl 2026-01 ``qwen2_32B_grpo_8_h20_megatron_vllm.sh`` (actor and reference on
    Megatron, TP=8, offload on) with model, data, lengths and devices overridden: one CPU
    device (so TP=1, the local backend: Megatron in a one-rank world in this process;
    TP=2 on Ray is the ROLL example's test), HF generation; every other key as written."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    name, args = verl_command_line(VERL_LINE)
    out = tmp_path / "verl"
    reward = tmp_path / "digits.py"
    reward.write_text(REWARD)
    overrides = [
        *args,
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files=[{TASK}]",
        f"data.val_files=[{TASK}]",
        "data.max_prompt_length=96",
        "data.max_response_length=12",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        f"trainer.default_local_dir={out}",
        f"custom_reward_function.path={reward}",
        "custom_reward_function.name=compute_score",
    ]
    placement = {
        "actor": ("0", "1", "1", "megatron (in process)"),
        "rollout": ("0", "1", "1", "hf (in process)"),
        "reference": ("0", "1", "1", "megatron (in process)"),
    }
    _run(VERL / "verl" / "trainer" / "config" / name, overrides, placement)
    rows = _train_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all("actor/kl_loss" in r and r["actor/grad_norm"] > 0 for r in rows)


def test_verl_megatron_lora_trains_with_the_base_model_as_reference(
    tmp_path, tiny_model_dir, monkeypatch, megatron_in_process
):
    """The same verl command line with Megatron-Bridge's LoRA section on (verl 2026-01's
    ``model.lora``): 2 steps on one CPU device; the reference is the actor with its
    adapters off (no engine of its own), the HF rollout gets the merged weights (its
    log-probs are the trainer's), and the final HF directory holds the merged model
    (frozen weights unchanged, adapted ones moved) and peft's adapter directory."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from safetensors.torch import load_file

    name, args = verl_command_line(VERL_LINE)
    out = tmp_path / "verl-lora"
    reward = tmp_path / "digits.py"
    reward.write_text(REWARD)
    overrides = [
        *args,
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.model.lora.rank=4",
        "actor_rollout_ref.model.lora.alpha=8",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        f"data.train_files=[{TASK}]",
        f"data.val_files=[{TASK}]",
        "data.max_prompt_length=96",
        "data.max_response_length=12",
        "data.train_batch_size=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        f"trainer.default_local_dir={out}",
        f"custom_reward_function.path={reward}",
        "custom_reward_function.name=compute_score",
    ]
    placement = {
        "actor": ("0", "1", "1", "megatron (in process)"),
        "rollout": ("0", "1", "1", "hf (in process)"),
    }
    _run(VERL / "verl" / "trainer" / "config" / name, overrides, placement)
    rows = _train_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in rows)
    assert all("actor/kl_loss" in r for r in rows)
    # step 1 starts at the base model (B = 0): no KL; step 2's adapters moved away from it
    assert rows[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert rows[1]["actor/kl_loss"] > 0
    final = out / "final" / "actor"
    assert (final / "lora_adapter" / "adapter_model.safetensors").is_file()
    before = load_file(str(Path(tiny_model_dir) / "model.safetensors"))
    after = load_file(str(final / "model.safetensors"))
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    adapted = [k for k in after if "_proj.weight" in k]
    assert adapted and any(not torch.equal(before[k], after[k]) for k in adapted)


@pytest.mark.vllm
def test_vllm_rollout_follows_the_megatron_actor(
    tmp_path, monkeypatch, megatron_in_process
) -> None:
    """Local backend: the weights synced from the Megatron actor after each update reach
    vLLM (CPU build; head size 32, which it has a kernel for): rollout log-probs equal
    the trainer's at every step, not just the first."""
    pytest.importorskip("vllm")
    from temper.utils.tiny import make_tiny_model

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    model = make_tiny_model(tmp_path / "tiny32", num_heads=2, num_kv_heads=1)
    reward = tmp_path / "digits.py"
    reward.write_text(REWARD)
    out = tmp_path / "run"
    cfg = {
        "experiment": {"output_dir": str(out), "max_steps": 2, "seed": 1, "trackers": ["jsonl"]},
        "model": {"path": str(model)},
        "data": {"train_files": ["task:arithmetic?n=16&seed=3"], "train_batch_size": 2},
        "rollout": {"engine": "vllm", "n": 2, "response_length": 8, "max_model_len": 256},
        "actor": {"strategy": "megatron", "mini_batch_size": 4, "optim": {"lr": 3e-3}},
        "algorithm": {"adv_estimator": "grpo"},
        "reward": {"function": "custom", "custom_function": {"path": str(reward)}},
    }
    cfg["data"]["max_prompt_length"] = 96
    run_pipeline(build_config(cfg))
    rows = _train_rows(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["actor/grad_norm"] > 0
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in rows)


# ----------------------------------------------------------------------- local, resume

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Fraction of the response's characters that are digits."""
    if not solution_str:
        return 0.0
    return sum(c.isdigit() for c in solution_str) / len(solution_str)
'''
STEPS = 4


def _ppo_config(tmp: Path, model_dir: Path) -> dict:
    reward_file = tmp / "digits.py"
    reward_file.write_text(REWARD)
    engine = {"strategy": "megatron", "mini_batch_size": 4, "micro_batch_size_per_device": 2}
    cfg = {
        "experiment": {"max_steps": STEPS, "seed": 1, "save_freq": 2, "trackers": ["jsonl"]},
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": ["task:arithmetic?n=32&seed=3"],
            "train_batch_size": 2,
            "max_prompt_length": 96,
        },
        "rollout": {"n": 4, "response_length": 8, "temperature": 1.0},
        "actor": {**engine, "optim": {"lr": 3e-3}},
        "critic": {**engine, "optim": {"lr": 1e-3}},
        "algorithm": {"adv_estimator": "gae", "lam": 0.95, "use_kl_in_reward": True},
        "reference": {"strategy": "megatron"},
        "reward": {"function": "custom", "custom_function": {"path": str(reward_file)}},
    }
    cfg["reward"]["num_workers"] = 1
    build_config(cfg)  # fail here, not in the subprocess
    return cfg


def _with_out(cfg: dict, out: Path) -> dict:
    return {**cfg, "experiment": {**cfg["experiment"], "output_dir": str(out)}}


@pytest.fixture
def megatron_in_process():
    """In-process megatron runs make a one-rank process group and Megatron's parallel
    state in this process: torn down afterwards, so later forked tests start clean."""
    yield
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def _engine_state(ckpt: Path) -> dict:
    """A sharded engine checkpoint (DCP directory) as one flat dict of tensors."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    flat = ckpt.parent / f"{ckpt.parent.name}-{ckpt.name}.pt"
    dcp_to_torch_save(str(ckpt), str(flat))
    return torch.load(flat, weights_only=False)


def _start_train(cfg: dict, out: Path, tmp: Path) -> tuple[subprocess.Popen, Path]:
    """``temper train`` on ``cfg`` (output ``out``) in a fresh process, logging to a file."""
    return start_train(_with_out(cfg, out), out.name, tmp)


def test_ppo_with_megatron_critic_resumes_after_sigkill(tmp_path, tiny_model_dir, monkeypatch):
    """Local backend (megatron in a one-rank world): PPO/GAE with a megatron actor,
    critic and reference trains 4 steps; a run SIGKILLed after step 2's checkpoint
    resumes to the same weights, AdamW moments and metrics (timings aside).

    Every run is its own ``temper train`` process, as a user's are: in this test process,
    after an in-process DeepSpeed run of another test, the megatron runs differed from a
    fresh process in the last bits (cause not found), which is not what this test checks."""
    from safetensors.torch import load_file

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    cfg = _ppo_config(tmp_path, tiny_model_dir)
    full = tmp_path / "full"
    proc, log = _start_train(cfg, full, tmp_path)
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    rows = _train_rows(full)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["critic/value_loss"] > 0 and r["actor/grad_norm"] > 0 for r in rows)

    killed = tmp_path / "killed"
    proc, log = _start_train(cfg, killed, tmp_path)
    kill_at(killed / "checkpoints" / "global_step_2" / "manifest.json", proc, log, timeout=600)
    assert not (killed / "final").exists()

    proc, log = _start_train(cfg, killed, tmp_path)  # resume_mode: auto
    assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    assert f"resumed from {killed / 'checkpoints'}" in log.read_text()
    assert [r["step"] for r in _train_rows(killed)][-1] == STEPS

    for role in ("actor", "critic"):
        step = f"checkpoints/global_step_{STEPS}"
        a = load_file(str(full / step / role / "model.safetensors"))
        b = load_file(str(killed / step / role / "model.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), role
        sa = _engine_state(full / step / f"{role}_train" / "engine")
        sb = _engine_state(killed / step / f"{role}_train" / "engine")
        assert sa.keys() == sb.keys()
        for k, v in sa.items():
            assert torch.equal(v, sb[k]) if isinstance(v, torch.Tensor) else v == sb[k], k
    strip = lambda rs: [  # noqa: E731
        {k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))} for r in rs
    ]
    assert strip(metric_rows(full)) == strip(metric_rows(killed))
