"""verl's fully-async trainer (``verl.experimental.fully_async_policy``, the 2026-08
snapshot's two config files) as ``async_training.mode: streaming``: each key of its
``async_training`` section, its top-level ``rollout`` section and the keys it asserts —
honoured, noted, or refused with key, reason and fix (``verl.fully_async``).

Every row starts from the config file with what each of verl's launching scripts sets
(``SCRIPT``: verl asserts the first two) and changes one key.
"""

from __future__ import annotations

from typing import Any

import pytest
from reference_paths import UPSTREAM  # next to this file

from temper.cli.main import main
from temper.config.dialects.verl.translate import translate_verl
from temper.config.errors import ConfigError
from temper.config.loader import load_yaml
from temper.pipelines.catalog import CATALOG, load_config

FA = UPSTREAM / "verl-2026-08-1dda039/verl/experimental/fully_async_policy/config"
FILES = ("fully_async_ppo_trainer.yaml", "fully_async_ppo_megatron_trainer.yaml")
SCRIPT = (
    "actor_rollout_ref.hybrid_engine=false",  # verl asserts both
    "data.train_batch_size=0",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",  # a step: 4 × 1 × 8 = 32 prompts
    "rollout.total_rollout_steps=320",  # 10 steps
)


def translated(*overrides: str, name: str = FILES[0]) -> tuple[dict[str, Any], str]:
    t = translate_verl(load_yaml(FA / name, [*SCRIPT, *overrides]), CATALOG)
    return t.native, "\n".join(t.notes)


def refused(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        translated(*overrides)
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("name", FILES)
def test_the_file_runs_streaming_one_push_cycle_a_step_on_its_own_rollout_pool(name):
    out, text = translated(name=name)
    assert out["async_training"] == {
        "staleness": 1,  # ceil(staleness_threshold 0.1)
        "mode": "streaming",
        "max_off_policy_strategy": "wait",
        "max_ahead_batches": 1.1,  # verl stops at (1 + staleness_threshold) cycles
        "partial_rollout_segment": 128,  # ceil(max_response_length 512 / 4)
    }
    assert out["data"]["train_batch_size"] == 32
    assert out["experiment"]["max_steps"] == 10
    res = out["resources"]  # trainer 1 × 8 (ppo_trainer), rollout 1 × 8 (the file's)
    assert res["actor_train"] == list(range(8)) and res["actor_infer"] == list(range(8, 16))
    assert out["actor"]["recompute_old_log_prob"] is False  # the file's bypass_mode: true
    assert out["actor"]["strategy"] == ("megatron" if "megatron" in name else "fsdp2")
    assert any(
        "FullyAsyncTrainer) never reads trainer.v1" in line and "trainer.v1.trainer_mode" in line
        for line in text.splitlines()
    )


@pytest.mark.parametrize(
    ("overrides", "batch", "updates"),
    [
        ((), 32, 4),
        (("async_training.require_batches=2",), 64, 8),
        (("async_training.trigger_parameter_sync_step=1",), 8, 1),
        (
            ("async_training.trigger_parameter_sync_step=2", "async_training.require_batches=3"),
            48,
            6,
        ),
    ],
)
def test_a_step_is_trigger_x_require_batches_mini_batch_updates_then_one_push(
    overrides, batch, updates
):
    out, text = translated(*overrides, "rollout.total_rollout_steps=960")
    assert out["data"]["train_batch_size"] == batch
    assert out["actor"]["mini_batch_size"] == 8  # each update one mini-batch
    assert f"trained as {updates} mini-batch updates, then one weight push" in text
    assert out["experiment"]["max_steps"] == 960 // batch


@pytest.mark.parametrize(("threshold", "k"), [(0.1, 1), (0.5, 1), (1, 1), (1.5, 2), (3, 3)])
def test_staleness_threshold_t_is_staleness_ceil_t(threshold, k):
    out, text = translated(f"async_training.staleness_threshold={threshold}")
    assert out["async_training"]["staleness"] == k
    assert out["async_training"]["mode"] == "streaming"
    assert f"async_training.staleness {k} = ceil(staleness_threshold {threshold:g})" in text


def test_staleness_threshold_0_is_the_synchronous_loop():
    out, text = translated("async_training.staleness_threshold=0")
    assert out.get("async_training", {}) == {"staleness": 0}  # mode fixed: synchronous
    assert "no generation is in flight at a weight push" in text


@pytest.mark.parametrize(
    ("overrides", "segment"),
    [
        ((), 128),
        (("data.max_response_length=1000",), 250),
        (("data.max_response_length=3",), 1),
        (("async_training.partial_rollout=false",), None),
    ],
)
def test_partial_rollout_is_a_segment_of_a_quarter_of_the_response(overrides, segment):
    out, _ = translated(*overrides)
    assert out["async_training"].get("partial_rollout_segment") == segment


def test_total_rollout_steps_counts_prompts_and_null_runs_the_epochs():
    out, text = translated(
        "rollout.total_rollout_steps=100", "actor_rollout_ref.actor.ppo_mini_batch_size=4"
    )
    assert out["experiment"]["max_steps"] == 6  # floor(100 / 16)
    out, text = translated("rollout.total_rollout_steps=null", "trainer.total_training_steps=5")
    assert "max_steps" not in out.get("experiment", {})
    assert (
        "trainer.total_training_steps: no effect here (verl's fully-async trainer counts its "
        "steps from rollout.total_rollout_steps)" in text
    )


def test_the_rollout_pool_sits_beside_the_trainers():
    out, text = translated(
        "trainer.n_gpus_per_node=6", "rollout.nnodes=1", "rollout.n_gpus_per_node=2"
    )
    res = out["resources"]
    assert res["actor_train"] == list(range(6)) and res["actor_infer"] == [6, 7]
    assert "fully-async main sets it from the top-level rollout section" in text


def test_standalone_memory_share_is_the_rollouts():
    out, _ = translated(
        "actor_rollout_ref.rollout.standalone_gpu_memory_utilization=0.5",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
    )
    assert out["rollout"]["gpu_memory_utilization"] == 0.5


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("async_training.use_trainer_do_validate", "where validation runs"),
        ("async_training.concurrent_samples_per_replica", "caps the requests each rollout"),
        ("async_training.dynamic_schedule_policy", "use_dynamic_resource_scheduling only"),
        ("async_training.dynamic_schedule_deactivate_ratio", "use_dynamic_resource_scheduling"),
        ("async_training.dynamic_schedule_enable_rebalance", "use_dynamic_resource_scheduling"),
        ("async_training.use_dynamic_resource_scheduling", "the trainer's devices only train"),
        ("rollout.n", "reads the top-level rollout.n"),
        ("data.gen_batch_size", "draws one prompt at a time"),
        ("actor_rollout_ref.actor.use_rollout_log_probs", "no code of verl reads it"),
        ("actor_rollout_ref.rollout.nnodes", "fully-async main sets it"),
        ("trainer.v1.sampler.max_off_policy_strategy", "FullyAsyncTrainer) never reads"),
    ],
)
def test_keys_noted_with_the_reason_they_change_nothing(key, words):
    _, text = translated()
    assert any(words in line and key in line for line in text.splitlines()), key


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        (
            "async_training.use_dynamic_resource_scheduling=true",
            "async_training.use_dynamic_resource_scheduling",
            "dynamic resource scheduling",
        ),
        ("data.train_batch_size=64", "data.train_batch_size", "asserts it is 0"),
        ("data.gen_batch_size=4", "data.gen_batch_size", "asserts gen_batch_size is 1"),
        ("actor_rollout_ref.hybrid_engine=true", "actor_rollout_ref.hybrid_engine", "is false"),
        ("async_training.staleness_threshold=-1", "async_training.staleness_threshold", ">= 0"),
        (
            "async_training.trigger_parameter_sync_step=0",
            "async_training.trigger_parameter_sync_step",
            ">= 1",
        ),
        ("async_training.require_batches=0", "async_training.require_batches", ">= 1"),
        ("async_training.partial_rollout=maybe", "async_training.partial_rollout", "true or false"),
        (  # bypass mode (the file's) refuses it first, for a reason of its own
            "actor_rollout_ref.rollout.calculate_log_probs=false "
            "algorithm.rollout_correction.bypass_mode=false",
            "actor_rollout_ref.rollout.calculate_log_probs",
            "computes its log-probs",
        ),
        ("rollout.total_rollout_steps=16", "rollout.total_rollout_steps", "fewer than one step's"),
        ("rollout.n_gpus_per_node=0", "rollout.n_gpus_per_node", "positive integer"),
        (
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.enable",
            "does not read algorithm.filter_groups",
        ),
    ],
)
def test_what_verl_asserts_or_temper_lacks_is_refused(override, key, words):
    text = refused(*override.split())
    assert text.startswith(f"{key}: ") and words in text and "Fix: " in text


