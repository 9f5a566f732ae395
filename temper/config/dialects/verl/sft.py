"""The verl key table of verl's SFT trainers, translated into ``pipeline: sft``.

Two eras of one trainer, told apart by shape (:func:`is_sft`): ``fsdp_sft_trainer`` with
``sft_trainer.yaml`` (``model.partial_pretrain``, ``model.fsdp_config``, ``optim.*``,
``data.multiturn.*``, top-level ``ulysses_sequence_parallel_size`` and
``use_remove_padding``), and verl 0.9's engine-based ``sft_trainer`` with
``sft_trainer_engine.yaml`` (``model`` = ``hf_model``, ``engine`` = ``fsdp`` or
``megatron``, ``optim``, ``checkpoint``, ``profiler``; its dataset is always the
multi-turn one, ``data.messages_key``). Rows reuse the RL table's where verl's keys mean
the same (trainer, data files, the model's and optimizer's keys under another prefix).

What differs from verl, stated where it applies:

- the loss is the token-mean NLL over each mini-batch's learnt tokens, on every rank and
  micro-batch (verl's legacy trainer averaged per micro-batch; ``balance_dp_token``
  summed tokens across ranks only);
- a single-turn response is closed by the tokenizer's EOS (verl's SFTDataset too), a
  conversation is tokenized whole, each assistant turn found by templating the
  conversation up to it (verl 0.9: turn by turn, concatenated).
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Call, Gated, Map, Note, Refuse, Rule, Use
from temper.config.dialects.verl import transforms as r
from temper.config.dialects.verl.automodel import automodel_engine, automodel_optim
from temper.config.dialects.verl.megatron import _engine as megatron_engine
from temper.config.dialects.verl.sections import TABLE as RL_TABLE
from temper.config.dialects.verl.table import MOD, PERF, PROFILE_OFF, _fsdp, _inert, _optim
from temper.config.dialects.verl.torchtitan import torchtitan_engine, torchtitan_optim
from temper.config.dialects.verl.v09 import fsdp_v09, megatron_v09
from temper.config.dialects.verl.veomni import veomni_engine, veomni_optim
from temper.config.dialects.verl.versions import SHM, _megatron_optim

SINGLE_TURN = "used only by verl's multi-turn SFT dataset (data.multiturn.enable)"
DEFAULT_MESSAGES = "messages"


def is_sft(data: dict[str, Any]) -> bool:
    """A verl SFT trainer config: no ``actor_rollout_ref``, and a key only the SFT
    trainers have (``model.partial_pretrain``, ``data.micro_batch_size_per_gpu``,
    top-level ``optim`` or ``engine``)."""
    if "actor_rollout_ref" in data:
        return False
    model, data_ = data.get("model"), data.get("data")
    return (
        (isinstance(model, dict) and "partial_pretrain" in model)
        or (isinstance(data_, dict) and "micro_batch_size_per_gpu" in data_)
        or "optim" in data
        or "engine" in data
    )


def _rl(*keys: str) -> dict[str, Rule]:
    """The RL table's rows for keys that mean the same in an SFT config."""
    return {k: RL_TABLE[k] for k in keys}


def _model_rows() -> dict[str, Rule]:
    """``actor_rollout_ref.model.*`` rows (verl's ``hf_model``) as ``model.*``."""
    out = {"model" + k[len(MOD) :]: v for k, v in RL_TABLE.items() if k.startswith(MOD + ".")}
    out["model.path"] = Map("model.path")
    out["model.use_shm"] = Note(SHM)
    return out


# ----------------------------------------------------------------- data: what a row is

