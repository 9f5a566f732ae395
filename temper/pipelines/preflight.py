"""``temper check`` as a pre-flight: what ``temper train`` would reject in its first minute.

A config that validates can still fail once a run starts: a model directory that does
not exist, a data file without the prompt column, an output directory that cannot be
written, an engine that is not installed or cannot run on this machine, a data source no
reward function scores, a tracker whose package is missing. :func:`preflight` finds those
before Ray starts or a model loads — reading ``config.json`` / ``tokenizer_config.json``, data schemas and columns,
never weights — and raises a ``ConfigError`` naming the key, the reason and the fix.

Two things are settled instead of refused, so a GPU config can be debugged on a laptop:

- an attention kernel this machine lacks (``flash_attention_2`` without the flash-attn
  package or without CUDA) becomes ``sdpa``, the same math, with a note;
- GPU-only tuning keys (engine memory fractions, CUDA graphs, fused kernels, …) set away
  from their defaults are accepted with a note when the run is on CPU.

``temper check`` prints the notes; ``temper train`` runs the same checks first. Checks are
grouped (:data:`CHECKS`) so a caller can run some of them (the replay test of the
upstream files runs ``engines`` and ``rewards`` only: their model and data paths are the
authors'). The ``pipeline`` group is the run's pipeline's own pre-flight (its record's
``preflight``: RLVR's prompt files, the agentic pipeline's environments).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import socket
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from temper.config.derive import Derived, placement
from temper.config.errors import ConfigError
from temper.config.lora_adapter import check_adapter_dir
from temper.config.plan import NO_TRAINING
from temper.config.schema import TemperConfig

# --------------------------------------------------------------------------- hardware


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def on_cpu(cfg: TemperConfig) -> bool:
    """Whether the run computes on CPU (``experiment.device``; ``auto`` without CUDA)."""
    device = cfg.experiment.device
    return device == "cpu" or (device == "auto" and not _cuda())


#: FlashAttention kernels (transformers' names) and the module each needs; a CUDA kernel,
#: so on CPU (or without the module) sdpa stands in
FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}

#: GPU-only tuning keys: (native key, default, what it tunes). On CPU a non-default value
#: changes nothing and is noted.
GPU_TUNING: tuple[tuple[str, Any, str], ...] = (
    ("rollout.gpu_memory_utilization", 0.5, "the engine's share of GPU memory"),
    ("rollout.enforce_eager", True, "CUDA graphs"),
    ("rollout.free_cache_engine", True, "freeing the GPU KV cache between phases"),
    ("model.use_liger", False, "Liger's fused GPU kernels"),
    ("model.use_fused_kernels", False, "fused GPU log-prob kernels"),
    ("model.enable_activation_offload", False, "offloading activations from GPU memory"),
    ("actor.fsdp.param_offload", False, "offloading parameters from GPU memory"),
    ("actor.fsdp.optimizer_offload", False, "offloading optimizer state from GPU memory"),
    ("critic.fsdp.param_offload", False, "offloading parameters from GPU memory"),
    ("critic.fsdp.optimizer_offload", False, "offloading optimizer state from GPU memory"),
    ("reference.param_offload", False, "offloading parameters from GPU memory"),
)


def _get(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _set(cfg: Any, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        cfg = getattr(cfg, part)
    setattr(cfg, leaf, value)


def check_engines(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """Rollout engine, training strategies and attention kernel: installed and able to
    run here (vLLM with this model; a DeepSpeed section that resolves; Megatron degrees
    this hardware runs); GPU-only tuning noted on CPU."""
    from temper.cluster.placement import worker_device
    from temper.rollout.registry import (
        check_rollout_engine,
        check_routed_experts,
        check_tensor_parallel,
        engine_problem,
    )
    from temper.training.megatron_check import check_megatron
    from temper.training.registry import check_engines as check_training_engines
    from temper.training.router_replay import from_rollout

    if plan.use_rollout:  # a pipeline that generates nothing (SFT) builds no engine
        problem = engine_problem(cfg.rollout.engine)
        if problem is not None:
            raise problem
        check_rollout_engine(cfg.rollout, cfg.model)  # e.g. a VL model this vLLM cannot run
        if from_rollout(cfg.actor.router_replay):  # R3: the engine returns routing here
            check_routed_experts(cfg.rollout, cfg.model)
    if cfg.experiment.device == "cuda" and not _cuda():
        # verl's trainer.device defaults to cuda: a GPU config debugged on a laptop
        cfg.experiment.device = "cpu"
        notes.append("experiment.device: cuda -> cpu (no CUDA device on this machine)")
    check_training_engines(cfg, plan)  # deepspeed installed, its section resolves
    notes.extend(check_megatron(cfg, plan, worker_device(cfg)))
    if plan.use_rollout:
        rollout_devices = len(placement(cfg)["actor_infer"])
        check_tensor_parallel(
            cfg.rollout,
            cfg.resources.backend,
            rollout_devices,
            cfg.model,
            standalone=NO_TRAINING in plan.uses,
        )
    cpu = on_cpu(cfg)
    attn = cfg.model.attn_implementation
    if attn in FLASH_PACKAGES:
        package = FLASH_PACKAGES[attn]
        missing = importlib.util.find_spec(package) is None
        if cpu or missing:
            why = "the run is on CPU" if cpu else f"its package ({package}) is not installed"
            cfg.model.attn_implementation = "sdpa"
            notes.append(
                f"model.attn_implementation: {attn} -> sdpa ({why}; sdpa computes the same "
                "attention)"
            )
    if cfg.model.use_liger and not cpu and importlib.util.find_spec("liger_kernel") is None:
        cfg.model.use_liger = False  # speed only, like flash-attn's fallback above
        notes.append(
            "model.use_liger: true -> false (liger-kernel is not installed; its kernels "
            "change speed only)"
        )
    if cpu:
        for key, default, what in GPU_TUNING:
            value = _get(cfg, key)
            if value != default:
                notes.append(f"{key}={value!r}: GPU-only tuning ({what}); no effect on CPU")
        trained = [("actor", cfg.actor)] + ([("critic", cfg.critic)] if plan.use_critic else [])
        for role, train in trained:
            if train.master_dtype != "fp32":
                notes.append(
                    f"{role}.master_dtype={train.master_dtype}: the role then computes in "
                    f"{train.master_dtype} on CPU, which is slow without AVX-512 half-precision "
                    "instructions; fp32 is the CPU advice"
                )


# --------------------------------------------------------------------------- models


def check_models(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """Policy, tokenizer, critic and reward model: each a model directory with a
    ``config.json`` (or a hub id in the local cache or reachable), read, not loaded."""
    check_model_path(cfg.model.path, "model.path", notes)
    check_adapter_dir(cfg.model.lora)
    tok = cfg.model.tokenizer_path or cfg.model.path
    key = "model.tokenizer_path" if cfg.model.tokenizer_path else "model.path"
    check_tokenizer_path(tok, key, notes)
    if plan.use_critic and cfg.critic.model_path:
        check_model_path(cfg.critic.model_path, "critic.model_path", notes)
    for name, teacher in cfg.distill.teachers.items():
        check_model_path(teacher.model_path, f"distill.teachers.{name}.model_path", notes)
    for role in ("actor", "reference", "critic"):  # megatron roles started from one
        path = getattr(cfg, role).megatron.dist_checkpoint_path
        if path and getattr(cfg, role).strategy == "megatron":
            from temper.training.megatron_dist_init import check_dist_checkpoint

            check_dist_checkpoint(path, f"{role}.megatron.dist_checkpoint_path")
    if cfg.reward.model.enable:
        if not cfg.reward.model.path:
            raise ConfigError(
                "reward.model.path",
                "the reward model is enabled but no model is given",
                "set reward.model.path to a sequence-classification model",
            )
        config = check_model_path(cfg.reward.model.path, "reward.model.path", notes)
        archs = [str(a) for a in (config or {}).get("architectures") or []]
        if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
            raise ConfigError(
                "reward.model.path",
                f"{cfg.reward.model.path} is a {', '.join(archs)}, not a sequence classifier "
                "(a reward model scores a whole response with one number)",
                "point it at an AutoModelForSequenceClassification checkpoint",
            )


def _alias(path: str) -> Path | None:
    """A temper model alias's directory (``smollm2:135m-instruct``) without converting."""
    from temper.utils.model_path import MODEL_ALIASES

    name = path.strip().lower()
    if name not in MODEL_ALIASES:
        return None
    from temper.utils.smollm2 import MODEL_DIR_NAME, STAMP, default_cache_dir, find_gguf

    target = default_cache_dir() / MODEL_DIR_NAME
    if (target / STAMP).is_file():
        return target
    try:
        find_gguf()  # the package that carries the weights; converted on first use
    except (ImportError, FileNotFoundError) as err:
        raise ConfigError("model.path", f"'{path}': {err}", "") from err
    return None


