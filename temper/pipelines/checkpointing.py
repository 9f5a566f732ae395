"""What a run's checkpoint holds, and how a run is saved and resumed.

One checkpoint (``<checkpoint_dir>/global_step_<N>/``, written atomically by
:mod:`temper.checkpoint`) holds::

    actor/              Hugging Face model directory + tokenizer (loads in transformers
                        and vLLM; LoRA: merged weights + lora_adapter/)
    actor_train/        model.safetensors (the trainable tensors, exact) and state.pt
                        (optimizer, LR schedule, update count)
    critic/, critic_train/   the same for the critic, when there is one
    trainer_state.pt    step, the producer's state (RLVR: the sampler position; agentic:
                        the env managers' seeds), every RNG, KL controller and running
                        reward statistics, rollout-engine state, reward and validation
                        history
    config.yaml         the resolved config of the run that wrote it

Resume restores all of it, so the resumed run draws the same prompts (plays the same
episodes), samples the same responses and computes the same updates as the
uninterrupted run, for every pipeline (see the resume tests). The HF directory is an export, not what resume reads: ``actor_train`` keeps the
exact trainable tensors (adapters only, under LoRA).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import yaml

from temper.checkpoint import (
    capture_rng,
    config_changes,
    find_latest,
    prune,
    read_manifest,
    restore_rng,
    write_checkpoint,
)
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.config.typed import to_dict

if TYPE_CHECKING:
    from temper.pipelines.run import Run
    from temper.roles.base import TrainedRole

log = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.pt"
CONFIG_FILE = "config.yaml"


def checkpoint_root(cfg: TemperConfig, out_dir: Path) -> Path:
    """``experiment.checkpoint_dir``, or ``<output_dir>/checkpoints``."""
    exp = cfg.experiment
    return Path(exp.checkpoint_dir).expanduser() if exp.checkpoint_dir else out_dir / "checkpoints"


def find_resume_checkpoint(cfg: TemperConfig, out_dir: Path) -> Path | None:
    """The checkpoint this run continues from, per ``experiment.resume_mode``."""
    exp = cfg.experiment
    if exp.resume_mode == "disable":
        return None
    if exp.resume_mode == "auto":
        return find_latest(checkpoint_root(cfg, out_dir))
    path = Path(str(exp.resume_from_path)).expanduser()
    if (path / "manifest.json").is_file():
        if read_manifest(path) is None:
            raise ConfigError(
                "experiment.resume_from_path",
                f"{path} is damaged (a file is missing or has the wrong size; see the log)",
                "resume from an earlier checkpoint, or use resume_mode=auto",
            )
        return path
    latest = find_latest(path)  # a checkpoint root is accepted too: its latest valid one
    if latest is None:
        raise ConfigError(
            "experiment.resume_from_path",
            f"{path} is not a complete checkpoint (no valid manifest.json) and holds none",
            "point it at a global_step_<N> directory written by temper, or use resume_mode=auto",
        )
    return latest


def check_resume_config(cfg: TemperConfig, path: Path) -> list[str]:
    """Compare the checkpoint's config with ``cfg``; raise on meaning changes (if strict).

    Returns the report lines (harmless changes included) for the console.
    """
    saved_file = path / CONFIG_FILE
    if not saved_file.is_file():
        return [f"resume: {path} has no {CONFIG_FILE}; config not compared"]
    saved = yaml.safe_load(saved_file.read_text(encoding="utf-8")) or {}
    changes = config_changes(saved, to_dict(cfg))
    meaning = [c for c in changes if c.rule.kind == "meaning"]
    lines = [f"resume: config change {c} [{c.rule.kind}]" for c in changes]
    if meaning and cfg.experiment.resume_strict:
        listed = "; ".join(str(c) for c in meaning)
        raise ConfigError(
            "experiment.resume_strict",
            f"resuming {path} with a config that changes the run's meaning: {listed}",
            "undo those changes, start a new run (experiment.resume_mode=disable or another "
            "output_dir), or set experiment.resume_strict=false to continue anyway",
        )
    return lines


def checkpoint_step(path: Path) -> int:
    manifest = read_manifest(path)
    if manifest is None:
        raise ValueError(f"{path} is not a complete checkpoint")
    return manifest.step


# --------------------------------------------------------------------------- role state


def _save_role(role: TrainedRole, hf_dir: Path, train_dir: Path, tokenizer: Any) -> None:
    """The role's HF directory (``hf_dir``) and its resumable engine state
    (``train_dir/engine``, in the engine's own format: sharded for fsdp2)."""
    engine = role.engine
    engine.save_hf(str(hf_dir))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(hf_dir))
    train_dir.mkdir(parents=True)
    engine.save_checkpoint(str(train_dir / "engine"))
    torch.save({"updates": role.updates}, train_dir / "state.pt")


