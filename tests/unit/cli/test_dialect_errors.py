"""Every place that refuses a config tells a verl or ROLL user in the keys of their own
file: the schema's types, each section, registry names, the batch arithmetic (config
validation), what the run and its pipeline cannot honour (``Pipeline.check`` and the
driver's checks, inside ``load_config``), the pre-flight of this machine and its files,
and whatever the run raises after loading — all through one translation."""

from __future__ import annotations

from pathlib import Path

import pytest

from temper.cli.main import main
from temper.config.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
VERL = str(EXAMPLES / "verl_gsm8k_ppo.yaml")
ROLL = str(EXAMPLES / "roll_rlvr.yaml")
ROLL_AGENTIC = str(EXAMPLES / "roll_agentic_sokoban.yaml")

# (site, file, overrides, the message's start, a word of the fix in that dialect)
CASES = [
    (
        "types",
        ROLL,
        ["prompt_length=abc"],
        "prompt_length (temper: data.max_prompt_length)",
        "set prompt_length",
    ),
    (
        "names",
        VERL,
        ["algorithm.adv_estimator=grpoo"],
        "algorithm.adv_estimator (temper: algorithm.adv_estimator): unknown value 'grpoo'",
        "use one of",
    ),
    (
        "names",
        ROLL,
        ["adv_estimator=grpoo"],
        "adv_estimator (temper: algorithm.adv_estimator)",
        "grpo",
    ),
    (
        "section",
        VERL,
        ["actor_rollout_ref.rollout.top_p=1.5"],
        "actor_rollout_ref.rollout.top_p (temper: rollout.top_p)",
        "",
    ),
    (
        "section",
        ROLL,
        ["actor_infer.generating_args.top_p=1.5"],
        "actor_infer.generating_args.top_p (temper: rollout.top_p)",
        "",
    ),
    (
        "roles",
        VERL,
        ["algorithm.adv_estimator=gae", "critic.enable=false"],
        "critic.enable (temper: critic.enable): adv_estimator gae needs a critic",
        "set critic.enable=true",
    ),
    ("roles", ROLL, ["pretrain="], "pretrain (temper: model.path)", "set pretrain to"),
    (
        "arithmetic",
        VERL,
        ["actor_rollout_ref.actor.ppo_mini_batch_size=3"],
        "actor_rollout_ref.actor.ppo_mini_batch_size (temper: actor.mini_batch_size)",
        "divisor",
    ),
    (
        "arithmetic",
        ROLL,
        ["actor_train.training_args.per_device_train_batch_size=3"],
        "actor_train.training_args.gradient_accumulation_steps (temper: actor.mini_batch_size)",
        "divisor",
    ),
    (
        "driver",
        VERL,
        ["reward_model.launch_reward_fn_async=true"],
        "reward_model.launch_reward_fn_async (temper: reward.launch_async)",
        "set reward_model.launch_reward_fn_async=false",
    ),
    (
        "driver",
        ROLL,
        ["use_reward_norm=true"],
        "use_reward_norm (temper: algorithm.use_reward_norm)",
        "set use_reward_scaling=true",
    ),
    (
        "multi-turn",
        VERL,
        [
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.format=xml",
        ],
        "actor_rollout_ref.rollout.multi_turn.format (temper: rollout.multi_turn.format)",
        "set actor_rollout_ref.rollout.multi_turn.format to one of hermes",
    ),
    (
        "pipeline",
        VERL,
        ["actor_rollout_ref.actor.checkpoint.save_contents=['hf_model']"],
        "actor_rollout_ref.actor.checkpoint.save_contents (temper: actor.checkpoint_contents)",
        "set it to [model, optimizer, extra]",
    ),
    (
        "validation",
        VERL,
        [
            "algorithm.adv_estimator=optimal_token_baseline",
            "actor_rollout_ref.actor.calculate_sum_pi_squared=false",
        ],
        "actor_rollout_ref.actor.calculate_sum_pi_squared (temper: actor.calculate_sum_pi_squared)"
        ": adv_estimator optimal_token_baseline needs Σπ² per token",
        "set actor_rollout_ref.actor.calculate_sum_pi_squared=true",
    ),
    (
        "policy loss",
        VERL,
        ["actor_rollout_ref.actor.policy_loss.loss_mode=dro"],
        "actor_rollout_ref.actor.policy_loss.dro_beta (temper: actor.policy_loss_kwargs.dro_beta)"
        ": policy loss 'dro' needs a positive dro_beta",
        "set actor_rollout_ref.actor.policy_loss.dro_beta to a number > 0",
    ),
    (
        "pipeline",
        VERL,
        ["data.train_files=[]"],
        "data.train_files (temper: data.train_files): no training data given",
        "set data.train_files",
    ),
    (
        "pipeline",
        ROLL,
        ["render_save_dir=/tmp/x"],
        "render_save_dir (temper: experiment.render_save_dir)",
        "remove render_save_dir (environments are played, and rendered, by an agentic "
        "config: train_env_manager)",
    ),
    (
        "pipeline",
        ROLL_AGENTIC,
        ["max_steps=null"],
        "max_steps (temper: experiment.max_steps)",
        "set max_steps",
    ),
    (
        "pipeline",
        ROLL_AGENTIC,
        ["train_env_manager.tags=[Nope]"],
        "train_env_manager.tags (temper: agentic.train_env_manager.tags)",
        "define it under custom_envs",
    ),
]


