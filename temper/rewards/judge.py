"""LLM judge: a model grades each response against the reference (``function: llm_judge``).

ROLL's ``LLMJudgeRewardWorker`` and verl's generative reward models. For every sample
the route sends here:

1. the judge prompt is ``reward.judge.prompt_template`` with ``{question}`` (the last
   user message of the sample's chat prompt), ``{response}`` (the decoded response)
   and ``{reference}`` (the ground truth) filled in, sent as one user message (the
   judge tokenizer's chat template applies);
2. the judge generates its verdict (``max_new_tokens``, greedy unless ``temperature``);
3. ``reward.judge.parser`` turns the verdict into the score:

   - ``yes_no`` (ROLL's default): 1 when the verdict says "yes", 0 when it says "no"
     (whole words, case-insensitive, the first one wins);
   - ``score``: the number after ``Score:`` divided by ``score_scale`` (ROLL's
     0–10 scale);
   - any other value is a regex whose first group is the number (÷ ``score_scale``).

A verdict the parser cannot read, or a judge call that raises, is that sample's reward
failure (``failure_score``, listed in ``failures`` with the verdict), like any other.

The judge runs on one of temper's rollout engines (``hf``, ``vllm``) behind
:class:`JudgeEngine`; which engine, where (in this process or as its own Ray role) is
the cluster layer's business (``temper.cluster.judge``).
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from temper.config.errors import ConfigError
from temper.config.schema import JudgeConfig

FIELDS = ("question", "response", "reference")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
_SCORE = r"score\s*[:：]\s*(-?[0-9]+(?:\.[0-9]+)?)"


class JudgeEngine(Protocol):
    """Generates one reply per conversation (a list of ``{"role", "content"}``);
    ``template_kwargs`` go to the judge tokenizer's chat template (``enable_thinking``)."""

    def complete(
        self,
        conversations: Sequence[list[dict[str, str]]],
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[str]: ...

    def close(self) -> None:
        """Release the engine (a Ray group is released with the other roles)."""
        ...


def check_judge_config(config: JudgeConfig, key: str = "reward.judge") -> None:
    """``ConfigError`` for a template with unknown fields or a parser that cannot work."""
    if not config.model_path:
        raise ConfigError(
            f"{key}.model_path",
            "is not set but llm_judge scores some samples",
            "set it to the judge model (a directory, hub id or smollm2:135m-instruct)",
        )
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(config.prompt_template) if f}
    except ValueError as err:
        raise ConfigError(f"{key}.prompt_template", f"is not a valid template: {err}") from err
    unknown = sorted(fields - set(FIELDS))
    if unknown:
        raise ConfigError(
            f"{key}.prompt_template",
            f"uses {', '.join('{' + f + '}' for f in unknown)}",
            "use only {question}, {response} and {reference} (double other braces: {{ }})",
        )
    parser_pattern(config.parser, f"{key}.parser")
    if config.score_scale <= 0:
        raise ConfigError(f"{key}.score_scale", "must be > 0")


def parser_pattern(parser: str, key: str = "reward.judge.parser") -> re.Pattern[str] | None:
    """The compiled regex of a numeric parser (None for ``yes_no``)."""
    if parser == "yes_no":
        return None
    pattern = _SCORE if parser == "score" else parser
    try:
        compiled = re.compile(pattern, re.IGNORECASE)
    except re.error as err:
        raise ConfigError(
            key, f"'{parser}' is not a regex: {err}", "use yes_no, score or a regex"
        ) from err
    if compiled.groups < 1:
        raise ConfigError(key, f"regex '{parser}' has no group", "capture the number: (\\d+)")
    return compiled


def parse_verdict(text: str, parser: str, scale: float) -> float:
    """The score a verdict gives (see the module doc); ``ValueError`` if unreadable."""
    pattern = parser_pattern(parser)
    if pattern is None:
        found = _YES_NO.search(text)
        if found is None:
            raise ValueError(f"judge verdict has neither YES nor NO: {text.strip()[:200]!r}")
        return 1.0 if found.group(1).lower() == "yes" else 0.0
    match = pattern.search(text)
    if match is None:
        raise ValueError(f"judge verdict has no score ({parser}): {text.strip()[:200]!r}")
    try:
        return float(match.group(1)) / scale
    except ValueError as err:
        raise ValueError(f"judge score {match.group(1)!r} is not a number") from err


def question_of(raw_prompt: Any, prompt_text: str | None) -> str:
    """The question a sample answers: its last user message, else its prompt text."""
    if isinstance(raw_prompt, list):
        for message in reversed(raw_prompt):
            if isinstance(message, dict) and message.get("role") == "user":
                return str(message.get("content", ""))
    return str(prompt_text or "")


class LLMJudge:
    """Scores (question, response, reference) triples with a judge model."""

    def __init__(self, config: JudgeConfig, engine: JudgeEngine) -> None:
        check_judge_config(config)
        self.config, self.engine = config, engine

    def prompt(self, question: str, response: str, reference: Any) -> list[dict[str, str]]:
        text = self.config.prompt_template.format(
            question=question, response=response, reference="" if reference is None else reference
        )
        return [{"role": "user", "content": text}]

    def score(
        self, questions: Sequence[str], responses: Sequence[str], references: Sequence[Any]
    ) -> list[tuple[float | None, str, str]]:
        """Per sample ``(score, verdict, "")`` or ``(None, verdict, failure reason)``."""
        conversations = [self.prompt(q, r, g) for q, r, g in zip(questions, responses, references)]
        if not conversations:
            return []
        try:
            verdicts = self.engine.complete(conversations)
        except Exception as err:  # the judge itself failed: every sample records why
            reason = f"JudgeError: {type(err).__name__}: {err}"[:500]
            return [(None, "", reason) for _ in conversations]
        out: list[tuple[float | None, str, str]] = []
        for verdict in verdicts:
            try:
                out.append(
                    (
                        parse_verdict(verdict, self.config.parser, self.config.score_scale),
                        verdict,
                        "",
                    )
                )
            except ValueError as err:
                out.append((None, verdict, f"UnparsableVerdict: {err}"))
        return out