def _hub_file(repo: str, filename: str, key: str) -> dict[str, Any] | None:
    """``filename`` of hub repo ``repo``: from the local cache, else downloaded (one try,
    short timeouts); a ConfigError when neither works."""
    import huggingface_hub as hub  # transformers depends on it

    cached = hub.try_to_load_from_cache(repo, filename)
    if isinstance(cached, str):
        return _read_json(Path(cached))
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    reason = "the hub is switched off (HF_HUB_OFFLINE)" if offline else ""
    if not offline:
        try:
            socket.setdefaulttimeout(5)
            socket.getaddrinfo("huggingface.co", 443)
        except OSError:
            reason = "the Hugging Face hub is unreachable from this machine"
        finally:
            socket.setdefaulttimeout(None)
    if not reason:
        try:
            return _read_json(Path(hub.hf_hub_download(repo, filename, etag_timeout=10)))
        except Exception as err:  # network, auth, a repo that does not exist
            reason = f"the hub did not give {filename}: {' '.join(str(err).split())[:200]}"
    raise ConfigError(
        key,
        f"'{repo}' is not a local directory and not in the Hugging Face cache, and {reason}",
        "point it at a local model directory (or download the model first)",
    )


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_model_path(path: str, key: str, notes: list[str]) -> dict[str, Any] | None:
    """The parsed ``config.json`` of model ``path`` (None for an alias not converted yet)."""
    if not path:
        raise ConfigError(key, "no model given", "set it to a model directory or hub id")
    if path.strip().lower() in _aliases():
        target = _alias(path)
        return _read_json(target / "config.json") if target is not None else None
    local = Path(os.path.expanduser(path))
    if local.exists() or not _HUB_ID.match(path):
        if not local.is_dir():
            raise ConfigError(
                key,
                f"model directory not found: {path}",
                f"check the path (relative paths start at {Path.cwd()}), or use a hub id",
            )
        config = local / "config.json"
        if not config.is_file():
            raise ConfigError(
                key,
                f"{path} holds no config.json, so it is not a Hugging Face model directory",
                "point it at the directory save_pretrained wrote",
            )
        data = _read_json(config)
        if data is None:
            raise ConfigError(key, f"{config} is not valid JSON", "re-save the model")
        return data
    return _hub_file(path, "config.json", key)


