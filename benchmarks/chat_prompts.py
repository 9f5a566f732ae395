"""The benchmarks' chat prompts: short questions, chat-templated, left-padded into a batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temper.data.batch import Batch

QUESTIONS = (
    "What is 2+3?",
    "Name a prime number larger than 10.",
    "Write a haiku about autumn.",
    "What is the capital of France?",
    "Explain gravity in one sentence.",
    "List three colors.",
    "What is 12 times 7?",
    "Say hello in Spanish.",
)


def chat_prompt_batch(tokenizer: Any, count: int, questions: Sequence[str] = QUESTIONS) -> Batch:
    """``count`` prompts (the questions in turn, each as one user turn with the generation
    prompt), left-padded: ``prompt_ids`` and ``prompt_mask``."""
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": questions[i % len(questions)]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(count)
    ]
    enc = tokenizer(texts, padding=True, padding_side="left", return_tensors="pt")
    return Batch.from_dict({"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]})
