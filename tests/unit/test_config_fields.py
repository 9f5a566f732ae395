"""Every native config field has a reader or a refusal ("no key is read by nothing").

The test enumerates every leaf field of ``temper.config.schema.TemperConfig`` and asks,
for each, one of:

* **read**: some module of the package reads the attribute — an attribute load of the
  field's name (or its name as a string: ``getattr`` tables) in a module that also names
  the field's section (its class, a base class, or an attribute the section is reached
  by). The config layer's own schema/typing/loading, the dialects (which *write* native
  keys) and ``checkpoint/compat.py`` (a table of key names) do not count. This is a static
  reachability check: it finds a key nothing mentions, not a reader that ignores it;
* **refused**: ``REFUSED`` gives a non-default value that ``temper check`` rejects (config
  validation plus the pipeline checks) with an error naming the key — checked for real;
* **pending**: ``PENDING`` names keys of training engines other issues are building
  (none now). The test checks they are still unread and their engine still
  unregistered, so an entry goes stale — and fails — the day its reader lands.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

import temper
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.pipelines.catalog import build_config
from temper.training.registry import ENGINES

PACKAGE = Path(temper.__file__).parent
NOT_READERS = ("config/schema.py", "config/typed.py", "config/loader.py", "config/errors.py")
NOT_READER_DIRS = ("config/dialects/", "cli/")
NOT_READERS_TOO = ("checkpoint/compat.py",)  # key names for resume comparison, not readers
# attributes a section is reached by besides its field name (EngineSpec.train, …)
ALIASES = {"TrainEngineConfig": {"train"}, "AgenticConfig": {"agentic"}}

#: path -> a non-default value that validation or the pipeline checks refuse
REFUSED: dict[str, Any] = {
    "reward.launch_async": True,
    "actor.checkpoint_contents": ["model"],
    "critic.checkpoint_contents": ["model", "optimizer"],
    "prime.prm.shuffle": True,  # checked under pipeline: prime
    "prime.prm.checkpoint_contents": ["model"],
}

#: path -> (strategy whose engine will read it, the issue building it)
PENDING: dict[str, tuple[str, str]] = {}


def leaf_fields(
    cls: type, prefix: str = "", access: str | None = None
) -> list[tuple[str, type, str | None]]:
    """``(dotted path, owning dataclass, attribute that reaches it)`` of every leaf."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += leaf_fields(hints[f.name], f"{prefix}{f.name}.", f.name)
        else:
            out.append((f"{prefix}{f.name}", cls, access))
    return out


FIELDS = leaf_fields(TemperConfig)


WHOLE_SECTIONS: set[str] = set()  # sections handed on whole: ``asdict(cfg.<section>)``


def _module_names() -> list[tuple[set[str], set[str]]]:
    """Per reading module: the names it reads (attributes, strings) and all names in it.
    A section passed whole to ``dataclasses.asdict`` (e.g. the sandbox limits, which
    become the sandbox's own ``Limits``) has every field read; it goes in
    ``WHOLE_SECTIONS``."""
    mods = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in NOT_READERS + NOT_READERS_TOO or rel.startswith(NOT_READER_DIRS):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        reads, names = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
                if isinstance(node.ctx, ast.Load):
                    reads.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                reads.add(node.value)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.ImportFrom):
                names.update(a.asname or a.name for a in node.names)
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Attribute):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called == "asdict":
                    WHOLE_SECTIONS.add(node.args[0].attr)
        mods.append((reads, names))
    return mods


MODULES = _module_names()


def section_names(cls: type) -> set[str]:
    """Names that show a module deals with section ``cls``: its class and base classes,
    every attribute the schema reaches it by, and their ``ALIASES``."""
    names = {c.__name__ for c in cls.__mro__ if dataclasses.is_dataclass(c)}
    names |= {a for _, owner, a in FIELDS if owner is cls and a}
    for c in cls.__mro__:
        names |= ALIASES.get(c.__name__, set())
    return names


def has_reader(path: str, owner: type) -> bool:
    leaf = path.rsplit(".", 1)[-1]
    if any(owner is cls and access in WHOLE_SECTIONS for _, cls, access in FIELDS):
        return True
    if owner is TemperConfig:
        return any(leaf in reads for reads, _ in MODULES)
    wanted = section_names(owner)
    return any(leaf in reads and wanted & names for reads, names in MODULES)


def _nested(path: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    node = out
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return out


BASE = {"model": {"path": "some/model"}, "data": {"train_files": ["train.parquet"]}}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.parametrize(("path", "owner"), [f[:2] for f in FIELDS], ids=[f[0] for f in FIELDS])
def test_every_field_is_read_refused_or_pending(path, owner):
    if path in PENDING:
        strategy, issue = PENDING[path]
        assert not has_reader(path, owner), f"{path} is read now ({issue}): drop it from PENDING"
        assert strategy not in ENGINES, f"{strategy} is registered ({issue}): {path} needs a reader"
        return
    if path in REFUSED:
        section = path.split(".")[0]  # a pipeline's own section: under that pipeline
        base = {**BASE, "pipeline": section} if section in ("prime",) else BASE
        with pytest.raises(ConfigError) as err:
            build_config(_merge(base, _nested(path, REFUSED[path])))
        assert path in str(err.value)
        return
    assert has_reader(path, owner), (
        f"{path}: no module reads it — honour it, or refuse non-default values at check "
        "and list it in REFUSED"
    )


def test_the_field_list_is_the_schema():
    assert len(FIELDS) > 300 and len({p for p, _, _ in FIELDS}) == len(FIELDS)
    assert set(REFUSED) | set(PENDING) <= {p for p, _, _ in FIELDS}
    defaults = TemperConfig()
    for path, value in REFUSED.items():
        node: Any = defaults
        for part in path.split("."):
            node = getattr(node, part)
        assert node != value, f"REFUSED[{path}] is the default"
