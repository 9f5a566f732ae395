"""Rules of the house that keep a new pipeline, engine or estimator one registration in
one file (DESIGN.md): no branch on a pipeline's name outside its own module, and no
schema ``Literal`` repeating a registry's names (the registry is the only list)."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import temper
from temper.config.schema import TemperConfig
from temper.pipelines.catalog import CATALOG, NAMES
from temper.pipelines.registry import PIPELINES

PACKAGE = Path(temper.__file__).parent
BRANCH = re.compile(r"\.pipeline\s*(==|!=|\bin\b)")


def test_no_branch_on_the_pipeline_name_outside_its_module():
    own = {PACKAGE / "pipelines" / f"{name}.py" for name in PIPELINES.primary_names()}
    found = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in own
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if BRANCH.search(line)
    ]
    assert not found, "\n".join(found)


def _literals(cls: type, prefix: str = "") -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        for arg in (tp, *typing.get_args(tp)):
            if typing.get_origin(arg) is typing.Literal:
                out[f"{prefix}{f.name}"] = {str(a) for a in typing.get_args(arg)}
            if isinstance(arg, type) and dataclasses.is_dataclass(arg):
                out.update(_literals(arg, f"{prefix}{f.name}."))
    return out


def test_no_schema_literal_repeats_a_registrys_names():
    literals = _literals(TemperConfig)
    repeats = [
        f"{key}: Literal {sorted(values)} lists the {registry} registry"
        for key, values in literals.items()
        for registry in NAMES
        if set(CATALOG.names(registry)) <= values
    ]
    assert not repeats, "\n".join(repeats)