def _refusal(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["check", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: ") and "\n" not in err, err
    return err.removeprefix("config error: ")


@pytest.mark.parametrize(("site", "path", "overrides", "start", "fix"), CASES)
def test_config_refusals_speak_the_files_dialect(site, path, overrides, start, fix, capsys):
    msg = _refusal([path, *overrides, "--config-only"], capsys)
    assert msg.startswith(start), msg
    assert fix in msg.split(". Fix: ", 1)[-1], msg


@pytest.mark.parametrize(
    ("path", "model_key", "resume", "start"),
    [
        (
            VERL,
            "actor_rollout_ref.model.path",
            [
                "critic.enable=false",
                "algorithm.adv_estimator=grpo",
                "trainer.resume_mode=resume_path",
                "trainer.resume_from_path=/nope",
            ],
            "trainer.resume_from_path (temper: experiment.resume_from_path)",
        ),
        (
            ROLL,
            "pretrain",
            ["resume_from_checkpoint=/nope"],
            "resume_from_checkpoint (temper: experiment.resume_from_path)",
        ),
    ],
)
def test_preflight_refusals_speak_the_files_dialect(
    path, model_key, resume, start, tiny_model_dir, capsys
):
    msg = _refusal([path, f"{model_key}={tiny_model_dir}", *resume], capsys)
    assert msg.startswith(start), msg
    msg = _refusal([path, f"{model_key}=/no/such/model"], capsys)
    assert msg.startswith(f"{model_key} (temper: model.path): model directory not found"), msg


def test_an_error_of_the_run_speaks_the_files_dialect(tiny_model_dir, capsys, monkeypatch):
    """A ConfigError the run raises after loading (building roles, resuming) is told in the
    file's keys too: ``main`` translates every one."""

    def run_pipeline(cfg, plan=None):
        raise ConfigError(
            "actor.mini_batch_size", "a problem found while building", "set actor.mini_batch_size=4"
        )

    monkeypatch.setattr("temper.pipelines.run_pipeline", run_pipeline)
    monkeypatch.setattr("temper.pipelines.preflight.preflight", lambda cfg, plan: [])
    assert main(["train", VERL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "config error: actor_rollout_ref.actor.ppo_mini_batch_size (temper: actor.mini_batch_size)"
    ), err
    assert "Fix: set actor_rollout_ref.actor.ppo_mini_batch_size=4" in err, err


def test_values_in_a_fix_are_spelled_as_the_dialect_spells_them():
    from temper.pipelines.catalog import load_config

    err = ConfigError("rollout.engine", "vllm cannot run it here", "set rollout.engine=hf")
    assert str(load_config(ROLL).in_dialect(err)).endswith(
        "Fix: set actor_infer.strategy_args.strategy_name=hf_infer"
    )
    assert str(load_config(VERL).in_dialect(err)).endswith(
        "Fix: set actor_rollout_ref.rollout.name=hf"
    )


def test_a_fix_for_a_key_the_dialect_sets_inverted_names_the_opposite_value(tmp_path):
    """verl's bypass_mode: true sets actor.recompute_old_log_prob: false; a fix that asks
    for the recompute asks the verl user for bypass_mode=false."""
    from temper.pipelines.catalog import load_config

    loaded = load_config(VERL, ["algorithm.rollout_correction.bypass_mode=true"])
    err = ConfigError(
        "actor.rollout_rs",
        "no token would ever be rejected",
        "set actor.recompute_old_log_prob=true, or remove actor.rollout_rs",
    )
    assert "bypass_mode=false" in str(loaded.in_dialect(err))


def test_a_fix_asking_for_the_ray_backend_asks_a_dialect_for_more_devices():
    """verl and ROLL pick the backend by device count: ``resources.backend=ray`` in a
    fix reads as more than one device there, not as the one-device phrase of the key."""
    from temper.pipelines.catalog import load_config

    err = ConfigError("rollout.tensor_parallel_size", "2 > 1", "run on resources.backend=ray")
    verl = str(load_config(VERL).in_dialect(err))
    assert verl.endswith(
        "Fix: run on more than one device (trainer.nnodes × trainer.n_gpus_per_node > 1: Ray)"
    ), verl
    roll = str(load_config(ROLL).in_dialect(err))
    assert "more than one device in the device_mappings" in roll, roll
    err = ConfigError("experiment.device", "x", "set resources.backend=local")
    assert "one device (trainer.nnodes=1" in str(load_config(VERL).in_dialect(err))
