"""The role interfaces the driver programs against.

The driver calls the same methods whether a role lives in this process (:class:`Actor`,
:class:`Critic`, :class:`Reference` over a training engine) or on Ray worker groups
(``temper.cluster.roles``' proxies): these Protocols are everything it may use, so a
proxy that type-checks against them can stand in for the local role.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from temper.algorithms.kd import KDParams
from temper.algorithms.preference import PreferenceParams
from temper.algorithms.reward_model import RewardLossParams
from temper.data.batch import Batch


class RoleEngine(Protocol):
    """What callers use of a role's engine: a ``TrainEngine`` in this process, or the
    driver's handle on a sharded engine (``temper.cluster.roles.RemoteEngine``)."""

    @property
    def shareable_module(self) -> nn.Module | None:
        """A Hugging Face causal LM that is the engine's live weights in this process (a
        colocated ``hf`` rollout generates with it), or None (sharded, Megatron, remote)."""
        ...

    @property
    def device(self) -> torch.device:
        """Where the role computes (reward models colocate there)."""
        ...

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """Full weights under Hugging Face names (LoRA merged), for weight sync."""
        ...

    def save_hf(self, path: str) -> None:
        """A Hugging Face model directory (loads in transformers and vLLM)."""
        ...

    def save_checkpoint(self, path: str) -> None:
        """The engine's resumable state (weights, optimizer, schedule) under ``path``."""
        ...

    def load_checkpoint(self, path: str) -> None:
        """Inverse of :meth:`save_checkpoint`."""
        ...


class TrainedRole(Protocol):
    """A role with an optimizer: the actor or the critic."""

    updates: int  # updates done (seeds the mini-batch shuffle; checkpointed)

    @property
    def engine(self) -> RoleEngine: ...

    def update(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over mini-batches of the step's batch; averaged metrics."""
        ...

    def set_total_steps(self, total_steps: int) -> None:
        """Total optimizer steps of the run (the LR schedule's length)."""
        ...


class ActorRole(TrainedRole, Protocol):
    """The policy: old log-probs before the update, then the update."""

    def compute_log_probs(
        self, batch: Batch, *, with_entropy: bool = False, with_sum_pi_squared: bool = False
    ) -> Batch:
        """A copy of ``batch`` with ``old_log_probs`` (and ``full_kl`` where the run
        uses the exact KL against the reference; ``sum_pi_squared``, Σ_v π_v² per token,
        if asked)."""
        ...

    def sft_update(self, batch: Batch) -> dict[str, float]:
        """A supervised update: NLL of the batch's target tokens (``response_mask``)."""
        ...

    def distill_update(
        self, batch: Batch, objective: str, params: KDParams, weight: float
    ) -> dict[str, float]:
        """An offline-distillation update: ``(1 − weight)·NLL + weight·KD`` against the
        teacher's top-k logits the batch carries."""
        ...

    def dpo_update(
        self, batch: Batch, loss_type: str, params: PreferenceParams
    ) -> dict[str, float]:
        """A preference update on a batch of pairs (chosen row, rejected row) with their
        ``ref_log_probs``: the mean pair loss ``loss_type``."""
        ...

    def compute_scores(self, batch: Batch) -> Batch:
        """A copy of ``batch`` with ``scores`` (B,) of a scalar-head actor (a reward
        model in training)."""
        ...

    def reward_update(
        self, batch: Batch, loss_type: str, params: RewardLossParams
    ) -> dict[str, float]:
        """A reward-model update on a batch of pairs (chosen row, rejected row), each
        scored at one slot: the mean pair loss ``loss_type`` of the scores."""
        ...


class CriticRole(TrainedRole, Protocol):
    """The value model."""

    def compute_values(self, batch: Batch) -> Batch:
        """A copy of ``batch`` with ``values`` (B, R)."""
        ...


class PRMRole(TrainedRole, Protocol):
    """PRIME's implicit process reward model (``temper.roles.prm``): a causal LM trained
    during RL against a frozen copy of its first weights."""

    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """A copy of ``batch`` with ``prm_ref_log_probs`` (B, R): the frozen copy's."""
        ...

    def compute_log_probs(self, batch: Batch) -> Batch:
        """A copy of ``batch`` with ``prm_log_probs`` (B, R): the trained PRM's."""
        ...


class ReferenceRole(Protocol):
    """The frozen reference policy."""

    @property
    def engine(self) -> RoleEngine: ...

    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """A copy of ``batch`` with ``ref_log_probs`` (B, R)."""
        ...

    def reload(self, model_path: str) -> None:
        """Score with the weights of Hugging Face directory ``model_path`` from now on
        (online DPO's refresh from the policy); ``ValueError`` where the reference is not
        an engine of its own (LoRA: the actor's base)."""
        ...

    def compute_top_logits(
        self, batch: Batch, k: int, scale: float, vocab: int | None = None, log_probs: bool = False
    ) -> Batch:
        """A copy of ``batch`` with ``kd_indices`` and ``kd_teacher_logits`` (B, R, k): the
        ``k`` most likely token ids ``< vocab`` at each response token and their logits /
        ``scale`` (a teacher of offline distillation; ``log_probs``: their log-softmax)."""
        ...


class TeacherRole(Protocol):
    """The teachers of on-policy distillation (``temper.roles.teacher.Teachers``)."""

    names: list[str]  # teacher t of ``teacher_log_probs[:, t]``
    teachers: dict[str, ReferenceRole]  # each teacher's role, by name

    def compute_teacher_log_probs(
        self, batch: Batch, topk: int = 0, vocab: int | None = None
    ) -> Batch:
        """A copy of ``batch`` with ``teacher_log_probs`` (B, T, R) and ``teacher_routed``
        (B, T): each teacher's log-probs of the response tokens of the samples routed to it
        (``topk`` > 0: also its top-k ids and log-probs, ``(B, T, R, k)``)."""
        ...


@dataclass
class Roles:
    """The trained and frozen roles of a run (``None``: not used by this config)."""

    actor: ActorRole
    reference: ReferenceRole | None
    critic: CriticRole | None
    teachers: TeacherRole | None = None  # on-policy distillation (distill.teachers)
    prm: PRMRole | None = None  # PRIME's implicit process reward model (pipeline prime)

    def shutdown(self) -> None:
        """Release what the roles hold outside this process (Ray worker groups)."""