#: What :func:`finish` makes of each of :data:`COLUMNS` (``--explain``, the manual).
USES = {
    "prompt_key": "data.prompt_key (with prompt_dict_keys), single-turn rows",
    "response_key": "sft.response_key (with response_dict_keys), single-turn rows",
    "prompt_dict_keys": "data.prompt_key: the prompt column's nested keys, single-turn rows",
    "response_dict_keys": "sft.response_key: the response column's nested keys, single-turn rows",
    "multiturn.enable": "multi-turn rows (data.messages_key) or single-turn ones",
    "multiturn.messages_key": "data.messages_key, multi-turn rows",
    "messages_key": "data.messages_key",
    "tools_key": "sft.tools_key, multi-turn rows",
    "thinking": "sft.enable_thinking_key, multi-turn rows",
    "enable_thinking_default": "data.apply_chat_template_kwargs.enable_thinking",
}


#: The keys :func:`finish` reads together (the columns that make a sample), by the name
#: it reads them as: verl's legacy trainer's key, then verl 0.9's (a file has one of them).
COLUMNS: dict[str, tuple[str, ...]] = {
    "prompt_key": ("data.prompt_key",),
    "response_key": ("data.response_key",),
    "prompt_dict_keys": ("data.prompt_dict_keys",),
    "response_dict_keys": ("data.response_dict_keys",),
    "multiturn.enable": ("data.multiturn.enable",),
    "multiturn.messages_key": ("data.multiturn.messages_key",),
    "messages_key": ("data.messages_key",),
    "tools_key": ("data.multiturn.tools_key", "data.tools_key"),
    "thinking": ("data.multiturn.enable_thinking_key", "data.enable_thinking_key"),
    "enable_thinking_default": ("data.enable_thinking_default",),
}


def _columns(ctx: Any) -> dict[str, tuple[Any, str]]:
    """Each :data:`COLUMNS` name the file sets: (its value, the key that set it)."""
    got = {}
    for name, keys in COLUMNS.items():
        for key in keys:
            if ctx.has(key):
                got[name] = (ctx.get(key), ctx.prefix + key)
    return got


def _dotted(column: Any, keys: Any, ctx: Any, key: str) -> str:
    """verl's ``prompt_key`` + ``prompt_dict_keys`` (each looked up in turn) as one dotted
    column path."""
    if isinstance(column, list | tuple):
        if len(column) != 1:
            ctx.key = key
            raise ctx.error(
                f"{len(column)} columns: verl's SFTDataset squeezes them into one only when "
                "there is one",
                "name one column",
            )
        column = column[0]
    parts = [str(column), *(str(k) for k in (keys or []))]
    return ".".join(parts)


