"""One decoding step's draw: ``torch.multinomial`` against temper's inverse-CDF sampler.

    python benchmarks/hf_sampling.py [--rows 32] [--vocab 49152] [--reps 30] [--device cpu]

Both draw one token per row from ``softmax(scores)`` of a (rows × vocab) fp32 tensor, as
the HF rollout engine does after its warpers each step: ``multinomial`` the way
``transformers.generate`` samples (softmax, then one exponential variate per entry), the
engine's :func:`temper.rollout.sampling.inverse_cdf_sample` (softmax, a float64 cumulative
sum, one uniform per row, a search) plus leaving only the drawn token finite for
``generate``'s greedy ``argmax``, as its last processor does. Median of ``--reps`` calls
each, the two alternating; the ratio is inverse-CDF / multinomial.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from temper.rollout.sampling import inverse_cdf_sample


def _timed(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=32, help="rows per step (prompts × n)")
    p.add_argument("--vocab", type=int, default=49152, help="SmolLM2's; Qwen2.5: 151936")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    scores = torch.randn(args.rows, args.vocab, device=device) * 3

    def multinomial() -> object:
        probs = torch.softmax(scores, dim=-1)
        return torch.multinomial(probs, num_samples=1).squeeze(1)

    def inverse_cdf() -> object:
        out = scores.clone()  # the engine overwrites the step's own scores in place
        drawn = inverse_cdf_sample(out)
        return out.fill_(float("-inf")).scatter_(1, drawn, 0.0).argmax(dim=-1)

    for fn in (multinomial, inverse_cdf):  # warm-up
        fn()
    times: dict[str, list[float]] = {"multinomial": [], "inverse_cdf": []}
    for _ in range(args.reps):
        times["multinomial"].append(_timed(multinomial, sync))
        times["inverse_cdf"].append(_timed(inverse_cdf, sync))
    m = statistics.median(times["multinomial"])
    i = statistics.median(times["inverse_cdf"])
    print(
        f"{args.rows} rows × {args.vocab} vocab, {args.device}, {torch.get_num_threads()} threads, "
        f"median of {args.reps}"
    )
    print(f"multinomial   {m * 1e3:8.2f} ms")
    print(f"inverse CDF   {i * 1e3:8.2f} ms   ({i / m:.2f}× multinomial's time)")


if __name__ == "__main__":
    main()
