"""Two fixed costs of every training step, each against the way it was done before.

* **AdamW**: torch's per-tensor loop (``torch.optim.AdamW`` default on CPU) vs its fused
  kernel (``fused=True``, what the torch engine builds), on tensors of SmolLM2-135M's
  shapes (30 layers, hidden 576, MLP 1536, vocabulary 49152; 135M parameters).
* **Tied embedding backward**: a dense input-embedding gradient (vocab x hidden, zeroed and
  scattered into, then added to the LM head's) vs a sparse one (``nn.Embedding.sparse``,
  the touched rows added into the LM head's dense gradient), for one micro-batch of
  ``--tokens`` input tokens and ``--scored`` LM-head positions.

Each is the best of ``--repeats`` after a warm-up, the two variants alternating, printed
as seconds and as a ratio in the same run (the machine may be shared)::

    python benchmarks/optimizer_step.py [--threads 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

VOCAB, HIDDEN, MLP, LAYERS = 49152, 576, 1536, 30


def smollm2_shaped_parameters() -> list[torch.nn.Parameter]:
    """Tensors of SmolLM2-135M's shapes (tied embedding once), each with a gradient."""
    shapes: list[tuple[int, ...]] = [(VOCAB, HIDDEN)]
    for _ in range(LAYERS):
        shapes += [(HIDDEN, HIDDEN), (192, HIDDEN), (192, HIDDEN), (HIDDEN, HIDDEN)]  # q k v o
        shapes += [(MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP), (HIDDEN,), (HIDDEN,)]
    shapes.append((HIDDEN,))
    params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


def best_of(fns: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Best seconds of each function, alternating, after one warm-up call each."""
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def bench_adamw(repeats: int) -> dict[str, float]:
    params = smollm2_shaped_parameters()
    loop = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0, foreach=False)
    fused = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0, fused=True)
    print(f"AdamW over {sum(p.numel() for p in params) / 1e6:.1f}M parameters")
    return best_of({"per-tensor loop": loop.step, "fused": fused.step}, repeats)


def bench_embedding(tokens: int, scored: int, repeats: int) -> dict[str, float]:
    weight = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN) * 0.02)
    ids = torch.randint(0, VOCAB, (1, tokens))
    hidden = torch.randn(scored, HIDDEN)

    def step(sparse: bool) -> None:
        weight.grad = None
        inputs = torch.nn.functional.embedding(ids, weight, sparse=sparse)
        logits = hidden @ weight.t()  # the tied LM head
        (inputs.sum() + logits.logsumexp(-1).sum()).backward()

    dense_grad = sparse_grad = None
    for sparse in (False, True):
        torch.manual_seed(0)
        step(sparse)
        assert weight.grad is not None and not weight.grad.is_sparse
        if sparse:
            sparse_grad = weight.grad.clone()
        else:
            dense_grad = weight.grad.clone()
    assert dense_grad is not None and sparse_grad is not None
    print(
        f"tied embedding backward, {tokens} input tokens, {scored} scored positions; "
        f"max |dense - sparse| gradient difference {float((dense_grad - sparse_grad).abs().max()):.1e}"
    )
    return best_of({"dense": lambda: step(False), "sparse": lambda: step(True)}, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=200, help="packed row length")
    parser.add_argument("--scored", type=int, default=128, help="LM-head positions")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for title, result, base in (
        ("AdamW step", bench_adamw(args.repeats), "per-tensor loop"),
        ("embedding backward", bench_embedding(args.tokens, args.scored, args.repeats), "dense"),
    ):
        for name, seconds in result.items():
            print(f"  {title:<20} {name:<16} {seconds:7.3f} s  {seconds / result[base]:.2f}x")


if __name__ == "__main__":
    main()
