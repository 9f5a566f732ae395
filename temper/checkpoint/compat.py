"""Which config changes between save and resume change a run's meaning.

Resuming with another model, other data, other batch sizes or another algorithm does not
continue the saved run: it starts a different one from its weights, and the curves
after the resume point no longer belong to the curves before it. Such changes are
reported (and stop the resume unless ``experiment.resume_strict`` is false). Changes
that only affect where things are logged, how often validation runs, or how fast the
same math is computed are harmless and allowed.

The table is matched by longest dotted prefix; a key no rule names counts as
meaning-changing (the safe default for keys added later).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Kind = Literal["meaning", "harmless"]


@dataclass(frozen=True)
class KeyRule:
    """How a change of the keys under ``prefix`` is judged, and why."""

    prefix: str
    kind: Kind
    why: str


def _rules(kind: Kind, why: str, *prefixes: str) -> tuple[KeyRule, ...]:
    return tuple(KeyRule(p, kind, why) for p in prefixes)


RULES: tuple[KeyRule, ...] = (
    *_rules("meaning", "the trained model, its data or its objective", "pipeline", "model"),
    *_rules("meaning", "what is trained on and in which order", "data", "experiment.seed"),
    *_rules("meaning", "how responses are sampled and scored", "rollout", "reward", "algorithm"),
    *_rules("meaning", "the policy/value update", "actor", "critic", "agentic"),
    *_rules("meaning", "whether a KL reference exists", "reference.enable"),
    *_rules(
        "harmless",
        "names, logging, saving and validation cadence",
        "experiment.project_name",
        "experiment.experiment_name",
        "experiment.output_dir",
        "experiment.checkpoint_dir",
        "experiment.save_freq",
        "experiment.save_every_minutes",
        "experiment.save_on_signal",
        "experiment.max_actor_ckpt_to_keep",
        "experiment.max_critic_ckpt_to_keep",
        "experiment.resume_mode",
        "experiment.resume_from_path",
        "experiment.resume_strict",
        "experiment.overwrite",
        "experiment.test_freq",
        "experiment.val_before_train",
        "experiment.val_after_train",
        "experiment.val_only",
        "experiment.log_val_generations",
        "experiment.logging_steps",
        "experiment.trackers",
        "experiment.tracker_kwargs",
        "experiment.rollout_data_dir",
        "experiment.validation_data_dir",
        "experiment.render_save_dir",
        "experiment.profile_steps",
    ),
    *_rules(
        "harmless",
        "the run's length (the LR schedule keeps the checkpoint's length)",
        "experiment.max_steps",
        "experiment.total_epochs",
    ),
    *_rules(
        "harmless",
        "placement and speed: the same math on other hardware or engines",
        "experiment.device",
        "experiment.balance_batch",
        "resources",
        "reference",
        "model.enable_gradient_checkpointing",
        "model.enable_activation_offload",
        "model.use_remove_padding",
        "model.use_liger",
        "model.use_fused_kernels",
        "model.attn_implementation",
        "rollout.engine",
        "rollout.infer_batch_size",
        "rollout.gpu_memory_utilization",
        "rollout.tensor_parallel_size",
        "rollout.enforce_eager",
        "rollout.free_cache_engine",
        "rollout.max_num_seqs",
        "rollout.max_num_batched_tokens",
        "rollout.enable_chunked_prefill",
        "rollout.block_size",
        "rollout.disable_log_stats",
        "rollout.enable_prefix_caching",
        "rollout.engine_kwargs",
        "rollout.log_prob_micro_batch_size_per_device",
        "rollout.log_prob_use_dynamic_bsz",
        "rollout.log_prob_max_token_len_per_device",
        "reward.num_workers",
        "reward.launch_async",
    ),
    *_rules("harmless", "validation only", "data.val_", "data.validation_shuffle", "rollout.val"),
    *(
        rule
        for role in ("actor", "critic")
        for rule in _rules(
            "harmless",
            "micro-batching and parallel layout (the loss is split-invariant)",
            f"{role}.micro_batch_size_per_device",
            f"{role}.use_dynamic_bsz",
            f"{role}.max_token_len_per_device",
            f"{role}.log_prob_micro_batch_size_per_device",
            f"{role}.log_prob_max_token_len_per_device",
            f"{role}.use_torch_compile",
            f"{role}.ulysses_sequence_parallel_size",
            f"{role}.fsdp",
            f"{role}.checkpoint_contents",
        )
    ),
)


@dataclass(frozen=True)
class ConfigChange:
    """One key whose value differs between the checkpoint and this run."""

    key: str
    saved: Any
    current: Any
    rule: KeyRule

    def __str__(self) -> str:
        return f"{self.key}: {self.saved!r} -> {self.current!r} ({self.rule.why})"


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as ``{"a.b.c": value}`` (lists stay values)."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


def _matches(key: str, prefix: str) -> bool:
    if prefix.endswith("_"):  # "data.val_" covers data.val_files, data.val_batch_size, …
        return key.startswith(prefix)
    return key == prefix or key.startswith(prefix + ".")


def rule_for(key: str) -> KeyRule:
    """The most specific rule for ``key`` (meaning-changing when none names it)."""
    best: KeyRule | None = None
    for rule in RULES:
        if _matches(key, rule.prefix) and (best is None or len(rule.prefix) > len(best.prefix)):
            best = rule
    return best or KeyRule(key, "meaning", "not in the table of harmless keys")


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[ConfigChange]:
    """Every differing key of two resolved configs (as dicts), judged by :data:`RULES`."""
    a, b = flatten(saved), flatten(current)
    missing = object()
    changes = []
    for key in sorted(set(a) | set(b)):
        old, new = a.get(key, missing), b.get(key, missing)
        if old != new:
            changes.append(
                ConfigChange(
                    key,
                    None if old is missing else old,
                    None if new is missing else new,
                    rule_for(key),
                )
            )
    return changes
