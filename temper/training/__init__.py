"""Training engines: a model, its optimizer and micro-batching behind one interface.

``build_engine(strategy, EngineSpec(...))`` gives the engine a role's config names
(``torch`` in this build); see :mod:`temper.training.base` for the interface.
"""

from __future__ import annotations

from temper.training.base import LossFn, NonFiniteError, TrainEngine
from temper.training.micro_batching import MicroBatching
from temper.training.registry import ENGINES, build_engine, register_engine
from temper.training.schedule import LRSchedule, lr_multiplier
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

__all__ = [
    "ENGINES",
    "EngineSpec",
    "LRSchedule",
    "LossFn",
    "MicroBatching",
    "NonFiniteError",
    "TorchEngine",
    "TrainEngine",
    "build_engine",
    "lr_multiplier",
    "register_engine",
]