def check_tokenizer_path(path: str, key: str, notes: list[str]) -> None:
    if path.strip().lower() in _aliases():
        return
    local = Path(os.path.expanduser(path))
    if local.is_dir():
        if not any((local / f).is_file() for f in TOKENIZER_FILES):
            raise ConfigError(
                key,
                f"{path} holds no tokenizer ({' or '.join(TOKENIZER_FILES)})",
                "save the tokenizer there, or set model.tokenizer_path",
            )
        return
    if _HUB_ID.match(path) and not local.exists():
        _hub_file(path, "tokenizer_config.json", key)


TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")
# a hub id: ``name`` or ``org/name`` (a path starts with ., /, ~ or has more parts)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w\-.]*(/[\w\-.]+)?$")


def _aliases() -> Iterable[str]:
    from temper.utils.model_path import MODEL_ALIASES

    return MODEL_ALIASES.keys()


# --------------------------------------------------------------------------- model files


@dataclasses.dataclass(frozen=True)
class ModelUse:
    """A model a run loads, as the pre-flight reads its directory.

    ``key``/``path``: the config key naming the model and its value; ``trust_key`` /
    ``trust``: the ``trust_remote_code`` that loads it; ``tokenizer``: the tokenizer
    whose ids it reads and that tokenizer's key (None: none checked); ``context``: the
    tokens its sequences may reach, the keys that set them and what they are (None:
    nothing bounds them here)."""

    key: str
    path: str
    trust_key: str
    trust: bool
    tokenizer: tuple[str, str] | None
    context: tuple[int, tuple[str, ...], str] | None