@derivation(
    *(key for keys in COLUMNS.values() for key in keys),
    fields=("data.apply_chat_template_kwargs", "actor.optim.lr_scheduler"),
)
def finish(ctx: Any) -> None:
    """``pipeline: sft``, and a row's columns: a conversation (verl 0.9's trainer always;
    the legacy one with ``data.multiturn.enable``), or a prompt and a response."""
    got = _columns(ctx)

    def value(name: str, default: Any = None) -> Any:
        return got[name][0] if name in got and got[name][0] is not None else default

    def source(name: str, fallback: str) -> str:
        return got[name][1] if name in got else fallback

    engine_era = "engine" in ctx.data
    ctx.write("pipeline", "sft", key="model.path" if engine_era else "model.partial_pretrain")
    # both trainers validate after the last step whatever trainer.test_freq says
    ctx.write("experiment.val_after_train", True, key="trainer.test_freq")
    multi = engine_era or bool(value("multiturn.enable", False))
    if multi:
        name = "messages_key" if engine_era else "multiturn.messages_key"
        ctx.write(
            "data.messages_key",
            value(name, DEFAULT_MESSAGES),
            key=source(name, "data.multiturn.enable"),
        )
        for native, name in (("tools_key", "tools_key"), ("enable_thinking_key", "thinking")):
            if name in got:
                ctx.write(f"sft.{native}", value(name, ""), key=got[name][1])
        for name in ("prompt_key", "response_key", "prompt_dict_keys", "response_dict_keys"):
            if name in got:
                ctx.note(
                    "no effect here (verl's multi-turn SFT dataset reads messages)", got[name][1]
                )
    else:
        for column, keys, native in (
            ("prompt_key", "prompt_dict_keys", "data.prompt_key"),
            ("response_key", "response_dict_keys", "sft.response_key"),
        ):
            if column in got or keys in got:
                path = _dotted(
                    value(column, column.split("_")[0]), value(keys), ctx, source(column, "")
                )
                ctx.write(native, path, key=source(column, source(keys, "")))
        # verl's single-turn dataset gives the template no tools and no enable_thinking
        ctx.write("sft.tools_key", "", key="data.multiturn.enable")
        ctx.write("sft.enable_thinking_key", "", key="data.multiturn.enable")
        for name in ("multiturn.messages_key", "tools_key", "thinking"):
            if name in got:
                ctx.note(f"no effect here ({SINGLE_TURN})", got[name][1])
    thinking = value("enable_thinking_default")
    if thinking not in (None, "none", "None"):
        native = "data.apply_chat_template_kwargs"
        kwargs = dict(ctx.out.written(native).value or {})
        kwargs.setdefault("enable_thinking", bool(thinking))  # the file's own kwargs win
        # one value from two keys: the kwargs the file gives, completed by the default
        ctx.replace(native, kwargs, got["enable_thinking_default"][1])
    if not engine_era and not ctx.out.written("actor.optim.lr_scheduler").key:
        # fsdp_sft_trainer decays with a cosine when optim.lr_scheduler is absent
        ctx.write("actor.optim.lr_scheduler", "cosine", key="optim.lr_scheduler")
        ctx.note("verl default applied (the file does not set it)", "optim.lr_scheduler=cosine")


def _data_rows() -> dict[str, Rule]:
    d = "data"
    return {
        **_rl(
            "data.train_files",
            "data.val_files",
            "data.train_max_samples",
            "data.val_max_samples",
            "data.train_batch_size",
            "data.apply_chat_template_kwargs",
            "data.custom_cls",
        ),
        f"{d}.use_shm": Note(SHM),
        f"{d}.micro_batch_size": Note(
            "deprecated: verl's SFT trainers read micro_batch_size_per_gpu only"
        ),
        f"{d}.micro_batch_size_per_gpu": Map("actor.micro_batch_size_per_device"),
        f"{d}.use_dynamic_bsz": Map("actor.use_dynamic_bsz"),
        f"{d}.max_token_len_per_gpu": Map("actor.max_token_len_per_device"),
        f"{d}.max_length": Map("sft.max_length"),
        f"{d}.truncation": Map("data.truncation", r.choice("error", "left", "right")),
        f"{d}.chat_template": Map("data.chat_template", lambda v, _c: "native" if v is None else v),
        f"{d}.balance_dp_token": Note(
            "temper divides the loss by the mini-batch's learnt tokens over every rank and "
            "micro-batch whatever it says (verl: per micro-batch, and across ranks when true)"
        ),
        f"{d}.pad_mode": Note(
            "how verl lays out a batch (padded or packed); temper packs micro-batches per "
            "model.use_remove_padding"
        ),
        f"{d}.num_workers": Note(PERF),
        f"{d}.ignore_input_ids_mismatch": Note(
            "temper tokenizes a conversation whole and finds each assistant turn by "
            "templating the conversation up to it, so there is no turn-by-turn tokenization "
            "to compare; a row whose template renders an earlier turn differently once later "
            "turns follow is reported and skipped (verl with true trains on the turn-by-turn "
            "tokens instead)"
        ),
        **{key: Use(USES[name], finish) for name, keys in COLUMNS.items() for key in keys},
    }


# ----------------------------------------------------------------- model, engine, optim


