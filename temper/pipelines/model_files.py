"""What a model directory must hold for a run to start, read without loading weights.

``config.json`` alone (the pre-flight's first look) says nothing of the weights beside
it or of whether this ``transformers`` can build the model. The checks here read
what loading would read first, and raise a ``ConfigError`` naming the config key of
the model and the file:

- :func:`check_weights`: a weight file is there (safetensors, sharded or not, or
  PyTorch ``.bin``); every safetensors file's header — its 8-byte length and its JSON
  table of tensors — parses and its tensors end where the file ends (a truncated or
  garbage file fails here, not in ``from_pretrained``); an index names files that
  exist and tensors they hold; a ``.bin`` file is not empty;
- :func:`check_architecture`: ``model_type`` is one this ``transformers`` knows, or
  the directory ships its own code and ``trust_remote_code`` allows it;
- :func:`check_vocab`: the tokenizer whose ids the model reads has no id past the
  model's ``vocab_size`` (an embedding lookup past the table fails mid-run);
- :func:`context_length` / :func:`check_context`: the tokens a sequence may reach fit
  the model's positions (``max_position_embeddings`` or its equivalent, extended by a
  ``rope_scaling`` factor);
- :func:`check_attention`: ``model.attn_implementation`` is a kernel this
  ``transformers`` has.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from temper.config.errors import ConfigError, unknown_name

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
#: The weight files ``from_pretrained`` looks for, in its order of preference.
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, BIN, BIN_INDEX)
#: A safetensors header larger than this is garbage, not a table of tensors (the format
#: itself caps it at 100 MB).
MAX_HEADER_BYTES = 100_000_000


# --------------------------------------------------------------------------- weights


def safetensors_tensors(path: Path) -> dict[str, Any]:
    """The tensor table of safetensors file ``path`` (header only); ``ValueError`` saying
    what is wrong with it."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"it is {size} bytes, too short for a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise ValueError(
                f"its header claims {length} bytes but the file holds {size - 8} after the "
                "length (truncated, or not a safetensors file)"
            )
        raw = f.read(length)
    try:
        table = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"its header is not JSON ({err})") from err
    if not isinstance(table, dict):
        raise ValueError("its header is not a table of tensors")
    tensors = {k: v for k, v in table.items() if k != "__metadata__"}
    end = 0
    for name, entry in tensors.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2):
            raise ValueError(f"its header gives tensor '{name}' no data_offsets")
        end = max(end, int(offsets[1]))
    data = size - 8 - length
    if end != data:
        what = "truncated" if end > data else "has bytes no tensor claims"
        raise ValueError(f"its tensors span {end} bytes but {data} follow the header ({what})")
    return tensors


def check_weights(directory: Path, key: str) -> None:
    """The weight files of model ``directory`` are there and readable (module doc)."""
    present = [name for name in WEIGHT_FILES if (directory / name).is_file()]
    if not present:
        loose = sorted(p.name for p in directory.glob("*.safetensors"))
        found = f" (it has {', '.join(loose[:3])} but no {SAFETENSORS_INDEX})" if loose else ""
        raise ConfigError(
            key,
            f"{directory} holds no weights: none of {', '.join(WEIGHT_FILES)}{found}",
            "point it at the directory save_pretrained wrote (weights included)",
        )
    first = present[0]
    if first == SAFETENSORS:
        _safetensors(directory / SAFETENSORS, key)
    elif first == BIN:
        _bin(directory / BIN, key)
    else:
        _index(directory / first, key)


def _safetensors(path: Path, key: str) -> dict[str, Any]:
    try:
        return safetensors_tensors(path)
    except OSError as err:
        raise ConfigError(key, f"{path} cannot be read: {err.strerror or err}", _REWRITE) from err
    except ValueError as err:
        raise ConfigError(key, f"{path} is not a valid safetensors file: {err}", _REWRITE) from err


def _bin(path: Path, key: str) -> None:
    try:
        with path.open("rb") as f:
            empty = not f.read(1)
    except OSError as err:
        raise ConfigError(key, f"{path} cannot be read: {err.strerror or err}", _REWRITE) from err
    if empty:
        raise ConfigError(key, f"{path} is empty", _REWRITE)