def model_uses(cfg: TemperConfig, plan: Derived, notes: list[str]) -> list[ModelUse]:
    """Every model the run loads: the policy (actor, reference and rollout share it), the
    critic's own, the reward model, the LLM judge."""
    from temper.pipelines.registry import resolve_pipeline
    from temper.rewards.registry import JUDGE

    model = cfg.model
    tokenizer = (
        (model.tokenizer_path, "model.tokenizer_path")
        if model.tokenizer_path
        else (model.path, "model.path")
    )
    # what one sample may reach: a prompt and its response, an episode, an SFT sequence
    context = resolve_pipeline(cfg.pipeline).context(cfg, notes)
    trust = ("model.trust_remote_code", model.trust_remote_code)
    uses = [ModelUse("model.path", model.path, *trust, tokenizer, context)]
    if plan.use_critic and cfg.critic.model_path and cfg.critic.model_path != model.path:
        uses.append(
            ModelUse("critic.model_path", cfg.critic.model_path, *trust, tokenizer, context)
        )
    for name, teacher in cfg.distill.teachers.items():  # scores the student's tokens
        key = f"distill.teachers.{name}.model_path"
        uses.append(ModelUse(key, teacher.model_path, *trust, tokenizer, context))
    rm = cfg.reward.model
    if rm.enable and rm.path:
        own = rm.input_tokenizer is not None  # re-templated with the RM's own tokenizer
        rm_context = context if not own and rm.max_length is None else None
        if rm.max_length is not None:
            rm_context = (rm.max_length, ("reward.model.max_length",), "a reward-model input")
        uses.append(
            ModelUse(
                "reward.model.path",
                rm.path,
                "reward.model.trust_remote_code",
                rm.trust_remote_code,
                (rm.path, "reward.model.path") if own else tokenizer,
                rm_context,
            )
        )
    judge = cfg.reward.judge
    functions = {cfg.reward.function, *(r.function for r in cfg.reward.routes.values())}
    if JUDGE in functions and judge.model_path:
        uses.append(
            ModelUse(
                "reward.judge.model_path",
                judge.model_path,
                "reward.judge.trust_remote_code",
                judge.trust_remote_code,
                (judge.model_path, "reward.judge.model_path"),
                (
                    judge.max_prompt_length + judge.max_new_tokens,
                    ("reward.judge.max_prompt_length", "reward.judge.max_new_tokens"),
                    "a judge prompt and its verdict",
                ),
            )
        )
    return uses


