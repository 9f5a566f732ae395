"""``temper check --explain KEY``: a key's doc, type and default, in any dialect."""

from __future__ import annotations

from temper.cli.main import main


def explain(capsys, *keys: str) -> str:
    args = ["check"] + [a for k in keys for a in ("--explain", k)]
    assert main(args) == 0
    return capsys.readouterr().out


def test_a_native_key(capsys):
    out = explain(capsys, "actor.clip_ratio_high")
    assert out.splitlines() == [
        "actor.clip_ratio_high (temper key)",
        "  Upper clip epsilon (default clip_ratio).",
        "  type: float | null; default: null",
    ]


def test_a_registry_backed_key_lists_the_names_it_takes(capsys):
    out = explain(capsys, "actor.strategy")
    assert "values (the strategy registry): deepspeed, fsdp2, megatron, torch" in out


def test_the_verl_and_roll_spellings(capsys):
    out = explain(
        capsys, "actor_rollout_ref.actor.clip_ratio_high", "actor_train.training_args.learning_rate"
    )
    assert "actor_rollout_ref.actor.clip_ratio_high (verl key): sets actor.clip_ratio_high" in out
    assert "    Upper clip epsilon (default clip_ratio)." in out
    assert "actor_train.training_args.learning_rate (ROLL key): sets actor.optim.lr" in out
    assert "    type: float; default: 1e-06" in out


def test_a_key_accepted_without_effect_says_why(capsys):
    out = explain(capsys, "trainer.default_hdfs_dir")
    assert out.startswith(
        "trainer.default_hdfs_dir (verl key): accepted at its inert value(s) (checkpoints stay "
        "local); otherwise refused: HDFS is not supported. Fix: use a local "
        "trainer.default_local_dir"
    )


def test_an_unknown_key_is_one_line(capsys):
    assert main(["check", "--explain", "actor.clip_ratio_hihg"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: actor.clip_ratio_hihg: not a key of the native schema")
    assert "\n" not in err


def test_check_without_a_config_or_explain_is_one_line(capsys):
    assert main(["check"]) == 2
    assert "temper check needs a config file" in capsys.readouterr().err


def test_verl_09_keys_and_keys_read_by_their_own_rule(capsys):
    """A key a rule of its own reads (verl 0.9's trainer_mode, reward.sandbox_fusion) says
    what the rule does."""
    out = explain(capsys, "model_engine", "trainer.v1.trainer_mode", "reward.sandbox_fusion")
    assert "model_engine (verl key): sets actor.strategy (converted)" in out
    assert "trainer.v1.trainer_mode (verl key): verl's V1 trainer mode: ``sync`` is" in out
    assert "set ``async_training.staleness`` to ``num_warmup_batches``" in out
    assert "reward.sandbox_fusion (verl key): verl 0.9's reward.sandbox_fusion" in out
