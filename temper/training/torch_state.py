"""The resumable state of a one-process engine: its trainable parameters (adapters only,
under LoRA), the optimizer and the LR schedule."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from temper.training.schedule import LRSchedule


def trainable_state(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, schedule: LRSchedule | None
) -> dict[str, Any]:
    """``{"model": trainable parameters, "optimizer", "scheduler"}`` (the last two only
    when the engine trains).

    Tensors are the live ones (like ``nn.Module.state_dict``): serialize or copy them
    before training on.
    """
    state: dict[str, Any] = {
        "model": {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    }
    if optimizer is not None and schedule is not None:
        state["optimizer"] = optimizer.state_dict()
        state["scheduler"] = schedule.state_dict()
    return state


def load_trainable_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    schedule: LRSchedule | None,
    state: dict[str, Any],
    role: str,
) -> None:
    """Restore :func:`trainable_state`'s output in place; a parameter set that does not
    match the model (another LoRA/model setting) raises before anything is copied."""
    params = dict(model.named_parameters())
    saved = state["model"]
    missing = [n for n, p in params.items() if p.requires_grad and n not in saved]
    unknown = [n for n in saved if n not in params]
    if missing or unknown:
        raise ValueError(
            f"{role} checkpoint does not match the model: missing {missing[:5]}, "
            f"unexpected {unknown[:5]} (was it saved with another LoRA/model setting?)"
        )
    with torch.no_grad():
        for name, tensor in saved.items():
            params[name].copy_(tensor)
    if optimizer is not None and "optimizer" in state:
        optimizer.load_state_dict(state["optimizer"])
    if schedule is not None and "scheduler" in state:
        schedule.load_state_dict(state["scheduler"])