def _legacy_model_rows() -> dict[str, Rule]:
    """``fsdp_sft_trainer``'s model section (FSDP1 or FSDP2 by ``model.strategy``)."""
    f = "model.fsdp_config"
    return {
        "model.partial_pretrain": Map("model.path"),
        "model.strategy": Map("actor.strategy", r.strategy),
        f"{f}.model_dtype": Map("actor.master_dtype", r.precision("model.strategy")),
        f"{f}.wrap_policy.min_num_params": Map("actor.fsdp.wrap_min_num_params"),
        f"{f}.cpu_offload": Map("actor.fsdp.offload_policy"),
        f"{f}.offload_params": Note(
            "FSDP1's split of CPU offload; under FSDP2 cpu_offload moves parameters, "
            "gradients and optimizer state together"
        ),
    }


def _fsdp_engine() -> dict[str, Rule]:
    """``engine`` = verl's ``FSDPEngineConfig`` (``engine/fsdp.yaml``)."""
    return {**_fsdp("engine", "actor", trained=True), **fsdp_v09("engine", "engine")}


FSDP_ENGINE = _fsdp_engine()
MEGATRON_ENGINE: dict[str, Rule] = {
    **megatron_v09("engine", "actor"),
    **megatron_engine("engine", "actor", section="engine"),
    "engine.strategy": Map("actor.strategy", r.strategy, weak=True),
}


#: ``engine`` = verl's ``VeOmniEngineConfig`` / ``AutomodelEngineConfig`` /
#: ``TorchtitanEngineConfig``: FSDP2, as fsdp2
VEOMNI_ENGINE = veomni_engine("engine", "actor")
AUTOMODEL_ENGINE = automodel_engine("engine", "actor")
TORCHTITAN_ENGINE = torchtitan_engine("engine", "actor")


def _engine(value: Any, ctx: Any) -> None:
    """verl 0.9's ``engine`` group: fsdp, veomni, automodel, torchtitan or megatron by its
    config class (``_target_``)."""
    if not isinstance(value, dict):
        raise ctx.error(f"expected a mapping, got {value!r}", "")
    target = str(value.get("_target_", ""))
    strategy = str(value.get("strategy"))
    megatron = "Mcore" in target or strategy == "megatron"
    table = {
        "veomni": VEOMNI_ENGINE,
        "automodel": AUTOMODEL_ENGINE,
        "torchtitan": TORCHTITAN_ENGINE,
    }.get(strategy, MEGATRON_ENGINE if megatron else FSDP_ENGINE)
    if megatron:
        ctx.write("actor.strategy", "megatron")
    elif target and "FSDP" not in target and table is FSDP_ENGINE:
        name = value.get("strategy") or target.rsplit(".", 1)[-1]
        raise ctx.error(
            f"verl's {name} training engine ({target.rsplit('.', 1)[-1]}) is not an engine "
            "temper has",
            "use engine=fsdp, veomni, automodel, torchtitan (FSDP2) or megatron",
        )
    ctx.walk_section(value, "engine", table)


def _optim_rows() -> dict[str, Rule]:
    o = "actor.optim"
    return {
        **_optim("optim", "actor"),
        **_megatron_optim("optim", "actor"),
        "optim.optimizer": Map(f"{o}.optimizer", _optimizer),
        "optim.warmup_steps_ratio": Map(f"{o}.warmup_ratio"),  # verl < 0.5's name
        "optim.lr_scheduler": Map(f"{o}.lr_scheduler", _scheduler),
        "optim.eps": Map(f"{o}.eps"),  # optim/automodel.yaml's (and torchtitan's)
        **veomni_optim("optim", "actor", "engine.strategy"),
        **automodel_optim("optim", "engine.strategy"),
        **torchtitan_optim("optim", "actor", "engine.strategy"),
    }


def _scheduler(v: Any, ctx: Any) -> Any:
    """fsdp_sft_trainer's ``lr_scheduler``: cosine or wsd (warmup-stable-decay)."""
    if v == "wsd":
        raise ctx.error(
            "the warmup-stable-decay schedule is not supported",
            "use cosine (fsdp_sft_trainer's default), linear or constant",
        )
    return r.choice("constant", "cosine", "linear")(v, ctx)


