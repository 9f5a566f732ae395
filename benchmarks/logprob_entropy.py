"""The vocabulary-sized pass of a training step: log-probs + entropy, forward and backward.

``split`` is the path the torch engine took before the fused function: chunked
``logprobs_from_logits`` with autograd, then the entropy metric from the detached logits
(``entropy_from_logits`` under ``no_grad``, chunked). ``fused`` is ``logprobs_and_entropy``
(one pass, the entropy detached), with ``--chunk`` rows per chunk (0: the engine's
default, ``fused_chunk_rows``; the split path then chunks its entropy by 2048 rows). Both
take the same ``(tokens, V)`` logits, made by a linear LM head from hidden states so the
backward runs as in a step, and backpropagate ``Σ log p``.

Reported: the median forward+backward time of each over ``--steps`` repeats after one
warm-up (the two alternate), as a ratio fused/split from the same run (``--no-head``: the
vocabulary pass alone, without the LM head's matmuls), and on CUDA the peak memory above the
inputs (``max_memory_allocated``), on CPU the peak resident set above the RSS at the start
of the pass (the kernel's high-water mark, reset before each pass; ``benchmarks/rss.py``).

    python benchmarks/logprob_entropy.py                       # 4096 tokens × 49152 (SmolLM2)
    python benchmarks/logprob_entropy.py --device cuda --dtype bf16 --tokens 16384 --vocab 151936
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from rss import current_rss, peak_rss, reset_peak_rss  # benchmarks/rss.py, beside this script

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def split(logits: torch.Tensor, labels: torch.Tensor, chunk: int) -> torch.Tensor:
    from temper.algorithms.logprobs import DEFAULT_CHUNK, entropy_from_logits
    from temper.algorithms.logprobs import logprobs_from_logits as logprobs

    log_p = logprobs(logits, labels)
    with torch.no_grad():
        entropy_from_logits(logits.detach(), chunk_size=chunk or DEFAULT_CHUNK)
    return log_p


def fused(logits: torch.Tensor, labels: torch.Tensor, chunk: int) -> torch.Tensor:
    from temper.algorithms.logprobs import fused_chunk_rows, logprobs_and_entropy

    rows = chunk or fused_chunk_rows(logits.shape[-1], logits.device)
    log_p, entropy = logprobs_and_entropy(logits, labels, chunk_size=rows)
    entropy.detach()
    return log_p


def once(
    fn: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    hidden: torch.Tensor,
    head: torch.Tensor | None,
    labels: torch.Tensor,
    chunk: int,
) -> tuple[float, float]:
    """(seconds, peak bytes above the inputs) of one forward + backward."""
    cuda = hidden.device.type == "cuda"
    h = hidden.detach().requires_grad_()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        reset_peak_rss()
        base = current_rss()
    t0 = time.perf_counter()
    fn(h if head is None else h @ head, labels, chunk).sum().backward()
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return seconds, (torch.cuda.max_memory_allocated() if cuda else peak_rss()) - base


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--chunk", type=int, nargs="*", default=[0, 2048])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--no-head", action="store_true", help="time the vocabulary pass alone")
    args = p.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, generator=g).to(args.device, dtype)
    weight = (torch.randn(args.hidden, args.vocab, generator=g) / args.hidden**0.5).to(
        args.device, dtype
    )
    head: torch.Tensor | None = weight
    labels = torch.randint(0, args.vocab, (args.tokens,), generator=g).to(args.device)
    if args.no_head:  # the logits themselves are the leaf
        hidden, head = (hidden @ weight).detach(), None
    from temper.algorithms.logprobs import fused_chunk_rows

    default = fused_chunk_rows(args.vocab, torch.device(args.device))
    print(f"{args.tokens} tokens × {args.vocab} vocab, {args.dtype} on {args.device}")
    for chunk in args.chunk:
        runs: dict[str, list[tuple[float, float]]] = {"split": [], "fused": []}
        for i in range(args.steps + 1):  # alternate, so load on the machine hits both alike
            for name, fn in (("split", split), ("fused", fused)):
                result = once(fn, hidden, head, labels, chunk)
                if i:  # the first of each is the warm-up
                    runs[name].append(result)
        base, new = (statistics.median(t for t, _ in runs[k]) for k in ("split", "fused"))
        base_mem, new_mem = (max(m for _, m in runs[k]) for k in ("split", "fused"))
        what = "peak" if args.device.startswith("cuda") else "peak RSS"
        mem = f"; {what} {new_mem / 2**30:.2f} vs {base_mem / 2**30:.2f} GiB"
        mem += f" ({new_mem / base_mem:.2f}×)"
        print(
            f"chunk {chunk or f'default ({default} rows)'}: fused {new * 1e3:.0f} ms, split {base * 1e3:.0f} ms "
            f"({new / base:.2f}×){mem}",
            flush=True,
        )


if __name__ == "__main__":
    main()
