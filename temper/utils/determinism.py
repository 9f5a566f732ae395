"""Deterministic kernels for a run (``experiment.deterministic``).

Seeding fixes every random draw, but some CUDA kernels still add in an order that varies
from run to run (atomic adds: the embedding's backward, ``index_add``, scatter), so two
runs of the same seed on a GPU can end a few ulps apart, and a resumed run is then not
bit-identical to the uninterrupted one. PyTorch's deterministic mode picks an
order-stable kernel for each such operation, or raises naming the one that has none;
cuBLAS needs a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``) before its first call.
CPU kernels are order-stable already; the mode costs speed on GPU only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

#: cuBLAS's setting for reproducible results (its documentation's larger workspace)
CUBLAS_WORKSPACE = ":4096:8"


@dataclass(frozen=True)
class KernelMode:
    """The process's kernel settings before :func:`use_deterministic_kernels`."""

    deterministic: bool
    warn_only: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    cublas_workspace: str | None

    def restore(self) -> None:
        torch.use_deterministic_algorithms(self.deterministic, warn_only=self.warn_only)
        torch.backends.cudnn.deterministic = self.cudnn_deterministic
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        if self.cublas_workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = self.cublas_workspace


def use_deterministic_kernels(on: bool) -> KernelMode:
    """Turn deterministic kernels on (``on``; off leaves the process as it is) and return
    the settings to restore when the run ends (the mode is process-wide)."""
    before = KernelMode(
        deterministic=torch.are_deterministic_algorithms_enabled(),
        warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        cublas_workspace=os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    )
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return before
