"""Roles: actor, reference and critic logic over training engines.

``build_roles(cfg, device)`` loads what a config needs; the pipeline then calls
``actor.compute_log_probs``, ``reference.compute_ref_log_probs``,
``critic.compute_values``, ``critic.update`` and ``actor.update``.
"""

from __future__ import annotations

from temper.roles.actor import Actor
from temper.roles.base import ActorRole, CriticRole, ReferenceRole, RoleEngine, Roles, TrainedRole
from temper.roles.builder import build_roles
from temper.roles.critic import Critic
from temper.roles.reference import Reference

__all__ = [
    "Actor",
    "ActorRole",
    "Critic",
    "CriticRole",
    "Reference",
    "ReferenceRole",
    "RoleEngine",
    "Roles",
    "TrainedRole",
    "build_roles",
]
