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

Checkpoints prove themselves (:mod:`temper.checkpoint.store`): the look-up of the one to
resume from checks manifests and sizes (cheap: the pre-flight's check), and ``temper
train`` checks every file's checksum too before loading (``verify=True``). A damaged
checkpoint — by its sums, or because it does not load — is passed over with one line, and
the run resumes from the newest older one that is whole; when none is, one ``ConfigError``
says so. The run's final export, ``<output_dir>/final/actor``, is sealed the same way
(:func:`write_final`), so a rerun can tell a complete one from a cut one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import yaml

from temper.checkpoint import (
    MANIFEST,
    WriteFailed,
    capture_rng,
    checkpoint_problem,
    config_changes,
    newest_valid,
    prune,
    read_manifest,
    restore_rng,
    write_checkpoint,
    write_sealed,
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
FINAL_DIR = "final"


class CheckpointWriteError(RuntimeError):
    """A checkpoint or the final export could not be written because the disk refused it
    (full, over quota, a file-size limit): one line that says what is intact and how the
    same command goes on."""


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
    """Where the run is: its step, and the history of its curve (the pipeline's per-step
    metric: RL's ``train/score_mean``, SFT's ``train/loss``) and of its validations that
    the summary reports (so a resumed run's summary covers the steps before the
    interruption)."""

    step: int = 0
    curve: list[float] = dataclasses.field(default_factory=list)
    validations: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "curve_history": list(self.curve),
            "val_history": [(step, dict(m)) for step, m in self.validations],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        # checkpoints written before the curve was the pipeline's held the reward only
        history = state.get("curve_history", state.get("reward_history", []))
        self.curve = [float(r) for r in history]
        self.validations = [(int(s), dict(m)) for s, m in state.get("val_history", [])]


def checkpoint_root(cfg: TemperConfig, out_dir: Path) -> Path:
    """``experiment.checkpoint_dir``, or ``<output_dir>/checkpoints``."""
    exp = cfg.experiment
    return Path(exp.checkpoint_dir).expanduser() if exp.checkpoint_dir else out_dir / "checkpoints"


def _resume_root(cfg: TemperConfig, out_dir: Path) -> tuple[Path, str] | None:
    """Where the run looks for checkpoints and the key that names it — None when
    ``experiment.resume_from_path`` names one checkpoint (no other is a stand-in)."""
    exp = cfg.experiment
    if exp.resume_mode == "auto":
        key = "experiment.checkpoint_dir" if exp.checkpoint_dir else "experiment.output_dir"
        return checkpoint_root(cfg, out_dir), key
    path = Path(str(exp.resume_from_path)).expanduser()
    if (path / MANIFEST).is_file():
        return None
    return path, "experiment.resume_from_path"  # a checkpoint root: its newest valid one


class NoUsableCheckpoint(ConfigError):
    """Checkpoints are there but none is usable: starting over would replace them, which
    only ``experiment.overwrite`` does (it moves them aside first). ``reasons``: each
    checkpoint's name and what is wrong with it."""

    def __init__(self, key: str, reason: str, fix: str, reasons: str) -> None:
        super().__init__(key, reason, fix)
        self.reasons = reasons


def _none_usable(root: Path, key: str, skipped: list[tuple[Path, str]]) -> ConfigError:
    listed = "; ".join(f"{path.name}: {why}" for path, why in skipped)
    return NoUsableCheckpoint(
        key,
        f"no checkpoint under {root} is usable ({listed})",
        "restore one from a copy, start over with experiment.overwrite=true (moves the run "
        "to <dir>.old-<time>), or choose another experiment.output_dir",
        reasons=listed,
    )


def find_resume_checkpoint(
    cfg: TemperConfig, out_dir: Path, verify: bool = False, warnings: list[str] | None = None
) -> Path | None:
    """The checkpoint this run continues from, per ``experiment.resume_mode``: the newest
    usable one.

    ``verify=False`` checks manifests and file sizes (a stat per file: the pre-flight's
    check, cheap for any model); ``verify=True`` also reads every file of the candidate
    and compares its checksum (``temper train``, right before loading it). Each newer
    checkpoint passed over adds a line to ``warnings``. Checkpoints present but none
    usable is a ``ConfigError``: starting over would silently replace them.
    """
    if cfg.experiment.resume_mode == "disable":
        return None
    where = _resume_root(cfg, out_dir)
    if where is None:  # resume_from_path names one checkpoint
        path = Path(str(cfg.experiment.resume_from_path)).expanduser()
        problem = checkpoint_problem(path, verify)
        if problem is not None:
            raise ConfigError(
                "experiment.resume_from_path",
                f"{path} is damaged ({problem})",
                "resume from an earlier checkpoint (its parent directory: the newest valid "
                "one), or use resume_mode=auto",
            )
        return path
    root, key = where
    found, skipped = newest_valid(root, verify)
    if found is None and skipped:
        raise _none_usable(root, key, skipped)
    if found is None and cfg.experiment.resume_mode != "auto":
        raise ConfigError(
            "experiment.resume_from_path",
            f"{root} is not a complete checkpoint (no valid manifest.json) and holds none",
            "point it at a global_step_<N> directory written by temper, or use resume_mode=auto",
        )
    if warnings is not None:
        warnings += [_damaged_line(bad, why, found) for bad, why in skipped]
    return found


def _damaged_line(bad: Path, why: str, found: Path | None) -> str:
    return f"resume: {bad} is damaged ({why}); resuming from {found}"


def restore(
    checkpointer: Checkpointer,
    cfg: TemperConfig,
    out_dir: Path,
    path: Path,
    warn: Callable[[str], None],
    note: Callable[[str], None],
) -> Path:
    """Load ``path`` into the run; if it does not load (damaged in a way its manifest
    cannot show — a format-1 checkpoint without checksums, bytes bad before they were
    summed), fall back to the newest older checkpoint that verifies, telling ``warn`` one
    line per checkpoint passed over (and ``note`` the config comparison with the one
    taken instead). Returns the checkpoint loaded.

    A later load overwrites every part an earlier, failed one may have restored (the
    roles' weights and optimizer, then each state), so the run is the older checkpoint's
    exactly. A ``ConfigError`` (the checkpoint does not fit this run) is not damage.
    """
    while True:
        try:
            checkpointer.load(path)
            return path
        except ConfigError:
            raise
        except Exception as err:
            text = " ".join(str(err).split())[:200]
            why = f"it does not load: {type(err).__name__}: {text}"
            where = _resume_root(cfg, out_dir)
            if where is None:
                raise ConfigError(
                    "experiment.resume_from_path",
                    f"{path} is damaged ({why})",
                    "resume from an earlier checkpoint, or use resume_mode=auto",
                ) from err
            log.debug("checkpoint %s does not load", path, exc_info=True)
            root, key = where
            older, skipped = newest_valid(root, verify=True, below=checkpoint_step(path))
            skipped = [(path, why), *skipped]
            if older is None:
                raise _none_usable(root, key, skipped) from err
            for bad, reason in skipped:
                warn(_damaged_line(bad, reason, older))
            for line in check_resume_config(cfg, older):
                note(line)
            path = older


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
        try:
            with write_checkpoint(self.root, step, meta=meta) as tmp:
                for name, role in self.roles.items():
                    tokenizer = self.tokenizer if name == "actor" else None
                    _save_role(role, tmp / name, tmp / f"{name}_train", tokenizer)
                torch.save(
                    {k: part.state_dict() for k, part in self.states.items()},
                    tmp / TRAINER_STATE,
                )
                (tmp / CONFIG_FILE).write_text(
                    yaml.safe_dump(self.config, sort_keys=False, allow_unicode=True),
                    encoding="utf-8",
                )
        except WriteFailed as err:
            previous, _ = newest_valid(self.root)
            then = (
                f"{previous} is intact: the same command resumes from it"
                if previous is not None
                else "no earlier checkpoint exists: free some space and start over "
                "(experiment.overwrite=true moves this run aside)"
            )
            raise CheckpointWriteError(_refused(err, "checkpoint", then)) from err
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


def _refused(err: WriteFailed, what: str, then: str) -> str:
    """The one line of a write the disk refused: what failed and why, what is intact and
    how to go on."""
    free = "" if err.free is None else f"; {format_bytes(err.free)} free there"
    return (
        f"the {what} {err.target} could not be written ({err.reason}{free}); nothing of it "
        f"was kept, and {then} once the disk has room (free space there, or set "
        "experiment.checkpoint_dir / experiment.output_dir to a disk with room)"
    )


def format_bytes(n: float) -> str:
    """``n`` bytes in decimal units (``1.2 GB``)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


# --------------------------------------------------------------------------- the final export


def write_final(out_dir: Path, step: int, engine: Any, tokenizer: Any, last: Path | None) -> Path:
    """``<out_dir>/final/actor``: the trained actor as a Hugging Face directory (loads in
    transformers and vLLM), with its tokenizer. ``final/`` is sealed like a checkpoint
    (temp dir, manifest with checksums, rename), so it appears whole or not at all: a
    signal or a full disk during the export leaves the previous one (or none), never a
    cut one. ``last``: the checkpoint the export can be rewritten from (the error says so).
    """
    target = out_dir / FINAL_DIR
    try:
        with write_sealed(target, step, meta={"export": "final"}) as tmp:
            engine.save_hf(str(tmp / "actor"))
            tokenizer.save_pretrained(str(tmp / "actor"))
    except WriteFailed as err:
        then = f"{last} is intact: the same command writes final/actor from it"
        raise CheckpointWriteError(_refused(err, "final export", then)) from err
    return target / "actor"


def final_problem(out_dir: Path) -> str | None:
    """Why ``<out_dir>/final/actor`` is not a complete export (``missing``, ``incomplete
    (…)`` naming the file, or not known to be whole), or None. Checksums are verified:
    the export is what users load, and it costs what reading it costs."""
    target = out_dir / FINAL_DIR
    if not (target / "actor").is_dir():
        return "missing"
    if not (target / MANIFEST).is_file():  # cut, or written before exports were sealed
        return f"not known to be whole (no {FINAL_DIR}/{MANIFEST})"
    problem = checkpoint_problem(target, verify=True)
    return None if problem is None else f"incomplete ({problem})"


# --------------------------------------------------------------------------- size of one


#: What one checkpoint holds per trained parameter, in units of the training dtype: the
#: Hugging Face export, the engine's exact copy, and AdamW's two moments. Engines that
#: keep fp32 master weights beside bf16 ones write more, so this is a lower bound.
COPIES_PER_PARAMETER = 4
_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclasses.dataclass(frozen=True)
class SizeEstimate:
    """One checkpoint's size in bytes; ``certain``: a lower bound the write will reach
    (False under LoRA: the export is merged, the adapters' state depends on targets)."""

    bytes: int
    how: str
    certain: bool


def parameter_count(config: dict[str, Any], backbone: bool = False) -> int | None:
    """The parameters of the model a ``config.json`` describes, counted on the meta device
    (no memory, no weights read; tied weights once). ``backbone``: without the LM head
    (a critic). None when this transformers does not know the architecture."""
    import transformers

    # A best effort for a pre-flight estimate: a config this transformers cannot build
    # (an unknown model_type, remote code, a kernel needed at init) gives no estimate.
    try:
        conf = transformers.AutoConfig.for_model(**config)
    except Exception:
        return None
    names = ("AutoModel",) if backbone else ("AutoModelForCausalLM", "AutoModel")
    for name in names:  # a model with no causal-LM class (a VL one): its backbone
        cls: Any = getattr(transformers, name)
        try:
            with torch.device("meta"):
                model = cls.from_config(conf)
        except Exception:
            continue
        return sum(p.numel() for p in model.parameters())
    return None


def estimate_checkpoint_size(
    cfg: TemperConfig,
    actor: dict[str, Any],
    critic: dict[str, Any] | None,
    cpu: bool,
) -> SizeEstimate | None:
    """One checkpoint's size, from the ``config.json`` of the policy (``actor``) and of the
    critic (when there is one) and the training dtype (``auto``: fp32 on CPU, bf16 on
    GPU); None if a model's parameters cannot be counted here."""
    dtype = cfg.model.dtype if cfg.model.dtype != "auto" else ("fp32" if cpu else "bf16")
    width = _DTYPE_BYTES[dtype]
    params = parameter_count({**actor, **cfg.model.override_config})
    if params is None:
        return None
    parts = [f"{_count(params)} parameters"]
    total = params
    if critic is not None:
        value = parameter_count(critic, backbone=True)
        if value is None:
            return None
        total += value
        parts.append(f"a {_count(value)}-parameter critic")
    if cfg.model.lora.rank > 0:  # the merged export; the adapters and their state are small
        how = f"{' + '.join(parts)} × {width} bytes: the merged LoRA export"
        return SizeEstimate(total * width, how, certain=False)
    how = (
        f"{' + '.join(parts)} × {width} bytes ({dtype}) × {COPIES_PER_PARAMETER}: the export, "
        "the trainer's copy and AdamW's two moments"
    )
    return SizeEstimate(total * width * COPIES_PER_PARAMETER, how, certain=True)


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n:,}"
