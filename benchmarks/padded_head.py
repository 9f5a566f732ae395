"""A padded training step with the LM head on the scored positions only, against the
head on every kept position (the path before it).

    python benchmarks/padded_head.py [--model tiny|smollm2] [--length 128] [--reps 3]

The batch is ``benchmarks/phases.py``'s (8 prompts × 4 samples, random responses of
``length/4 .. length`` tokens), trained padded (``use_remove_padding: false``) in
micro-batches of 8. ``scored`` is temper's path: a forward pre-hook gives the LM head the
hidden states of the scored positions only (``torch_logits.head_on_positions``), so the
logits are ``(K, V)``. ``full`` is the same engine with the hook off: the head maps all
``b × (r + 1)`` kept positions and the scored rows are sliced and indexed out of the
``(b, r + 1, V)`` logits afterwards. Both give the same loss (printed).

Reported: the median step time of each (alternating calls, the machine may be shared),
and the median of how far a step raises the process's resident set above where it
started (``benchmarks/rss.py``: the kernel's exact high-water mark, reset before each).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path
from typing import Any

from temper.training import torch_logits


def _sibling(name: str) -> Any:
    """A module of this directory (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


phases = _sibling("phases")  # the same model, batch and engine set-up
rss = _sibling("rss")  # the process's RSS high-water mark


def step_peak(step: Any) -> tuple[float, int]:
    """``step()``'s seconds and how far it raised the process's RSS above where it
    started (bytes): the memory the step needed at its peak, logits and their gradients
    included."""
    rss.reset_peak_rss()
    before = rss.current_rss()
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    return seconds, rss.peak_rss() - before


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="tiny, smollm2, or a dir")
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    path = phases.model_path(args.model)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    batch = phases.train_batch(phases.prompt_batch(tok, 8), 4, args.length, len(tok), pad)
    engine = phases.temper_engine(path, packed=False, micro=8)
    own_head = torch_logits.output_head

    def scored() -> float:
        torch_logits.output_head = own_head  # type: ignore[assignment]
        return phases.temper_step(engine, batch)

    def full() -> float:
        torch_logits.output_head = lambda model: None  # type: ignore[assignment]
        try:
            return phases.temper_step(engine, batch)
        finally:
            torch_logits.output_head = own_head  # type: ignore[assignment]

    # the optimizer steps between calls: compare losses of the same weights first
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    a = scored()
    engine.model.load_state_dict(state)
    b = full()
    print(f"warm-up loss: scored {a:.6f}, full {b:.6f}")
    times: dict[str, list[float]] = {"scored": [], "full": []}
    peaks: dict[str, list[int]] = {"scored": [], "full": []}
    for _ in range(args.reps):
        for name, fn in (("scored", scored), ("full", full)):
            seconds, peak = step_peak(fn)
            times[name].append(seconds)
            peaks[name].append(peak)
    t = {k: statistics.median(v) for k, v in times.items()}
    memory = {k: statistics.median(v) for k, v in peaks.items()}
    scored_tokens = int(batch["response_mask"].sum())
    print(
        f"model {args.model}, {len(batch)} samples × ≤{args.length} response tokens "
        f"({scored_tokens} scored), micro-batches of 8, median of {args.reps}"
    )
    print(f"{'head on':8} {'step s':>8} {'step peak RSS MiB':>18}")
    for name in ("scored", "full"):
        print(f"{name:8} {t[name]:8.2f} {memory[name] / 2**20:18.1f}")
    print(
        f"scored / full: time {t['scored'] / t['full']:.3f}, "
        f"step peak memory {memory['scored'] / memory['full']:.3f}"
    )


if __name__ == "__main__":
    main()
