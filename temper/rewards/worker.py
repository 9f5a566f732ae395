"""What a reward worker process runs: resolve a ``FunctionSpec`` and call it.

Kept free of torch and of the config loader so a (re)spawned worker is ready in a
fraction of a second. ``FunctionSpec`` is the picklable description of a reward
function that crosses the process boundary (a built-in name, or a file path + name).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import signal
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from temper.rewards.custom import load_custom_function
from temper.rewards.registry import get_reward_function

MAX_REASON_CHARS = 500


@dataclasses.dataclass(frozen=True)
class FunctionSpec:
    """A reward function by name: built-in ``name``, or ``name`` inside the file ``path``.

    ``batched``: verl batch signature ``fn(data_sources, solution_strs, ground_truths,
    extra_infos, **kwargs) -> list``. ``kwargs`` are passed to every call.
    """

    name: str
    path: str | None = None
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    batched: bool = False

    @property
    def label(self) -> str:
        """Short name for metrics and failure records."""
        return f"custom:{self.name}" if self.path else self.name

    def __hash__(self) -> int:
        return hash((self.name, self.path, self.batched, repr(sorted(self.kwargs.items()))))


def resolve(spec: FunctionSpec) -> Any:
    """The callable a spec names (custom files are imported once per process)."""
    if spec.path:
        return load_custom_function(spec.path, spec.name)
    return get_reward_function(spec.name)


def call(spec: FunctionSpec, arguments: Mapping[str, Any]) -> Any:
    """``fn(**arguments, **spec.kwargs)``."""
    return resolve(spec)(**arguments, **spec.kwargs)


def describe_error(err: BaseException) -> str:
    """``"Type: message"`` (truncated) — the failure reason recorded for a sample."""
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def worker_main(conn: Any, preload: Sequence[str]) -> None:
    """Loop: receive ``(spec, arguments)``, send ``("ok", value)`` or ``("error", reason)``.

    Sends ``("ready", None)`` after start-up so start-up time never counts against a
    sample's timeout. ``None`` asks the worker to exit. Ctrl-C is left to the parent.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in preload:  # a missing optional module only slows the first call
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        spec, arguments = task
        try:
            reply: tuple[str, Any] = ("ok", call(spec, arguments))
        except Exception as err:
            reply = ("error", describe_error(err))
            traceback.clear_frames(err.__traceback__)
        try:
            conn.send(reply)
        except Exception as err:  # e.g. an unpicklable return value
            conn.send(("error", f"reward result could not be sent back: {describe_error(err)}"))
