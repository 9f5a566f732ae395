"""A scripted policy behind the ``RolloutEngine`` interface.

For checking environments, tool configs and the multi-turn loop without a model (and
for testing them): it is a stand-in for the *model*, not for an engine path — the
runner, chat-template deltas and tool loop it drives are the real ones. The reply to
each prompt is ``policy(prompt_text)``, encoded with the real tokenizer and ended with
EOS (cut at ``max_new_tokens``); every generated row is recorded in ``generated`` so
callers can check masks token by token. Log-probs are the constant ``LOG_PROB``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from temper.data.batch import Batch
from temper.rollout.base import RolloutEngine, SamplingParams

LOG_PROB = -0.25


class ScriptedEngine(RolloutEngine):
    """Replies ``policy(prompt_text)`` to every prompt (see the module docstring)."""

    def __init__(self, tokenizer, policy: Callable[[str], str]) -> None:
        self.tokenizer, self.policy = tokenizer, policy
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.pad_token_id = tokenizer.pad_token_id
        self.generated: list[list[int]] = []  # every row of every call, in order
        self.batch_sizes: list[int] = []

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        rows, cuts = [], []
        for ids, mask in zip(prompts["prompt_ids"], prompts["prompt_mask"]):
            text = self.tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=False)
            reply = self.tokenizer(self.policy(text), add_special_tokens=False)["input_ids"]
            reply = [*reply, self.tokenizer.eos_token_id]
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