def check_model_files(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """Each model the run loads (:func:`model_uses`): its weight files present and
    readable, an architecture this transformers knows, a tokenizer whose ids its
    embedding holds, sequences within its context, and an attention kernel transformers
    has (:mod:`temper.pipelines.model_files`). Local directories are read in full; of a
    hub id, what its cached or downloaded config.json says is checked."""
    from temper.pipelines import model_files as files
    from temper.training.router_replay import OFF as REPLAY_OFF
    from temper.training.router_replay import check_replay_model

    files.check_attention(cfg.model.attn_implementation)
    if cfg.model.external_lib:  # it may register the architecture
        from temper.training.models import import_external_lib

        import_external_lib(cfg.model.external_lib)
    sizes: dict[str, int] = {}
    for use in model_uses(cfg, plan, notes):
        config = check_model_path(use.path, use.key, notes)
        if config is None:  # an alias converted on first use: temper writes it whole
            continue
        if use.key == "model.path" or use.key == "critic.model_path":
            config = {**config, **cfg.model.override_config}
        directory = _local_model_dir(use.path)
        if directory is not None:
            files.check_weights(directory, use.key)
        files.check_architecture(config, directory, use.key, use.trust_key, use.trust)
        if use.key == "model.path" and cfg.actor.router_replay != REPLAY_OFF:
            check_replay_model(config.get("model_type"), cfg.actor.router_replay, use.key)
        if use.tokenizer is not None:
            tok_path, tok_key = use.tokenizer
            tok_dir = _local_model_dir(tok_path)
            if tok_dir is not None:
                if tok_path not in sizes:
                    sizes[tok_path] = files.tokenizer_size(tok_dir, tok_key, use.trust)
                files.check_vocab(config, sizes[tok_path], use.key, tok_key)
        if use.context is not None:
            need, keys, what = use.context
            files.check_context(config, use.key, need, keys, what)


def _local_model_dir(path: str) -> Path | None:
    """The directory of model ``path`` on this machine (an alias's once converted), or
    None for a hub id (its files are the hub's until downloaded)."""
    if path.strip().lower() in _aliases():
        return _alias(path)
    local = Path(os.path.expanduser(path))
    return local if local.is_dir() else None


# --------------------------------------------------------------------------- data

#: Rows read to collect the data sources and tags of a line-oriented file.
MAX_SCAN_ROWS = 100_000


def check_prompt_data(cfg: TemperConfig, notes: list[str]) -> None:
    """Prompt data files exist; their prompt (or messages) column is there; every sample
    (by data source and ROLL tag) is scored by a reward (the RLVR pipeline's pre-flight)."""
    for key, files in (
        ("data.train_files", cfg.data.train_files),
        ("data.val_files", cfg.data.val_files),
    ):
        if not files:
            continue
        columns, samples = _scan(files, key, cfg)
        column = cfg.data.messages_key or cfg.data.prompt_key
        ckey = "data.messages_key" if cfg.data.messages_key else "data.prompt_key"
        if columns is not None and column.split(".")[0] not in columns and column not in columns:
            raise ConfigError(
                ckey,
                f"the column '{column}' is not in {key} "
                f"(its columns: {', '.join(sorted(columns))})",
                f"set {ckey} to the column holding the prompts",
            )
        _check_rewards(cfg, samples, key)
        _check_video_engine(cfg, columns, key)
        if key == "data.train_files" and cfg.data.source_weights:
            _check_weights(cfg, {tag for _source, tag in samples})


def _check_video_engine(cfg: TemperConfig, columns: set[str] | None, key: str) -> None:
    """Prompts with videos generate on the ``hf`` engine: temper hands vLLM a prompt's
    images only (vLLM's CPU build cannot run the Qwen2-VL family here, so a video path
    into it could not be tested)."""
    from temper.rollout.registry import resolve_engine_name

    column = cfg.data.video_key
    if columns is None or (column.split(".")[0] not in columns and column not in columns):
        return
    if resolve_engine_name(cfg.rollout.engine, cfg.model) != "vllm":
        return
    raise ConfigError(
        "rollout.engine",
        f"{key} has a video column '{column}', and vLLM rollout of video prompts is not "
        "supported (temper passes vLLM images only)",
        "set rollout.engine=hf, which generates from videos",
    )


def check_columns(
    cfg: TemperConfig,
    wanted: list[tuple[str, str]],
    sources: list[tuple[str, list[str]]] | None = None,
) -> None:
    """Every file of ``sources`` (``(config key, files)``; default the train and val
    files) holds each ``(config key, column)`` of ``wanted`` (a dotted column names a
    nested field: its first part must be a column)."""
    data = cfg.data
    if sources is None:
        sources = [("data.train_files", data.train_files), ("data.val_files", data.val_files)]
    for key, files in sources:
        if not files:
            continue
        columns, _samples = _scan(files, key, cfg)
        if columns is None:
            continue
        for ckey, column in wanted:
            if column.split(".")[0] not in columns and column not in columns:
                raise ConfigError(
                    ckey,
                    f"the column '{column}' is not in {key} "
                    f"(its columns: {', '.join(sorted(columns))})",
                    f"set {ckey} to the column holding them",
                )


def check_sft_data(cfg: TemperConfig, notes: list[str]) -> None:
    """Supervised data files exist and hold their columns: the conversation column
    (``data.messages_key``), or the prompt and the response (the SFT pipeline's
    pre-flight)."""
    data = cfg.data
    wanted = (
        [("data.messages_key", data.messages_key)]
        if data.messages_key
        else [("data.prompt_key", data.prompt_key), ("sft.response_key", cfg.sft.response_key)]
    )
    check_columns(cfg, wanted)


def check_dpo_data(cfg: TemperConfig, notes: list[str]) -> None:
    """Preference data files exist and hold the prompt, chosen and rejected columns (the
    DPO pipeline's pre-flight)."""
    check_pair_data(cfg, "dpo", cfg.dpo.chosen_key, cfg.dpo.rejected_key)


def check_rm_data(cfg: TemperConfig, notes: list[str]) -> None:
    """The reward-model pipeline's pre-flight: its pairs' columns, as for DPO."""
    check_pair_data(cfg, "rm", cfg.rm.chosen_key, cfg.rm.rejected_key)


def check_pair_data(cfg: TemperConfig, section: str, chosen: str, rejected: str) -> None:
    """Preference data files exist and hold the prompt, chosen and rejected columns
    (``section``: the config section naming the latter two)."""
    wanted = [
        ("data.prompt_key", cfg.data.prompt_key),
        (f"{section}.chosen_key", chosen),
        (f"{section}.rejected_key", rejected),
    ]
    check_columns(cfg, wanted)


def check_eval_data(cfg: TemperConfig, notes: list[str]) -> None:
    """Files of responses exist and hold the responses column; every row's data source
    finds a reward (as for RL prompts); the metrics file can be written (the eval
    pipeline's pre-flight)."""
    key, files = "evaluate.files", cfg.evaluate.files
    columns, samples = _scan(files, key, cfg)
    column = cfg.evaluate.response_key
    if columns is not None and column.split(".")[0] not in columns and column not in columns:
        raise ConfigError(
            "evaluate.response_key",
            f"the column '{column}' is not in {key} (its columns: {', '.join(sorted(columns))})",
            "set evaluate.response_key to the column holding the responses",
        )
    _check_rewards(cfg, samples, key)
    if cfg.evaluate.output_path:
        writable(Path(cfg.evaluate.output_path).expanduser().parent, "evaluate.output_path")


def _check_weights(cfg: TemperConfig, tags: set[str]) -> None:
    """Every weighted tag (or domain) has prompts, and every prompt a weight — what the
    sampler checks when the run starts."""
    from temper.data.sampler import domains_of

    data = cfg.data
    names = set(tags)
    if data.source_domains:
        names = set(domains_of(sorted(tags), data.source_domains, data.source_default_domain))
    what = "domain(s)" if data.source_domains else "tag(s)"
    empty = sorted(k for k, w in data.source_weights.items() if w > 0 and k not in names)
    if empty:
        raise ConfigError(
            "data.source_weights",
            f"{what} {', '.join(empty)} have a weight but no prompts in data.train_files "
            f"(its {what}: {', '.join(sorted(names))})",
            "give them a weight of 0, or add their data",
        )
    unweighted = sorted(names - set(data.source_weights))
    if unweighted:
        raise ConfigError(
            "data.source_weights",
            f"{what} {', '.join(unweighted)} have prompts but no weight",
            "give every one a weight (0 excludes it)",
        )


def _scan(
    files: list[str], key: str, cfg: TemperConfig
) -> tuple[set[str] | None, set[tuple[str, str]]]:
    """Columns and the (data source, tag) pairs of ``files``, as the data loader reads
    them (a missing source is ``unknown``, a missing tag the source): parquet from its
    schema and those two columns, other files from their rows (up to ``MAX_SCAN_ROWS``)."""
    from temper.data.errors import empty_files_error
    from temper.data.prompts import data_source_of, get_path
    from temper.data.row_formats import ROW_FORMATS
    from temper.data.sources import expand_files, read_file

    row_format = ROW_FORMATS.get(cfg.data.row_format)

    columns: set[str] = set()
    samples: set[tuple[str, str]] = set()
    ds_key, tag_key = cfg.data.data_source_key, cfg.data.tag_key
    paths = expand_files(files, key)
    read = [0]  # rows seen, broken ones included: none at all is an empty file
    for path in paths:
        rows: Iterable[dict[str, Any]]
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                names = set(pq.read_schema(path).names)
                read[0] += pq.read_metadata(path).num_rows
            except (OSError, ValueError) as err:
                raise ConfigError(key, f"cannot read {path}: {err}", "check the file") from err
            columns |= names
            heads = {ds_key.split(".")[0], tag_key.split(".")[0], "data_source"}
            wanted = [c for c in (*heads, *row_format.reads) if c in names]
            rows = pq.read_table(path, columns=wanted).to_pylist() if wanted else [{}]
        else:
            rows = _rows(read_file(path, key), columns, read)
        for raw in rows:
            row = _formatted(row_format, raw, cfg)
            columns |= set(row)
            source = data_source_of(row, ds_key)
            tag = get_path(row, tag_key)
            samples.add(
                (source, source if tag is None or not isinstance(tag, str | int) else str(tag))
            )
    if not read[0]:
        raise empty_files_error(key, paths)
    return columns, samples


def _formatted(row_format: Any, row: dict[str, Any], cfg: TemperConfig) -> dict[str, Any]:
    """``row`` rewritten by ``data.row_format``; as it is where it does not fit (the
    loader reports that row)."""
    from temper.data.errors import RowProblem

    try:
        out: dict[str, Any] = row_format(row, cfg.data)
    except RowProblem:
        return row
    return out


def _rows(
    source_rows: Iterable[Any], columns: set[str], read: list[int]
) -> Iterable[dict[str, Any]]:
    for i, row in enumerate(source_rows):
        if i >= MAX_SCAN_ROWS:
            return
        read[0] += 1
        if row.row is not None:
            columns |= set(row.row)
            yield row.row


def _check_rewards(cfg: TemperConfig, samples: set[tuple[str, str]], key: str) -> None:
    """Every sample finds a reward: the route whose tags hold its tag, a catch-all route,
    else ``reward.function`` — which, for ``auto``, must know the sample's data source."""
    reward = cfg.reward
    if reward.function == "custom" or reward.custom_function.path:
        from temper.rewards.custom import load_custom_function

        load_custom_function(reward.custom_function.path, reward.custom_function.name)
        return
    routed = {t for r in reward.routes.values() for t in (r.tags or [])}
    if any(not r.tags for r in reward.routes.values()) or reward.function != "auto":
        return
    if reward.model.enable and not reward.routes:
        return  # verl: the reward model scores every sample
    from temper.rewards.functions.auto import DATA_SOURCES, function_name_for

    unknown = sorted(
        {s for s, tag in samples if tag not in routed and function_name_for(s) is None}
    )
    if unknown:
        missing = unknown == ["unknown"]
        reason = (
            f"the rows of {key} have no '{cfg.data.data_source_key}' column"
            if missing
            else f"no reward scores the data source(s) {', '.join(map(repr, unknown))} of {key}"
        )
        raise ConfigError(
            "reward.function",
            f"{reason}, and reward.function is auto, which picks a built-in reward by data source",
            "set reward.function (or a custom reward function), or use data sources auto "
            f"knows: {', '.join(sorted(DATA_SOURCES))}",
        )


# --------------------------------------------------------------------------- outputs


def check_outputs(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The run and checkpoint directories can be created and written and have room for a
    checkpoint; the checkpoint a run would resume from (``experiment.resume_mode``) is
    complete, and its config does not change the run's meaning (``resume_strict``); a
    start that would replace the run the directory holds is refused, and a directory a
    live run holds is noted (:func:`~temper.pipelines.run_dir.check_run_dir`).

    Complete here means its manifest and every file's size (a stat per file, cheap for
    any model); ``temper train`` also verifies every file's checksum before it loads
    one, and passes over a damaged one to the newest older checkpoint that verifies."""
    from temper.pipelines.checkpointing import check_resume_config
    from temper.pipelines.run import output_dir
    from temper.pipelines.run_dir import check_run_dir, resume_point

    out = output_dir(cfg)
    resume = resume_point(cfg, out, verify=False)
    check_run_dir(cfg, out, resume, notes)
    if resume is not None:
        check_resume_config(cfg, resume)  # its report is the run's to print
    writable(out, "experiment.output_dir")
    if cfg.experiment.checkpoint_dir:
        writable(Path(cfg.experiment.checkpoint_dir).expanduser(), "experiment.checkpoint_dir")
    for key in ("rollout_data_dir", "validation_data_dir", "render_save_dir"):
        value = getattr(cfg.experiment, key)
        if value:
            writable(Path(value).expanduser(), f"experiment.{key}")
    check_checkpoint_space(cfg, plan, notes)


def check_checkpoint_space(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The checkpoint directory's disk has room for one checkpoint, estimated from the
    models' ``config.json`` (parameters counted on the meta device, no weights read); an
    uncertain estimate (LoRA) that does not fit is a note. A checkpoint is written before
    the retention limit removes an old one, so one more must fit whatever is kept."""
    import shutil

    from temper.pipelines.checkpointing import (
        checkpoint_root,
        estimate_checkpoint_size,
        format_bytes,
    )
    from temper.pipelines.run import output_dir

    try:
        actor = check_model_path(cfg.model.path, "model.path", [])
        critic = None
        if plan.use_critic:
            critic_path = cfg.critic.model_path or cfg.model.path
            critic = check_model_path(critic_path, "critic.model_path", [])
    except ConfigError:
        return  # the models' own check says what is wrong with them
    if actor is None or (plan.use_critic and critic is None):
        return  # a model alias not converted yet: its size is known once it is
    root = checkpoint_root(cfg, output_dir(cfg))
    probe = root.resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    estimate = estimate_checkpoint_size(cfg, actor, critic, on_cpu(cfg))
    key = "experiment.checkpoint_dir" if cfg.experiment.checkpoint_dir else "experiment.output_dir"
    if estimate is None:
        notes.append(f"{key}: a checkpoint's size cannot be estimated for this model here")
        return
    if free >= estimate.bytes:
        return
    need = f"a checkpoint takes about {format_bytes(estimate.bytes)} ({estimate.how})"
    have = f"the disk of {root} has {format_bytes(free)} free"
    if not estimate.certain:
        notes.append(f"{key}: {need}, and {have}")
        return
    raise ConfigError(
        key,
        f"{need}, and {have}",
        "free space there, or set experiment.checkpoint_dir to a disk with room",
    )


def writable(path: Path, key: str) -> None:
    """``path`` exists as a writable directory, or its nearest existing parent is one."""
    probe = path.resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(key, f"{probe} is a file, so {path} cannot be a directory", "")
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "" if probe == path.resolve() else f" (its nearest existing parent {probe})"
        raise ConfigError(
            key, f"{path} cannot be written{where}", "choose a directory you can write"
        )


# --------------------------------------------------------------------------- tools, envs


def check_tools(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The multi-turn tool config loads and names registered tools; the interaction
    config loads and names interactions temper has."""
    mt = cfg.rollout.multi_turn
    if mt.interaction_config_path:
        from temper.rewards.interactions import load_interactions

        try:
            load_interactions(mt.interaction_config_path)
        except (OSError, ValueError) as e:
            raise ConfigError(
                "rollout.multi_turn.interaction_config_path",
                str(e),
                "point it at an interaction YAML whose classes temper has (see "
                "temper.rewards.interactions.INTERACTIONS)",
            ) from e
    if mt.tool_config_path:
        from temper.envs import tools as tool_registry
        from temper.rollout.tools import load_tool_schemas, schema_names

        schemas = load_tool_schemas(mt.tool_config_path)
        unknown = [n for n in schema_names(schemas) if n not in tool_registry.tool_names()]
        if unknown:
            raise ConfigError(
                "rollout.multi_turn.tool_config_path",
                f"tools {unknown} are not in temper's tool registry "
                f"({', '.join(tool_registry.tool_names())})",
                "register them with temper.envs.tools.register_tool, or remove them",
            )


# --------------------------------------------------------------------------- driver

Check = Callable[[TemperConfig, Derived, list[str]], None]


def check_reward_runtime(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The code sandbox runs here, the judge's template and parser resolve, IFEval is
    installed (:func:`temper.rewards.preflight.check_rewards`)."""
    from temper.rewards.preflight import check_rewards

    check_rewards(cfg.reward)


def check_placement(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The roles' devices fit the cluster Ray will have: this machine when no Ray
    address is set (:mod:`temper.pipelines.cluster_fit`)."""
    from temper.pipelines.cluster_fit import check_placement as fit

    fit(cfg, plan, notes)


def check_pipeline_files(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """The run's pipeline's own pre-flight (its record's ``preflight``)."""
    from temper.pipelines.registry import resolve_pipeline

    resolve_pipeline(cfg.pipeline).preflight(cfg, notes)


def check_tracker_setup(cfg: TemperConfig, plan: Derived, notes: list[str]) -> None:
    """Each tracker's package is installed and its ``tracker_kwargs`` are ones it reads."""
    from temper.tracking import check_trackers

    check_trackers(cfg.experiment.trackers, cfg.experiment.tracker_kwargs)


CHECKS: dict[str, Check] = {
    "engines": check_engines,  # first: it settles experiment.device, which placement reads
    "placement": check_placement,
    "rewards": check_reward_runtime,
    "models": check_models,
    "model_files": check_model_files,
    "outputs": check_outputs,
    "pipeline": check_pipeline_files,
    "tools": check_tools,
    "trackers": check_tracker_setup,
}


def preflight(cfg: TemperConfig, plan: Derived, checks: Collection[str] | None = None) -> list[str]:
    """Run the pre-flight ``checks`` (all by default) on ``cfg``; raise a ConfigError for
    the first problem; return the notes of what was settled or has no effect here.
    ``cfg`` is updated in place where a setting is settled (the attention kernel)."""
    from temper.pipelines.registry import resolve_pipeline

    applies = resolve_pipeline(cfg.pipeline).checks  # a pipeline without a run directory
    notes: list[str] = []
    for name, check in CHECKS.items():
        if (checks is None or name in checks) and (applies is None or name in applies):
            check(cfg, plan, notes)
    return notes
