"""Linear layers on oneDNN's packed weight layout for the length of a CPU rollout.

A decoding step multiplies a few dozen rows by every weight of the model once. On CPU
``F.linear`` runs that as a GEMM over the weight in its plain (row-major) layout, which
for so few rows leaves much of the core's throughput unused; oneDNN's linear over a
weight it has first reordered into its own blocked layout runs the same product in
less time (``benchmarks/hf_packed_linear.py``), and most of all for the vocabulary-wide
LM head. The reorder costs about as much as a few decoding steps, so it pays off for
generations of more than a handful of tokens; it is done once per ``generate`` call
(a colocated engine's weights are the trainer's and change every step).

While :func:`packed_linears` is open, each eligible ``nn.Linear`` of the model computes
``y = x Wᵀ + b`` with oneDNN's ``_linear_pointwise`` on a packed copy of ``W``; its hooks
still run (only the instance's ``forward`` is swapped). The packed copies take as much
memory as the linear weights themselves, and are freed when the context closes.
Results equal ``F.linear``'s up to float32 summation order.

Eligible: a plain ``torch.nn.Linear`` (not a subclass: quantized or adapter layers keep
their own forward) whose weight is an ordinary float32 CPU tensor holding all of its
``out × in`` entries (not a sharded ``DTensor`` or a ZeRO-3 placeholder).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

#: below this many new tokens the reorder (about three decoding steps' time) is not
#: earned back
MIN_NEW_TOKENS = 8


def available(device: torch.device) -> bool:
    """Whether this torch build can pack linear weights on ``device`` (CPU + oneDNN)."""
    return (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def eligible(module: nn.Module) -> bool:
    """A plain float32 CPU ``nn.Linear`` with its whole weight here (module doc)."""
    if type(module) is not nn.Linear:
        return False
    weight = module.weight
    return (
        type(weight.data) is torch.Tensor
        and weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and weight.numel() == module.in_features * module.out_features
        and not weight.is_mkldnn
    )


def _packed_forward(
    packed: torch.Tensor, bias: torch.Tensor | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    return forward


@contextlib.contextmanager
def packed_linears(model: nn.Module, rows: int) -> Iterator[int]:
    """Run ``model``'s eligible linears on packed weights inside the block.

    ``rows``: the batch rows of a decoding step (oneDNN's hint for the layout). Yields
    the number of layers packed; every swapped ``forward`` is removed on exit, also on
    an exception.
    """
    swapped: list[nn.Module] = []
    try:
        with torch.no_grad():
            for module in model.modules():
                if not eligible(module) or "forward" in module.__dict__:
                    continue
                assert isinstance(module, nn.Linear)
                packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), rows)
                bias = None if module.bias is None else module.bias.detach()
                module.forward = _packed_forward(packed, bias)  # type: ignore[method-assign,assignment]
                swapped.append(module)
        yield len(swapped)
    finally:
        for module in swapped:
            del module.forward
