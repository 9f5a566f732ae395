"""Every ``Use`` row of the ROLL and verl tables names the derivation that reads its key,
and the derivations' declarations (``core.derivation``) hold on both sides: against the
tables of their dialect, and against what each derivation really reads when it translates
the upstream files.

- a Use row whose derivation does not declare its key fails;
- a key a derivation declares that no table has (as a row, or under a row that claims
  its section) fails (the walk would refuse it as unknown), and so does one that a table whose rows name the derivation calls inert
  (``Note``, ``Gated``): that table tells the user the key has no effect while the
  derivation reads it (unless the derivation declares it ``explains``: read only to word a
  note);
- a key a derivation reads without declaring it fails, and so does a declared key (each
  key a template names, every role of it) that the derivation never reads over the
  replay rows of its dialect and :data:`EXTRA` (files that reach the branches no upstream
  file does);
- the same for the native fields of the result a derivation reads (what other keys
  already wrote: a final pass's), which must be fields (or sections) of the schema.

A table's derivations are those its Use rows name, its pipeline's final pass (verl's
trainers: :attr:`Tables.finish` and the pass every trainer runs), and every derivation
they call over the replay.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
import upstream_replay  # next to this file

from temper.config.dialects.core.derivation import (
    DECLARED,
    Derivation,
    Record,
    matches,
    recording,
    under,
)
from temper.config.dialects.core.rules import Gated, Note, Use
from temper.config.dialects.core.walk import KeyTable
from temper.config.dialects.roll.distill import DISTILL_TABLE, DISTILL_VL_TABLE
from temper.config.dialects.roll.dpo import DPO_TABLE
from temper.config.dialects.roll.sft import SFT_TABLE
from temper.config.dialects.roll.translate import RL_TABLE
from temper.config.dialects.verl import translate as verl

#: every table, by dialect and name (a derivation is held to its own dialect's tables)
TABLES: dict[str, KeyTable] = {
    "roll.rl": RL_TABLE,
    "roll.sft": SFT_TABLE,
    "roll.dpo": DPO_TABLE,
    "roll.distill": DISTILL_TABLE,
    "roll.distill_vl": DISTILL_VL_TABLE,
    "verl.ppo": verl.PPO.keys,
    "verl.sft": verl.SFT.keys,
    "verl.generation": verl.GENERATION.keys,
    "verl.server": verl.SERVER.keys,
    "verl.evaluation": verl.EVALUATION.keys,
}
USE_ROWS = [
    (name, key, rule)
    for name, table in TABLES.items()
    for key, rule in table.rules.items()
    if isinstance(rule, Use)
]
DERIVATIONS: dict[str, Derivation[..., Any]] = {
    name: d for name, d in DECLARED.items() if name.startswith(("roll.", "verl."))
}
#: verl table -> its final pass (a derivation that calls the trainer's others)
FINISH: dict[str, list[Derivation[..., Any]]] = {
    "verl.ppo": [verl.PPO.finish, verl._finish],  # type: ignore[list-item]
    "verl.sft": [verl.SFT.finish, verl._finish],  # type: ignore[list-item]
    "verl.generation": [verl.GENERATION.finish],  # type: ignore[list-item]
    "verl.server": [verl.SERVER.finish],  # type: ignore[list-item]
    "verl.evaluation": [verl.EVALUATION.finish],  # type: ignore[list-item]
}


def _id(row: tuple[str, str, Use]) -> str:
    return f"{row[0]}:{row[1]}"


@pytest.mark.parametrize("row", USE_ROWS, ids=_id)
def test_a_use_rows_derivation_declares_its_key(row: tuple[str, str, Use]) -> None:
    _table, key, rule = row
    assert any(matches(key, p) for p in rule.by.reads), (
        f"{key} names {rule.by.name}, which does not declare it"
    )


def _honoured(derivation: Derivation[..., Any], key: str) -> list[str]:
    """What is wrong with a key ``derivation`` declares, per table ([] when nothing)."""
    found, wrong = False, []
    dialect = derivation.name.split(".")[0] + "."
    for name, table in TABLES.items():
        if not name.startswith(dialect):
            continue
        rule = table.rule(key)
        if rule is None:
            parts = key.split(".")
            # a rule on a section above it claims the key (a Call that reads the section)
            above = any(table.rule(".".join(parts[:n])) for n in range(1, len(parts)))
            found = found or above or bool(table.children(tuple(parts)))
            continue
        found = True
        inert = isinstance(rule, Note | Gated) and key not in derivation.explains
        if inert and derivation.name in _named()[name]:
            wrong.append(f"the {name} table calls it inert ({type(rule).__name__})")
    return wrong if found else ["no table has it"]


@functools.cache
def _named() -> dict[str, set[str]]:
    """Table -> the derivations its pipeline runs: those its Use rows name, its final
    pass, and what they call over the replay."""
    calls = _recorded().calls
    named = {}
    for name, table in TABLES.items():
        todo = {r.by.name for r in table.rules.values() if isinstance(r, Use)}
        todo |= {d.name for d in FINISH.get(name, [])}
        seen: set[str] = set()
        while todo:
            d = todo.pop()
            seen.add(d)
            todo |= calls.get(d, set()) - seen
        named[name] = seen
    return named


def test_every_final_pass_is_declared() -> None:
    for finish in FINISH.values():
        for d in finish:
            assert d.name in DECLARED, d


@pytest.mark.parametrize("name", sorted(DERIVATIONS))
def test_what_a_derivation_declares_the_tables_honour(name: str) -> None:
    derivation = DERIVATIONS[name]
    wrong = {k: _honoured(derivation, k) for k in sorted(derivation.reads)}
    assert not {k: w for k, w in wrong.items() if w}


VERL_PPO = "verl-2026-08-1dda039/verl/trainer/config/ppo_trainer.yaml"
VERL_SFT = "verl-2026-08-1dda039/verl/trainer/config/sft_trainer_engine.yaml"
#: verl's V1 trainer's async modes, on a rollout pool of their own (separate_async)
POOL = [
    "trainer.n_gpus_per_node=6",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=2",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]
GRPO = "roll-2026-08-8eb27cc/examples/docs_examples/example_grpo.yaml"
PPO = "roll-2026-08-8eb27cc/examples/docs_examples/example_ppo.yaml"
#: Upstream files with overrides that reach what no upstream file does: a rejection
#: filter without the old-log-prob recompute, an eval file, prompt and messages both
#: (refused), a query filter with extra prompts; verl's V1 async modes, bypass mode's
#: REINFORCE loss, an SFT file's thinking default.
EXTRA = [
    upstream_replay.Row(
        f"{path} {' '.join(overrides)}", upstream_replay.UPSTREAM / path, tuple(overrides)
    )
    for path, overrides in (
        (
            PPO,
            [
                "critic.strategy_args.strategy_name=megatron_train",
                "critic.strategy_args.strategy_config={tensor_model_parallel_size: 1}",
                "reward.device_mapping=[0]",
                "reward.world_size=1",
            ],
        ),
        (
            GRPO,
            [
                "train_infer_correction.filters=[{enabled: true, agg_type: sequence}]",
                "enable_old_logprobs_recompute=false",
                "entropy_loss_coef=0.01",
                "actor_train.data_args.eval_file_name=[eval.jsonl]",
            ],
        ),
        (GRPO, ["actor_train.data_args.prompt=prompt"]),
        (
            GRPO,
            [
                "rewards.crossthinkqa.query_filter_config={type: std_filter}",
                "rewards.ifeval.query_filter_config={type: std_filter}",
                "rewards.math_rule.query_filter_config={type: std_filter}",
                "rewards.code_sandbox.query_filter_config={type: std_filter}",
                "rewards.llm_judge.query_filter_config={type: std_filter}",
                "is_use_additional_prompts=true",
            ],
        ),
        (VERL_PPO, ["trainer.v1.trainer_mode=separate_async", *POOL]),
        (VERL_PPO, ["trainer.v1.trainer_mode=colocate_async"]),
        (
            VERL_PPO,
            [
                "algorithm.rollout_correction.bypass_mode=true",
                "algorithm.rollout_correction.loss_type=reinforce",
                "algorithm.rollout_correction.rollout_is=token",
            ],
        ),
        (VERL_SFT, ["data.enable_thinking_default=true"]),
    )
]


@functools.cache
def _recorded() -> Record:
    """What each derivation read over the rows of the upstream replay and EXTRA."""
    record = Record()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with recording() as extra:
            for row in EXTRA:
                upstream_replay.check(row)
    for part in (upstream_replay.replayed()[1], extra):
        for mine, theirs in (
            (record.keys, part.keys),
            (record.fields, part.fields),
            (record.calls, part.calls),
        ):
            for name, read in theirs.items():
                mine.setdefault(name, set()).update(read)
    return record


@pytest.mark.parametrize("name", sorted(DERIVATIONS))
def test_a_derivation_reads_what_it_declares(name: str) -> None:
    derivation, read = DERIVATIONS[name], _recorded().keys.get(name, set())
    undeclared = {
        r for r in read if not any(matches(r, p) or under(r, p) for p in derivation.reads)
    }
    assert not undeclared, f"{name} reads keys it does not declare"
    never = [
        key
        for key in sorted(derivation.reads)
        if not any(matches(r, key) or under(r, key) for r in read)
    ]
    assert not never, f"{name} declares keys it never reads over the replay"


@pytest.mark.parametrize("name", sorted(DERIVATIONS))
def test_a_derivation_reads_the_fields_it_declares(name: str) -> None:
    derivation, read = DERIVATIONS[name], _recorded().fields.get(name, set())
    unknown = []
    for native in sorted(derivation.fields):
        try:
            verl.native_type(native)
        except KeyError:
            unknown.append(native)
    assert not unknown, f"{name} declares fields the schema lacks"
    undeclared = {r for r in read if not any(r == f or under(f, r) for f in derivation.fields)}
    assert not undeclared, f"{name} reads result fields it does not declare"
    never = [f for f in sorted(derivation.fields) if not any(r == f or under(f, r) for r in read)]
    assert not never, f"{name} declares fields it never reads over the replay"
