"""The HF engine's CPU rollout with linears on oneDNN-packed weights against plain ones.

    python benchmarks/hf_packed_linear.py [--model smollm2:135m-instruct] [--prompts 8]
        [--n 4] [--new-tokens 64] [--reps 3]

Part 1, one linear at a decoding step's shape (``--prompts × --n`` rows, the model's
layer shapes and its LM head): ``F.linear`` against ``_linear_pointwise`` on the packed
weight (:mod:`temper.rollout.packed_linear`), each over as many distinct weights as the
model has such layers so that, as in a real step, the weights stream from memory rather
than sit in cache; and the reorder's own time per layer.

Part 2, the whole rollout: ``HFRolloutEngine.generate`` of ``--prompts`` chat prompts ×
``--n`` samples, ``--new-tokens`` tokens each (temperature 1, ``ignore_eos``, log-probs
on, as an RL step asks), with ``pack_linears`` on and off, alternating, ``--reps`` times
each after a warm-up; the model loaded as a colocated trainer's is on CPU (temper's
segment attention kernel). The ratio is packed / plain: below 1 is faster.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
from chat_prompts import chat_prompt_batch  # benchmarks/chat_prompts.py, beside this script
from decode_bound import best  # best-of-N timing, benchmarks/decode_bound.py

from temper.rollout import packed_linear
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine
from temper.training import segment_attention


def time_shape(out_f: int, in_f: int, count: int, rows: int) -> tuple[float, float, float]:
    """Seconds per call of F.linear and of the packed linear at (rows × in_f) @ W (out_f ×
    in_f)ᵀ over up to 32 distinct weights, and of one reorder."""
    copies = min(count, 32)
    weights = [torch.randn(out_f, in_f) for _ in range(copies)]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, rows) for w in weights]
    x = torch.randn(rows, in_f)

    def plain() -> None:
        for w in weights:
            torch.nn.functional.linear(x, w)

    def on_packed() -> None:
        for w in packed:
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    def reorder() -> None:
        torch.ops.mkldnn._reorder_linear_weight(weights[0], rows)

    return best(plain, 5) / copies, best(on_packed, 5) / copies, best(reorder, 3)


def layer_table(module: torch.nn.Module, rows: int) -> None:
    """Part 1: per weight shape, plain vs packed linear over distinct weights."""
    shapes: dict[tuple[int, int], int] = {}
    for m in module.modules():
        if packed_linear.eligible(m):
            shapes[tuple(m.weight.shape)] = shapes.get(tuple(m.weight.shape), 0) + 1
    print(
        f"{'weight':>14} {'layers':>6} {'F.linear ms':>11} {'packed ms':>9} {'ratio':>6} "
        f"{'reorder ms':>10}"
    )
    total_plain = total_packed = 0.0
    for (out_f, in_f), count in sorted(shapes.items(), key=lambda kv: -kv[0][0] * kv[0][1]):
        plain_s, packed_s, reorder_s = time_shape(out_f, in_f, count, rows)
        total_plain += plain_s * count
        total_packed += packed_s * count
        print(
            f"{out_f:>6} x {in_f:<5} {count:>6} {plain_s * 1e3:>11.3f} {packed_s * 1e3:>9.3f} "
            f"{packed_s / plain_s:>6.2f} {reorder_s * 1e3:>10.2f}"
        )
    print(
        f"one step's linears: {total_plain * 1e3:.1f} ms plain, {total_packed * 1e3:.1f} ms "
        f"packed ({total_packed / total_plain:.2f}x)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2:135m-instruct")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    if not packed_linear.available(torch.device("cpu")):
        raise SystemExit("this torch build has no oneDNN linear: nothing to compare")
    segment_attention.register()
    engine = HFRolloutEngine.from_pretrained(
        args.model, dtype="fp32", device="cpu", attn_implementation=segment_attention.SEGMENT_KERNEL
    )
    rows = args.prompts * args.n
    print(
        f"model={args.model} threads={torch.get_num_threads()} rows={rows} "
        f"new_tokens={args.new_tokens}"
    )
    layer_table(engine.module, rows)

    batch = chat_prompt_batch(engine.tokenizer, args.prompts)
    params = SamplingParams(
        n=args.n, max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True, logprobs=True
    )
    times: dict[bool, list[float]] = {True: [], False: []}
    for rep in range(args.reps + 1):
        for packed in (True, False):
            engine.pack_linears = packed
            start = time.perf_counter()
            engine.generate(batch, params)
            if rep:  # the first round is the warm-up
                times[packed].append(time.perf_counter() - start)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(
        f"rollout: packed {on:.2f} s, plain {off:.2f} s (median of {args.reps}): "
        f"{on / off:.2f}x; per decoding step {on / args.new_tokens * 1e3:.0f} vs "
        f"{off / args.new_tokens * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
