"""Roles from a whole config: which exist, on which engine, with which batching.

* actor: always; engine ``actor.strategy``.
* reference: iff ``reference.enable``, or (unset and a KL term is used —
  ``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``). With LoRA it is the actor's
  engine with adapters disabled (no second model).
* critic: iff ``critic.enable``, or (unset and the advantage estimator needs values,
  e.g. ``gae``); a value model from ``critic.model_path`` or the policy.

Inference micro-batching (old log-probs) takes the first of ``actor.log_prob_*``,
``rollout.log_prob_*`` (verl keeps them there), and the training micro-batch settings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from temper.config.derive import uses_critic, uses_reference
from temper.config.schema import TemperConfig, TrainEngineConfig
from temper.roles.actor import Actor
from temper.roles.critic import Critic
from temper.roles.reference import Reference
from temper.training.micro_batching import MicroBatching
from temper.training.models import resolve_device
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

log = logging.getLogger(__name__)


@dataclass
class Roles:
    """The trained and frozen roles of a run (``None``: not used by this config)."""

    actor: Actor
    reference: Reference | None
    critic: Critic | None


def infer_micro_batching(cfg: TemperConfig, engine: TrainEngineConfig) -> MicroBatching:
    """No-grad micro-batching of a trained role (actor old log-probs, critic values)."""
    ro = cfg.rollout
    size = (
        engine.log_prob_micro_batch_size_per_device
        or ro.log_prob_micro_batch_size_per_device
        or engine.micro_batch_size_per_device
    )
    budget = None
    if engine.log_prob_max_token_len_per_device is not None:
        budget = engine.log_prob_max_token_len_per_device
    elif ro.log_prob_use_dynamic_bsz:
        budget = ro.log_prob_max_token_len_per_device
    elif engine.use_dynamic_bsz:
        budget = engine.max_token_len_per_device
    return MicroBatching(size=size, max_tokens=budget)


def reference_micro_batching(cfg: TemperConfig, actor_micro: MicroBatching) -> MicroBatching:
    ref = cfg.reference
    size = ref.log_prob_micro_batch_size_per_device or actor_micro.size
    budget = ref.log_prob_max_token_len_per_device if ref.use_dynamic_bsz else None
    return MicroBatching(size=size, max_tokens=budget)


def local_strategy(cfg: TemperConfig, strategy: str, key: str) -> str:
    """The engine a role gets on the ``local`` backend.

    The local backend runs every role in this one process on one device (validation
    guarantees it), where FSDP2 / DeepSpeed / Megatron with a world size of 1 shard
    nothing and compute exactly what the single-process ``torch`` engine computes. A
    verl or ROLL file written for those engines therefore runs here on ``torch``; the
    swap is logged so nobody mistakes it for a sharded run.
    """
    if cfg.resources.backend == "local" and strategy != "torch":
        log.warning(
            "%s=%s on the local backend (one process, one device): using the torch engine, "
            "which computes the same update without sharding",
            key,
            strategy,
        )
        return "torch"
    return strategy


def build_actor(cfg: TemperConfig, dev: torch.device) -> Actor:
    """The actor on engine ``actor.strategy`` (``torch`` on the local backend)."""
    engine = build_engine(
        local_strategy(cfg, cfg.actor.strategy, "actor.strategy"),
        EngineSpec(
            model=cfg.model,
            device=dev,
            train=cfg.actor,
            infer_micro=infer_micro_batching(cfg, cfg.actor),
            entropy_chunk_size=cfg.actor.entropy_chunk_size,
            seed=cfg.experiment.seed,
            total_steps=cfg.actor.optim.total_training_steps,
            role="actor",
        ),
    )
    return Actor(cfg.actor, engine, temperature=_temperature(cfg), seed=cfg.experiment.seed)


def build_reference(cfg: TemperConfig, dev: torch.device, actor: Actor | None = None) -> Reference:
    """The frozen reference: the actor's engine without adapters under LoRA (``actor``
    must then be given), else its own engine on ``reference.strategy``."""
    ref_micro = reference_micro_batching(cfg, infer_micro_batching(cfg, cfg.actor))
    temperature = _temperature(cfg)
    if cfg.model.lora.rank > 0:
        if actor is None:
            raise ValueError("a LoRA reference shares the actor's engine: pass the actor")
        return Reference(
            actor.engine, disable_adapters=True, micro_batching=ref_micro, temperature=temperature
        )
    engine = build_engine(
        local_strategy(cfg, cfg.reference.strategy, "reference.strategy"),
        EngineSpec(
            model=cfg.model,
            device=dev,
            train=None,
            infer_micro=ref_micro,
            param_offload=cfg.reference.param_offload,
            seed=cfg.experiment.seed,
            role="reference",
            fsdp=cfg.reference.fsdp,
        ),
    )
    return Reference(engine, temperature=temperature)


def build_critic(cfg: TemperConfig, dev: torch.device) -> Critic:
    """The critic: a value model on ``critic.strategy``."""
    engine = build_engine(
        local_strategy(cfg, cfg.critic.strategy, "critic.strategy"),
        EngineSpec(
            model=cfg.model,
            device=dev,
            kind="value",
            model_path=cfg.critic.model_path,
            train=cfg.critic,
            infer_micro=infer_micro_batching(cfg, cfg.critic),
            seed=cfg.experiment.seed,
            total_steps=cfg.critic.optim.total_training_steps,
            role="critic",
        ),
    )
    return Critic(cfg.critic, engine, seed=cfg.experiment.seed)


def _temperature(cfg: TemperConfig) -> float:
    return cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0


def build_roles(cfg: TemperConfig, device: str | torch.device | None = None) -> Roles:
    """Load the models and build ``Roles(actor, reference | None, critic | None)``.

    ``device`` defaults to ``experiment.device`` (``auto``: cuda when available).
    """
    dev = resolve_device(device if device is not None else cfg.experiment.device)
    actor = build_actor(cfg, dev)
    reference = build_reference(cfg, dev, actor) if uses_reference(cfg) else None
    critic = build_critic(cfg, dev) if uses_critic(cfg) else None
    return Roles(actor=actor, reference=reference, critic=critic)
