"""Playing episodes without training: the ``agentic_rollout`` pipeline (``temper generate``;
ROLL's agentic rollout pipeline, ``start_agentic_rollout_pipeline.py``).

For ``experiment.max_steps`` steps the policy of ``model.path`` plays every env group of
``agentic.train_env_manager`` — reset with the step's seeds, as a training step's are
(:class:`~temper.envs.EnvManager`), played by the run's env manager
(``agentic.env_manager``) with the rollout engine ``rollout.engine`` names and the
sampling ``rollout.*`` sets. Nothing is trained: the weights are ``model.path``'s
throughout.

Each step logs to the trackers in ``experiment.output_dir`` (``metrics.jsonl`` always),
under ``val/`` as ROLL does: the episode metrics (success rate overall and per tag, mean
return, turns, invalid-action rate: :func:`~temper.pipelines.trajectories.episode_metrics`),
``val/score/{mean,max,min}`` of the episode returns overall and per tag
(``val/<tag>/score/…``), and the rollout's own metrics and ``time/step_rollout``. With
``experiment.rollout_data_dir`` every step's episodes go to ``<step>.jsonl``, one row per
episode as the agentic pipeline dumps them (ROLL's ``rollout_dump_dir``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from temper.cluster.generation import RESOURCE_KEYS
from temper.config.errors import ConfigError
from temper.config.plan import NO_TRAINING, ROLLOUT
from temper.config.schema import TemperConfig
from temper.pipelines.agentic import check_env_managers, check_env_tags, episode_groups
from temper.pipelines.record import Pipeline, episode_length, no_producer
from temper.pipelines.unread import refuse_run_keys, refuse_unread

#: Sections a rollout of episodes reads nothing of, and why.
TRAINS_NOTHING = "an agentic rollout trains nothing"
UNREAD_SECTIONS = {
    "critic": f"{TRAINS_NOTHING}: no critic",
    "reference": f"{TRAINS_NOTHING}: no reference",
    "distill": f"{TRAINS_NOTHING}: no teachers",
    "async_training": f"{TRAINS_NOTHING}: there is no training to run ahead of",
    "generate": "the episodes come from agentic.train_env_manager, not prompt files",
    "actor": f"{TRAINS_NOTHING}: the policy is model.path's, sampled by rollout.*",
    "algorithm": f"{TRAINS_NOTHING}: no advantages, losses or reward shaping",
    "reward": "the episodes' returns are the environments' rewards",
}
#: Keys of shared sections it reads nothing of, and why.
UNREAD_KEYS = {
    "data.train_files": "the episodes come from agentic.train_env_manager",
    "data.val_files": "there is no validation: every step plays the train env manager",
    "agentic.val_env_manager": "there is no validation: every step plays the train env manager",
    "rollout.val": "there is no validation: every step samples with rollout.*",
}
#: The env managers an agentic rollout plays (validation's is refused)
TRAIN_ONLY = ("train_env_manager",)
#: The experiment and resources keys it reads (the rest: refused).
READS = {
    "experiment": (
        "seed",
        "device",
        "max_steps",
        "output_dir",
        "trackers",
        "tracker_kwargs",
        "project_name",
        "experiment_name",
        "logging_steps",
        "rollout_data_dir",
    ),
    "resources": RESOURCE_KEYS,
}


def score_metrics(returns: Sequence[float], tags: Sequence[str]) -> dict[str, float]:
    """ROLL's rollout scores: ``val/score/{mean,max,min}`` of the episode returns, and the
    same per tag as ``val/<tag>/score/…``."""
    out: dict[str, float] = {}
    groups: dict[str, list[float]] = {"": list(returns)}
    for value, tag in zip(returns, tags, strict=True):
        groups.setdefault(f"{tag}/", []).append(value)
    for prefix, values in groups.items():
        if values:
            out[f"val/{prefix}score/mean"] = sum(values) / len(values)
            out[f"val/{prefix}score/max"] = max(values)
            out[f"val/{prefix}score/min"] = min(values)
    return out


def play_episodes(cfg: TemperConfig) -> dict[str, Any]:
    """Play ``experiment.max_steps`` steps of episodes (module docstring); the summary."""
    from temper.cluster.generation import build_generation_engine
    from temper.cluster.judge import build_judge
    from temper.cluster.placement import worker_device
    from temper.envs import EnvManager
    from temper.pipelines.demand import demand_of
    from temper.pipelines.dumps import dump_generations
    from temper.pipelines.env_managers import ENV_MANAGERS
    from temper.pipelines.run import load_tokenizer, seed_everything
    from temper.pipelines.trajectories import episode_metrics, trajectory_rows
    from temper.rewards.preflight import sandbox_choice
    from temper.rollout import sampling_params_from_config
    from temper.tracking import build_trackers
    from temper.training.models import import_external_lib

    exp = cfg.experiment
    assert exp.max_steps is not None  # check() refuses a rollout without it
    start = time.perf_counter()
    seed_everything(exp.seed)
    import_external_lib(cfg.model.external_lib)
    tokenizer = load_tokenizer(cfg)
    engine = build_generation_engine(cfg, tokenizer, demand_of(cfg))
    judge = build_judge(cfg, worker_device(cfg), None)  # for envs that grade with one
    box = sandbox_choice(cfg.reward)  # for the envs that play in the run's sandbox
    envs = EnvManager.from_agentic(cfg.agentic, "train", exp.seed, judge=judge, sandbox=box)
    player = ENV_MANAGERS.get(cfg.agentic.env_manager).player(cfg, engine, tokenizer)
    params = sampling_params_from_config(cfg.rollout, validation=False)
    tracker = build_trackers(
        exp.trackers,
        exp.output_dir,
        total_steps=exp.max_steps,
        every=exp.logging_steps,
        kwargs=exp.tracker_kwargs,
        project=exp.project_name,
        name=exp.experiment_name,
    )

    def decode(ids: list[int]) -> str:
        text: str = tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return text

    success = 0.0
    try:
        for step in range(1, exp.max_steps + 1):
            begin = time.perf_counter()
            played = player.play_round(envs, step, params)
            seconds = time.perf_counter() - begin
            episodes = played.episodes
            metrics = {
                **played.metrics,
                **episode_metrics(episodes, "val"),
                **score_metrics(episodes["episode_return"], episodes["tag"]),
                "time/step_rollout": seconds,
            }
            tracker.log(metrics, step)
            if exp.rollout_data_dir:
                dump_generations(
                    exp.rollout_data_dir, step, trajectory_rows(played.batch, step, decode)
                )
            success = metrics["val/success_rate"]
            print(
                f"[{step}/{exp.max_steps}] {len(episodes)} episodes, success "
                f"{success:.3f}, return {metrics['val/score/mean']:.3f} ({seconds:.1f}s)",
                flush=True,
            )
    finally:
        tracker.close()
        engine.close()
        if judge is not None:
            judge.close()
    return {"steps": exp.max_steps, "success_rate": success, "seconds": time.perf_counter() - start}


def preflight(cfg: TemperConfig, notes: list[str]) -> None:
    """The train env manager's environments resolve and can run here."""
    check_env_tags(cfg, TRAIN_ONLY, notes)


def check(cfg: TemperConfig) -> None:
    """Keys an agentic rollout reads nothing of are refused with why; it needs steps."""
    refuse_unread(cfg, "agentic_rollout", UNREAD_SECTIONS, UNREAD_KEYS)
    refuse_run_keys(
        cfg,
        "agentic_rollout",
        "an agentic rollout logs metrics and dumps episodes from the rollout's engines (no "
        "checkpoints or validation, and no roles to place but the rollout's)",
        READS,
    )
    check_env_managers(cfg.agentic, TRAIN_ONLY)
    if cfg.experiment.max_steps is None:
        raise ConfigError(
            "experiment.max_steps",
            "an agentic rollout plays a number of steps, not epochs of a dataset",
            "set experiment.max_steps",
        )


PIPELINE = Pipeline(
    build=no_producer,
    uses=frozenset({ROLLOUT, NO_TRAINING}),
    check=check,
    preflight=preflight,
    step_shape=episode_groups,
    sections=frozenset({"agentic"}),
    context=episode_length,
    command="generate",
    main=play_episodes,
    checks=frozenset({"engines", "models", "model_files", "pipeline"}),
)
