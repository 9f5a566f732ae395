"""``temper check`` as a pre-flight: what ``temper train`` would reject in its first minute.

A config that validates can still fail once a run starts: a model directory that does
not exist, a data file without the prompt column, an output directory that cannot be
written, an engine that is not installed or cannot run on this machine, a data source no
reward function scores, a tracker whose package is missing. :func:`preflight` finds those
before Ray starts or a model loads — reading ``config.json`` / ``tokenizer_config.json``, data schemas and columns,
never weights — and raises a ``ConfigError`` naming the key, the reason and the fix.

Two things are settled instead of refused, so a GPU config can be debugged on a laptop:

- an attention kernel this machine lacks (``flash_attention_2`` without the flash-attn
  package or without CUDA) becomes ``sdpa``, the same math, with a note;
- GPU-only tuning keys (engine memory fractions, CUDA graphs, fused kernels, …) set away
  from their defaults are accepted with a note when the run is on CPU.

The models' checks are :mod:`temper.pipelines.preflight_models`'s, the data files'
:mod:`temper.pipelines.preflight_data`'s (each pipeline's pre-flight calls the ones for
its rows); this module has the engines, outputs, tools and the driver's list.
``temper check`` prints the notes; ``temper train`` runs the same checks first. Checks are
grouped (:data:`CHECKS`) so a caller can run some of them (the replay test of the
upstream files runs ``engines`` and ``rewards`` only: their model and data paths are the
authors'). The ``pipeline`` group is the run's pipeline's own pre-flight (its record's
``preflight``: RLVR's prompt files, the agentic pipeline's environments).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from temper.config.derive import Derived, placement
from temper.config.errors import ConfigError
from temper.config.plan import NO_TRAINING
from temper.config.schema import TemperConfig
from temper.pipelines.preflight_models import check_model_files, check_model_path, check_models

# --------------------------------------------------------------------------- hardware


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def on_cpu(cfg: TemperConfig) -> bool:
    """Whether the run computes on CPU (``experiment.device``; ``auto`` without CUDA)."""
    device = cfg.experiment.device
    return device == "cpu" or (device == "auto" and not _cuda())


#: FlashAttention kernels (transformers' names) and the module each needs; a CUDA kernel,
#: so on CPU (or without the module) sdpa stands in
FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}

#: GPU-only tuning keys: (native key, default, what it tunes). On CPU a non-default value
#: changes nothing and is noted.
GPU_TUNING: tuple[tuple[str, Any, str], ...] = (
    ("rollout.gpu_memory_utilization", 0.5, "the engine's share of GPU memory"),
    ("rollout.enforce_eager", True, "CUDA graphs"),
    ("rollout.free_cache_engine", True, "freeing the GPU KV cache between phases"),
    ("model.use_liger", False, "Liger's fused GPU kernels"),
    ("model.use_fused_kernels", False, "fused GPU log-prob kernels"),
    ("model.enable_activation_offload", False, "offloading activations from GPU memory"),
    ("actor.fsdp.param_offload", False, "offloading parameters from GPU memory"),
    ("actor.fsdp.optimizer_offload", False, "offloading optimizer state from GPU memory"),
    ("critic.fsdp.param_offload", False, "offloading parameters from GPU memory"),
    ("critic.fsdp.optimizer_offload", False, "offloading optimizer state from GPU memory"),
    ("reference.param_offload", False, "offloading parameters from GPU memory"),
)


def _get(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _set(cfg: Any, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        cfg = getattr(cfg, part)
    setattr(cfg, leaf, value)


def check_engines(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """Rollout engine, training strategies and attention kernel: installed and able to
    run here (vLLM with this model; a DeepSpeed section that resolves; Megatron degrees
    this hardware runs); GPU-only tuning noted on CPU."""
    from temper.cluster.placement import worker_device
    from temper.rollout.registry import (
        check_rollout_engine,
        check_routed_experts,
        check_tensor_parallel,
        engine_problem,
    )
    from temper.training.megatron_check import check_megatron
    from temper.training.registry import check_engines as check_training_engines
    from temper.training.router_replay import from_rollout

    if plan.use_rollout:  # a pipeline that generates nothing (SFT) builds no engine
        problem = engine_problem(cfg.rollout.engine)
        if problem is not None:
            raise problem
        check_rollout_engine(cfg.rollout, cfg.model)  # e.g. a VL model this vLLM cannot run
        if from_rollout(cfg.actor.router_replay):  # R3: the engine returns routing here
            check_routed_experts(cfg.rollout, cfg.model)
    if cfg.experiment.device == "cuda" and not _cuda():
        # verl's trainer.device defaults to cuda: a GPU config debugged on a laptop
        cfg.experiment.device = "cpu"
        notes.append("experiment.device: cuda -> cpu (no CUDA device on this machine)")
    check_training_engines(cfg, plan)  # deepspeed installed, its section resolves
    notes.extend(check_megatron(cfg, plan, worker_device(cfg)))
    if plan.use_rollout:
        rollout_devices = len(placement(cfg)["actor_infer"])
        check_tensor_parallel(
            cfg.rollout,
            cfg.resources.backend,
            rollout_devices,
            cfg.model,
            standalone=NO_TRAINING in plan.uses,
        )
    cpu = on_cpu(cfg)
    attn = cfg.model.attn_implementation
    if attn in FLASH_PACKAGES:
        package = FLASH_PACKAGES[attn]
        missing = importlib.util.find_spec(package) is None
        if cpu or missing:
            why = "the run is on CPU" if cpu else f"its package ({package}) is not installed"
            cfg.model.attn_implementation = "sdpa"
            notes.append(
                f"model.attn_implementation: {attn} -> sdpa ({why}; sdpa computes the same "
                "attention)"
            )
    if cfg.model.use_liger and not cpu and importlib.util.find_spec("liger_kernel") is None:
        cfg.model.use_liger = False  # speed only, like flash-attn's fallback above
        notes.append(
            "model.use_liger: true -> false (liger-kernel is not installed; its kernels "
            "change speed only)"
        )
    if cpu:
        for key, default, what in GPU_TUNING:
            value = _get(cfg, key)
            if value != default:
                notes.append(f"{key}={value!r}: GPU-only tuning ({what}); no effect on CPU")
        trained = [("actor", cfg.actor)] + ([("critic", cfg.critic)] if plan.use_critic else [])
        for role, train in trained:
            if train.master_dtype != "fp32":
                notes.append(
                    f"{role}.master_dtype={train.master_dtype}: the role then computes in "
                    f"{train.master_dtype} on CPU, which is slow without AVX-512 half-precision "
                    "instructions; fp32 is the CPU advice"
                )


# --------------------------------------------------------------------------- outputs


def check_outputs(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The run and checkpoint directories can be created and written and have room for a
    checkpoint; the checkpoint a run would resume from (``experiment.resume_mode``) is
    complete, and its config does not change the run's meaning (``resume_strict``); a
    start that would replace the run the directory holds is refused, and a directory a
    live run holds is noted (:func:`~temper.pipelines.run_dir.check_run_dir`).

    Complete here means its manifest and every file's size (a stat per file, cheap for
    any model); ``temper train`` also verifies every file's checksum before it loads
    one, and passes over a damaged one to the newest older checkpoint that verifies."""
    from temper.pipelines.checkpointing import check_resume_config
    from temper.pipelines.run import output_dir
    from temper.pipelines.run_dir import check_run_dir, resume_point

    out = output_dir(cfg)
    resume = resume_point(cfg, out, verify=False)
    check_run_dir(cfg, out, resume, notes)
    if resume is not None:
        check_resume_config(cfg, resume)  # its report is the run's to print
    writable(out, "experiment.output_dir")
    if cfg.experiment.checkpoint_dir:
        writable(Path(cfg.experiment.checkpoint_dir).expanduser(), "experiment.checkpoint_dir")
    for key in ("rollout_data_dir", "validation_data_dir", "render_save_dir"):
        value = getattr(cfg.experiment, key)
        if value:
            writable(Path(value).expanduser(), f"experiment.{key}")
    check_checkpoint_space(cfg, plan, notes)


