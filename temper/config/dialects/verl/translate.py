"""The verl dialect: a verl PPO trainer config -> the native schema.

The translator is generic code over :data:`verl_sections.TABLE`: it walks the input
tree, looks every key up, and maps it to a native field, notes it (accepted, no effect
here, with why) or rejects it (``ConfigError`` naming the verl key, the reason and the
fix). Keys that are not in the table are typos: "did you mean …". Nothing is dropped
silently. Conventions that differ between verl and temper:

- ``ppo_mini_batch_size`` counts prompts in verl; temper's ``mini_batch_size`` counts
  samples, so it is multiplied by ``rollout.n``. Deprecated global micro-batch sizes are
  divided by the data-parallel size, as verl's workers do.
- verl runs through Ray (its SFT trainers under torchrun). Here one device (``nnodes × n_gpus_per_node == 1``)
  runs on the ``local`` backend, more on ``ray``; verl's hybrid engine (actor, rollout
  and reference on all devices) is temper's default colocated placement.
- Keys that several verl keys feed (``experiment.seed``, ``rollout.response_length``
  from ``data.max_response_length`` and ``rollout.response_length``, …) must agree.
- verl defaults that differ from temper's and change a run (``DEFAULTS``: GAE with a
  critic, FSDP, 30 epochs) are applied when the file omits them, and listed in the notes.
- Document 003's vendor wrapper (``backend_config:`` holding the verl config, plus
  ``af_output_dir`` and top-level ``engine_kwargs``) is unwrapped.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from collections.abc import Callable
from typing import Any, Union, get_args, get_origin

from temper.config.catalog import VALUES, Catalog
from temper.config.dialects import Translation
from temper.config.dialects.core import paths
from temper.config.dialects.core.context import Context
from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.paths import MISSING
from temper.config.dialects.core.result import Written
from temper.config.dialects.core.rules import Gated, Note, Refuse, Rule, meaning
from temper.config.dialects.core.walk import KeyTable
from temper.config.dialects.verl import asynchronous as verl_async
from temper.config.dialects.verl import distill as verl_distill
from temper.config.dialects.verl import generation as verl_generation
from temper.config.dialects.verl import prime as verl_prime
from temper.config.dialects.verl import sft as verl_sft
from temper.config.dialects.verl import spin as verl_spin
from temper.config.dialects.verl import sppo as verl_sppo
from temper.config.dialects.verl import table_rollout as verl_rollout
from temper.config.dialects.verl.sections import DEFAULTS, INHERIT, TABLE, WRAPPER
from temper.config.dialects.verl.transforms import UNSET
from temper.config.dialects.verl.v09 import MODEL_ENGINE_STRATEGY
from temper.config.errors import ConfigError, did_you_mean
from temper.config.loader import RawConfig
from temper.config.schema import TemperConfig
from temper.config.typed import _convert

# verl policy losses that always aggregate with seq-mean-token-mean.
SEQUENCE_MEAN_LOSSES = ("gspo", "sapo")
#: each role's token budgets, which verl counts per sequence-parallel rank
BUDGETS = {
    "actor": ("actor.max_token_len_per_device", "rollout.log_prob_max_token_len_per_device"),
    "reference": ("reference.log_prob_max_token_len_per_device",),
    "critic": ("critic.max_token_len_per_device", "critic.log_prob_max_token_len_per_device"),
}


@dataclasses.dataclass(frozen=True)
class Tables:
    """One verl trainer's keys: its table, the verl defaults that differ from temper's,
    the ``${oc.select:…}`` inheritances, and its own part of the final pass."""

    table: dict[str, Rule]
    defaults: dict[str, Any]
    inherit: list[tuple[str, str]]
    finish: Callable[[Any], None]
    #: a trainer's (saving cadence and Ray backend follow verl's); generation and
    #: evaluation run in one process and save nothing
    trains: bool = True

    @functools.cached_property
    def keys(self) -> KeyTable:
        return KeyTable(self.table)

    @property
    def reverse(self) -> dict[str, str]:
        return self.keys.reverse


_WRAPPER = KeyTable({**WRAPPER, "backend_config": Note("")})  # popped before the walk
REVERSE = KeyTable(TABLE).reverse  # the PPO trainer's


def translate_verl(raw: RawConfig, catalog: Catalog) -> Translation:
    """Translate a verl config (or document 003's ``backend_config`` wrapper) — the PPO
    trainer's, an SFT trainer's (:mod:`verl.sft`), or ``main_generation``'s or
    ``main_eval``'s (:mod:`verl.generation`), or a PPO trainer's as ``temper generate``
    reads it (``main_generation_server``'s); the catalog says which advantage
    estimators need a critic (verl builds one for those)."""
    if verl_generation.is_generation(raw.data):
        tables = GENERATION
    elif verl_generation.is_evaluation(raw.data):
        tables = EVALUATION
    elif raw.command == "generate" and not verl_sft.is_sft(raw.data):
        tables = SERVER  # a PPO trainer's composition: verl 0.9's main_generation_server
    else:
        tables = SFT if verl_sft.is_sft(raw.data) else PPO
    return _Translator(raw.data, catalog, raw.added, tables).run()


@functools.cache
def native_type(path: str) -> Any:
    """The annotated type of a native field (``Any`` inside free-form dict fields)."""
    cls: Any = TemperConfig
    parts = path.split(".")
    for i, part in enumerate(parts):
        hints = typing.get_type_hints(cls)
        if part not in hints:
            raise KeyError(f"verl table names a native field that does not exist: {path}")
        tp = hints[part]
        if i == len(parts) - 1:
            return tp
        inner = _strip_optional(tp)
        if not dataclasses.is_dataclass(inner):
            return Any
        cls = inner
    return Any


def _strip_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else tp
    return tp


def _allows_none(tp: Any) -> bool:
    return tp is Any or (get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp))


class _Translator(Context):
    def __init__(
        self,
        data: dict[str, Any],
        catalog: Catalog,
        added: dict[str, str] | None = None,
        tables: Tables | None = None,
    ) -> None:
        super().__init__({})  # the verl config (the file less document 003's wrapper)
        self.tables = tables or PPO
        self.file = copy.deepcopy(data)
        self.catalog = catalog
        self.added = added or {}  # key -> the plain override that added it
        self.prefix = ""
        self.shown = ""  # the prefix keys are shown with (the wrapper's own keys: none)
        self.path = ""  # the same without the wrapper prefix
        self.state: dict[str, Any] = {}

    # ------------------------------------------------------------------ context API

    @property
    def writes(self) -> dict[str, Written]:
        """The native fields written so far (the result's): final passes that move or
        rescale a field write here; what they read they read through ``out.written`` or
        ``out.section``, which their recording sees."""
        return self.out.fields

    def get(self, path: str, default: Any = None) -> Any:
        node = super().get(path)
        return default if node is None or node == UNSET else node

    def write(self, native: str, value: Any, key: str | None = None) -> None:
        """Set native field ``native`` (converted to its type) as verl key ``key`` (default:
        the key being translated); for ``Call`` rules that split one verl value."""
        key = key or self.key
        self.out.write(native, _convert(value, native_type(native), key), key)

    def error_at(self, key: str, reason: str, fix: str) -> ConfigError:
        """A refusal of verl key ``key`` (a final pass's, which reads several keys)."""
        return ConfigError(self.prefix + key, reason, fix)

    def replace(self, native: str, value: Any, key: str) -> None:
        """Set native field ``native`` over what another key set, as verl key ``key`` (the
        final pass's derivations: a separate rollout pool re-counts the devices)."""
        self.out.replace(native, _convert(value, native_type(native), key), key)

    # ------------------------------------------------------------------ driver

    def run(self) -> Translation:
        self._unwrap()
        # keys that decide which trainer the file is for come first (Hydra puts them after
        # the sections they compose): a trainer temper lacks is named before any key of
        # its files. model_engine chose every role's files; async_training is verl's
        # fully-async trainer's own section (what of it is refused, dynamic resource
        # scheduling, is named before the keys it composes)
        for first in ("async_training", "model_engine"):
            if first in self.data:
                self.data = {first: self.data.pop(first), **self.data}
        self._apply_defaults()
        self.shown = self.prefix
        self.tables.keys.walk_section(self, self.data, ())
        self.tables.finish(self)
        _finish(self)
        self.settle()
        return Translation(
            native=self.out.native(),
            notes=self.out.notes(),
            sources=self.out.sources(),
            table=self.tables.reverse,
        )

    def walk_section(self, node: dict[str, Any], path: str, table: dict[str, Rule]) -> None:
        """Translate section ``path`` with a table of its own (a ``Call`` rule that picks
        the table by the section's contents: verl 0.9's ``engine`` group)."""
        saved = self.path, self.key
        try:
            KeyTable(table).walk_section(self, node, tuple(path.split(".")))
        finally:
            self.path, self.key = saved

    def _unwrap(self) -> None:
        if "backend_config" not in self.file:
            self.data = self.file
            return
        tree = self.file.pop("backend_config")
        if not isinstance(tree, dict):
            raise ConfigError("backend_config", "must be a mapping holding a verl config", "")
        self.data, self.prefix = tree, "backend_config."
        _WRAPPER.walk_section(self, self.file, ())

    def _apply_defaults(self) -> None:
        # verl 0.9's model_engine group picks the actor file, and with it the strategy a
        # file without the actor section would have (a short file naming only the group)
        engine = self._lookup("model_engine")
        strategy = "actor_rollout_ref.actor.strategy"
        ppo = "model_engine" in self.tables.table
        if ppo and engine in MODEL_ENGINE_STRATEGY and self._lookup(strategy) is MISSING:
            self._set(strategy, MODEL_ENGINE_STRATEGY[engine])
        for key, value in self.tables.defaults.items():
            if self._lookup(key) is MISSING:
                self._set(key, value)
                self.note("verl default applied (the file does not set it)", f"{key}={value}")
        for target, source in self.tables.inherit:
            if self._lookup(target) is MISSING and self._lookup(source) is not MISSING:
                self._set(target, copy.deepcopy(self._lookup(source)))

    def _lookup(self, path: str) -> Any:
        return paths.get(self.data, path, MISSING)

    def _set(self, path: str, value: Any) -> None:
        paths.put(self.data, path, value)

    # ------------------------------------------------------------------ the walk's

    def enter(self, path: str) -> bool:
        self.path, self.key = path, self.shown + path
        if path.rsplit(".", 1)[-1] == "_target_":
            self.note("Hydra _target_ (a verl class path): temper builds its own objects")
            return False
        return True

    def null_section(self) -> None:
        self.note("null section: the temper defaults apply")

    def not_a_section(self, parts: tuple[str, ...], siblings: frozenset[str], value: Any) -> None:
        raise ConfigError(self.key, f"expected a mapping, got {value!r}", "")

    def unknown(self, parts: tuple[str, ...], siblings: frozenset[str]) -> None:
        valid = sorted(siblings)
        parent = ".".join(parts[:-1])
        where = f"'{self.shown}{parent}'" if parent else "the top level"
        added = self.added.get(self.key) or next(
            (t for k, t in self.added.items() if k.startswith(self.key + ".")), None
        )
        also = (
            f"; the override '{added}' adds it to the config (Hydra would refuse it too: "
            "this verl version has no such key)"
            if added
            else ""
        )
        raise ConfigError(
            self.key,
            f"unknown verl key{did_you_mean(parts[-1], valid)}{also}",
            f"remove it, or use one of the keys of {where}: {', '.join(valid)}",
        )

    # ------------------------------------------------------------------ rules

    def _critic_unused(self) -> bool:
        """verl builds a critic when ``critic.enable`` says so, else for an advantage
        estimator that needs values (GAE)."""
        enable = self._lookup("critic.enable")
        if isinstance(enable, bool):
            return not enable
        estimator = self._lookup("algorithm.adv_estimator")
        if estimator is MISSING or not isinstance(estimator, str):
            return False
        return VALUES not in self.catalog.needs("adv_estimator", estimator)

    UNSET_NOTE = "'???' (verl's mandatory-value marker, unset)"

    def unset(self, value: Any) -> bool:
        return bool(value == UNSET)

    def unread(self, rule: Rule, value: Any) -> bool:
        """verl never reads the section of a critic it does not build."""
        critic_only = self.path.startswith("critic.") and isinstance(rule, Refuse | Gated)
        if not (critic_only and self._critic_unused()):
            return False
        for leaf in paths.leaves(value, self.key):
            self.note("no effect here (no critic: the advantage estimator needs none)", leaf)
        return True

    def put(self, native: str, value: Any, given: Any, weak: bool = False) -> None:
        """A mapped value, converted to the native field's type; a null the field cannot
        hold leaves it to the other keys or its default (noted)."""
        tp = native_type(native)
        if value is None and not _allows_none(tp):
            self.note(
                "null (unset): the temper default applies"
                if given is None
                else f"{given!r}: leaves {native} to the other keys or its default"
            )
            return
        if value is not None:
            value = _convert(value, tp, self.key)
        self._write(native, value, weak)

    def _write(self, native: str, value: Any, weak: bool = False) -> None:
        self.out.write(native, value, self.key, weak)


# --------------------------------------------------------------------------- final passes


@derivation(fields=("reward.custom_function.path",))
def _finish_ppo(ctx: _Translator) -> None:
    """The PPO trainer's part of the final pass: the SPIN recipe's pipeline, the SPPO
    recipe's estimator and loss,
    sequence-level losses, the chosen engine's kwargs, a custom reward function."""
    verl_spin.finish(ctx)  # a SPIN file's algorithm keys are read by nothing
    verl_prime.finish(ctx)  # a PRIME file's reward model is its PRM
    verl_sppo.finish(ctx)  # first of the rest: it chooses the policy loss they read
    _sequence_level_losses(ctx)
    _sequence_parallel_budgets(ctx)
    verl_async.finish(ctx)
    verl_distill.finish(ctx)
    verl_rollout.finish_engine_kwargs(ctx)
    path, path_key, _ = ctx.out.written("reward.custom_function.path")
    if path:
        ctx.key = path_key  # custom_reward_function.path, or verl 0.9's reward.…
        ctx._write("reward.function", "custom")


@derivation(fields=("resources.nnodes", "resources.devices_per_node"))
def _finish(ctx: _Translator) -> None:
    """Every verl trainer's part of the final pass: saving cadence and backend."""
    if not ctx.tables.trains:
        return
    # verl saves every trainer.save_freq steps and nothing else: temper's time-based
    # recovery checkpoints (native configs only) stay off, so a verl file saves as
    # it does there
    ctx.key = ctx.prefix + "trainer.save_freq"
    ctx._write("experiment.save_every_minutes", None)
    nnodes = ctx.out.written("resources.nnodes", 1).value
    per_node = ctx.out.written("resources.devices_per_node", 1).value
    ctx.key = ctx.prefix + "trainer.n_gpus_per_node"
    ctx._write("resources.backend", "ray" if nnodes * per_node > 1 else "local")
    ctx.note(
        "verl runs through Ray (its SFT trainers under torchrun); temper uses the local "
        "backend for one device and Ray for more",
    )


@derivation(fields=("actor.policy_loss", "actor.loss_agg_mode"))
def _sequence_level_losses(ctx: _Translator) -> None:
    """verl's ``gspo`` and ``sapo`` policy losses call ``agg_loss`` with
    ``loss_agg_mode="seq-mean-token-mean"`` hard-coded (core_algos.py), whatever
    ``actor.loss_agg_mode`` says; the value loss and entropy still use the setting.
    temper's losses honour ``loss_agg_mode``, so the translation pins the policy
    loss's aggregation with ``PolicyLossParams.loss_agg_mode_override``."""
    loss, key, _ = ctx.out.written("actor.policy_loss")
    if loss not in SEQUENCE_MEAN_LOSSES:
        return
    ctx.key = key
    ctx._write("actor.policy_loss_kwargs.loss_agg_mode_override", "seq-mean-token-mean")
    mode, mode_key, _ = ctx.out.written("actor.loss_agg_mode")
    if mode not in (None, "seq-mean-token-mean"):
        ctx.note(
            f"verl's {loss} policy loss aggregates with seq-mean-token-mean whatever it "
            "says (it still applies to the other loss terms); "
            "actor.policy_loss_kwargs.loss_agg_mode_override does the same here",
            mode_key,
        )


@derivation(
    fields=(
        "{role}.strategy",
        "{role}.megatron.context_parallel_size",
        "{sp}.ulysses_sequence_parallel_size",
        *(native for natives in BUDGETS.values() for native in natives),
    ),
    role=BUDGETS,
    sp=("actor", "critic"),
)
def _sequence_parallel_budgets(ctx: _Translator) -> None:
    """verl's token budgets (``*_max_token_len_per_gpu``) count the tokens one rank of a
    sequence-parallel group holds: its micro-batching packs ``budget × sp_size`` tokens
    of whole samples (``dp_actor.py``, ``dp_critic.py``; 0.9's engines:
    ``prepare_micro_batches``), where ``sp_size`` is the Ulysses size of an FSDP role
    and the context-parallel size of a Megatron one. temper's budgets count the tokens
    of whole samples, so the translation multiplies them: verl's configs that fill a
    sequence-parallel group with one long sample hold it here too."""
    for role, natives in BUDGETS.items():
        strategy = ctx.out.written(f"{role}.strategy").value
        # the reference runs with the actor's sequence parallelism (verl's ref config
        # interpolates the actor's size; this table refuses another one)
        sp_role = "actor" if role == "reference" else role
        size_key = (
            f"{role}.megatron.context_parallel_size"
            if strategy == "megatron"
            else f"{sp_role}.ulysses_sequence_parallel_size"
        )
        size, size_source, _ = ctx.out.written(size_key, 1)
        budgets = [(native, ctx.out.written(native)) for native in natives]
        if not isinstance(size, int) or size <= 1:
            continue
        for native, (budget, key, weak) in budgets:
            if not isinstance(budget, int):
                continue
            ctx.writes[native] = Written(budget * size, key, weak)
            ctx.note(
                f"verl's token budgets count one sequence-parallel rank's tokens: × "
                f"{size_source.rsplit('.', 1)[-1]} {size} = {budget * size} tokens of whole "
                f"samples here ({native})",
                key,
            )


PPO = Tables(TABLE, DEFAULTS, INHERIT, _finish_ppo)
SFT = Tables(verl_sft.TABLE, {}, [], verl_sft.finish)
GENERATION = Tables(
    verl_generation.GENERATION, {}, [], verl_generation.finish_generation, trains=False
)
SERVER = Tables(verl_generation.SERVER, {}, [], verl_generation.finish_server, trains=False)
EVALUATION = Tables(
    verl_generation.EVALUATION, {}, [], verl_generation.finish_evaluation, trains=False
)


def key_meaning(key: str) -> tuple[tuple[str, ...], str] | None:
    """What verl key ``key`` becomes here: (native keys it sets, how), or None when the
    table has no such key (``temper check --explain``; the PPO trainer's table first,
    then the SFT trainers', then main_generation's and main_eval's)."""
    rule = next(
        (
            t[key]
            for t in (
                TABLE,
                verl_sft.TABLE,
                verl_generation.GENERATION,
                verl_generation.EVALUATION,
            )
            if key in t
        ),
        None,
    )
    return None if rule is None else meaning(rule)
