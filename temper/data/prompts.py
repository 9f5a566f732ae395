"""From one dataset row to the prompt text the policy sees, and its length policy.

Columns (all names from :class:`~temper.config.schema.DataConfig`):

- ``prompt_key`` holds a string or a chat list ``[{"role", "content"}, ...]`` (verl);
  ``messages_key``, when set, is used instead and holds a chat list or its JSON string (ROLL);
  a string there that is not JSON (``[``/``{`` first) is the user's prompt itself, as ROLL's
  vision-language pipeline reads its ``prompt`` column.
- ``ground_truth_key`` is a dotted path (``reward_model.ground_truth``); a flat column of
  that literal name also counts. When the path is absent the row's ``ground_truth`` column,
  then its ``answer`` column, is used (ROLL and raw HF datasets name it so); when none
  exists the ground truth is ``None`` — reward models and custom rewards may not need one.
- ``data_source_key`` names the task; when that column is absent, the row's
  ``data_source`` column (verl-shaped rows under a ROLL config, whose key is the tag),
  else ``"unknown"``; ``tag_key`` is the
  domain tag (defaults to the data source); ``extra_info_key`` is a dict passed to rewards,
  to which the columns named in ``extra_info_columns`` are added (ROLL keeps a code
  row's ``test_cases``/``case_type`` as top-level columns).

Templates (``chat_template``):

- ``native``: ``tokenizer.apply_chat_template(messages, add_generation_prompt=True,
  **apply_chat_template_kwargs)`` (e.g. ``enable_thinking: false`` for Qwen3);
  ``system_prompt`` is prepended unless the row already starts with a system message
  (two system messages break most templates). Tokenized without extra special tokens,
  since the template writes them.
- ``raw``: the prompt string as is (a chat list: its contents joined by blank lines;
  ``system_prompt`` first). Tokenized *with* the tokenizer's special tokens (a base
  model's BOS).
- a Jinja template string (contains ``{{`` or ``{%``): used in place of the tokenizer's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import DataConfig
from temper.data.errors import RowProblem

GROUND_TRUTH_FALLBACKS = ("ground_truth", "answer")
TRUNCATION_MODES = ("error", "left", "right", "middle")


@dataclasses.dataclass(frozen=True)
class PromptFields:
    """What a row contributes to a prompt sample, before templating."""

    messages: list[dict[str, str]]
    text: str | None
    ground_truth: Any
    data_source: str
    tag: str
    extra_info: dict[str, Any]


MISSING = object()  # what get_path returns for an absent path


def get_path(row: dict[str, Any], dotted: str) -> Any:
    """``row[a][b]`` for ``"a.b"`` (or a flat column literally named ``"a.b"``); else MISSING."""
    if dotted in row:
        return row[dotted]
    value: Any = row
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def data_source_of(row: dict[str, Any], key: str) -> str:
    """The row's data source: column ``key``; when the row has none, its ``data_source``
    column (verl-shaped rows read with ROLL's ``data_source_key: tag``); else ``unknown``."""
    source = get_path(row, key)
    if source is MISSING:
        source = row.get("data_source", MISSING)
    return "unknown" if source is MISSING or source is None else str(source)


def ground_truth_of(row: dict[str, Any], key: str) -> Any:
    """The row's ground truth at ``key``, else at ``ground_truth``, else ``answer``, else None."""
    for candidate in (key, *GROUND_TRUTH_FALLBACKS):
        value = get_path(row, candidate)
        if value is not MISSING and value is not None:
            return value
    return None


def _check_messages(value: Any, column: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise RowProblem(
            f"column '{column}' must be a string or a chat message list, got {type(value).__name__}"
        )
    if not value:
        raise RowProblem(f"prompt is empty (column '{column}' is an empty list)")
    messages = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise RowProblem(f"column '{column}' message {i} is not a {{role, content}} object")
        content = msg.get("content")
        if not isinstance(content, str):
            raise RowProblem(
                f"column '{column}' message {i} content must be a string, got "
                f"{type(content).__name__}"
            )
        messages.append({"role": msg["role"], "content": content})
    if not any(m["content"].strip() for m in messages):
        raise RowProblem(f"prompt is empty (every message in column '{column}' is blank)")
    return messages


def parse_row(row: dict[str, Any], cfg: DataConfig) -> PromptFields:
    """Pull prompt, ground truth, data source, tag and extra info out of ``row``.

    Raises :class:`RowProblem` with a one-line reason for a malformed row.
    """
    column = cfg.messages_key or cfg.prompt_key
    value = get_path(row, column)
    if value is MISSING:
        raise RowProblem(f"missing column '{column}' (row has: {', '.join(map(str, row))})")
    if value is None:  # the column is there (a csv's empty cell reads so too): a bad row
        raise RowProblem(f"column '{column}' is null: the row has no prompt")
    text: str | None = None
    if cfg.messages_key and isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise RowProblem(f"column '{column}' is a string but not a JSON message list") from err
    if isinstance(value, str):
        if not value.strip():
            raise RowProblem(f"prompt is empty (column '{column}')")
        text = value
        messages = [{"role": "user", "content": value}]
    else:
        messages = _check_messages(value, column)

    data_source = data_source_of(row, cfg.data_source_key)
    tag = get_path(row, cfg.tag_key)
    extra = get_path(row, cfg.extra_info_key)
    if extra is MISSING or extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise RowProblem(
            f"column '{cfg.extra_info_key}' must be an object, got {type(extra).__name__}"
        )
    extra = dict(extra)
    for name in cfg.extra_info_columns:  # e.g. ROLL's test_cases for the code reward
        found = get_path(row, name)
        if found is not MISSING:
            extra[name] = found
    return PromptFields(
        messages=messages,
        text=text,
        ground_truth=ground_truth_of(row, cfg.ground_truth_key),
        data_source=data_source,
        tag=data_source if tag is MISSING or tag is None else str(tag),
        extra_info=dict(extra),
    )


# --------------------------------------------------------------------------- templating


def is_jinja(template: str) -> bool:
    return "{{" in template or "{%" in template


def check_template(cfg: DataConfig, tokenizer: Any) -> None:
    """Fail before reading data when ``chat_template`` cannot work with this tokenizer."""
    mode = cfg.chat_template
    if mode == "raw" or is_jinja(mode):
        return
    if mode != "native":
        raise ConfigError(
            "data.chat_template",
            f"unknown value '{mode}'",
            "use native (the tokenizer's template), raw (plain text) or a Jinja template",
        )
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            "data.chat_template",
            "the tokenizer has no chat template (a base model?)",
            "set data.chat_template=raw, or give a Jinja template string",
        )


def with_system(messages: list[dict[str, str]], system_prompt: str | None) -> list[dict[str, str]]:
    """``messages`` with ``system_prompt`` first, unless it already starts with a system turn."""
    if not system_prompt or (messages and messages[0]["role"] == "system"):
        return list(messages)
    return [{"role": "system", "content": system_prompt}, *messages]


def render(
    fields: PromptFields, cfg: DataConfig, tokenizer: Any
) -> tuple[str, list[dict[str, str]]]:
    """The prompt text to tokenize and the chat list it came from (``raw_prompt``)."""
    messages = with_system(fields.messages, cfg.system_prompt)
    if cfg.chat_template == "raw":
        if fields.text is not None:
            body = fields.text
            text = f"{cfg.system_prompt}\n\n{body}" if cfg.system_prompt else body
        else:
            text = "\n\n".join(m["content"] for m in messages)
        return text, messages
    kwargs: dict[str, Any] = dict(getattr(cfg, "apply_chat_template_kwargs", None) or {})
    kwargs.update(tokenize=False, add_generation_prompt=True)
    if is_jinja(cfg.chat_template):
        kwargs["chat_template"] = cfg.chat_template
    return tokenizer.apply_chat_template(messages, **kwargs), messages


def tokenize(tokenizer: Any, texts: Sequence[str], raw: bool) -> list[list[int]]:
    """Token ids of ``texts`` (special tokens added only for raw text; see module doc)."""
    if not texts:
        return []
    encoded = tokenizer(list(texts), add_special_tokens=raw, return_attention_mask=False)[
        "input_ids"
    ]
    return [list(ids) for ids in encoded]


# --------------------------------------------------------------------------- length


def truncate_ids(ids: Sequence[int], max_length: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``max_length`` tokens (verl semantics).

    left: keep the last tokens; right: keep the first; middle: keep the first
    ``max_length // 2`` and the last ``max_length - max_length // 2``. ``error`` is the
    caller's business (it needs the row's file and line), so it is rejected here.
    """
    ids = list(ids)
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[-max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = max_length // 2
        tail = max_length - head
        return ids[:head] + ids[-tail:]
    raise ValueError(f"truncation mode '{mode}' does not cut; use one of left, right, middle")
