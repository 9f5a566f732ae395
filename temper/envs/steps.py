"""What a step-wise env manager shows the model at each env step (ROLL's StepEnvManager).

A step-wise episode does not grow one multi-turn conversation: every env step is a fresh
single-turn prompt — the task instruction, a window of the last steps (observation,
answer, reward) and the current observation — and every step becomes its own training
sample. :func:`history_window` picks the window, :func:`render_step_prompt` the text.

Every step of the window is shown. ROLL's ``StepEnvManager.format_messages`` appends a
remembered step to its history text only when the answer was invalid (the append sits
inside the branch that adds the invalid-answer tip), which leaves valid steps out of
the window its ``history_length`` promises; here the window is what the key says.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "StepRecord",
    "fill_template",
    "history_window",
    "render_concat_prompt",
    "render_step_prompt",
]

#: a ``str.format`` field or an escaped brace (``{{`` / ``}}``)
_FORMAT = re.compile(r"\{\{|\}\}|\{(\w+)\}")


def fill_template(template: str, fields: Mapping[str, object]) -> str:
    """``template`` filled as ROLL fills its templates (``str.format``): ``{name}`` is the
    field's value, ``{{`` and ``}}`` are literal braces; a ``{name}`` not in ``fields``
    stays as written (where ``str.format`` would raise)."""

    def fill(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return m.group(0)[0]  # an escaped brace
        return str(fields[m.group(1)]) if m.group(1) in fields else m.group(0)

    return _FORMAT.sub(fill, template)


#: appended to a remembered answer the env refused, so the model sees why it went nowhere
INVALID_TIP = (
    " (this answer was not a valid action: the next one must follow the format the "
    "instruction gives)"
)


@dataclass(frozen=True)
class StepRecord:
    """One played env step: the observation it started from, the model's answer, the
    env's reward for it and whether the answer parsed to valid actions."""

    observation: str
    answer: str
    reward: float
    valid: bool = True


def history_window(records: Sequence[StepRecord], history_length: int | None) -> list[StepRecord]:
    """The earlier steps a prompt shows. ``history_length`` counts the current step
    (ROLL's window ``history[-n:-1]``): ``n`` shows up to ``n - 1`` earlier steps, ``1``
    none, ``0`` all of them (an empty slice start); ``None`` (the tag sets no window) none."""
    if history_length is None:
        return []
    with_current = [*records, None]
    return [r for r in with_current[-history_length:-1] if r is not None]


def _history_text(window: Sequence[StepRecord], first_step: int) -> str:
    parts = []
    for k, r in enumerate(window):
        answer = r.answer if r.valid else r.answer + INVALID_TIP
        parts.append(
            f"(step: {first_step + k}, observation: {r.observation}, action: {answer}, "
            f"reward: {r.reward:g})"
        )
    return ", ".join(parts)


def render_step_prompt(
    *,
    instruction: str,
    observation: str,
    records: Sequence[StepRecord],
    history_length: int | None,
    template: str = "",
    turn_prompt: str = "",
    max_response_length: int = 0,
) -> str:
    """The user message of the next step after ``records`` (the episode's steps so far).

    With a ``template`` (ROLL's ``agent_template``) its fields are filled:
    ``env_instruction``, ``history`` (the window, 1-based step numbers), ``step_count``
    (steps taken), ``history_length`` (steps in the window), ``current_step``
    (``step_count + 1``), ``current_observation`` and ``max_response_length``
    (:func:`fill_template`). Without one: the instruction, the window, the
    observation and ``turn_prompt``.
    """
    window = history_window(records, history_length)
    history = _history_text(window, len(records) - len(window) + 1)
    if template:
        fields = {
            "env_instruction": instruction,
            "history": history,
            "step_count": len(records),
            "history_length": len(window),
            "current_step": len(records) + 1,
            "current_observation": observation,
            "max_response_length": max_response_length,
        }
        return fill_template(template, fields)
    parts = [instruction]
    if history:
        parts.append(f"Recent steps: {history}")
    parts.append(f"Current observation (step {len(records) + 1}):\n{observation}")
    if turn_prompt:
        parts.append(turn_prompt)
    return "\n\n".join(p for p in parts if p)


def render_concat_prompt(
    *,
    observation: str,
    suffix: str,
    records: Sequence[StepRecord],
    history_length: int | None,
    template: str = "",
) -> str:
    """The user message of a step-concat step (ROLL's ``StepConcatEnvManager``, GEM's
    observation concatenation): ``history`` is the window's observations (only the
    observations: no answers, no rewards, no instruction) joined by newlines, and
    ``current_observation`` is ``f"{observation}\\n{suffix}"``.

    A ``template`` (ROLL's ``agent_template``) is filled by :func:`fill_template`. Without
    one: the history (when any) and the current observation, one per line.
    """
    window = history_window(records, history_length)
    history = "\n".join(r.observation for r in window)
    current = f"{observation}\n{suffix}"
    if template:
        return fill_template(template, {"history": history, "current_observation": current})
    return f"{history}\n{current}" if history else current