def _optimizer(v: Any, ctx: Any) -> Any:
    """verl's optimizer name: AdamW, or Megatron's adam (decoupled weight decay: AdamW)."""
    if str(v).lower() == "adam" and ctx.writes.get("actor.strategy", (None,))[0] == "megatron":
        ctx.note("Megatron's adam decouples weight decay: it is AdamW")
        return "adamw"
    if str(v) == "Adam" and not ctx.get("optim.weight_decay", 0.0):
        ctx.note("torch's Adam without weight decay is AdamW without weight decay")
        return "adamw"
    return r.choice("adamw", aliases={"AdamW": "adamw", "adamw": "adamw"})(str(v), ctx)


# ----------------------------------------------------------------- trainer and the rest


def _trainer_rows() -> dict[str, Rule]:
    t = "trainer"
    return {
        **_rl(
            "trainer.default_local_dir",
            "trainer.default_hdfs_dir",
            "trainer.project_name",
            "trainer.experiment_name",
            "trainer.total_epochs",
            "trainer.total_training_steps",
            "trainer.logger",
            "trainer.nnodes",
            "trainer.resume_mode",
            "trainer.resume_from_path",
            "trainer.device",
            "trainer.balance_batch",
        ),
        f"{t}.n_gpus_per_node": Map("resources.devices_per_node", _devices),
        f"{t}.seed": Map("experiment.seed"),
        f"{t}.save_freq": Map("experiment.save_freq", _per_epoch),
        f"{t}.test_freq": Map("experiment.test_freq", _per_epoch),
        f"{t}.max_ckpt_to_keep": Map("experiment.max_actor_ckpt_to_keep"),
        f"{t}.resume_path": Map("experiment.resume_from_path"),  # verl < 0.5's name
        f"{t}.checkpoint.save_contents": Map("actor.checkpoint_contents"),
        f"{t}.checkpoint.load_contents": _load_contents(f"{t}.checkpoint"),
        f"{t}.profile_interval": _inert(
            lambda v, _c: v is None or list(v) == [-1, -1],
            PROFILE_OFF,
            "verl's profiler is not supported",
            "remove it; set experiment.profile_steps for torch.profiler traces",
        ),
    }


def _devices(v: Any, ctx: Any) -> Any:
    ctx.note(
        "the devices of the run here; verl's SFT trainers take their world size from "
        "torchrun's --nproc_per_node (and this key under Ray)"
    )
    return v


def _per_epoch(v: Any, ctx: Any) -> Any:
    if v == "after_each_epoch":
        raise ctx.error(
            "'after_each_epoch' is not supported (a cadence here counts steps)",
            "set it to the steps of one epoch: rows / data.train_batch_size",
        )
    return v


def _load_contents(prefix: str) -> Refuse:
    return _inert(
        r.equals(f"{prefix}.save_contents", ["model", "optimizer", "extra"]),
        "a resume loads what was saved",
        "temper loads exactly what it saved (load_contents must equal save_contents)",
        "remove load_contents",
    )


TABLE: dict[str, Rule] = {
    **_data_rows(),
    **_model_rows(),
    **_legacy_model_rows(),
    **_optim_rows(),
    **_trainer_rows(),
    "engine": Call(_engine),
    "checkpoint.save_contents": Map("actor.checkpoint_contents"),
    "checkpoint.load_contents": _load_contents("checkpoint"),
    "profiler": Gated(
        "enable",
        (False, None),
        PROFILE_OFF,
        "verl's profilers are not supported",
        "remove it; set experiment.profile_steps for torch.profiler traces",
    ),
    "ulysses_sequence_parallel_size": Map("actor.ulysses_sequence_parallel_size"),
    "use_remove_padding": Map("model.use_remove_padding"),
}