def _index(path: Path, key: str) -> None:
    """A sharded checkpoint's index: its shards exist, parse, and hold what it names."""
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
        assert isinstance(weight_map, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as err:
        raise ConfigError(
            key, f"{path} is not a weight index (JSON with a weight_map): {err}", _REWRITE
        ) from err
    by_file: dict[str, list[str]] = {}
    for tensor, file in weight_map.items():
        by_file.setdefault(str(file), []).append(str(tensor))
    for file, names in sorted(by_file.items()):
        shard = path.parent / file
        if not shard.is_file():
            raise ConfigError(
                key, f"{path.name} names {file}, which is not in {path.parent}", _REWRITE
            )
        if file.endswith(".safetensors"):
            missing = sorted(set(names) - set(_safetensors(shard, key)))
            if missing:
                raise ConfigError(
                    key,
                    f"{path.name} places {len(missing)} tensor(s) in {file} that it does not "
                    f"hold (first: {missing[0]})",
                    _REWRITE,
                )
        else:
            _bin(shard, key)


_REWRITE = "re-save or re-download the model"


# --------------------------------------------------------------------------- architecture


def check_architecture(
    config: Mapping[str, Any], directory: Path | None, key: str, trust_key: str, trust: bool
) -> None:
    """``model_type`` is known to this ``transformers`` (registrations made by an
    imported ``external_lib`` included), or the model ships its own code — an
    ``auto_map`` whose files are in ``directory`` — and ``trust`` allows running it."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = config.get("model_type")
    auto_map = config.get("auto_map") if isinstance(config.get("auto_map"), dict) else None
    if auto_map and trust:
        _check_remote_code(auto_map, directory, key)
        return
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
        return
    # without a model_type transformers matches a known type in the path (a gpt2-… dir)
    if (
        model_type is None
        and directory is not None
        and any(t in str(directory) for t in CONFIG_MAPPING)
    ):
        return
    what = f"model_type '{model_type}'" if model_type else "no model_type"
    if auto_map:
        raise ConfigError(
            key,
            f"config.json names {what}, which transformers {transformers.__version__} does not "
            "know; the model ships its own code (auto_map), which runs only when trusted",
            f"set {trust_key}=true if you trust that code",
        )
    raise ConfigError(
        key,
        f"config.json names {what}, which transformers {transformers.__version__} does not know",
        "use a transformers version that has this architecture, or set model.external_lib "
        "to the module that registers it",
    )


def _check_remote_code(auto_map: Mapping[str, Any], directory: Path | None, key: str) -> None:
    """The files an ``auto_map`` names are in the model directory (a reference to another
    hub repo, ``repo--module.Class``, is that repo's business)."""
    if directory is None:
        return
    for ref in auto_map.values():
        for item in ref if isinstance(ref, list) else [ref]:
            if not isinstance(item, str) or "--" in item or "." not in item:
                continue
            module = item.rsplit(".", 1)[0]
            if not (directory / f"{module.replace('.', '/')}.py").is_file():
                raise ConfigError(
                    key,
                    f"config.json's auto_map names {item}, but {directory} holds no {module}.py",
                    "copy the model's code files into its directory (or re-download it)",
                )


# --------------------------------------------------------------------------- vocabulary


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config (a vision-language model nests it)."""
    for name in ("text_config", "llm_config", "language_config"):
        inner = config.get(name)
        if isinstance(inner, dict):
            return inner
    return config


def tokenizer_size(path: Path, key: str, trust: bool) -> int:
    """``len(tokenizer)`` of the tokenizer in ``path`` (the tokenizer is loaded: small)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    # loading reads config.json too; its warnings (an eos id past a too-small vocabulary)
    # would precede the one line that says what is wrong
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust)
    except Exception as err:  # a broken tokenizer file raises what its parser raises
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        raise ConfigError(
            key,
            f"the tokenizer in {path} cannot be loaded: {reason}",
            "re-save the tokenizer (tokenizer.json / tokenizer_config.json) there",
        ) from err
    finally:
        hf_logging.set_verbosity(verbosity)
    return len(tokenizer)


def check_vocab(config: Mapping[str, Any], size: int, key: str, tokenizer: str) -> None:
    """Every id of a tokenizer of ``size`` tokens has a row in the model's embedding."""
    vocab = text_config(config).get("vocab_size", config.get("vocab_size"))
    if isinstance(vocab, int) and size > vocab:
        raise ConfigError(
            key,
            f"the tokenizer ({tokenizer}) has {size} tokens but config.json's vocab_size is "
            f"{vocab}: ids from {vocab} on have no embedding",
            "use the tokenizer saved with this model, or resize the model's embeddings "
            "(resize_token_embeddings) and save it",
        )


# --------------------------------------------------------------------------- context

#: Keys that bound a model's positions, as vLLM reads them (the smallest one binds).
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
#: RoPE scalings whose ``max_position_embeddings`` is already the extended length.
EXTENDED_ALREADY = ("llama3", "longrope", "su")


def context_length(config: Mapping[str, Any]) -> int | None:
    """The longest sequence the model's positions cover, or None where its config does
    not say. A ``rope_scaling`` (transformers 5: ``rope_parameters``) with a ``factor``
    extends it: ``original_max_position_embeddings`` (else the length) × factor, as vLLM
    derives it; llama3 and longrope scalings state the extended length already."""
    text = text_config(config)
    found = [text[k] for k in POSITION_KEYS if isinstance(text.get(k), int) and text[k] > 0]
    if not found:
        return None
    length = int(min(found))
    rope = text.get("rope_scaling") or text.get("rope_parameters")
    if isinstance(rope, dict):
        kind = rope.get("rope_type", rope.get("type"))
        factor = rope.get("factor")
        if kind not in EXTENDED_ALREADY and isinstance(factor, int | float) and factor > 1:
            base = rope.get("original_max_position_embeddings")
            base = base if kind == "yarn" and isinstance(base, int) else length
            length = max(length, int(base * factor))
    return length


def check_context(
    config: Mapping[str, Any], key: str, need: int, keys: tuple[str, ...], what: str
) -> None:
    """``need`` tokens (``what``, the sum of ``keys``, named in the fix: a reason is not
    translated into the user's dialect, a fix is) fit the model's context."""
    limit = context_length(config)
    if limit is None or need <= limit:
        return
    raise ConfigError(
        key,
        f"{what} may reach {need} tokens, more than the model's context of {limit} "
        "(config.json's max_position_embeddings, with any rope scaling)",
        f"lower {' and '.join(keys)} to fit {limit} tokens, or use a model with a longer context",
    )


# --------------------------------------------------------------------------- attention


#: Names valid whatever this transformers registers (``auto`` is temper's: sdpa).
ALWAYS = ("auto", "eager", "sdpa", "flash_attention_2")


def check_attention(name: str, key: str = "model.attn_implementation") -> None:
    """``name`` is an attention kernel this ``transformers`` has: eager or one of its
    attention functions, or a hub kernel (``org/repo``) when the kernels package is
    installed. (Whether this machine runs it is the engines' pre-flight.)"""
    if name in ALWAYS:
        return
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    valid = ["auto", "eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    if name in valid:
        return
    if "/" in name and importlib.util.find_spec("kernels") is not None:
        return  # a hub kernel: transformers fetches it through the kernels package
    raise unknown_name(key, name, valid)


def check_sdpa(config: Mapping[str, Any], name: str) -> None:
    """``sdpa`` asked of a model whose transformers class has no SDPA attention (gpt-oss:
    SDPA cannot add its sinks) is refused here, as loading it would be; ``auto`` picks
    eager for it."""
    from temper.training.attention_kind import declares

    if name == "sdpa" and not declares(config, "_supports_sdpa"):
        raise ConfigError(
            "model.attn_implementation",
            f"{config.get('model_type')} does not run transformers' SDPA attention",
            "set model.attn_implementation: eager (or auto, which picks it here)",
        )
