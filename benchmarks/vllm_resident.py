"""Does an in-process vLLM engine slow the trainer's update down? The same step, before and after.

    python benchmarks/vllm_resident.py [--model smollm2:135m-instruct] [--rows 4] [--seq 180]
                                       [--micro-batches 2] [--reps 3]

One process, as temper runs vLLM (in process, :mod:`temper.rollout.vllm_process`): a
Hugging Face causal LM's training step (``--micro-batches`` forward + backward passes of
``--rows`` × ``--seq`` random tokens, then AdamW) is timed ``--reps`` times

1. before vLLM is imported,
2. after an in-process ``LLM`` of the same model is built (its weights, KV cache and
   threads resident),
3. after that engine generated 32 × 128 tokens,

and each row prints the median step, the minor page faults per step (memory the step
maps afresh), the process's thread count and the CPU seconds of every thread busy during
the last step (a thread of vLLM's competing with the trainer would show there). fp32, this process's torch threads.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from temper.rollout.vllm_process import preserve_process_state, use_in_process_engine
from temper.utils.model_path import resolve_model_path


def thread_cpu_seconds() -> dict[int, float]:
    """User + system CPU seconds of each thread of this process (Linux ``/proc``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2:135m-instruct")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--seq", type=int, default=180)
    p.add_argument("--micro-batches", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(args.model)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, int(model.config.vocab_size), (args.rows, args.seq))

    def timed(label: str) -> None:
        times = []
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(args.reps):
            before = thread_cpu_seconds()
            start = time.perf_counter()
            for _ in range(args.micro_batches):
                model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
            after = thread_cpu_seconds()
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.reps
        busy = {
            ("main" if tid == os.getpid() else tid): round(cpu - before.get(tid, 0.0), 2)
            for tid, cpu in after.items()
            if cpu - before.get(tid, 0.0) > 0.05
        }
        print(
            f"{label:24} step {statistics.median(times):6.2f} s (median of {args.reps})  "
            f"page faults/step {faults:9.0f}  threads {len(after):3d}  "
            f"busy CPU s in the last step {busy}",
            flush=True,
        )

    timed("before vLLM")
    use_in_process_engine()
    from vllm import LLM, SamplingParams

    with preserve_process_state():  # as temper builds it: the trainer keeps its threads
        llm = LLM(
            model=path,
            dtype="float32",
            enforce_eager=True,
            max_model_len=512,
            kv_cache_memory_bytes=256 * 2**20,
            seed=0,
        )
    timed("vLLM resident")
    llm.generate(
        [{"prompt_token_ids": list(range(100, 150))}] * 32,
        SamplingParams(max_tokens=128, ignore_eos=True),
        use_tqdm=False,
    )
    timed("after a rollout")


if __name__ == "__main__":
    main()
