"""The numbers of a metrics row, as plain floats, for sinks whose library takes only them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``metrics`` as ``{key: float}``: Python numbers and 0-d tensors or numpy scalars
    (their ``item()``); anything else (a string) is left out, as the console leaves it."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):  # a torch or numpy scalar: its Python number
            value = value.item()
        if isinstance(value, (int, float)):
            out[key] = float(value)
    return out
