"""One rule application for every dialect (``core.apply``): the same table, walked with
verl's context and with ROLL's, notes and refuses in the same words — the key, the
reason, the value given, the fix — and differs only where a dialect's convention does
(verl's ``???`` marker, verl's typed writes)."""

from __future__ import annotations

from typing import Any

import pytest

from temper.config.dialects.core.apply import shown, unsupported
from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Gated, Map, Note, Refuse, Rule, Same, Use, meaning
from temper.config.dialects.core.walk import KeyTable
from temper.config.dialects.roll.context import Ctx
from temper.config.dialects.verl.translate import _Translator
from temper.config.errors import ConfigError
from temper.pipelines.catalog import CATALOG

TABLE: dict[str, Rule] = {
    "trainer.seed": Map("experiment.seed"),
    "trainer.speed": Note("speed only"),
    "trainer.hdfs": Refuse("HDFS is not supported", "remove it", ok=(None,), why="local"),
    "trainer.profile": Gated("enable", (False, None), "profiling is off", "no profiler", "off"),
    "trainer.copy": Same("trainer.seed", "temper keeps one seed"),
}


def _contexts(data: dict[str, Any]) -> list[Any]:
    return [_Translator(data, CATALOG), Ctx(data)]


def _walk(ctx: Any, data: dict[str, Any]) -> Any:
    ctx.data = data
    KeyTable(TABLE).walk_section(ctx, data, ())
    return ctx


@pytest.mark.parametrize("dialect", ["verl", "roll"])
def test_a_refusal_names_key_reason_value_and_fix(dialect: str) -> None:
    data = {"trainer": {"hdfs": "hdfs://x/y"}}
    ctx = _contexts(data)[dialect == "roll"]
    with pytest.raises(ConfigError) as err:
        _walk(ctx, data)
    assert str(err.value) == (
        "trainer.hdfs: HDFS is not supported (got 'hdfs://x/y'). Fix: remove it"
    )


@pytest.mark.parametrize("dialect", ["verl", "roll"])
def test_a_gate_switched_on_is_refused_at_the_gate(dialect: str) -> None:
    data = {"trainer": {"profile": {"enable": True, "steps": [1]}}}
    ctx = _contexts(data)[dialect == "roll"]
    with pytest.raises(ConfigError) as err:
        _walk(ctx, data)
    assert str(err.value) == "trainer.profile.enable: no profiler (got True). Fix: off"


def test_both_dialects_note_and_write_alike() -> None:
    data = {
        "trainer": {
            "seed": 3,
            "speed": {"a": 1, "b": 2},
            "hdfs": None,
            "profile": {"enable": False, "steps": [1]},
            "copy": 3,
        }
    }
    verl_ctx, roll_ctx = (_walk(c, data) for c in _contexts(data))
    assert verl_ctx.out.native() == roll_ctx.out.native() == {"experiment": {"seed": 3}}
    assert (
        verl_ctx.out.notes()
        == roll_ctx.out.notes()
        == [
            "trainer.speed.a, trainer.speed.b: no effect here (speed only)",
            "trainer.hdfs: accepted at its inert value (local)",
            "trainer.profile.enable, trainer.profile.steps: accepted at its inert value "
            "(profiling is off)",
            "trainer.copy: no effect here (same as trainer.seed; temper keeps one seed)",
        ]
    )


def test_same_refuses_a_different_value() -> None:
    data = {"trainer": {"seed": 3, "copy": 4}}
    with pytest.raises(ConfigError) as err:
        _walk(Ctx(data), data)
    assert str(err.value) == (
        "trainer.copy: 4 differs from trainer.seed (3); temper keeps one seed. "
        "Fix: set trainer.copy to 3 or remove it"
    )


def test_verl_conventions_stay_verl_s() -> None:
    """verl's ``???`` marker leaves the temper default (noted); ROLL has no marker, and a
    value of verl's typed write is converted to the native field's type."""
    data = {"trainer": {"seed": "???", "hdfs": "???"}}
    ctx = _walk(_contexts(data)[0], data)
    assert ctx.out.native() == {}
    assert ctx.out.notes()[0] == (
        "trainer.seed: '???' (verl's mandatory-value marker, unset): the temper default applies"
    )
    with pytest.raises(ConfigError, match=r"\(got '\?\?\?'\)"):
        _walk(Ctx(data), data)


def test_shown_values() -> None:
    assert shown({"a": 1, "b": {"c": 2}}) == "a section with a, b"
    assert shown(list(range(100))).endswith("...") and len(shown(list(range(100)))) == 80
    path = "/" + "d/" * 60 + "f.py"
    assert shown(path) == repr(path)  # a path in full: the user looks for it


def test_one_meaning_for_every_rule() -> None:
    assert meaning(TABLE["trainer.hdfs"]) == (
        (),
        "accepted at its inert value(s) (local); otherwise refused: HDFS is not supported. "
        "Fix: remove it",
    )
    assert meaning(TABLE["trainer.seed"]) == (("experiment.seed",), "sets experiment.seed")


@derivation("trainer.mode", "trainer.backend")
def _backend(ctx: Any) -> None:
    """Reads trainer.backend in the 'split' mode only."""
    if ctx.get("trainer.mode") == "split":
        ctx.write("rollout.engine", ctx.get("trainer.backend"), "trainer.backend")


USE = {
    "trainer.mode": Use("the mode", _backend),
    "trainer.backend": Use("rollout.engine in split mode", _backend, idle="read in split mode"),
}


@pytest.mark.parametrize("dialect", ["verl", "roll"])
@pytest.mark.parametrize("mode", ["split", "joint"])
def test_a_use_row_its_derivation_did_not_read_is_noted(dialect: str, mode: str) -> None:
    """A Use row with an ``idle`` reason is noted 'no effect here' in a run whose
    derivation did not read its key, in either dialect, and nothing otherwise."""
    data = {"trainer": {"mode": mode, "backend": "vllm"}}
    ctx = _contexts(data)[dialect == "roll"]
    ctx.data = data
    KeyTable(USE).walk_section(ctx, data, ())
    _backend(ctx)
    ctx.settle()
    if mode == "split":
        assert ctx.out.native() == {"rollout": {"engine": "vllm"}}
        assert ctx.out.notes() == []
    else:
        assert ctx.out.native() == {}
        assert ctx.out.notes() == ["trainer.backend: no effect here (read in split mode)"]
    assert meaning(USE["trainer.backend"])[1] == (
        f"read by the derivation {_backend.name}: rollout.engine in split mode; where it "
        "does not read it, no effect (read in split mode)"
    )


def test_a_value_outside_a_closed_list_is_refused_in_the_one_wording() -> None:
    err = unsupported("trainer.device", "cudaa", ("cpu", "cuda"))
    assert str(err) == (
        "trainer.device: this value is not supported (got 'cudaa'). "
        "Fix: use one of: cpu, cuda (did you mean 'cuda'?)"
    )
