"""Save/resume: checkpoint layout, atomic writes, discovery, retention, RNG, config checks.

A low layer (DESIGN.md): it knows directories, files, RNGs and config dicts; the
pipelines decide what goes into a checkpoint (see ``temper.pipelines.checkpointing``).
"""

from temper.checkpoint.compat import RULES, ConfigChange, KeyRule, config_changes, rule_for
from temper.checkpoint.rng import capture_rng, restore_rng
from temper.checkpoint.store import (
    MANIFEST,
    Manifest,
    WriteFailed,
    checkpoint_problem,
    find_latest,
    list_checkpoints,
    newest_valid,
    prune,
    read_manifest,
    step_dir,
    write_checkpoint,
    write_sealed,
)

__all__ = [
    "MANIFEST",
    "RULES",
    "ConfigChange",
    "KeyRule",
    "Manifest",
    "WriteFailed",
    "capture_rng",
    "checkpoint_problem",
    "config_changes",
    "find_latest",
    "list_checkpoints",
    "newest_valid",
    "prune",
    "read_manifest",
    "restore_rng",
    "rule_for",
    "step_dir",
    "write_checkpoint",
    "write_sealed",
]
