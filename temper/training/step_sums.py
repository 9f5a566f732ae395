"""A mini-batch's loss and metric sums, kept on the device until the mini-batch ends.

``float(tensor)`` of a GPU tensor waits for every kernel queued before it; summing each
micro-batch's loss and metrics that way stops the host at every micro-batch's backward,
so the GPU then idles while the host prepares the next one. :class:`StepSums` adds them
as float64 tensors where they are (the same sums, in the same order, as Python's floats
of them) and reads them back once, one copy per device.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: The key of the loss's sum beside the metrics' (an engine's, a pipeline's last stage's)
LOSS_SUM = "__loss_sum__"


class StepSums:
    """Named partial sums of scalars (Python numbers or one-element tensors)."""

    def __init__(self) -> None:
        self._sums: dict[str, float | torch.Tensor] = {}

    def add(self, values: Mapping[str, float | torch.Tensor]) -> None:
        for k, v in values.items():
            x = v.detach().reshape(()).double() if isinstance(v, torch.Tensor) else float(v)
            self._sums[k] = self._sums[k] + x if k in self._sums else x

    def floats(self) -> dict[str, float]:
        """The sums as Python floats, in the order first added: one device→host copy for
        all the sums held on each device."""
        out: dict[str, float] = {}
        by_device: dict[torch.device, list[str]] = {}
        for k, v in self._sums.items():
            if isinstance(v, torch.Tensor):
                by_device.setdefault(v.device, []).append(k)
            else:
                out[k] = v
        for keys in by_device.values():
            values = torch.stack([self._sums[k] for k in keys]).tolist()  # type: ignore[misc]
            out.update(zip(keys, values))
        return {k: out[k] for k in self._sums}


__all__ = ["LOSS_SUM", "StepSums"]
