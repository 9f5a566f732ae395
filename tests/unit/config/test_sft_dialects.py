"""verl's and ROLL's SFT configs as ``pipeline: sft``: every key of their files is mapped,
noted or refused with its reason (rows in ``sft_keys.py``), the whole files translate and
validate, and errors name the user's keys (``sft_train``, not the shared rows'
``actor_train``)."""

from __future__ import annotations

import copy
import math
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from reference_paths import UPSTREAM  # next to this file
from sft_keys import ROLL, VERL_ENGINE, VERL_LEGACY  # the table next to this file

from temper.config.derive import explain
from temper.config.dialects.roll.translate import translate_roll
from temper.config.dialects.verl.translate import key_meaning, translate_verl
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig, load_yaml
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict
from temper.config.validate import check_names
from temper.pipelines.catalog import CATALOG, load_config
from temper.training.schedule import LRSchedule

LEGACY = UPSTREAM / "verl-2026-01-b178a3c/verl/trainer/config/sft_trainer.yaml"
ENGINE = UPSTREAM / "verl-2026-08-1dda039/verl/trainer/config/sft_trainer_engine.yaml"
ROLL_FILE = UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen3-30BA3B-sft_fsdp2/sft_config.yaml"
BASES = {"verl-legacy": (LEGACY, VERL_LEGACY), "verl-engine": (ENGINE, VERL_ENGINE)}
BASES["roll"] = (ROLL_FILE, ROLL)


@cache
def _base(path: Path) -> dict[str, Any]:
    return load_yaml(path, []).data


def base(name: str) -> dict[str, Any]:
    return copy.deepcopy(_base(BASES[name][0]))


def translate(name: str, data: dict[str, Any]):
    raw = RawConfig(data=data, source="<test>")
    return translate_roll(raw) if name == "roll" else translate_verl(raw, CATALOG)


def build(name: str, data: dict[str, Any]) -> tuple[TemperConfig, list[str]]:
    tr = translate(name, data)
    cfg = from_dict(TemperConfig, tr.native)
    check_names(cfg, CATALOG)
    return cfg, tr.notes


def noted(notes: list[str], key: str) -> bool:
    return any(re.search(rf"(^|[ :,]){re.escape(key)}($|[,=:])", n) for n in notes)


