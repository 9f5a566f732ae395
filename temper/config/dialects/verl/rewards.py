"""verl's code sandbox (``reward_model.sandbox_fusion``), as temper's rewards.

- ``reward_model.sandbox_fusion.url`` set: code samples run on that SandboxFusion
  service (``reward.sandbox: sandbox_fusion``, ``reward.sandbox_url``) — verl's
  ``default_compute_score`` sends its code data sources there; ``memory_limit_mb`` is
  sent with every request (``reward.sandbox_limits.memory_mb``); ``max_concurrent`` is
  speed only (requests go out from the ``reward.num_workers`` processes). Unset, the
  section is inert and code runs in temper's local sandbox (``reward.sandbox: bwrap``).

The served reward model (``reward_model.rollout``) is verl's reward loop; its rules are
with the other version-dependent keys (:mod:`temper.config.dialects.verl.versions`).
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core import paths
from temper.config.dialects.core.rules import Call, Rule
from temper.config.dialects.verl.transforms import UNSET

RM = "reward_model"


def _unset(value: Any) -> bool:
    return value in (None, "", UNSET)


def sandbox_fusion(value: Any, ctx: Any, weak: bool = False) -> None:
    """verl's SandboxFusion service: with a url, code samples run there (reward.sandbox
    sandbox_fusion, reward.sandbox_url, memory_limit_mb per request); without one the
    section is inert and code runs in temper's local sandbox.

    ``weak``: verl 0.9's ``reward.sandbox_fusion``, which a legacy section that sets any
    value replaces (``migrate_legacy_reward_impl``)."""
    if not isinstance(value, dict):
        raise ctx.error(f"expected a mapping, got {value!r}", "")
    base = ctx.key
    if _unset(value.get("url")):
        for leaf in paths.leaves(value, base):
            ctx.note("accepted at its inert value (no SandboxFusion url: the local sandbox)", leaf)
        return
    for name, v in value.items():
        ctx.key = f"{base}.{name}"
        if name == "url":
            ctx._write("reward.sandbox", "sandbox_fusion", weak)
            ctx._write("reward.sandbox_url", str(v), weak)
        elif name == "memory_limit_mb":
            ctx._write("reward.sandbox_limits.memory_mb", int(v), weak)
        elif name == "_target_":
            ctx.note("Hydra _target_ (a verl class path): temper builds its own objects")
        elif name == "max_concurrent":
            ctx.note("no effect here (requests go out from the reward.num_workers processes)")
        else:
            raise ctx.error(
                "unknown sandbox_fusion key", "use url, max_concurrent, memory_limit_mb"
            )
    ctx.key = base


def reward_sandbox_fusion(value: Any, ctx: Any) -> None:
    """verl 0.9's reward.sandbox_fusion: as the legacy sandbox_fusion section, which wins
    where it sets any value (migrate_legacy_reward_impl copies it over this one)."""
    sandbox_fusion(value, ctx, weak=True)


RULES: dict[str, Rule] = {
    f"{RM}.sandbox_fusion": Call(sandbox_fusion),
    # verl 0.9's legacy location (legacy_reward_impl.yaml), and its new one
    "sandbox_fusion": Call(sandbox_fusion),
    "reward.sandbox_fusion": Call(reward_sandbox_fusion),
}