def check_checkpoint_space(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The checkpoint directory's disk has room for one checkpoint, estimated from the
    models' ``config.json`` (parameters counted on the meta device, no weights read); an
    uncertain estimate (LoRA) that does not fit is a note. A checkpoint is written before
    the retention limit removes an old one, so one more must fit whatever is kept."""
    import shutil

    from temper.pipelines.checkpointing import (
        checkpoint_root,
        estimate_checkpoint_size,
        format_bytes,
    )
    from temper.pipelines.run import output_dir

    try:
        actor = check_model_path(cfg.model.path, "model.path", [])
        critic = None
        if plan.use_critic:
            critic_path = cfg.critic.model_path or cfg.model.path
            critic = check_model_path(critic_path, "critic.model_path", [])
    except ConfigError:
        return  # the models' own check says what is wrong with them
    if actor is None or (plan.use_critic and critic is None):
        return  # a model alias not converted yet: its size is known once it is
    root = checkpoint_root(cfg, output_dir(cfg))
    probe = root.resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    estimate = estimate_checkpoint_size(cfg, actor, critic, on_cpu(cfg))
    key = "experiment.checkpoint_dir" if cfg.experiment.checkpoint_dir else "experiment.output_dir"
    if estimate is None:
        notes.append(f"{key}: a checkpoint's size cannot be estimated for this model here")
        return
    if free >= estimate.bytes:
        return
    need = f"a checkpoint takes about {format_bytes(estimate.bytes)} ({estimate.how})"
    have = f"the disk of {root} has {format_bytes(free)} free"
    if not estimate.certain:
        notes.append(f"{key}: {need}, and {have}")
        return
    raise ConfigError(
        key,
        f"{need}, and {have}",
        "free space there, or set experiment.checkpoint_dir to a disk with room",
    )


def writable(path: Path, key: str) -> None:
    """``path`` exists as a writable directory, or its nearest existing parent is one."""
    probe = path.resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(key, f"{probe} is a file, so {path} cannot be a directory", "")
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == path.resolve() else f" (its nearest existing parent {probe})"
        raise ConfigError(
            key, f"{path} cannot be written{where}", "choose a directory you can write"
        )


# --------------------------------------------------------------------------- tools, envs


def check_tools(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The multi-turn tool config loads and names registered tools; the interaction
    config loads and names interactions temper has."""
    mt = cfg.rollout.multi_turn
    if mt.interaction_config_path:
        from temper.rewards.interactions import load_interactions

        try:
            load_interactions(mt.interaction_config_path)
        except (OSError, ValueError) as e:
            raise ConfigError(
                "rollout.multi_turn.interaction_config_path",
                str(e),
                "point it at an interaction YAML whose classes temper has (see "
                "temper.rewards.interactions.INTERACTIONS)",
            ) from e
    if mt.tool_config_path:
        from temper.envs import tools as tool_registry
        from temper.rollout.tools import load_tool_schemas, schema_names

        schemas = load_tool_schemas(mt.tool_config_path)
        unknown = [n for n in schema_names(schemas) if n not in tool_registry.tool_names()]
        if unknown:
            raise ConfigError(
                "rollout.multi_turn.tool_config_path",
                f"tools {unknown} are not in temper's tool registry "
                f"({', '.join(tool_registry.tool_names())})",
                "register them with temper.envs.tools.register_tool, or remove them",
            )


# --------------------------------------------------------------------------- driver

Check = Callable[[TemperConfig, Derived, list[str]], None]


def check_reward_runtime(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The code sandbox runs here, the judge's template and parser resolve, IFEval is
    installed (:func:`temper.rewards.preflight.check_rewards`)."""
    from temper.rewards.preflight import check_rewards

    check_rewards(cfg.reward)


def check_placement(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The roles' devices fit the cluster Ray will have: this machine when no Ray
    address is set (:mod:`temper.pipelines.cluster_fit`)."""
    from temper.pipelines.cluster_fit import check_placement as fit

    fit(cfg, plan, notes)


def check_pipeline_files(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The run's pipeline's own pre-flight (its record's ``preflight``)."""
    from temper.pipelines.registry import resolve_pipeline

    resolve_pipeline(cfg.pipeline).preflight(cfg, notes)


def check_tracker_setup(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """Each tracker's package is installed and its ``tracker_kwargs`` are ones it reads."""
    from temper.tracking import check_trackers

    check_trackers(cfg.experiment.trackers, cfg.experiment.tracker_kwargs)


CHECKS: dict[str, Check] = {
    "engines": check_engines,  # first: it settles experiment.device, which placement reads
    "placement": check_placement,
    "rewards": check_reward_runtime,
    "models": check_models,
    "model_files": check_model_files,
    "outputs": check_outputs,
    "pipeline": check_pipeline_files,
    "tools": check_tools,
    "trackers": check_tracker_setup,
}


def preflight(cfg: TemperConfig, plan: Derived, checks: Collection[str] | None = None) -> list[str]:
    """Run the pre-flight ``checks`` (all by default) on ``cfg``; raise a ConfigError for
    the first problem; return the notes of what was settled or has no effect here.
    ``cfg`` is updated in place where a setting is settled (the attention kernel)."""
    from temper.pipelines.registry import resolve_pipeline

    applies = resolve_pipeline(cfg.pipeline).checks  # a pipeline without a run directory
    notes: list[str] = []
    for name, check in CHECKS.items():
        if (checks is None or name in checks) and (applies is None or name in applies):
            check(cfg, plan, notes)
    return notes
