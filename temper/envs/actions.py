"""Extracting actions from a model's raw response (pure functions).

Rules of ``parse_action`` (decisions documented here, tests in
``tests/unit/envs/test_actions.py``):

- **Tags** are matched case-insensitively, across newlines (``re.IGNORECASE |
  re.DOTALL``), with the tag's ``action_pattern`` whose first group is the
  answer (default ``<answer>(.*?)</answer>``).
- **Several answer tags**: the *first* one is taken by default, like ROLL
  (``default_parser_action_func`` uses ``re.search``); ``take="last"`` takes the
  last one instead (some chat models restate a draft answer before the final).
- **No tag**, or an empty answer: ``action=None``, ``valid=False``.
- **Think required** (ROLL ``enable_think``): a non-empty ``<think>…</think>``
  block must close before the chosen answer starts, otherwise invalid.
- **Special tokens** (``<|im_end|>`` and any ``<|…|>``) are removed from the answer.
- **Several actions** in one answer are split on ``action_sep`` (ROLL ``"||"``);
  empty pieces are dropped; beyond ``max_actions`` the rest is dropped (ROLL
  keeps the first ``max_actions_per_turn``) and ``reason`` says so, still valid.
- **Valid actions**: when the env lists its actions, each piece is matched
  case- and whitespace-insensitively (``" up "`` → ``"Up"``), or by its 1-based
  id (``"1"`` → the first action, as ROLL's ``action_lookup`` ids allow). Known
  pieces are returned canonical; unknown ones make the parse invalid (ROLL: the
  known ones still run and the format penalty applies) and are listed in
  ``unknown``. Without a list (free-form answers) the answer is one action.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["DEFAULT_ACTION_PATTERN", "ParsedAction", "parse_action"]

DEFAULT_ACTION_PATTERN = r"<answer>(.*?)</answer>"
_THINK = re.compile(r"<think>(.*?)</think>", re.IGNORECASE | re.DOTALL)
_SPECIAL = re.compile(r"<\|[^|>]*\|>")


@dataclass
class ParsedAction:
    """The result of parsing one response."""

    action: str | None  # the first action (canonical name when valid_actions is given)
    valid: bool  # parsed, think rule met, every piece known
    reason: str  # "" when valid and complete, else why (for logs and metrics)
    actions: list[str] = field(default_factory=list)  # all known actions, in order
    unknown: list[str] = field(default_factory=list)  # pieces not in valid_actions
    think: str | None = None  # the think text, when present
    content: str = ""  # the raw answer text (special tokens removed, stripped)


def _norm(s: str) -> str:
    return " ".join(s.split()).lower()


def parse_action(
    text: str,
    pattern: str = DEFAULT_ACTION_PATTERN,
    valid_actions: Sequence[str] | None = None,
    require_think: bool = False,
    action_sep: str | None = None,
    max_actions: int | None = None,
    take: Literal["first", "last"] = "first",
) -> ParsedAction:
    """Parse the action(s) out of a raw response ``text`` (rules in the module docstring)."""
    regex = re.compile(pattern, re.IGNORECASE | re.DOTALL)
    matches = list(regex.finditer(text or ""))
    think_m = _THINK.search(text or "")
    think = think_m.group(1).strip() if think_m else None
    if not matches:
        return ParsedAction(None, False, "no answer tag", think=think)
    m = matches[0] if take == "first" else matches[-1]
    if require_think:
        if think_m is None or think_m.end() > m.start():
            return ParsedAction(None, False, "missing <think>…</think> before the answer")
        if not think:
            return ParsedAction(None, False, "empty <think> block", think=think)
    content = _SPECIAL.sub("", m.group(1) if m.groups() else m.group(0)).strip()
    if not content:
        return ParsedAction(None, False, "empty answer", think=think)
    pieces = [p.strip() for p in content.split(action_sep)] if action_sep else [content]
    pieces = [p for p in pieces if p]
    if not pieces:
        return ParsedAction(None, False, "empty answer", think=think, content=content)
    reason = ""
    if max_actions is not None and len(pieces) > max_actions:
        reason = f"{len(pieces)} actions, kept the first {max_actions}"
        pieces = pieces[:max_actions]
    if valid_actions is None:
        return ParsedAction(pieces[0], True, reason, pieces, think=think, content=content)
    lookup = {_norm(a): a for a in valid_actions}
    lookup.update({str(i + 1): a for i, a in enumerate(valid_actions)})
    known: list[str] = []
    unknown: list[str] = []
    for p in pieces:
        canon = lookup.get(_norm(p))
        (known if canon is not None else unknown).append(canon if canon is not None else p)
    if unknown:
        reason = "unknown action " + ", ".join(repr(u) for u in unknown)
    return ParsedAction(
        known[0] if known else None,
        not unknown,
        reason,
        known,
        unknown,
        think=think,
        content=content,
    )
