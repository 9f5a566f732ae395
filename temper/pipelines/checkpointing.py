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
uninterrupted run, for every pipeline (see the resume tests). The HF directory is an
export, not what resume reads: ``actor_train`` keeps the exact trainable tensors
(adapters only, under LoRA).

The :class:`Checkpointer` knows no trainer: it is built from the run's *stateful parts*
(torchtitan's ``states={…}``) — the trained roles, which write directories, and named
parts with ``state_dict``/``load_state_dict`` (progress, producer, shaping, rollout,
RNG), restored in the order given (the RNG last, right before training goes on).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any, Protocol

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
from temper.roles.base import TrainedRole

log = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.pt"
CONFIG_FILE = "config.yaml"
#: The manifest ``meta`` key of a recovery checkpoint (replaced by the next save).
RECOVERY = "recovery"


class Stateful(Protocol):
    """A part of the run whose state a checkpoint holds (torch's ``Stateful``)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RNGState:
    """Every global RNG (python, numpy, torch, CUDA) as a stateful part."""

    def state_dict(self) -> dict[str, Any]:
        return capture_rng()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng(state)


@dataclasses.dataclass
class Progress:
    """Where the run is: its step, and the reward and validation history the summary
    reports (so a resumed run's summary covers the steps before the interruption)."""

    step: int = 0
    rewards: list[float] = dataclasses.field(default_factory=list)
    validations: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "reward_history": list(self.rewards),
            "val_history": [(step, dict(m)) for step, m in self.validations],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.rewards = [float(r) for r in state.get("reward_history", [])]
        self.validations = [(int(s), dict(m)) for s, m in state.get("val_history", [])]


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
            "undo those changes, start a new run in another experiment.output_dir, or set "
            "experiment.resume_strict=false to continue anyway",
        )
    return lines


def checkpoint_step(path: Path) -> int:
    manifest = read_manifest(path)
    if manifest is None:
        raise ValueError(f"{path} is not a complete checkpoint")
    return manifest.step


# --------------------------------------------------------------------------- the checkpointer


@dataclasses.dataclass
class Checkpointer:
    """Saves and restores a run's stateful parts as ``<root>/global_step_<N>``.

    ``roles``: trained roles by name (``actor``, ``critic``), each written as ``<name>/``
    (the Hugging Face export, with ``tokenizer`` for the actor) and ``<name>_train/`` (its
    engine's resumable state, in the engine's own format, and its update count).
    ``states``: parts stored in ``trainer_state.pt`` under their names, loaded in this
    order. ``config``: the resolved config written beside them; ``keep``: how many
    checkpoints to keep (None: all).
    """

    root: Path
    roles: dict[str, TrainedRole]
    states: dict[str, Stateful]
    config: dict[str, Any]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    tokenizer: Any = None
    keep: int | None = None
    last_save_s: float = 0.0

    def save(self, step: int, recovery: bool = False) -> Path:
        """Write ``global_step_<step>`` atomically, then apply the retention limit.

        ``recovery``: a checkpoint only to resume from after a crash (a time-based save):
        the next checkpoint replaces it, and it does not count towards ``keep``.
        """
        start = time.perf_counter()
        meta = {**self.meta, RECOVERY: True} if recovery else self.meta
        with write_checkpoint(self.root, step, meta=meta) as tmp:
            for name, role in self.roles.items():
                tokenizer = self.tokenizer if name == "actor" else None
                _save_role(role, tmp / name, tmp / f"{name}_train", tokenizer)
            torch.save(
                {k: part.state_dict() for k, part in self.states.items()}, tmp / TRAINER_STATE
            )
            (tmp / CONFIG_FILE).write_text(
                yaml.safe_dump(self.config, sort_keys=False, allow_unicode=True), encoding="utf-8"
            )
        final = self.root / f"global_step_{step}"
        for old in prune(self.root, self.keep, protect=final, transient=RECOVERY):
            log.info("removed old checkpoint %s", old)
        self.last_save_s = time.perf_counter() - start
        return final

    def load(self, path: Path) -> None:
        """Restore everything :meth:`save` wrote, roles first, then the states in order."""
        state = _upgrade(torch.load(path / TRAINER_STATE, map_location="cpu", weights_only=True))
        for name, role in self.roles.items():
            train_dir = path / f"{name}_train"
            if not train_dir.is_dir():
                raise ConfigError(
                    f"{name}.enable",
                    f"this run has a {name} but checkpoint {path} has none",
                    f"resume with the checkpoint's algorithm/{name} settings",
                )
            _load_role(role, train_dir)
        for name, part in self.states.items():
            part.load_state_dict(state[name])


def _upgrade(state: dict[str, Any]) -> dict[str, Any]:
    """A trainer state of an earlier layout in today's: the progress was stored flat
    (step and histories at the top), the producer's state as the sampler's alone."""
    if "progress" not in state:
        keys = ("step", "reward_history", "val_history")
        state = {**state, "progress": {k: state[k] for k in keys if k in state}}
    if state.get("producer") is None:
        state["producer"] = {"sampler": state.get("sampler")}
    state.setdefault("rollout", {})
    return state


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
