"""Waits that end: a placement the cluster cannot hold is refused by ``temper check`` (on
this machine temper knows the cluster), a Ray wait the pre-flight cannot foresee ends at
its deadline in one line naming the role and what it waited for, a reward worker that
never starts stops the run, and a library's launcher variables are set where temper
makes the process group — not left to whichever test ran before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from temper.cli.main import main
from temper.utils.tiny import make_tiny_model

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream" / "roll-2026-08-8eb27cc"
ROLL_RLVR = UPSTREAM / "examples/qwen2.5-7B-rlvr_megatron/rlvr_config.yaml"
ROLL_PPO = UPSTREAM / "examples/docs_examples/example_ppo.yaml"
TASK = "task:arithmetic?n=16&seed=3"


@pytest.fixture
def no_run(monkeypatch):
    """``train`` must stop before the run: reaching the pipeline fails the test."""

    def run_pipeline(cfg, plan=None):
        raise AssertionError("train started a run although it should refuse the config")

    monkeypatch.setattr("temper.pipelines.run_pipeline", run_pipeline)


def refused(args: list[str], capsys) -> str:
    """The one-line refusal of ``check`` and ``train`` (the same), exit 2, no traceback;
    the message without its ``config error:`` prefix."""
    messages = []
    for command in ("check", "train"):
        assert main([command, *args]) == 2, command
        out, err = capsys.readouterr()
        err = err.strip()
        assert err.startswith("config error: ") and "\n" not in err, err
        assert "Traceback" not in err + out
        messages.append(err)
    assert messages[0] == messages[1]
    return messages[0].removeprefix("config error: ")


def native(tmp_path: Path, model_dir: Path | str, **sections) -> str:
    """A small native RLVR config on the Ray backend (sections update its defaults)."""
    data: dict = {
        "model": {"path": str(model_dir)},
        "data": {"train_files": [TASK], "train_batch_size": 4, "max_prompt_length": 96},
        "rollout": {"engine": "hf", "n": 2, "response_length": 8},
        "actor": {"strategy": "fsdp2", "mini_batch_size": 8, "micro_batch_size_per_device": 1},
        "experiment": {"output_dir": str(tmp_path / "out"), "max_steps": 1, "device": "cpu"},
        "resources": {"backend": "ray", "devices_per_node": 2},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# --------------------------------------------------------------------------- placement


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory) -> Path:
    """A tiny judge whose context holds ROLL's judge prompt (4096 + the verdict)."""
    return make_tiny_model(tmp_path_factory.mktemp("judge"), max_position_embeddings=8192)


def roll_judge_run(tmp_path: Path, policy: Path, judge: Path | str) -> list[str]:
    """ROLL's RLVR file with its LLM judge on devices 12..15 as written, run on one device
    (``num_gpus_per_node=1``, the other roles moved to device 0): the tiny models, judge
    rows of ROLL's shape, short lengths and the hf engines."""
    data = tmp_path / "judge.jsonl"
    messages = '[{"role": "user", "content": "Capital of France?"}]'
    row = {"id": "0", "tag": "RLVR", "messages": messages, "ground_truth": "Paris"}
    data.write_text(json.dumps(row) + "\n")
    return [
        str(ROLL_RLVR),
        f"pretrain={policy}",
        f"reward_pretrain={policy}",
        f"rewards.llm_judge.model_args.model_name_or_path={judge}",
        "num_gpus_per_node=1",
        *[
            f"{r}.device_mapping=list(range(0,1))"
            for r in ("actor_train", "actor_infer", "reference")
        ],
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "rewards.llm_judge.strategy_args.strategy_name=hf_infer",
        "~rewards.llm_judge.strategy_args.strategy_config",
        "rewards.llm_judge.generating_args.max_new_tokens=4",
        "prompt_length=96",
        "response_length=8",
        f"actor_train.data_args.dataset_dir={tmp_path}",
        f"actor_train.data_args.file_name=[{data.name}]",
        "~actor_train.data_args.domain_interleave_probs",
        "~validation",
        f"output_dir={tmp_path / 'out'}",
        f"checkpoint_config.output_dir={tmp_path / 'out' / 'ckpt'}",
    ]


