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
from chat_prompts import chat_prompt_batch  # benchmarks/chat_prompts.py, beside this script

from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine


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
    batch = chat_prompt_batch(tok, args.prompts)
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
        f"prompt_len={batch['prompt_ids'].shape[1]}"
    )
    print(f"generated {tokens} tokens in {best:.2f}s: {tokens / best:.1f} tokens/s")


if __name__ == "__main__":
    main()
