"""Token sequences of a growing conversation: chat-template deltas and the sanity check.

A multi-turn episode is trained as **one** token sequence. It is built incrementally,
turn by turn, so the ids the model generated are kept exactly as generated (token in,
token out — never decoded and re-encoded, which can change ids: "retokenization
drift"). Only the text *around* the model's turns comes from the chat template:

* the first prompt: ``render(messages, add_generation_prompt=True)``;
* after a model turn, the template's **delta**: render the conversation with the
  assistant message (its content = the decoded generated text) and with the next
  messages (observation / tool results) plus the generation prompt, and take the text
  that the longer rendering adds. The assistant message's own closing scaffold (e.g.
  ChatML's ``\\n`` after ``<|im_end|>``, or the whole ``<|im_end|>\\n`` when the turn
  was cut at the token limit) is the part of its rendering after the generated text.

This is correct when the template is *prefix-stable* (rendering ``messages[:k+1]``
extends rendering ``messages[:k]``) and renders an assistant message's content
verbatim. Templates that trim content, drop earlier reasoning, or insert text
depending on the position of a message are not; :meth:`ChatTokenizer.sanity_check`
(verl's ``enable_tokenization_sanity_check``) finds them by comparing the incremental
ids with one tokenization of the whole conversation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

Message = dict[str, Any]


class TokenizationMismatch(RuntimeError):
    """The incremental token sequence disagrees with the chat template's rendering."""


@dataclasses.dataclass
class SanityResult:
    """Outcome of comparing incremental ids with the whole conversation's tokenization.

    ``ok``: ids identical (on the common length). ``drift``: same text, different ids —
    the model emitted a non-canonical tokenization; harmless for training (we train on
    the ids that were sampled) but counted. Otherwise the *text* differs: the template
    delta is wrong (see the module docstring) and ``detail`` shows where.
    """

    ok: bool
    drift: bool
    detail: str = ""


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ChatTokenizer:
    """Renders conversations with a tokenizer's chat template and encodes the deltas."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        """``tools``: OpenAI function schemas given to the template (``tools=``);
        ``template_kwargs``: extra ``apply_chat_template`` arguments (e.g. ``enable_thinking``)."""
        self.tokenizer = tokenizer
        self.tools = list(tools) if tools else None
        self.template_kwargs = dict(template_kwargs or {})
        self.prefix_breaks = 0  # deltas computed from a non-prefix rendering (counted)

    # ------------------------------------------------------------------ primitives

    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        kwargs = dict(self.template_kwargs)
        if self.tools:
            kwargs["tools"] = self.tools
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
        )

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` — the template text already holds any BOS, so none is added."""
        if not text:
            return []
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        # verbatim: no special-token skipping, no "clean-up" of spaces before punctuation
        return self.tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    # ------------------------------------------------------------------ turns

    def prompt(self, messages: Sequence[Message]) -> tuple[list[int], str]:
        """Ids and text of the first prompt (with the generation prompt)."""
        text = self.render(messages, add_generation_prompt=True)
        return self.encode(text), text

    def assistant_content(self, generated: Sequence[int], stop_ids: Sequence[int]) -> str:
        """The assistant message's text: the generated ids, minus a final stop token."""
        ids = list(generated)
        if ids and ids[-1] in set(stop_ids):
            ids = ids[:-1]
        return self.decode(ids)

    def continuation(
        self,
        rendered: str,
        history: Sequence[Message],
        generated: Sequence[int],
        content: str,
        new_messages: Sequence[Message],
    ) -> tuple[list[int], str]:
        """Ids (mask 0) to append after a model turn, and the new rendered prompt text.

        ``rendered``: the text of the prompt the turn was generated from
        (``render(history[:-1], True)``); ``history`` ends with the assistant message
        whose content is ``content`` (decoded from ``generated``); ``new_messages``:
        observation / tool messages shown next. Returns the ids of the assistant's
        closing scaffold + the new messages + the generation prompt.
        """
        with_assistant = self.render(history, add_generation_prompt=False)
        closing = self._closing(rendered, with_assistant, generated, content)
        following = self.render([*history, *new_messages], add_generation_prompt=True)
        if following.startswith(with_assistant):
            delta = following[len(with_assistant) :]
        else:  # not prefix-stable: best effort, the sanity check will report it
            self.prefix_breaks += 1
            delta = following[_common_prefix(following, with_assistant) :]
        return self.encode(closing + delta), following

    def _closing(
        self, rendered: str, with_assistant: str, generated: Sequence[int], content: str
    ) -> str:
        """The template text after the generated tokens of the assistant message."""
        if not with_assistant.startswith(rendered):
            self.prefix_breaks += 1
            return ""
        turn = with_assistant[len(rendered) :]
        generated_text = self.decode(generated)
        if turn.startswith(generated_text):  # stopped on the template's end-of-turn token
            return turn[len(generated_text) :]
        if turn.startswith(content):  # cut at the token limit, or another stop token
            tail = turn[len(content) :]
            stop_text = generated_text[len(content) :]
            return tail[len(stop_text) :] if stop_text and tail.startswith(stop_text) else tail
        self.prefix_breaks += 1  # the template rewrites the content (trim, think-strip)
        return ""

    # ------------------------------------------------------------------ sanity check

    def sanity_check(self, ids: Sequence[int], messages: Sequence[Message]) -> SanityResult:
        """Compare incremental ``ids`` with one tokenization of the whole conversation.

        The conversation is rendered once (with a generation prompt when it ends on a
        non-assistant message) and tokenized; ``ids`` must equal its prefix. A final
        assistant message's closing scaffold is not part of ``ids`` (the episode ended
        there), hence the prefix comparison.
        """
        ends_on_model = bool(messages) and messages[-1].get("role") == "assistant"
        full_text = self.render(messages, add_generation_prompt=not ends_on_model)
        full = self.encode(full_text)
        ids = list(ids)
        if full[: len(ids)] == ids:
            return SanityResult(ok=True, drift=False)
        text = self.decode(ids)
        if full_text.startswith(text):
            return SanityResult(ok=False, drift=True, detail="same text, different token ids")
        at = _common_prefix(text, full_text)
        detail = (
            f"incremental and full tokenization differ at character {at}: incremental "
            f"{text[max(0, at - 40) : at + 40]!r} vs full {full_text[max(0, at - 40) : at + 40]!r}"
        )
        return SanityResult(ok=False, drift=False, detail=detail)