# ------------------------------------------------------------------ temper check


def _check_line(tiny: Any, out: Any) -> list[str]:
    """The usual overrides of an upstream file (model, data, length, device, outputs) and
    what verl's launching scripts set (``SCRIPT``)."""
    return [
        *SCRIPT,
        f"actor_rollout_ref.model.path={tiny}",  # model
        f"critic.model.path={tiny}",
        "data.train_files=task:arithmetic?n=64&seed=5",  # data
        "data.val_files=task:arithmetic?n=8&seed=6&split=test",
        "data.max_prompt_length=96",  # length
        "data.max_response_length=8",
        "trainer.n_gpus_per_node=1",  # device
        "rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={out}",  # outputs
    ]


@pytest.mark.parametrize("name", FILES)
def test_temper_check_passes_the_fully_async_files(name, tiny_model_dir, tmp_path):
    line = _check_line(tiny_model_dir, tmp_path / "out")
    cfg = load_config(FA / name, line).config
    assert (cfg.async_training.mode, cfg.async_training.staleness) == ("streaming", 1)
    assert cfg.async_training.partial_rollout_segment == 2  # a quarter of 8
    assert main(["check", str(FA / name), *line]) == 0


def test_the_multi_turn_tool_line_streams_a_partial_rollout_of_its_tool_turns():
    """``dapo_7b_async_retool.sh``: verl's fully-async multi-turn tool calling with
    ``partial_rollout=True`` — no longer refused for its turns. Without its custom dataset
    class (refused on its own: custom code) the line's config builds, each model turn
    generated in segments of a quarter of 16384 tokens."""
    from upstream_scripts import script_commands  # next to this file

    root = UPSTREAM / "verl-2026-08-1dda039"
    (cmd,) = script_commands(
        root / "verl/experimental/fully_async_policy/shell/dapo_7b_async_retool.sh", root
    )
    overrides = [o for o in cmd.overrides if not o.startswith("data.custom_cls")]
    cfg = load_config(cmd.config, overrides).config
    assert cfg.rollout.multi_turn.enable and cfg.rollout.multi_turn.tool_config_path
    assert (cfg.async_training.mode, cfg.async_training.staleness) == ("streaming", 1)
    assert cfg.async_training.partial_rollout_segment == 4096