def test_a_roll_judge_on_devices_this_machine_lacks_is_refused_by_check(
    tmp_path, tiny_model_dir, judge_dir, capsys, no_run
):
    """Issue 29: ``check`` derived 16 nodes and said valid; ``train`` then waited for 16
    Ray nodes forever. Now both refuse it, naming the file's key and both sides."""
    msg = refused(roll_judge_run(tmp_path, tiny_model_dir, judge_dir), capsys)
    assert msg.startswith(
        "rewards.llm_judge.device_mapping (temper: resources.reward): the roles' devices "
        "(actor 0; rollout 0; judge 12..15) are placed on 16 nodes of 1 device, but with "
        "no Ray cluster address Ray runs on this machine alone: one node, "
    )
    assert msg.endswith(
        "Fix: place every role on this node's devices (0), raise num_gpus_per_node to this "
        "node's devices, or start Ray on 16 nodes and set resources.ray.address (a temper key)"
    )
    # placed on this machine, the same file is valid
    args = [*roll_judge_run(tmp_path, tiny_model_dir, judge_dir)]
    assert main(["check", *args, "rewards.llm_judge.device_mapping=[0]"]) == 0
    assert "valid (pre-flight passed)" in capsys.readouterr().out


def test_the_roll_judges_hub_model_not_on_this_machine_is_refused(
    tmp_path, tiny_model_dir, capsys, no_run, monkeypatch
):
    """The file's own judge (a hub id this machine does not have) fails ``check`` too."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = roll_judge_run(tmp_path, tiny_model_dir, "virtuoussy/Qwen2.5-7B-Instruct-RLVR")
    msg = refused([*args, "rewards.llm_judge.device_mapping=[0]"], capsys)
    assert msg.startswith(
        "rewards.llm_judge.model_args.model_name_or_path (temper: reward.judge.model_path): "
        "'virtuoussy/Qwen2.5-7B-Instruct-RLVR' is not a local directory and not in the "
        "Hugging Face cache"
    )


@pytest.mark.parametrize(
    ("resources", "start"),
    [
        (
            {"nnodes": 2},
            "resources.nnodes: the roles' devices (actor 0..3; rollout 0..3) are placed on 2 "
            "nodes of 2 devices, but with no Ray cluster address Ray runs on this machine "
            "alone",
        ),
        (
            {"actor_train": [0, 1], "ray": {"num_cpus": 1}},
            "resources.ray.num_cpus: the roles' devices (actor 0,1; rollout 0,1) ask Ray for "
            "2 process slots of 1 CPU, and the local Ray gets 1",
        ),
    ],
)
def test_a_placement_this_machine_cannot_hold(
    tmp_path, tiny_model_dir, capsys, no_run, resources, start
):
    msg = refused([native(tmp_path, tiny_model_dir, resources=resources)], capsys)
    assert msg.startswith(start), msg


def test_a_ray_address_where_nothing_answers_is_refused_at_once(
    tmp_path, tiny_model_dir, capsys, no_run
):
    """Ray's own connect retries for minutes without a word; the pre-flight asks once."""
    from temper.cluster.process_group import free_port

    address = f"127.0.0.1:{free_port()}"  # nothing listens: refused at once
    begin = time.monotonic()
    path = native(tmp_path, tiny_model_dir, resources={"ray": {"address": address}})
    msg = refused([path], capsys)
    assert time.monotonic() - begin < 30
    assert msg.startswith(f"resources.ray.address: no Ray cluster answers at {address} within ")
    assert "Fix: start Ray there (ray start --head --port=PORT)" in msg


def test_a_deadline_of_zero_is_refused(tmp_path, tiny_model_dir, capsys, no_run):
    path = native(tmp_path, tiny_model_dir, resources={"ray": {"rpc_timeout": 0}})
    assert refused([path], capsys).startswith("resources.ray.rpc_timeout: must be > 0, got 0")


