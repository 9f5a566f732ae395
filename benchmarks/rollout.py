"""Tokens/s of the ``hf`` and ``vllm`` rollout engines on the same prompts, in one run.

    python benchmarks/rollout.py [--model smollm2:135m-instruct] [--prompts 8] [--n 4]
                                 [--new-tokens 64] [--temperature 1.0] [--repeats 2]
                                 [--sync-repeats 3]

Both engines get the same chat prompts and the same sampling settings (``n`` samples
per prompt, log-probs on, ``ignore_eos`` so every row runs the full length and the token
count is exact). Each is warmed up once, then timed ``--repeats`` times (best kept).
fp32 on CPU. Also times a vLLM weight sync of the whole model from an HF copy of it
(what ``Run.sync_weights`` does after each update). Prints one line per engine and the
vllm/hf ratio.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch
from chat_prompts import chat_prompt_batch  # benchmarks/chat_prompts.py, beside this script

from temper.config.schema import ModelConfig, RolloutConfig
from temper.data.batch import Batch
from temper.rollout.base import RolloutEngine, SamplingParams
from temper.rollout.hf import HFRolloutEngine


def time_engine(
    engine: RolloutEngine, batch: Batch, params: SamplingParams, repeats: int
) -> tuple[float, int]:
    """(best seconds, generated tokens) over ``repeats`` calls after one warm-up."""
    engine.generate(batch, SamplingParams(max_new_tokens=4, ignore_eos=True))
    best, tokens = float("inf"), 0
    for _ in range(repeats):
        torch.manual_seed(0)
        start = time.perf_counter()
        out = engine.generate(batch, params)
        best = min(best, time.perf_counter() - start)
        tokens = int(out["response_mask"].sum())
    return best, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--sync-repeats", type=int, default=3)
    args = parser.parse_args()

    from temper.rollout.vllm_engine import VLLMRolloutEngine
    from temper.utils.model_path import resolve_model_path

    path = resolve_model_path(args.model)
    hf = HFRolloutEngine.from_pretrained(path, dtype="fp32", device="cpu")
    tok = hf.tokenizer
    batch = chat_prompt_batch(tok, args.prompts)
    params = SamplingParams(
        n=args.n, max_new_tokens=args.new_tokens, temperature=args.temperature, ignore_eos=True
    )
    print(
        f"model={args.model} dtype=fp32 threads={torch.get_num_threads()} "
        f"prompts={args.prompts} n={args.n} new_tokens={args.new_tokens} "
        f"prompt_len={batch['prompt_ids'].shape[1]} temperature={args.temperature}"
    )
    hf_s, hf_tokens = time_engine(hf, batch, params, args.repeats)
    print(f"hf    {hf_tokens} tokens in {hf_s:.2f}s: {hf_tokens / hf_s:.1f} tokens/s")

    start = time.perf_counter()
    vllm = VLLMRolloutEngine.from_config(
        RolloutConfig(engine="vllm", max_model_len=batch["prompt_ids"].shape[1] + args.new_tokens),
        ModelConfig(path=path, dtype="fp32"),
        seed=0,
    )
    startup = time.perf_counter() - start
    v_s, v_tokens = time_engine(vllm, batch, params, args.repeats)
    print(
        f"vllm  {v_tokens} tokens in {v_s:.2f}s: {v_tokens / v_s:.1f} tokens/s "
        f"(engine start {startup:.1f}s)"
    )
    syncs = []
    for _ in range(args.sync_repeats):
        vllm.load_weights(hf.module.state_dict().items())
        syncs.append(vllm.last_sync)
    best = min(syncs, key=lambda s: s.seconds)
    print(
        f"vllm weight sync: {best.tensors} tensors, {best.bytes / 2**20:.0f} MiB in "
        f"{best.buckets} buckets: {best.seconds:.2f}s (best of {args.sync_repeats})"
    )
    print(f"ratio vllm/hf tokens/s: {(v_tokens / v_s) / (hf_tokens / hf_s):.2f}")
    vllm.close()
    del hf
    gc.collect()


if __name__ == "__main__":
    main()
