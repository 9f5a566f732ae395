"""``temper check``'s pre-flight of the run's models (:mod:`temper.pipelines.preflight`):
each a model directory with a ``config.json`` (or a hub id in the local cache or
reachable), read, not loaded; then the files of each model the run loads — weights,
architecture, tokenizer, context — without loading a weight."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from temper.config.derive import Derived
from temper.config.errors import ConfigError
from temper.config.lora_adapter import check_adapter_dir
from temper.config.schema import TemperConfig, TrainEngineConfig
from temper.pipelines.ulysses_check import splits_sequences
from temper.training.ulysses import check_model as check_ulysses_model

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


def _splitting_roles(cfg: TemperConfig, key: str) -> list[tuple[str, TrainEngineConfig]]:
    """The trained roles that run the model at ``key`` on an engine that splits its
    sequences (Ulysses)."""
    roles: list[tuple[str, TrainEngineConfig]] = []
    if key == "model.path":
        roles.append(("actor", cfg.actor))
    if key == ("critic.model_path" if cfg.critic.model_path else "model.path"):
        roles.append(("critic", cfg.critic))
    return [(role, engine) for role, engine in roles if splits_sequences(engine.strategy)]


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
        for role, engine in _splitting_roles(cfg, use.key):
            check_ulysses_model(config, role, engine.ulysses_sequence_parallel_size)
        if use.key in ("model.path", "critic.model_path"):
            files.check_sdpa(config, cfg.model.attn_implementation)
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
