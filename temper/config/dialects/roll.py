"""The ROLL dialect: a ROLL pipeline YAML (RLVR or agentic) -> the native schema.

The generic walker visits every key of the input against ``roll_table.TOP``: mapped,
noted, rejected, or read by one of the derivations in ``roll_derive`` (the arithmetic and
cross-key rules: model path, mini-batch size, strategies, placement, rewards).
Unknown keys raise a ``ConfigError`` with "did you mean". Top-level keys that came
from ``defaults:`` files and are not ROLL settings (``deepspeed_zero2``, envs.yaml's
``custom_env``) are definitions: unreferenced ones are noted.

Placement: ROLL always runs on Ray; here ``resources.backend`` is ``ray`` when the
device mappings use more than one device, else ``local`` (one process).
"""

from __future__ import annotations

import functools
from typing import Any

from temper.config.catalog import Catalog
from temper.config.dialects import Translation
from temper.config.dialects import roll_derive as derive
from temper.config.dialects.roll_derive import MISSING, Ctx
from temper.config.dialects.roll_devices import parse_device_mapping
from temper.config.dialects.roll_rules import Map, Note, Reject, Rule, Same, Use
from temper.config.dialects.roll_table import ROLL_DEFAULTS, TOP
from temper.config.errors import ConfigError, did_you_mean
from temper.config.loader import RawConfig

__all__ = ["parse_device_mapping", "translate_roll"]

# --------------------------------------------------------------------------- table walk


def _leaves(value: Any, path: str) -> list[str]:
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{path}.{k}")]
    return [path]


_PATTERNS = [(tuple(p.split(".")), rule) for p, rule in TOP.items()]
# native key -> the ROLL key that maps to it (keys without a `*` segment)
REVERSE: dict[str, str] = {}
for _key, _rule in TOP.items():
    if isinstance(_rule, Map) and "*" not in _key:
        for _dst in _rule.dst if isinstance(_rule.dst, tuple) else (_rule.dst,):
            REVERSE.setdefault(_dst, _key)


@functools.cache  # the table is fixed; paths recur across and within files
def _lookup(parts: tuple[str, ...]) -> tuple[Rule, list[str]] | None:
    for pat, rule in _PATTERNS:
        if len(pat) == len(parts):
            stars = []
            for p, s in zip(pat, parts):
                if p == "*":
                    stars.append(s)
                elif p != s:
                    break
            else:
                return rule, stars
    return None


@functools.cache
def _children(parts: tuple[str, ...]) -> frozenset[str]:
    n = len(parts)
    return frozenset(
        pat[n]
        for pat, _ in _PATTERNS
        if len(pat) > n and all(p in ("*", s) for p, s in zip(pat, parts))
    )


def _walk(ctx: Ctx, value: Any, parts: tuple[str, ...]) -> None:
    key = ".".join(parts)
    found = _lookup(parts)
    if found is not None:
        _apply(ctx, key, value, *found)
        return
    kids = _children(parts)
    if kids and isinstance(value, dict):
        for k, v in value.items():
            _walk(ctx, v, (*parts, str(k)))
        return
    if kids and value is None:
        ctx.note(key, "empty section")
        return
    siblings = _children(parts[:-1])
    raise ConfigError(
        key,
        f"unknown ROLL key{did_you_mean(parts[-1], siblings)}",
        "remove it, or see temper/config/dialects/roll_table.py for the ROLL keys temper "
        "understands",
    )


def _apply(ctx: Ctx, key: str, value: Any, rule: Rule, stars: list[str]) -> None:
    ctx.used.append(value)
    if isinstance(rule, Map):
        dsts = rule.dst if isinstance(rule.dst, tuple) else (rule.dst,)
        out = rule.fn(value) if rule.fn else value
        for dst in dsts:
            ctx.set(dst.format(*stars), out, key)
    elif isinstance(rule, Note):
        ctx.notes.append(f"{', '.join(_leaves(value, key))}: accepted, no effect here: {rule.why}")
    elif isinstance(rule, Reject):
        if not rule.ok(value):
            raise ConfigError(key, f"{value!r} is not supported: {rule.why}", rule.fix)
        ctx.note(key, rule.note)
    elif isinstance(rule, Same):
        other = ctx.get(rule.other, MISSING)
        if other is not MISSING and other != value:
            raise ConfigError(
                key,
                f"{value!r} differs from {rule.other} ({other!r}); {rule.why}",
                f"set {key} to {other!r} or remove it",
            )
        ctx.note(key, f"same as {rule.other}; {rule.why}")
    # Use: read by a derivation in roll_derive.


def translate_roll(raw: RawConfig, catalog: Catalog | None = None) -> Translation:
    """Translate a ROLL pipeline config (see the module docstring); ROLL's rules read no
    registry, so ``catalog`` (the dialect interface's) is not needed."""
    given = dict(raw.data)
    applied = {k: v for k, v in ROLL_DEFAULTS.items() if k not in given}
    if isinstance(given.get("validation"), dict) and "eval_steps" in given["validation"]:
        applied.pop("eval_steps", None)
    data = {**applied, **given}
    ctx = Ctx(data)
    derive.env_manager_sampling(ctx)
    defs = []
    for key, value in data.items():
        is_rule = _lookup((key,)) is not None or bool(_children((key,)))
        if not is_rule and (key in raw.from_defaults or key in raw.referenced):
            defs.append(key)  # a definition other keys interpolate (or a defaults file's)
            continue
        _walk(ctx, value, (str(key),))
    agentic = "train_env_manager" in data
    ctx.set("pipeline", "agentic" if agentic else "rlvr", "train_env_manager")
    derive.model(ctx)
    derive.lengths(ctx, agentic)
    derive.algorithm(ctx)
    derive.data(ctx)
    derive.strategies(ctx)
    derive.placement(ctx)
    derive.mini_batch(ctx)
    derive.rewards(ctx)
    derive.dynamic_sampling(ctx)
    if agentic:
        derive.episodes(ctx)
    derive.definitions(ctx, raw, defs)
    if applied:
        ctx.notes.append(
            "ROLL defaults applied for keys the file omits: "
            + ", ".join(f"{k}={v!r}" for k, v in applied.items())
        )
    return Translation(native=ctx.native, notes=ctx.notes, sources=dict(ctx.src), table=REVERSE)


def key_meaning(key: str) -> tuple[tuple[str, ...], str] | None:
    """What ROLL key ``key`` becomes here: (native keys it sets, how), or None when the
    table has no such key (``temper check --explain``)."""
    found = _lookup(tuple(key.split(".")))
    if found is None:
        return None
    rule, _stars = found
    if isinstance(rule, Map):
        dst = rule.dst if isinstance(rule.dst, tuple) else (rule.dst,)
        return dst, "sets " + ", ".join(dst) + (" (converted)" if rule.fn else "")
    if isinstance(rule, Use):
        return (), f"read by a derivation: {rule.what}"
    if isinstance(rule, Note):
        return (), f"accepted, no effect here: {rule.why}"
    if isinstance(rule, Reject):
        return (), f"refused ({rule.why}); fix: {rule.fix}"
    return (), f"must equal {rule.other}: {rule.why}"
