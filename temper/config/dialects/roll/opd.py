"""ROLL's on-policy distillation (OPD) files, rewritten into ROLL RL files plus the native
``distill`` section before the RL walk — what ROLL itself does in
``BaseConfig._handle_opd_mapping`` / ``_apply_opd_config``:

- pure OPD (``start_onpolicy_distill_pipeline.py``, which forces ``is_pure_opd``; its files
  configure ``student_train``/``student_infer``): ``student_train`` is ``actor_train``,
  ``student_infer`` is ``actor_infer``; ROLL then sets ``gamma: 0``,
  ``adv_estimator: reinforce``, ``critic_warmup: 0``, ``use_kl_loss`` and
  ``add_token_level_kl`` off — the advantage is ``−Σ_i opd_kl_coef_i·KL_i`` alone
  (``distill.pure``);
- mixed OPD (``use_opd: true`` in an RLVR or agentic file): the RL advantage minus the
  same signal (``distill.pure: false``); ``reference`` must not be configured;
- ``teacher``: one worker (named ``default``) or a dict of named workers, each with
  ``opd_kl_coef`` (default 1.0) and ``tag_included`` (empty: every tag). Each becomes
  ``distill.teachers.<name>`` (its ``model_args.model_name_or_path``, coefficient and
  tags); the first one's worker settings (strategy, micro-batch, devices) are the
  ``reference`` section's — ROLL maps the first teacher to ``reference`` too, and temper
  builds every teacher the way it builds the reference.
"""

from __future__ import annotations

import copy
from typing import Any

from temper.config.dialects.core.context import Context
from temper.config.dialects.core.derivation import derivation
from temper.config.errors import ConfigError

#: The teacher's keys that are distillation's, not its worker's (they leave the copy that
#: becomes the ``reference`` section).
OWN = ("opd_kl_coef", "tag_included")
#: What ROLL fixes in pure OPD mode (``_apply_opd_config``), over what the file says.
PURE_FIXED: dict[str, Any] = {
    "gamma": 0,
    "adv_estimator": "reinforce",
    "critic_warmup": 0,
    "use_kl_loss": False,
    "add_token_level_kl": False,
}


def is_opd(data: dict[str, Any]) -> bool:
    """A ROLL on-policy distillation file: the student's workers, or a mode flag."""
    return bool(
        data.get("student_train")
        or data.get("student_infer")
        or data.get("is_pure_opd")
        or data.get("use_opd")
    )


def _named_teachers(teacher: Any) -> dict[str, dict[str, Any]]:
    """ROLL's ``teacher``: one worker config (``model_args``, ``strategy_args``, …) is
    ``{"default": it}``; otherwise a dict of named worker configs."""
    if not isinstance(teacher, dict) or not teacher:
        raise ConfigError(
            "teacher",
            "on-policy distillation needs a teacher",
            "configure teacher (a worker with model_args.model_name_or_path, or a dict of them)",
        )
    single = "model_args" in teacher or "strategy_args" in teacher
    named = {"default": teacher} if single else teacher
    for name, cfg in named.items():
        if not isinstance(cfg, dict):
            raise ConfigError(
                f"teacher.{name}", "is not a worker config", "give it model_args and strategy_args"
            )
    return named


@derivation("is_pure_opd", "use_opd", "student_train", "student_infer", "teacher")
def rewrite_opd(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """``(ROLL RL data, native distill section, notes)`` for an OPD file (module docstring).

    The distill section carries ``renamed``: the RL file's section prefixes and the OPD
    file's that they came from (``actor_train`` → ``student_train``, ``reference`` →
    ``teacher``), so a message names the key the user wrote (:func:`user_key`)."""
    given = Context(data)  # the file as written (what this derivation reads of it)
    pure = bool(given.get("is_pure_opd", False)) or given.has("student_train")
    mixed = bool(given.get("use_opd", False))
    data = copy.deepcopy(data)
    data.pop("is_pure_opd", None)
    data.pop("use_opd", None)
    notes: list[str] = []
    renamed: dict[str, str] = {}
    if pure and mixed:
        raise ConfigError(
            "use_opd",
            "pure on-policy distillation (student_train/student_infer, is_pure_opd) and "
            "mixed mode (use_opd) are exclusive in ROLL",
            "remove use_opd, or configure actor_train/actor_infer instead of the student's",
        )
    if pure:
        for student, actor in (("student_train", "actor_train"), ("student_infer", "actor_infer")):
            if not given.get(student):
                raise ConfigError(
                    student,
                    "pure on-policy distillation needs student_train, student_infer and teacher",
                    f"configure {student}",
                )
            if data.get(actor):
                raise ConfigError(
                    actor,
                    f"{student} is the {actor} of an on-policy distillation file",
                    f"remove {actor}",
                )
            data[actor] = data.pop(student)
            renamed[actor] = student
        for key, value in PURE_FIXED.items():
            if key in data and data[key] != value:
                notes.append(f"{key}: ROLL's pure on-policy distillation sets it to {value!r}")
            data[key] = value
    elif data.get("reference"):
        raise ConfigError(
            "reference",
            "in ROLL's mixed on-policy distillation (use_opd) the teacher is the reference",
            "remove reference",
        )
    named = _named_teachers(given.get("teacher"))
    data.pop("teacher", None)
    teachers: dict[str, Any] = {}
    first: dict[str, Any] | None = None
    for name, worker in named.items():
        where = (
            "teacher"
            if list(named) == ["default"] and "model_args" in worker
            else f"teacher.{name}"
        )
        path = (worker.get("model_args") or {}).get("model_name_or_path")
        if not path:
            raise ConfigError(
                f"{where}.model_args.model_name_or_path",
                "a teacher needs its own model",
                "set it to the teacher's model directory or hub id",
            )
        coef = worker.get("opd_kl_coef")
        teachers[name] = {
            "model_path": path,
            "kl_coef": 1.0 if coef is None else float(coef),
            "tags": list(worker.get("tag_included") or []),
        }
        rest = {k: v for k, v in worker.items() if k not in OWN}
        rest["model_args"] = {
            k: v for k, v in (rest.get("model_args") or {}).items() if k != "model_name_or_path"
        }
        if first is None:
            first = rest
            renamed["reference"] = where
        elif rest != first:
            notes.append(
                f"{where}: its worker settings (strategy, micro-batch, devices) differ from the "
                f"first teacher's; every teacher is built with those (the reference section's)"
            )
    assert first is not None
    data["reference"] = first
    notes.append(
        f"teacher: on-policy distillation from {', '.join(teachers)} "
        f"({'pure' if pure else 'mixed'}): distill.teachers; the first teacher's worker "
        "settings are the reference section's"
    )
    return data, {"teachers": teachers, "pure": pure, "renamed": renamed}, notes


def user_key(key: str, renamed: dict[str, str]) -> str:
    """``key`` of the rewritten RL file as the OPD file spells it (``actor_train.x`` →
    ``student_train.x``)."""
    head, dot, rest = key.partition(".")
    return renamed[head] + dot + rest if head in renamed else key
