"""Tokens/s of the HF rollout engine (``HFRolloutEngine.generate``).

    python benchmarks/hf_generate.py [--model smollm2:135m-instruct] [--prompts 8]
                                     [--new-tokens 64] [--device cpu] [--repeats 2]

Generates ``--new-tokens`` tokens for each of ``--prompts`` chat prompts in one
batch with ``ignore_eos`` (every row runs the full length, so the count is exact)
and prints generated tokens per second of wall time, best of ``--repeats`` after a
warm-up call. fp32 on CPU, the model's default dtype rules elsewhere.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from temper.data.batch import Batch
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine

QUESTIONS = [
    "What is 2+3?",
    "Name a prime number larger than 10.",
    "Write a haiku about autumn.",
    "What is the capital of France?",
    "Explain gravity in one sentence.",
    "List three colors.",
    "What is 12 times 7?",
    "Say hello in Spanish.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args()

    engine = HFRolloutEngine.from_pretrained(args.model, dtype=args.dtype, device=args.device)
    tok = engine.tokenizer
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(args.prompts)
    ]
    enc = tok(texts, padding=True, padding_side="left", return_tensors="pt")
    batch = Batch.from_dict({"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]})
    params = SamplingParams(
        max_new_tokens=args.new_tokens, temperature=args.temperature, ignore_eos=True
    )
    torch.manual_seed(0)
    engine.generate(batch, SamplingParams(max_new_tokens=4, ignore_eos=True))  # warm-up
    best = float("inf")
    tokens = 0
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = engine.generate(batch, params)
        best = min(best, time.perf_counter() - start)
        tokens = int(out["response_mask"].sum())
    print(
        f"model={args.model} device={args.device} dtype={next(engine.module.parameters()).dtype} "
        f"threads={torch.get_num_threads()} prompts={args.prompts} new_tokens={args.new_tokens} "
        f"prompt_len={enc['input_ids'].shape[1]}"
    )
    print(f"generated {tokens} tokens in {best:.2f}s: {tokens / best:.1f} tokens/s")


if __name__ == "__main__":
    main()
