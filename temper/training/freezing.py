"""Which parameters ``freeze_vision_tower`` / ``freeze_module_prefix`` freeze, by name —
the same rule for every engine, whatever names its own parameters carry.

ROLL's rule is ``name.startswith(prefix)`` on the Hugging Face model's parameter names
(``model.visual.blocks``). mcore_adapter names the vision tower ``vision_model`` (ROLL's
megatron files: ``vision_model.blocks``): a prefix under it that names no parameter
freezes the same part of the HF tower. A setting that freezes nothing is a
``ConfigError``: it would silently train what the user meant to freeze.
"""

from __future__ import annotations

from collections.abc import Sequence

from temper.config.errors import ConfigError
from temper.config.schema import TrainEngineConfig

#: mcore_adapter's name of a vision-language model's vision tower (Hugging Face: visual)
MCORE_VISION = "vision_model"


def freeze_prefixes(train: TrainEngineConfig, role: str, towers: Sequence[str]) -> list[str]:
    """``freeze_module_prefix``, plus the vision tower's prefixes ``towers`` when
    ``freeze_vision_tower`` (a model without a tower is a ``ConfigError``)."""
    prefixes = list(train.freeze_module_prefix)
    if train.freeze_vision_tower:
        if not towers:
            raise ConfigError(
                f"{role}.freeze_vision_tower",
                "the model has no vision tower (not a vision-language model)",
                "set it to false",
            )
        prefixes += towers
    return prefixes


def frozen(
    prefixes: Sequence[str], names: Sequence[str], towers: Sequence[str], role: str
) -> set[int]:
    """The indices of ``names`` (HF parameter names) that one of ``prefixes`` starts;
    ``towers``: the HF names of the vision tower, which an mcore ``vision_model.*``
    prefix stands for. A prefix that matches no name is a ``ConfigError``."""
    hit: set[int] = set()
    for prefix in prefixes:
        wanted = [prefix]
        if prefix.split(".")[0] == MCORE_VISION and not _starting(names, wanted):
            rest = prefix[len(MCORE_VISION) :]
            wanted = [t + rest for t in towers] or wanted
        found = _starting(names, wanted)
        if not found:
            tops = sorted({".".join(n.split(".")[:2]) for n in names})
            raise ConfigError(
                f"{role}.freeze_module_prefix",
                f"'{prefix}' matches no parameter of the model (names start with: "
                f"{', '.join(tops)})",
                "use a prefix of the model's parameter names, e.g. model.visual",
            )
        hit |= found
    return hit


def _starting(names: Sequence[str], prefixes: Sequence[str]) -> set[int]:
    return {i for i, n in enumerate(names) if n.startswith(tuple(prefixes))}
