"""Test doubles: a scripted policy behind the rollout-engine interface, and teaching a
tiny random model a conversation. Importable from any test as ``doubles`` (this folder
is on the test path; see tests/conftest.py).

* :class:`ScriptedEngine` stands in for the *model*, not for an engine path: the runner,
  chat-template deltas and tool loop it drives are the real ones. The reply to each
  prompt is ``policy(prompt_text)``, encoded with the real tokenizer and ended with EOS
  (cut at ``max_new_tokens``); every generated row is recorded in ``generated`` so tests
  can check masks token by token. Log-probs are the constant ``LOG_PROB``. A prompt
  that is an earlier prompt followed by the start of its reply (a partial rollout's
  continuation) gets the rest of that reply, as a model continuing its prefix would.
* :func:`teach_tiny_model` makes a random tiny model *do* something specific (write a
  well-formed tool call, then an answer) so an end-to-end test can exercise that path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from temper.data.batch import Batch
from temper.rollout.base import RolloutEngine, SamplingParams

LOG_PROB = -0.25


class ScriptedEngine(RolloutEngine):
    """Replies ``policy(prompt_text)`` to every prompt (see the module docstring)."""

    def __init__(self, tokenizer: Any, policy: Callable[[str], str]) -> None:
        self.tokenizer, self.policy = tokenizer, policy
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.pad_token_id = tokenizer.pad_token_id
        self.generated: list[list[int]] = []  # every row of every call, in order
        self.batch_sizes: list[int] = []
        self.replies: dict[tuple[int, ...], list[int]] = {}  # prompt -> its whole reply

    def _reply(self, prompt: list[int]) -> list[int]:
        """The rest of the reply to ``prompt``: continued where an earlier prompt's reply
        was cut, else ``policy``'s reply to its text."""
        for context, reply in self.replies.items():
            n = len(context)
            if len(prompt) > n and tuple(prompt[:n]) == context:
                done = prompt[n:]
                if reply[: len(done)] == done:
                    return reply[len(done) :]
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        reply = self.tokenizer(self.policy(text), add_special_tokens=False)["input_ids"]
        reply = [*reply, self.tokenizer.eos_token_id]
        self.replies[tuple(prompt)] = reply
        return reply

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        rows, cuts = [], []
        for ids, mask in zip(prompts["prompt_ids"], prompts["prompt_mask"]):
            reply = self._reply(ids[mask.bool()].tolist())
            cuts.append(len(reply) > params.max_new_tokens)
            rows.append(reply[: params.max_new_tokens])
            self.generated.append(rows[-1])
        self.batch_sizes.append(len(rows))
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for k, r in enumerate(rows):
            ids[k, : len(r)] = torch.tensor(r)
            mask[k, : len(r)] = 1
        out = Batch(prompts.tensors.clone(recurse=False), dict(prompts.objects), dict(prompts.meta))
        out["response_ids"] = ids
        out["response_mask"] = mask
        out["rollout_log_probs"] = mask.float() * LOG_PROB
        out["truncated"] = cuts
        return out

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        pass


def turn_index(prompt_text: str) -> int:
    """0 for the first model turn, 1 for the second, … (counts generation prompts)."""
    return prompt_text.count("<|im_start|>assistant") - 1


def teach_tiny_model(
    model_dir: str | Path,
    out_dir: str | Path,
    conversations: list[list[dict[str, str]]],
    *,
    steps: int = 120,
    lr: float = 3e-3,
    seed: int = 0,
) -> dict[str, float]:
    """Supervised-train a (tiny) model to write the assistant turns of ``conversations``.

    Each conversation is rendered once with the chat template; the loss (mean token
    cross-entropy) covers exactly the tokens of every assistant message's content and
    the end-of-turn text that follows it (``eos_token``), found by character offsets, so
    the model learns to write those turns — and to stop — after the same context.
    Full-batch Adam for ``steps`` steps; model and tokenizer are written to ``out_dir``.
    Lets an end-to-end test make a random model *do* something specific (e.g. write a
    well-formed tool call, then an answer) under greedy or low-temperature sampling.
    Needs a fast tokenizer (offsets). Returns ``{"loss_first", "loss_last"}``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    eos_text = tok.eos_token or ""
    rows, targets = [], []
    for messages in conversations:
        text = tok.apply_chat_template(messages, tokenize=False)
        spans = []  # character spans the loss covers
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            start = len(
                tok.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True)
            )
            if not text.startswith(m["content"] + eos_text, start):
                raise ValueError("the chat template does not render assistant turns verbatim")
            spans.append((start, start + len(m["content"]) + len(eos_text)))
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        labels = [
            i if any(a <= lo and hi <= b for a, b in spans) and hi > lo else -100
            for i, (lo, hi) in zip(ids, enc["offset_mapping"])
        ]
        rows.append(ids)
        targets.append(labels)
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids_t = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    labels_t = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            loss = model(input_ids=ids_t, attention_mask=mask, labels=labels_t).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return {"loss_first": losses[0], "loss_last": losses[-1]}
