"""Roles from a whole config and its plan: on which engine, with which batching.

Which roles run is the plan's (``temper.config.derive.Derived.roles``):

* actor: always; engine ``actor.strategy``.
* reference: iff ``reference.enable``, or (unset and a KL term is used —
  ``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``). With LoRA it is the actor's
  engine with adapters disabled (no second model).
* critic: iff ``critic.enable``, or (unset and the advantage estimator needs values,
  e.g. ``gae``); a value model from ``critic.model_path`` or the policy.

With the exact KL (``algorithm.kl_penalty: full`` in the reward, ``actor.kl_loss_type:
full`` as the loss) the actor's engine gets the reference as its ``kl_reference``.

Inference micro-batching (old log-probs) takes the first of ``actor.log_prob_*``,
``rollout.log_prob_*`` (verl keeps them there), and the training micro-batch settings.
"""

from __future__ import annotations

import logging

import torch

from temper.algorithms.kl import kl_estimator_needs_logits
from temper.config.derive import Derived
from temper.config.errors import ConfigError
from temper.config.plan import SCORE_HEAD
from temper.config.schema import TemperConfig, TrainEngineConfig
from temper.roles.actor import Actor
from temper.roles.base import ReferenceRole, Roles
from temper.roles.critic import Critic
from temper.roles.gkd_term import DirectDistill
from temper.roles.prm import ImplicitPRM
from temper.roles.reference import Reference
from temper.roles.teacher import Teachers
from temper.training.base import TrainEngine
from temper.training.micro_batching import MicroBatching
from temper.training.models import resolve_device
from temper.training.registry import build_engine, local_engine
from temper.training.router_replay import OFF as REPLAY_OFF
from temper.training.spec import EngineSpec

log = logging.getLogger(__name__)