def _load_role(role: TrainedRole, train_dir: Path) -> None:
    extra = torch.load(train_dir / "state.pt", map_location="cpu", weights_only=True)
    role.engine.load_checkpoint(str(train_dir / "engine"))
    role.updates = int(extra["updates"])


# --------------------------------------------------------------------------- run state


def save_checkpoint(run: Run) -> Path:
    """Write ``global_step_<run.step>`` atomically, then apply the retention limits."""
    cfg, roles = run.cfg, run.roles
    root = checkpoint_root(cfg, run.out_dir)
    start = time.perf_counter()
    with write_checkpoint(root, run.step, meta={"pipeline": cfg.pipeline}) as tmp:
        _save_role(roles.actor, tmp / "actor", tmp / "actor_train", run.tokenizer)
        if roles.critic is not None:
            _save_role(roles.critic, tmp / "critic", tmp / "critic_train", None)
        torch.save(
            {
                "step": run.step,
                "producer": run.producer.state_dict(),
                "rng": capture_rng(),
                "shaping": run.shaping_state.state_dict(),
                "rollout": run.rollout.state_dict(),
                "reward_history": list(run.reward_history),
                "val_history": [(step, dict(m)) for step, m in run.val_history],
            },
            tmp / TRAINER_STATE,
        )
        (tmp / CONFIG_FILE).write_text(
            yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True), encoding="utf-8"
        )
    final = root / f"global_step_{run.step}"
    limits = [cfg.experiment.max_actor_ckpt_to_keep]
    if roles.critic is not None:
        limits.append(cfg.experiment.max_critic_ckpt_to_keep)
    set_limits = [n for n in limits if n is not None and n > 0]
    for old in prune(root, max(set_limits) if set_limits else None, protect=final):
        log.info("removed old checkpoint %s", old)
    run.last_save_s = time.perf_counter() - start
    return final


def load_checkpoint(run: Run, path: Path) -> None:
    """Restore everything :func:`save_checkpoint` wrote; RNG last, right before training."""
    state = torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True)
    _load_role(run.roles.actor, path / "actor_train")
    if run.roles.critic is not None:
        if not (path / "critic_train").is_dir():
            raise ConfigError(
                "critic.enable",
                f"this run has a critic but checkpoint {path} has none",
                "resume with the checkpoint's algorithm/critic settings",
            )
        _load_role(run.roles.critic, path / "critic_train")
    # checkpoints written before the producers had their own state hold the sampler's
    run.producer.load_state_dict(state.get("producer") or {"sampler": state.get("sampler")})
    run.shaping_state.load_state_dict(state["shaping"])
    if state.get("rollout"):
        run.rollout.load_state_dict(state["rollout"])
    run.step = int(state["step"])
    run.reward_history = [float(r) for r in state.get("reward_history", [])]
    run.val_history = [(int(s), dict(m)) for s, m in state.get("val_history", [])]
    run.sync_weights(force=True)
    restore_rng(state["rng"])
