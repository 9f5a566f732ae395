"""Pipelines by ``pipeline:`` name — the built-in ones, or the user's own by path.

A built-in pipeline is one record (:class:`~temper.pipelines.producer.Pipeline`) in its
own module, registered here lazily so a config loads only the pipeline it names. A
researcher's pipeline needs no registration: ``pipeline:`` names it the way
``reward.custom_function`` names a reward function (slime plugs its rollout functions
the same way) —

- ``my_pkg.my_module:NAME``: a module importable from here (``PYTHONPATH``, or the
  working directory, as ``python -m`` would find it);
- ``path/to/file.py:NAME``: a file (relative to the working directory).

``NAME`` is a :class:`Pipeline` record, or a producer class (any callable taking a
:class:`~temper.pipelines.producer.ProducerContext`), which gets the defaults of every
other hook (no checks of its own; ``train_batch_size × n`` samples per step). A path
that does not resolve fails at ``temper check`` in one line.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import cast

from temper.config.errors import ConfigError, did_you_mean
from temper.pipelines.producer import Producer, ProducerContext
from temper.pipelines.record import Pipeline
from temper.registry import Registry
from temper.utils.user_code import UserCodeError, import_dotted, import_file

PIPELINES: Registry[Pipeline] = Registry("pipeline")


def _builtin(module: str) -> Callable[[], Pipeline]:
    def load() -> Pipeline:
        record: Pipeline = importlib.import_module(module).PIPELINE
        return record

    return load


PIPELINES.add_lazy("rlvr", _builtin("temper.pipelines.rlvr"))
PIPELINES.add_lazy("agentic", _builtin("temper.pipelines.agentic"))
PIPELINES.add_lazy("agentic_rollout", _builtin("temper.pipelines.episodes"))
PIPELINES.add_lazy("sft", _builtin("temper.pipelines.sft"))
PIPELINES.add_lazy("dpo", _builtin("temper.pipelines.dpo"))
PIPELINES.add_lazy("spin", _builtin("temper.pipelines.spin"))
PIPELINES.add_lazy("prime", _builtin("temper.pipelines.prime"))
PIPELINES.add_lazy("generate", _builtin("temper.pipelines.generate"))
PIPELINES.add_lazy("eval", _builtin("temper.pipelines.evaluate"))
PIPELINES.add_lazy("rlvr_rollout", _builtin("temper.pipelines.rlvr_rollout"))
PIPELINES.add_lazy("reward_model", _builtin("temper.pipelines.reward_model"))
PIPELINES.add_lazy("distill", _builtin("temper.pipelines.distill"))

#: What a producer class must define (the ``Producer`` protocol's methods).
PRODUCER_METHODS = ("produce", "validate", "dump_rows", "state_dict", "load_state_dict", "close")

_FORM = (
    "name a registered pipeline ({names}), a module object (my_pkg.my_module:MyPipeline, "
    "importable here) or a file (path/to/pipeline.py:MyPipeline)"
)


def is_path(name: str) -> bool:
    """Whether ``pipeline: name`` is a path to the user's code, not a registered name."""
    return ":" in name


def resolve_pipeline(name: str) -> Pipeline:
    """The pipeline ``name`` denotes; ``ConfigError`` on the ``pipeline`` key otherwise."""
    fix = _FORM.format(names=", ".join(PIPELINES.names()))
    if not is_path(name):
        if name not in PIPELINES:
            raise ConfigError(
                "pipeline", f"unknown pipeline '{name}'{did_you_mean(name, PIPELINES.names())}", fix
            )
        return PIPELINES.get(name)
    where, _, attr = name.rpartition(":")
    if not where or not attr.isidentifier():
        raise ConfigError("pipeline", f"'{name}' is not of the form module:NAME", fix)
    try:
        module = import_file(where) if where.endswith(".py") else import_dotted(where)
    except UserCodeError as err:
        raise ConfigError("pipeline", err.reason, err.fix or fix) from err
    if not hasattr(module, attr):
        public = [a for a in vars(module) if not a.startswith("_")]
        raise ConfigError(
            "pipeline", f"{where} defines no '{attr}'{did_you_mean(attr, public)}", fix
        )
    return _as_pipeline(getattr(module, attr), name)


def _as_pipeline(obj: object, name: str) -> Pipeline:
    """A :class:`Pipeline` record as is; a producer class as a record with defaults."""
    if isinstance(obj, Pipeline):
        return obj
    if inspect.isclass(obj):
        missing = [m for m in PRODUCER_METHODS if not callable(getattr(obj, m, None))]
        if missing:
            raise ConfigError(
                "pipeline",
                f"{name} is a class without the producer methods {', '.join(missing)} "
                "(the Producer protocol of temper.pipelines.producer)",
                "define them, or point at a Pipeline record",
            )
        return Pipeline(build=cast(Callable[[ProducerContext], Producer], obj))
    raise ConfigError(
        "pipeline",
        f"{name} is a {type(obj).__name__}, neither a Pipeline record nor a producer class",
        "point it at a temper.pipelines.Pipeline(...) or a class implementing Producer",
    )
