"""Grouped-query attention under a mask: transformers' ``sdpa`` against temper's kernel.

    python benchmarks/gqa_attention.py [--model smollm2:135m-instruct] [--prompts 8] [--n 4]
                                       [--new-tokens 128] [--reps 3] [--no-generate]

transformers' ``sdpa`` function copies each key/value head once per query head whenever
a mask is given (left-padded prompts in generation, padded training rows); the forward
of temper's ``temper_segments`` kernel without a packed layout
(:func:`temper.training.segment_attention.unpacked_attention`, what an ``sdpa`` model
is loaded with on CPU when packing is on, so the colocated HF rollout engine and padded
forwards run it) passes the grouped heads to SDPA with ``enable_gqa`` instead.

1. One attention call at a decoding step's shapes (``prompts × n`` rows, the model's
   heads, key lengths from 64 to prompt + ``--new-tokens``): median of 50 calls each;
   and the forward + backward of a padded 8-row micro-batch at those lengths (median of
   10).
2. Unless ``--no-generate``: ``HFRolloutEngine.generate`` of ``--prompts`` chat prompts ×
   ``--n`` samples, ``--new-tokens`` tokens each (``ignore_eos``), with the model's
   attention switched between ``sdpa`` and the kernel before each call, alternating;
   median of ``--reps`` each. Same model object, same weights, same process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from chat_prompts import chat_prompt_batch  # benchmarks/chat_prompts.py, beside this script
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine
from temper.training import segment_attention
from temper.utils.model_path import resolve_model_path


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _compare(module: torch.nn.Module, tensors: tuple[torch.Tensor, ...], reps: int) -> str:
    """sdpa's and temper's time on the same inputs (a backward when they need gradients)."""
    backward = tensors[0].requires_grad

    def run(attention: Callable[..., tuple[torch.Tensor, None]]) -> Callable[[], object]:
        def call() -> object:
            out = attention(module, *tensors)[0]
            return out.sum().backward() if backward else out

        return call

    sdpa = _median_ms(run(sdpa_attention_forward), reps)
    ours = _median_ms(run(segment_attention.unpacked_attention), reps)
    return f"{sdpa:9.3f} {ours:10.3f} {ours / sdpa:7.2f}"


def bench_call(config: Any, rows: int, lengths: list[int]) -> None:
    heads, kv_heads = int(config.num_attention_heads), int(config.num_key_value_heads)
    dim = int(config.hidden_size) // heads

    class Attention(torch.nn.Module):  # what an attention function reads of its module
        is_causal = True
        num_key_value_groups = heads // kv_heads

    module = Attention()
    print(f"one attention call: {rows} rows, {heads} query / {kv_heads} key-value heads × {dim}")
    print(f"{'keys':>6} {'sdpa ms':>9} {'temper ms':>10} {'ratio':>7}")
    for length in lengths:
        q = torch.randn(rows, heads, 1, dim)
        k, v = torch.randn(rows, kv_heads, length, dim), torch.randn(rows, kv_heads, length, dim)
        mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
        mask[: rows // 2, :, :, : length // 8] = False  # left padding in half the rows
        print(f"{length:6d} {_compare(module, (q, k, v, mask), 50)}")
    micro = 8
    print(f"forward + backward of a padded micro-batch: {micro} rows, causal, left padding")
    for length in lengths:
        q = torch.randn(micro, heads, length, dim, requires_grad=True)
        k = torch.randn(micro, kv_heads, length, dim, requires_grad=True)
        v = torch.randn(micro, kv_heads, length, dim, requires_grad=True)
        mask = torch.ones(micro, 1, length, length, dtype=torch.bool).tril()
        mask[: micro // 2, :, :, : length // 8] = False
        mask[: micro // 2, :, : length // 8, 0] = True  # padded queries keep one key
        print(f"{length:6d} {_compare(module, (q, k, v, mask), 10)}")


def bench_generate(path: str, args: argparse.Namespace) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    segment_attention.register()
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    )
    tok = AutoTokenizer.from_pretrained(path)
    prompts = chat_prompt_batch(tok, args.prompts)
    engine = HFRolloutEngine(model, tok)
    params = SamplingParams(n=args.n, max_new_tokens=args.new_tokens, ignore_eos=True)
    times: dict[str, list[float]] = {"sdpa": [], segment_attention.SEGMENT_KERNEL: []}
    for rep in range(args.reps + 1):  # the first round warms both up
        for kernel in times:
            model.set_attn_implementation(kernel)
            start = time.perf_counter()
            engine.generate(prompts, params)
            if rep:
                times[kernel].append(time.perf_counter() - start)
    sdpa, ours = (statistics.median(t) for t in times.values())
    tokens = args.prompts * args.n * args.new_tokens
    print(
        f"\nHFRolloutEngine.generate, {args.prompts} prompts × {args.n}, {args.new_tokens} tokens"
        f" (median of {args.reps}): sdpa {sdpa:.2f} s ({tokens / sdpa:.0f} tok/s), "
        f"temper {ours:.2f} s ({tokens / ours:.0f} tok/s): {ours / sdpa:.2f}× the time"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2:135m-instruct")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-generate", action="store_true")
    args = p.parse_args()
    from transformers import AutoConfig

    path = resolve_model_path(args.model)
    config = AutoConfig.from_pretrained(path)
    longest = 64 + args.new_tokens
    lengths = sorted({64, (64 + longest) // 2, longest})
    bench_call(config, args.prompts * args.n, lengths)
    if not args.no_generate:
        bench_generate(path, args)


if __name__ == "__main__":
    main()