def set_key(data: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        data = data.setdefault(part, {})
    data[leaf] = value


def del_key(data: dict[str, Any], path: str) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        data = data[part]
    del data[leaf]


def get_native(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


def rows() -> list[tuple[str, str, str, list[str], str]]:
    out = []
    for name, (_path, table) in BASES.items():
        for line in table.strip().splitlines():
            tokens = line.split()
            key, value, rest = tokens[0], tokens[1], tokens[2:]
            extras = []
            while rest and rest[0][0] in "+-" and rest[0] != "->":
                extras.append(rest.pop(0))
            out.append((name, key, value, extras, " ".join(rest)))
    return out


ROWS = rows()


@pytest.mark.parametrize(
    ("name", "key", "value", "extras", "expect"),
    ROWS,
    ids=[f"{r[0]}:{r[1]}={r[2]}" for r in ROWS],
)
def test_key(name, key, value, extras, expect):
    data = base(name)
    for extra in extras:
        if extra.startswith("+"):
            k, _, v = extra[1:].partition("=")
            set_key(data, k, yaml.safe_load(v))
        else:
            del_key(data, extra[1:])
    set_key(data, key, yaml.safe_load(value))
    if expect.startswith("!!"):
        with pytest.raises(ConfigError) as err:
            build(name, data)
        assert key.rsplit(".", 1)[0] in str(err.value), err.value
        assert expect[2:].strip().lower() in str(err.value).lower(), err.value
        return
    cfg, notes = build(name, data)
    assert cfg.pipeline == "sft"
    if expect == "noted":
        assert noted(notes, key), notes
        return
    target, _, wanted = expect[2:].strip().partition(" = ")
    want = yaml.safe_load(wanted) if wanted else yaml.safe_load(value)
    got = get_native(cfg, target)
    assert got == (pytest.approx(want) if isinstance(want, float) else want)


def _leaves(value: Any, path: str) -> list[str]:
    if isinstance(value, dict) and value:
        return [x for k, v in value.items() for x in _leaves(v, f"{path}.{k}")]
    return [path]


@pytest.mark.parametrize("name", sorted(BASES))
def test_every_leaf_of_the_file_has_a_row_or_a_note(name):
    """Each leaf of the file has a row (tested above), a note, or its value reached a
    native key (the translation's sources name it, or a section holding it)."""
    keys = {r[1] for r in ROWS if r[0] == name}
    tr = translate(name, base(name))
    sources = set(tr.sources.values())
    silent = [
        leaf
        for k, v in base(name).items()
        for leaf in _leaves(v, k)
        if leaf not in keys
        and not noted(tr.notes, leaf)
        and not any(leaf == s or leaf.startswith(s + ".") for s in sources)
    ]
    assert not silent, silent


#: ROLL's file asks for Ulysses SP 2 on 8 devices: 4 samples a step, one per SP group.
#: Ulysses attention is not built, so the 8 ranks are data-parallel ranks, which 4
#: samples cannot feed (test below); with ulysses_size 1 the file is otherwise whole.
NO_SP = ["sft_train.model_args.ulysses_size=1"]


@pytest.mark.parametrize(
    ("path", "overrides"),
    [(LEGACY, []), (ENGINE, []), (ROLL_FILE, NO_SP)],
    ids=["legacy", "engine", "roll"],
)
def test_the_whole_files_load_as_sft(path, overrides):
    loaded = load_config(path, overrides)
    assert loaded.config.pipeline == "sft"
    assert loaded.plan.roles == ("actor",) and not loaded.plan.use_rollout


def test_sequence_parallel_groups_are_data_parallel_ranks_and_check_says_so():
    """ROLL's file: 8 devices, ulysses_size 2 -> 4 groups of 2 ranks, each a data-parallel
    rank taking 1 sample per micro-batch, ROLL's global batch of 4 rows."""
    loaded = load_config(ROLL_FILE)
    rows = {name: (value, how) for name, value, how in explain(loaded.config, loaded.plan)}
    assert loaded.plan.actor.dp == 4 and loaded.config.data.train_batch_size == 4
    assert loaded.plan.actor.micro_batch_size == 1
    value, how = rows["actor sequence parallelism"]
    assert value == "2 ranks per sequence" and "Ulysses" in how
    assert rows["actor data-parallel size"] == (
        "4",
        "8 devices, strategy fsdp2, / sequence-parallel size 2",
    )


def test_legacy_file_in_native_terms():
    cfg = load_config(LEGACY).config
    assert (cfg.data.prompt_key, cfg.sft.response_key, cfg.sft.max_length) == (
        "question",
        "answer",
        1024,
    )
    assert cfg.sft.tools_key == "" and cfg.data.messages_key is None  # single-turn
    assert cfg.actor.optim.lr_scheduler == "cosine"  # fsdp_sft_trainer's default
    assert (cfg.data.train_batch_size, cfg.actor.micro_batch_size_per_device) == (256, 4)
    assert cfg.resources.devices_per_node == 8 and cfg.resources.backend == "ray"
    # test_freq -1, yet fsdp_sft_trainer validates after its last step
    assert cfg.experiment.test_freq == -1 and cfg.experiment.val_after_train


def test_engine_file_reads_conversations():
    cfg = load_config(ENGINE).config
    assert cfg.data.messages_key == "messages" and cfg.sft.tools_key == "tools"
    assert cfg.actor.use_dynamic_bsz and cfg.actor.max_token_len_per_device == 8192
    assert cfg.experiment.val_after_train  # sft_trainer validates after its last step


def test_engine_file_on_veomni_runs_fsdp2():
    """``engine=veomni optim=veomni``: VeOmni's engine is FSDP2 with Ulysses; its keys and
    its cosine schedule to ``lr_min`` translate onto temper's fsdp2 engine."""
    overrides = [
        "engine=veomni",
        "optim=veomni",
        "optim.lr=1e-5",
        "optim.lr_min=1e-6",
        "engine.param_offload=true",
        "engine.enable_full_shard=false",
        "engine.mixed_precision=false",
        "trainer.n_gpus_per_node=2",
    ]
    cfg = load_config(ENGINE, overrides).config
    actor = cfg.actor
    assert actor.strategy == "fsdp2" and actor.master_dtype == "bf16"
    assert actor.fsdp.param_offload and not actor.fsdp.reshard_after_forward
    assert actor.optim.lr_scheduler == "cosine"
    assert actor.optim.min_lr_ratio == pytest.approx(0.1)
    with pytest.raises(ConfigError, match="expert parallelism over FSDP"):
        load_config(ENGINE, [*overrides, "engine.expert_parallel_size=2"])


def test_engine_file_on_torchtitan_runs_fsdp2():
    """``engine=torchtitan optim=torchtitan``: verl's TorchTitan engine is FSDP2 over its
    shard × replicate mesh, with torchtitan's schedule (decay over its own 10000 steps)
    and its clip; parallelism beyond data is refused."""
    overrides = [
        "engine=torchtitan",
        "optim=torchtitan",
        "trainer.n_gpus_per_node=2",
        "engine.data_parallel_shard_size=2",
        "optim.lr_warmup_steps=10",
        "optim.decay_type=sqrt",
    ]
    actor = load_config(ENGINE, overrides).config.actor
    assert actor.strategy == "fsdp2" and actor.fsdp.fsdp_size == -1  # one group: all ranks
    assert (actor.optim.lr_scheduler, actor.optim.total_training_steps) == ("sqrt", 10000)
    assert actor.optim.warmup_from_one and actor.grad_clip == 1.0
    for override, words in [
        ("engine.data_parallel_shard_size=1", "must cover them"),
        ("engine.tensor_parallel_size=2", "tensor parallelism"),
        ("optim.lr_warmup_steps_ratio=0.1", "lr_warmup_steps"),  # with steps unset
    ]:
        extra = ["optim.lr_warmup_steps=-1"] if "ratio" in override else []
        with pytest.raises(ConfigError, match=words):
            load_config(ENGINE, [*overrides, *extra, override])


AUTOMODEL = ["engine=automodel", "optim=automodel", "trainer.n_gpus_per_node=4"]


def test_engine_file_on_automodel_runs_fsdp2():
    """``engine=automodel optim=automodel``: NeMo AutoModel's engine is FSDP2 (HSDP with
    ``dp_replicate_size``); its kernels are noted, its parallelism beyond data refused."""
    cfg = load_config(
        ENGINE, [*AUTOMODEL, "engine.dp_replicate_size=2", "engine.model_dtype=bf16"]
    ).config
    actor = cfg.actor
    assert actor.strategy == "fsdp2" and actor.fsdp.fsdp_size == 2  # 4 devices / 2 replicas
    assert actor.master_dtype == "bf16"
    assert (actor.optim.lr_scheduler, actor.optim.min_lr_ratio) == ("cosine", 0.01)
    for override, words in [
        ("engine.tp_size=2", "tensor parallelism"),
        ("engine.ep_size=8", "expert parallelism"),
        ("engine.distributed_strategy=megatron_fsdp", "megatron_fsdp"),
        ("engine.model_dtype=auto", "checkpoint's dtype"),
        ("engine.backend_config.fake_balanced_gate=true", "ignores the router"),
        ("optim.lr_warmup_steps_ratio=0.1", "warmup starts at 0"),  # init_lr_ratio 0.1
        ("optim.wd_incr_style=linear", "weight-decay schedule"),
    ]:
        with pytest.raises(ConfigError, match=words):
            load_config(ENGINE, [*AUTOMODEL, override])


def test_automodel_schedule_is_temper_schedule_step_for_step():
    """NeMo AutoModel's ``OptimizerParamScheduler`` (Megatron's), written out by hand:
    ``W`` warmup steps of ``init + (lr - init) · s / W`` with ``init = lr ·
    init_lr_ratio``, then ``min + (lr - min) · ½(1 + cos(π (s - W) / (T - W)))`` with
    ``min = lr · min_lr_ratio``, counted from step 0. With init_lr_ratio 0 the translated
    optimizer gives the same learning rate at every step."""
    lr, total = 1e-5, 10
    overrides = [
        *AUTOMODEL,
        f"optim.lr={lr}",
        "optim.lr_warmup_steps_ratio=0.2",
        "optim.init_lr_ratio=0",
        "optim.min_lr_ratio=0.1",
        f"optim.total_training_steps={total}",
    ]
    optim = load_config(ENGINE, overrides).config.actor.optim
    schedule = LRSchedule(torch.optim.SGD([torch.zeros(1)], lr=lr), optim)
    warmup, floor = int(0.2 * total), 0.1 * lr
    for step in range(total + 1):
        if step <= warmup:
            want = lr * step / warmup
        else:
            cosine = 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
            want = floor + (lr - floor) * cosine
        assert schedule.apply() == pytest.approx(want, rel=1e-9, abs=1e-15), step
        schedule.step()


def test_roll_file_in_native_terms():
    cfg = load_config(ROLL_FILE, ["sft_train.training_args.gradient_accumulation_steps=2"]).config
    assert (cfg.data.prompt_key, cfg.sft.query_key, cfg.sft.response_key) == (
        "instruction",
        "input",
        "output",
    )
    # ROLL's dp = 8 devices / Ulysses 2; × gradient_accumulation_steps 2 × per-device batch 1
    assert cfg.data.train_batch_size == 8 and not cfg.data.shuffle
    assert cfg.sft.max_length == 2048 and cfg.actor.strategy == "fsdp2"
    assert not cfg.experiment.val_after_train  # only the verl SFT translations set it


def test_roll_errors_name_sft_train(tmp_path):
    data = base("roll")
    data["sft_train"]["training_args"]["adam_beta3"] = 0.9
    with pytest.raises(ConfigError) as err:
        translate("roll", data)
    assert err.value.key == "sft_train.training_args.adam_beta3"
    path = tmp_path / "sft.yaml"
    data = base("roll")
    data["sft_train"]["training_args"]["learning_rate"] = -1.0
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as err:  # refused by validation, told in ROLL's keys
        load_config(path)
    assert str(err.value).startswith("sft_train.training_args.learning_rate")


def test_explain_knows_the_sft_keys():
    assert key_meaning("data.max_length") == (("sft.max_length",), "sets sft.max_length")
    assert key_meaning("model.partial_pretrain") == (("model.path",), "sets model.path")
