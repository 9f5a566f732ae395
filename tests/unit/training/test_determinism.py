"""experiment.deterministic: deterministic kernels for the run, and the process's own
settings back when it ends (the mode is process-wide)."""

from __future__ import annotations

import os

import torch

from temper.utils.determinism import CUBLAS_WORKSPACE, use_deterministic_kernels


def test_on_sets_the_modes_and_restore_puts_the_process_back(monkeypatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert not torch.are_deterministic_algorithms_enabled()
    before = use_deterministic_kernels(True)
    try:
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    finally:
        before.restore()
    assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.backends.cudnn.deterministic
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_off_changes_nothing_and_a_users_workspace_setting_is_kept(monkeypatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    use_deterministic_kernels(False).restore()
    assert not torch.are_deterministic_algorithms_enabled()
    before = use_deterministic_kernels(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # the user's choice stands
    before.restore()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
