"""Supervised rows → token sequences: a row's prompt and response (or its conversation)
templated and tokenized, the tokens to learn marked, and the cuts to a length limit.

The row shapes, the layout of a sample and the cuts are described in
:mod:`temper.data.sft`, which builds datasets from these pieces (and the preference
pairs of :mod:`temper.data.preference` reuse the :class:`Encoder`).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from temper.config.schema import TemperConfig
from temper.data.errors import DataError, RowProblem
from temper.data.prompts import MISSING, get_path, is_jinja, with_system
from temper.data.row_formats import ROW_FORMATS
from temper.data.vision import ImageInput, VisionProcessor, row_media

ROLES = ("system", "user", "assistant", "tool")

# --------------------------------------------------------------------------- rows


def _text(row: dict[str, Any], column: str, what: str) -> str:
    """A non-empty string column; RowProblem naming it otherwise."""
    value = get_path(row, column)
    if value is MISSING:
        raise RowProblem(f"missing column '{column}' (row has: {', '.join(map(str, row))})")
    if value is None:
        raise RowProblem(f"column '{column}' is null: the row has no {what}")
    if not isinstance(value, str):
        raise RowProblem(f"column '{column}' must be a string, got {type(value).__name__}")
    if not value.strip():
        raise RowProblem(f"{what} is empty (column '{column}')")
    return value


def _optional(row: dict[str, Any], column: str | None) -> Any:
    """The value of an optional column (None where the row has no such column)."""
    if not column:
        return None
    value = get_path(row, column)
    return None if value is MISSING else value


def check_turns(messages: Any, column: str, learn: bool = True) -> list[dict[str, Any]]:
    """A conversation whose turns alternate: an optional system turn first, then a user
    turn, assistant and user turns by turns (tool results after an assistant turn), and
    (``learn``) at least one assistant turn to learn. Returns plain dicts (RowProblem on
    the first fault)."""
    if messages is MISSING:
        raise RowProblem(f"missing column '{column}'")
    if isinstance(messages, str) and messages.lstrip()[:1] == "[":
        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as err:
            raise RowProblem(f"column '{column}' is a string but not a JSON message list") from err
    if not isinstance(messages, list) or not messages:
        raise RowProblem(f"column '{column}' must be a non-empty list of chat messages")
    out: list[dict[str, Any]] = []
    previous = None
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise RowProblem(
                f"column '{column}' message {i} is not a chat message with role {', '.join(ROLES)}"
            )
        role, content = msg["role"], msg.get("content")
        calls = msg.get("tool_calls")
        if content is None and not (role == "assistant" and calls):
            raise RowProblem(f"column '{column}' message {i} ({role}) has no content")
        if content is not None and not isinstance(content, str):
            raise RowProblem(
                f"column '{column}' message {i} content must be a string, got "
                f"{type(content).__name__}"
            )
        if role in ("user", "assistant") and not (content or "").strip() and not calls:
            raise RowProblem(f"column '{column}' message {i} ({role}) is empty")
        fault = _turn_fault(previous, role, i)
        if fault:
            raise RowProblem(f"column '{column}' message {i}: {fault}")
        out.append({k: v for k, v in msg.items() if v is not None})
        previous = role
    if learn and not any(m["role"] == "assistant" for m in out):
        raise RowProblem(f"column '{column}' has no assistant turn to learn")
    return out


def _turn_fault(previous: str | None, role: str, index: int) -> str | None:
    """Why ``role`` cannot follow ``previous`` in a conversation (None: it can)."""
    if role == "system":
        return None if index == 0 else "a system turn after the conversation started"
    if previous in (None, "system"):
        return None if role == "user" else f"the conversation starts with a {role} turn, not user"
    if role == previous and role in ("user", "assistant"):
        return f"a second {role} turn in a row (turns must alternate user/assistant)"
    if role == "tool" and previous not in ("assistant", "tool"):
        return "a tool result that follows no assistant turn"
    if role == "user" and previous == "tool":
        return "a user turn right after a tool result (the assistant has not answered it)"
    return None


# --------------------------------------------------------------------------- encoding


class Encoder:
    """Templates and tokenizes rows into :class:`SFTExample` s (see the module doc)."""

    def __init__(
        self, cfg: TemperConfig, tokenizer: Any, vision: VisionProcessor | None = None
    ) -> None:
        self.data, self.sft = cfg.data, cfg.sft
        self.tokenizer = tokenizer
        self.vision = vision
        self.raw = self.data.chat_template == "raw"
        eos = tokenizer.eos_token_id
        if eos is None:
            raise DataError(
                "model.tokenizer_path",
                "the tokenizer has no eos token to close a response with",
                "use a tokenizer that defines eos_token",
            )
        self.eos = int(eos)

    def encode_row(
        self, row: dict[str, Any], data_file: str, where: str
    ) -> tuple[list[int], list[int], list[int], tuple[ImageInput, ...]]:
        """:meth:`encode` of a file's row after ``data.row_format``, with its images
        (``data_file``, ``where``: the row's place, for relative paths and reports)."""
        row = ROW_FORMATS.get(self.data.row_format)(row, self.data)
        images, videos = row_media(row, self.data, self.vision, data_file, where)
        if videos:
            raise RowProblem(
                f"column '{self.data.video_key}' holds videos: supervised and distillation "
                "samples take images only"
            )
        return (*self.encode(row, images=images), images)

    def encode(
        self,
        row: dict[str, Any],
        response_key: str | None = None,
        images: tuple[ImageInput, ...] = (),
    ) -> tuple[list[int], list[int], list[int]]:
        """``(prompt_ids, response_ids, target_mask)`` of a row (RowProblem if bad);
        ``response_key``: the response column (default ``sft.response_key``; a preference
        pair's chosen or rejected column); ``images``: the prompt's, read by
        :meth:`encode_row`."""
        tools = _optional(row, self.sft.tools_key)
        kwargs = dict(self.data.apply_chat_template_kwargs)
        thinking = _optional(row, self.sft.enable_thinking_key)
        if thinking is not None:
            kwargs["enable_thinking"] = bool(thinking)
        if self.data.messages_key:
            if images:
                raise RowProblem(
                    f"images go with prompt and response rows; a conversation in "
                    f"'{self.data.messages_key}' is read as text"
                )
            column = self.data.messages_key
            messages = check_turns(get_path(row, column), column)
            messages = with_system(messages, self.data.system_prompt)
            return self._conversation(messages, tools, kwargs)
        return self._pair(row, tools, kwargs, response_key or self.sft.response_key, images)

    def _template(
        self, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any], generation: bool
    ) -> list[int]:
        options = {**kwargs, "tokenize": False, "add_generation_prompt": generation}
        if tools:
            options["tools"] = copy.deepcopy(tools)
        if is_jinja(self.data.chat_template):
            options["chat_template"] = self.data.chat_template
        try:
            text = self.tokenizer.apply_chat_template(copy.deepcopy(messages), **options)
        except Exception as err:  # a template that raises on this row (jinja exceptions)
            raise RowProblem(f"the chat template fails on this row: {err}") from err
        return self._tokens(text, special=False)

    def _tokens(self, text: str, special: bool) -> list[int]:
        ids: list[int] = self.tokenizer(text, add_special_tokens=special)["input_ids"]
        return list(ids)

    def _pair(
        self,
        row: dict[str, Any],
        tools: Any,
        kwargs: dict[str, Any],
        response_key: str,
        images: tuple[ImageInput, ...] = (),
    ) -> tuple[list[int], list[int], list[int]]:
        column = self.data.prompt_key
        value = get_path(row, column)
        if value is MISSING:
            raise RowProblem(f"missing column '{column}' (row has: {', '.join(map(str, row))})")
        response = _text(row, response_key, "response")
        system = _optional(row, self.sft.system_key) or self.data.system_prompt
        if isinstance(value, str) or value is None:
            prompt = _text(row, column, "prompt")
            query = _optional(row, self.sft.query_key)
            if query:  # ROLL: instruction + "\n" + input, when the row has an input
                prompt = f"{prompt}\n{query}"
            messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        else:
            messages = check_turns(value, column, learn=False)
            if messages[-1]["role"] == "assistant":
                raise RowProblem(
                    f"column '{column}' ends with an assistant turn: the response to learn "
                    f"is column '{response_key}' (a whole conversation goes in "
                    "data.messages_key)"
                )
        messages = with_system(messages, system)
        if images:
            assert self.vision is not None  # row_media reads images for a VL model only
            prompt_ids = self._tokens(self.vision.render(messages, images, self.data), self.raw)
        elif self.raw:
            text = "\n\n".join(str(m.get("content", "")) for m in messages)
            prompt_ids = self._tokens(text, special=True)
        else:
            prompt_ids = self._template(messages, tools, kwargs, generation=True)
        response_ids = [*self._tokens(response, special=False), self.eos]
        return prompt_ids, response_ids, [1] * len(response_ids)

    def _conversation(
        self, messages: list[dict[str, Any]], tools: Any, kwargs: dict[str, Any]
    ) -> tuple[list[int], list[int], list[int]]:
        full = self._template(messages, tools, kwargs, generation=False)
        mask = [0] * len(full)
        for k, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            start = self._template(messages[:k], tools, kwargs, generation=True)
            end = self._template(messages[: k + 1], tools, kwargs, generation=False)
            if full[: len(start)] != start or full[: len(end)] != end:
                raise RowProblem(
                    f"the chat template renders assistant turn {k} differently once later "
                    "turns follow (it rewrites earlier turns), so its tokens cannot be found"
                )
            for i in range(len(start), len(end)):
                mask[i] = 1
        first = mask.index(1)
        last = len(mask) - mask[::-1].index(1)  # nothing after the last learnt token matters
        return full[:first], full[first:last], mask[first:last]


