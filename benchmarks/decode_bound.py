"""vLLM-CPU decode time per step against its bound, for engine settings given on the line.

    python benchmarks/decode_bound.py [--model smollm2:135m-instruct] [--prompts 8] [--n 4]
        [--new-tokens 64] [--repeats 3] [--set KEY=VALUE ...] [--set ...]

Each ``--set`` group (comma-separated ``rollout.*`` keys, values read as YAML, e.g.
``--set enable_prefix_caching=false`` or ``--set block_size=32,enforce_eager=false``; none:
temper's defaults) starts its own engine, one after the other in this process. For each,
the rollout of ``--prompts`` chat prompts × ``--n`` samples (temperature 1, ``ignore_eos``,
log-probs on, as temper's RL step asks) is timed at 1 and at ``--new-tokens`` new tokens,
best of ``--repeats`` after a warm-up, with the prefix cache dropped before each call (a
step after a weight sync starts with it empty); decode per step = (T(L) - T(1)) / (L - 1):
the prefill and the fixed costs cancel.

The bound of one decode step (all ``prompts × n`` rows advance one token) is the larger of

* weight streaming: the model's parameter bytes (each weight read once per step; a tied
  embedding once) over this machine's read bandwidth, measured as the best of 5
  ``torch.sum`` over a 1 GiB fp32 tensor (this process's threads);
* compute: 2 × parameters × rows FLOPs over the best ``torch.mm`` GFLOP/s at the model's
  decode shapes (rows × hidden × intermediate), fp32.

KV-cache reads (a few MB at these lengths) are left out: the bound is a floor. Printed:
the bound's parts, and per setting the decode step in ms and as a multiple of the bound.
The machine may be shared: compare settings from the same run.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch
import yaml
from chat_prompts import chat_prompt_batch  # benchmarks/chat_prompts.py, beside this script

from temper.config.schema import ModelConfig, RolloutConfig
from temper.rollout.base import SamplingParams


def best(fn, repeats: int) -> float:
    """Best seconds of ``repeats`` calls of ``fn`` after one warm-up."""
    fn()
    out = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - start)
    return out


def read_bandwidth() -> float:
    """Bytes/s of a streaming read (``torch.sum`` over 1 GiB of fp32)."""
    x = torch.ones(1 << 28)
    return x.numel() * 4 / best(lambda: x.sum(), 5)


def gemm_flops(rows: int, hidden: int, inner: int) -> float:
    """FLOP/s of ``torch.mm`` at a decode shape (rows × hidden) @ (hidden × inner)."""
    a, b = torch.randn(rows, hidden), torch.randn(hidden, inner)
    return 2 * rows * hidden * inner / best(lambda: torch.mm(a, b), 20)


def parse_set(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        key, value = item.split("=", 1)
        out[key.removeprefix("rollout.")] = yaml.safe_load(value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], help="rollout.* keys, a,b=..")
    args = parser.parse_args()

    from transformers import AutoConfig

    from temper.rollout.vllm_engine import VLLMRolloutEngine
    from temper.utils.model_path import resolve_model_path

    path = resolve_model_path(args.model)
    config = AutoConfig.from_pretrained(path)
    rows = args.prompts * args.n
    bandwidth = read_bandwidth()
    flops = gemm_flops(rows, config.hidden_size, config.intermediate_size)
    settings = [parse_set(s) for s in args.set] or [{}]
    engine_kwargs = {"vllm": {"kv_cache_memory_bytes": 512 << 20}}
    results = []
    params = 0
    for overrides in settings:
        rollout = RolloutConfig(
            **{"engine": "vllm", "max_model_len": 512, "engine_kwargs": engine_kwargs} | overrides
        )
        start = time.perf_counter()
        engine = VLLMRolloutEngine.from_config(rollout, ModelConfig(path=path), seed=0)
        startup = time.perf_counter() - start
        if not params:  # unique parameters, as vLLM holds them (a tied embedding once)
            from transformers import AutoModelForCausalLM

            with torch.device("meta"):
                meta = AutoModelForCausalLM.from_config(config)
            params = sum(p.numel() for p in meta.parameters())
            del meta
        tok = engine.tokenizer
        batch = chat_prompt_batch(tok, args.prompts)

        def rollout_of(tokens: int, engine=engine, batch=batch):
            sampling = SamplingParams(n=args.n, max_new_tokens=tokens, ignore_eos=True)

            def call() -> None:
                engine.llm.reset_prefix_cache()  # as after a weight sync
                engine.generate(batch, sampling)

            return call

        one = best(rollout_of(1), args.repeats)
        full = best(rollout_of(args.new_tokens), args.repeats)
        results.append((overrides, startup, one, (full - one) / (args.new_tokens - 1)))
        engine.close()
        del engine
        gc.collect()

    stream = params * 4 / bandwidth
    compute = 2 * params * rows / flops
    bound = max(stream, compute)
    print(
        f"model={args.model} params={params / 1e6:.1f}M fp32 threads={torch.get_num_threads()} "
        f"rows={rows} new_tokens={args.new_tokens}"
    )
    print(
        f"bound per decode step {bound * 1e3:.1f} ms = max(weight streaming "
        f"{params * 4 / 2**20:.0f} MiB / {bandwidth / 1e9:.1f} GB/s = {stream * 1e3:.1f} ms, "
        f"compute {2 * params * rows / 1e9:.1f} GFLOP / {flops / 1e9:.0f} GFLOP/s = "
        f"{compute * 1e3:.1f} ms)"
    )
    for overrides, startup, one, step in results:
        label = ",".join(f"{k}={v}" for k, v in overrides.items()) or "defaults"
        print(
            f"{label:40s} decode step {step * 1e3:6.1f} ms = {step / bound:.2f}x bound; "
            f"1-token rollout {one:.2f}s; engine start {startup:.0f}s"
        )


if __name__ == "__main__":
    main()
