"""verl's PRIME recipe (``recipe/prime``: ``main_prime`` over ``prime_trainer.yaml``) →
the ``prime`` pipeline (:mod:`temper.pipelines.prime`: RL on an implicit PRM trained
alongside).

The recipe is verl's PPO trainer config with keys of its own, which verl's PPO files
lack, so any one of :data:`KEYS` identifies a PRIME file. Its ``reward_model`` section
configures the implicit PRM, not a scoring reward model: the keys the PPO table maps to
``reward.model`` (path, strategy, micro-batching, FSDP) move to ``prime.prm``, and the
recipe's own keys map as below:

- ``data.filter_accuracy`` / ``accuracy_lower_bound`` / ``accuracy_upper_bound`` /
  ``oversample_factor`` / ``filter_truncate`` → ``prime.*`` (the trainer's
  ``filter_and_downsample``);
- ``reward_model.model.ref_path`` / ``beta_train`` / ``loss_type`` / ``update`` /
  ``optim.*`` / ``fsdp_config.optimizer_offload`` and ``reward_model.mini_batch_size``
  → ``prime.prm.*``; ``reward_model.prime_granularity`` / ``prime_norm`` →
  ``prime.granularity`` / ``prime.norm``;
- ``algorithm.reward_dpo_coef`` / ``reward_gt_coef`` → ``prime.*``.

verl's PRIME trainer computes its advantages itself (``compute_rloo_advantage_return``:
RLOO per reward source), whatever ``algorithm`` says, and never applies a KL penalty in
the reward, and builds no critic, so the translation notes the ``algorithm`` and
``critic`` keys as not read. Its reward
manager ``prime`` scores each response with the rule as ``naive`` does (in a process
pool): it becomes ``naive`` here, whose workers are processes too.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.result import Written
from temper.config.dialects.core.rules import Map, Note, Refuse, Rule
from temper.config.dialects.verl import transforms as r
from temper.config.dialects.verl.table import _optim

RM, M = "reward_model", "reward_model.model"
KEYS = (
    f"{RM}.prime_granularity",
    f"{RM}.prime_norm",
    "data.filter_accuracy",
    "data.oversample_factor",
    "algorithm.reward_dpo_coef",
    "algorithm.reward_gt_coef",
    f"{M}.beta_train",
)
PERF = "a performance setting with no effect on results here"
RULES: dict[str, Rule] = {
    "data.filter_accuracy": Map("prime.filter_accuracy"),
    "data.accuracy_lower_bound": Map("prime.accuracy_lower_bound"),
    "data.accuracy_upper_bound": Map("prime.accuracy_upper_bound"),
    "data.oversample_factor": Map("prime.oversample_factor"),
    "data.filter_truncate": Map("prime.filter_truncate"),
    f"{RM}.prime_granularity": Map("prime.granularity"),
    f"{RM}.prime_norm": Map("prime.norm"),
    f"{RM}.mini_batch_size": Map("prime.prm.mini_batch_size"),
    "algorithm.reward_dpo_coef": Map("prime.reward_dpo_coef"),
    "algorithm.reward_gt_coef": Map("prime.reward_gt_coef"),
    f"{M}.ref_path": Map("prime.prm.ref_path"),
    f"{M}.beta_train": Map("prime.prm.beta_train"),
    f"{M}.loss_type": Map("prime.prm.loss_type"),
    f"{M}.update": Map("prime.prm.update"),
    f"{M}.ref_type": Refuse(
        "only a frozen PRM reference is supported (verl's recipe builds no other)",
        "set ref_type: freeze",
        ok=("freeze", None),
        why="the PRM's reference is frozen",
    ),
    f"{M}.tokenizer_path": Refuse(
        "the PRM scores the policy's token ids: a tokenizer of its own is not supported",
        "set it to actor_rollout_ref.model.path (the recipe's default)",
        ok=r.same_tokenizer,
        why="the PRM reads the policy's token ids, with the policy's tokenizer",
    ),
    f"{M}.enable_gradient_checkpointing": Refuse(
        "temper has one gradient-checkpointing setting for every model of the run",
        "set it equal to actor_rollout_ref.model.enable_gradient_checkpointing (the "
        "recipe's default)",
        ok=r.equals("actor_rollout_ref.model.enable_gradient_checkpointing", False),
        why="the PRM follows the policy's model.enable_gradient_checkpointing",
    ),
    f"{M}.fused_kernel_options.impl_backend": Note(PERF),
    f"{M}.fsdp_config.optimizer_offload": Map("prime.prm.fsdp.optimizer_offload"),
    **_optim(f"{M}.optim", "prime.prm"),
    f"{M}.optim.grad_clip": Map("prime.prm.grad_clip"),
}
#: Where the PPO table's ``reward.model`` fields go in a PRIME file (the rest: notes).
MOVE = {
    "path": "prime.prm.model_path",
    "strategy": "prime.prm.strategy",
    "micro_batch_size_per_device": "prime.prm.micro_batch_size_per_device",
    "use_dynamic_bsz": "prime.prm.use_dynamic_bsz",
    "forward_max_token_len_per_device": "prime.prm.log_prob_max_token_len_per_device",
}
PRM = "the PRIME recipe's reward model is its implicit PRM (prime.prm), trained during the run"
PRM_UNREAD = "no effect here (the PRM loads as the policy does, under model.*)"
NOT_READ = (
    "no effect here (verl's PRIME trainer computes RLOO advantages per reward source, "
    "applies no KL penalty in the reward and builds no critic, whatever algorithm and "
    "critic say)"
)


def is_prime(ctx: Any) -> str | None:
    """The PRIME key the file sets (the first of :data:`KEYS`), else ``None``."""
    return next((key for key in KEYS if ctx.get(key) is not None), None)


@derivation(
    *KEYS,
    "data.filter_accuracy",
    fields=(
        "reward.model",
        "algorithm",
        "critic",
        "prime.accuracy_lower_bound",
        "prime.accuracy_upper_bound",
        "reward.reward_manager",
    ),
)
def finish(ctx: Any) -> None:
    """A PRIME file runs the prime pipeline; its reward model is the PRM (module doc)."""
    key = is_prime(ctx)
    if key is None:
        return
    ctx.write("pipeline", "prime", key=ctx.prefix + key)
    for native, (value, source, weak) in ctx.out.section("reward.model", "algorithm", "critic"):
        if native.startswith("reward.model."):
            del ctx.writes[native]
            leaf = native[len("reward.model.") :]
            if value is None:
                continue
            if leaf in MOVE:
                ctx.writes[MOVE[leaf]] = Written(value, source, weak)
            elif leaf.startswith("fsdp."):
                ctx.writes[f"prime.prm.{leaf}"] = Written(value, source, weak)
            else:
                ctx.unnote(source)
                ctx.note(PRM if leaf == "enable" else PRM_UNREAD, source)
        elif native.startswith(("algorithm.", "critic.")):
            del ctx.writes[native]
            ctx.unnote(source)
            if value is not None:
                ctx.note(NOT_READ, source)
    filtered = ctx.get("data.filter_accuracy", False)
    for bound in ("accuracy_lower_bound", "accuracy_upper_bound"):
        source = ctx.out.written(f"prime.{bound}").key
        if not filtered and ctx.out.drop(f"prime.{bound}"):  # verl reads them under it only
            ctx.note("no effect here (bounds of data.filter_accuracy, which is off)", source)
    manager, source, _ = ctx.out.written("reward.reward_manager")
    if manager == "prime":
        ctx.note(
            "verl's prime reward manager scores each response by rule, as naive does, in a "
            "process pool: naive here, in reward worker processes",
            source,
        )
        ctx.replace("reward.reward_manager", "naive", source)