def truncate(
    prompt: list[int], response: list[int], mask: list[int], max_length: int, mode: str
) -> tuple[list[int], list[int], list[int]] | None:
    """Cut a sample to ``max_length`` tokens (verl's SFT datasets): ``left`` drops its
    first tokens (the prompt's, then the response's), ``right`` its last. A sample keeps
    at least one context token (the first learnt token is predicted from it). None when
    nothing is left to learn."""
    over = len(prompt) + len(response) - max_length
    if over <= 0:
        return prompt, response, mask
    if mode == "left":
        cut = max(0, over - len(prompt))
        prompt, response, mask = prompt[over:], response[cut:], mask[cut:]
        if not prompt and response:  # the first kept token becomes context
            prompt, response, mask = response[:1], response[1:], mask[1:]
    elif mode == "right":
        keep = len(response) - over
        if keep <= 0:
            return None
        response, mask = response[:keep], mask[:keep]
    else:
        raise ValueError(f"truncation mode '{mode}' does not cut a sample; use left or right")
    if not prompt or not any(mask):
        return None
    return prompt, response, mask


def learn_prompt(
    prompt: list[int], response: list[int], context: frozenset[int]
) -> tuple[list[int], list[int], list[int]]:
    """``sft.learn_prompt``: a sample whose every token after the first is learnt, but
    the ``context`` ids (image and video placeholders, which stand for pixels):
    ``(prompt[:1], prompt[1:] + response, mask)``, ``mask = [t ∉ context]``."""
    tokens = prompt[1:] + response
    return prompt[:1], tokens, [int(t not in context) for t in tokens]