@pytest.mark.slow
@pytest.mark.ray
def test_an_unsatisfiable_ray_placement_ends_within_its_deadline(tmp_path, tiny_model_dir, capsys):
    """A cluster whose CPUs another job holds: Ray cannot reserve the roles' bundles, and
    ``train`` stops after rpc_timeout in one line naming the roles, the devices asked and
    what the cluster has free — not a silent wait."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():  # an earlier test's Ray: this test needs a cluster of its own
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        held = ray.util.placement_group([{"CPU": 2}])  # the other job
        ray.get(held.ready(), timeout=60)
        path = native(tmp_path, tiny_model_dir, resources={"ray": {"rpc_timeout": 3}})
        begin = time.monotonic()
        assert main(["train", path]) == 2
        took = time.monotonic() - begin
        out, err = capsys.readouterr()
    finally:
        ray.shutdown()
    assert took < 60, took
    # exit 2 is the one-line path of main(); stderr also holds Ray's own log lines (and,
    # after some earlier tests, the logging module's complaint about a stream they closed)
    assert "Traceback" not in out, out
    errors = [line for line in err.splitlines() if line.startswith("config error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith(
        "config error: resources.actor_train: actor, rollout: Ray could not reserve devices "
        "0,1 (2 bundles of {'CPU': 1}) within 3s; the cluster has 0 of 2 CPU free. Fix: free "
        "the cluster's devices"
    ), errors


# --------------------------------------------------------------------------- reward workers


def test_a_reward_worker_that_never_starts_stops_within_its_deadline(tmp_path, monkeypatch):
    """A worker whose imports hang (a module that blocks at import) ends the run's wait
    at the start-up deadline with one line, not never."""
    from temper.cli.main import _user_error_hint
    from temper.rewards import executor
    from temper.rewards.worker import FunctionSpec

    (tmp_path / "hangs_on_import.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # a spawned worker starts with this sys.path
    monkeypatch.setattr(executor, "STARTUP_TIMEOUT_S", 3.0)
    pool = executor.RewardExecutor(1, preload=("hangs_on_import",))
    call = executor.RewardCall(FunctionSpec("arithmetic"), {}, 5)
    begin = time.monotonic()
    try:
        with pytest.raises(executor.RewardWorkerError) as err:
            pool.run([call])
    finally:
        pool.close()
    assert time.monotonic() - begin < 30
    assert str(err.value).startswith(
        "reward worker: not ready within 3s of its start (a new Python process importing the "
        "reward's modules: hangs_on_import). Fix: "
    )
    assert _user_error_hint(err.value) == ""  # temper train prints it as one line


# --------------------------------------------------------------------------- environment


@pytest.mark.slow
def test_megatron_actor_and_zero3_critic_on_the_local_backend(tmp_path, tiny_model_dir):
    """Issue 29: ROLL's PPO file with the actor on megatron_train and the critic on a
    ZeRO-3 deepspeed_train, on one device. Megatron made the one-rank world without the
    launcher variables, and DeepSpeed's ``zero.Init`` then read ``LOCAL_RANK``: a
    KeyError traceback, unless an earlier test of the suite had set it. A user's shell
    has none of them, so neither does this run. In the file's bf16 the critic's value
    head (fp32, made outside zero.Init) then broke ZeRO-3's flattening: an
    AssertionError traceback."""
    out = tmp_path / "out"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    env["TEMPER_CACHE"] = str(tmp_path / "cache")
    args = [
        str(ROLL_PPO),
        f"pretrain={tiny_model_dir}",
        f"reward_pretrain={tiny_model_dir}",
        "max_steps=1",
        "prompt_length=96",
        "response_length=8",
        "num_gpus_per_node=1",
        *[
            f"{r}.device_mapping=list(range(0,1))"
            for r in ("actor_train", "actor_infer", "reference", "critic")
        ],
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "critic.strategy_args.strategy_name=deepspeed_train",
        "critic.strategy_args.strategy_config={zero_optimization:{stage:3}}",
        "actor_train.data_args.file_name=[task:arithmetic?n=64&seed=5]",
        "actor_train.data_args.messages=prompt",
        "rollout_batch_size=64",
        "~validation",
        "track_with=stdout",
        f"output_dir={out}",
        f"checkpoint_config.output_dir={out / 'ckpt'}",
    ]
    run = subprocess.run(
        [sys.executable, "-m", "temper", "train", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stdout + run.stderr
    assert "done: 1 steps" in run.stdout