def infer_micro_batching(cfg: TemperConfig, engine: TrainEngineConfig) -> MicroBatching:
    """No-grad micro-batching of a trained role (actor old log-probs, critic values)."""
    ro = cfg.rollout
    size = (  # a sequence-parallel group's samples
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
    guarantees it), where FSDP2 with a world size of 1 shards nothing and computes
    exactly what the single-process ``torch`` engine computes. A verl or ROLL file written
    for it therefore runs here on ``torch``; the swap is logged so nobody mistakes it for a
    sharded run. ``deepspeed`` and ``megatron`` run as themselves in a one-rank world (see
    :data:`SWAPPED_ON_LOCAL`).
    """
    engine = local_engine(cfg, strategy)
    if engine != strategy:
        log.warning(
            "%s=%s on the local backend (one process, one device): using the torch engine, "
            "which computes the same update without sharding",
            key,
            strategy,
        )
    return engine


def build_actor(cfg: TemperConfig, dev: torch.device, *, scorer: bool = False) -> Actor:
    """The actor on engine ``actor.strategy`` (see :func:`local_strategy`); ``scorer``:
    the trained model is the policy's backbone with a scalar score head (a value model
    saved as a sequence-classification model: reward-model training)."""
    engine = build_engine(
        local_strategy(cfg, cfg.actor.strategy, "actor.strategy"),
        EngineSpec(
            model=cfg.model,
            device=dev,
            kind="score" if scorer else "causal_lm",
            train=cfg.actor,
            infer_micro=infer_micro_batching(cfg, cfg.actor),
            entropy_chunk_size=cfg.actor.entropy_chunk_size,
            seed=cfg.experiment.seed,
            total_steps=cfg.actor.optim.total_training_steps,
            role="actor",
            router_replay=cfg.actor.router_replay != REPLAY_OFF,
        ),
    )
    return Actor(
        cfg.actor,
        engine,
        temperature=_temperature(cfg),
        seed=cfg.experiment.seed,
        distill=DirectDistill.of(cfg.distill),
    )


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
    # the reference splits sequences as the actor does (verl's rule)
    return _frozen(cfg, dev, None, "reference", cfg.actor.ulysses_sequence_parallel_size)


def _frozen(
    cfg: TemperConfig,
    dev: torch.device,
    model_path: str | None,
    role: str,
    sequence_parallel: int = 1,
) -> Reference:
    """A forward-only policy on its own engine ``reference.strategy``, with the reference's
    micro-batching: the reference (``model_path`` None: the policy's weights) or a teacher
    (whose top-k logits are of whole sequences: ``sequence_parallel`` 1)."""
    ref_micro = reference_micro_batching(cfg, infer_micro_batching(cfg, cfg.actor))

    def engine_from(path: str | None) -> TrainEngine:
        return build_engine(
            local_strategy(cfg, cfg.reference.strategy, "reference.strategy"),
            EngineSpec(
                model=cfg.model,
                device=dev,
                model_path=path,
                train=None,
                infer_micro=ref_micro,
                param_offload=cfg.reference.param_offload,
                seed=cfg.experiment.seed,
                role=role,
                fsdp=cfg.reference.fsdp,
                megatron=cfg.reference.megatron,
                deepspeed=cfg.reference.deepspeed,
                sequence_parallel=sequence_parallel,
            ),
        )

    # reloadable (online DPO's refresh): the same engine, from another weights directory
    return Reference(
        engine_from(model_path), temperature=_temperature(cfg), engine_from=engine_from
    )


def build_teachers(cfg: TemperConfig, dev: torch.device) -> Teachers | None:
    """The teachers of ``distill.teachers`` (None without any): each a frozen engine built
    as the reference's, on its own weights."""
    if not cfg.distill.teachers:
        return None
    roles: dict[str, ReferenceRole] = {
        name: build_teacher(cfg, dev, name) for name in cfg.distill.teachers
    }
    return teachers_of(cfg, roles)


def build_teacher(cfg: TemperConfig, dev: torch.device, name: str) -> Reference:
    """Teacher ``name`` of ``distill.teachers``: a frozen engine on its weights, built as
    the reference's (in this process, or in a Ray worker of the teacher's group)."""
    return _frozen(cfg, dev, cfg.distill.teachers[name].model_path, "reference")


def teachers_of(cfg: TemperConfig, roles: dict[str, ReferenceRole]) -> Teachers:
    """The router over the teachers' roles (local, or Ray worker groups' proxies)."""
    return Teachers(roles, {name: t.tags for name, t in cfg.distill.teachers.items()})


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


def build_roles(
    cfg: TemperConfig, plan: Derived, device: str | torch.device | None = None
) -> Roles:
    """Load the models and build ``Roles(actor, reference | None, critic | None)``, the
    roles ``plan`` says run.

    ``device`` defaults to ``experiment.device`` (``auto``: cuda when available).
    """
    dev = resolve_device(device if device is not None else cfg.experiment.device)
    actor = build_actor(cfg, dev, scorer=SCORE_HEAD in plan.uses)
    reference = build_reference(cfg, dev, actor) if plan.use_reference else None
    critic = build_critic(cfg, dev) if plan.use_critic else None
    key = full_kl_key(cfg)
    if key is not None:
        if reference is None or not actor.engine.supports_full_kl:
            raise ConfigError(
                key,
                "the exact KL over the vocabulary needs a reference and a training engine "
                "that compares logits (torch, fsdp2, deepspeed)",
                "enable the reference and use actor.strategy torch, fsdp2 or deepspeed, or a sampled "
                "estimator (low_var_kl)",
            )
        actor.engine.kl_reference = reference
    prm = build_prm(cfg, dev) if plan.use_prm else None
    return Roles(
        actor=actor,
        reference=reference,
        critic=critic,
        teachers=build_teachers(cfg, dev),
        prm=prm,
    )


def build_prm(cfg: TemperConfig, dev: torch.device) -> ImplicitPRM:
    """PRIME's implicit PRM (:func:`temper.roles.prm.build_prm`)."""
    from temper.roles.prm import build_prm as build

    return build(cfg, dev, local_strategy(cfg, cfg.prime.prm.strategy, "prime.prm.strategy"))


def full_kl_key(cfg: TemperConfig) -> str | None:
    """The key that asks for the exact KL (``full``), or None."""
    algo, actor = cfg.algorithm, cfg.actor
    if actor.use_kl_loss and kl_estimator_needs_logits(actor.kl_loss_type):
        return "actor.kl_loss_type"
    if algo.use_kl_in_reward and kl_estimator_needs_logits(algo.kl_penalty):
        return "algorithm.kl_penalty"
    return None
