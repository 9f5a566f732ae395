"""Seconds of temper's training step on the phases benchmark's batch, for A/B runs.

    python benchmarks/train_step.py [--model smollm2] [--length 128] [--fixed] [--reps 3]
                                    [--label NAME]

One optimizer step of the torch engine (packed micro-batches of 8, a policy-gradient
loss, the entropy metric) on ``benchmarks/phases.py``'s batch: 8 chat prompts × 4
samples, responses of ``length/4 .. length`` random tokens (``--fixed``: all of
``--length``, as ``vs_trl.py --mode fixed`` trains). One warm-up step, then ``--reps``
timed steps; prints their median. Compare two versions of the code by running this
script from each checkout in turn, alternating, on the same machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import phases  # benchmarks/phases.py, beside this script


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="tiny, smollm2, or a model dir")
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--fixed", action="store_true", help="every response --length tokens")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--label", default="step", help="printed before the result")
    args = p.parse_args()
    from transformers import AutoConfig, AutoTokenizer

    path = phases.model_path(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    vocab = int(AutoConfig.from_pretrained(path).vocab_size)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    batch = phases.train_batch(phases.prompt_batch(tok, 8), 4, args.length, vocab, pad)
    if args.fixed:
        batch["response_mask"][:] = 1
    engine = phases.temper_engine(path, packed=True, micro=8)
    phases.temper_step(engine, batch)  # warm-up
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        phases.temper_step(engine, batch)
        times.append(time.perf_counter() - start)
    print(
        f"{args.label}: median {statistics.median(times):.2f} s of {args.reps} "
        f"({', '.join(f'{t:.2f}' for t in times)})",
        flush=True,
    )


if __name__ == "__main__":
    main()
