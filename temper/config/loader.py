"""Read a YAML config the way Hydra composes it, then apply command-line overrides.

verl and ROLL users write Hydra configs and Hydra command lines, so composition and
overrides are Hydra's own (hydra-core, the library verl and ROLL run on):

- ``defaults:`` lists — ``_self_``, config groups, packages (``path@_here_``,
  ``group@pkg: option``), ``optional``/``override``, relative paths such as
  ``../config/envs@_here_`` — are composed by :func:`hydra.compose`;
- ``hydra.searchpath`` (in the file or on the command line) adds config directories, as
  in verl's multi-turn examples and recipes (``defaults: [ppo_trainer, _self_]``). A
  relative ``file://`` entry is looked up from the working directory first, as Hydra
  does, then from the config file's directory and its parents — verl's entries are
  relative to the root of a verl checkout, where its scripts are run; a note says which
  directory was used. A ``pkg://`` entry (``pkg://verl.trainer.config``, verl's
  fully-async configs) is the package's directory in the checkout found the same way
  (``verl/trainer/config``), else left to Hydra (an installed package);
- overrides are parsed by Hydra's override grammar: ``a.b=1``, ``+a.b=1`` (add),
  ``++a.b=1`` (add or set), ``~a.b`` (delete), dict and list literals
  (``{max_position_embeddings:32768}``, ``[console,wandb]``), quoting, ``${...}``;
  overrides that name a config group (``actor@actor_rollout_ref.actor=megatron_actor``)
  choose that group's option, as in Hydra.

Two deliberate differences from Hydra, both accepting lines Hydra would refuse (a line
Hydra accepts behaves as in Hydra): a plain ``a.b=1`` may set a key the file does not
have (Hydra demands ``+a.b=1``) — the schema and the dialect tables, not the file,
decide which keys exist, and they answer an unknown key with "did you mean …"; and a
value Hydra's grammar rejects (temper's ``task:arithmetic?n=64&seed=5`` data URIs, ROLL's
``list(range(0,8))`` device mappings) is read as a plain string, or a list of strings
when bracketed. A sweep (``a=1,2``) is refused: temper runs one config.

``${...}`` interpolations are resolved after the overrides, so an override of
``response_length`` reaches every reference. Composing a file is slow (pure-Python YAML
over a tree of files), so the composed file is cached per (file, modification time,
group overrides); overrides are applied to a copy.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import pickle
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from temper.config.errors import ConfigError


@dataclasses.dataclass
class RawConfig:
    """A composed, override-applied, resolved config as plain Python data."""

    data: dict[str, Any]
    source: str
    from_defaults: set[str] = dataclasses.field(default_factory=set)
    notes: list[str] = dataclasses.field(default_factory=list)
    # keys a plain ``key=value`` override added (Hydra would have refused it) -> its text
    added: dict[str, str] = dataclasses.field(default_factory=dict)
    # top-level keys that ``${...}`` interpolations elsewhere in the file read
    referenced: set[str] = dataclasses.field(default_factory=set)
    # the command that reads it (train, generate, eval): one verl file serves several
    # entry points (ppo_trainer.yaml is main_ppo's and main_generation_server's), and
    # which one the user runs is said by the command, not the file
    command: str = "train"


@dataclasses.dataclass(frozen=True)
class Override:
    """One command-line override: ``op`` is '', '+', '++' or '~'."""

    op: str
    key: str
    value: Any
    text: str
    has_value: bool = True


# --------------------------------------------------------------------------- YAML


def parse_yaml_text(text: str, where: str = "<string>") -> Any:
    """YAML as OmegaConf (and so Hydra) reads it: ``1e-6`` is a float; one-line errors."""
    from omegaconf._utils import get_yaml_loader

    try:
        return yaml.load(text, Loader=get_yaml_loader())
    except yaml.YAMLError as err:
        raise ConfigError(
            where, f"not valid YAML: {_one_line(str(err))}", "fix the YAML syntax"
        ) from err


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------- overrides

_KEY = re.compile(r"^(\+\+|\+|~)?([A-Za-z0-9_@/.\-\[\]]+)(=(.*))?$", re.S)


def _lenient_value(raw: str) -> Any:
    """A value Hydra's grammar rejects: a string, or a list of strings when bracketed."""
    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        return [_lenient_value(item) for item in text[1:-1].split(",") if item.strip()]
    return raw


def parse_overrides(texts: Sequence[str]) -> list[Override]:
    """Hydra's override grammar, one :class:`Override` per text (see the module doc)."""
    from hydra.errors import HydraException

    out = []
    for text in texts:
        try:
            parsed = _parse_one(text)
        except HydraException as err:
            m = _KEY.match(text)
            if m is None or m.group(3) is None or m.group(1) == "~":
                reason = _one_line(str(err)).split(" See https://")[0]
                raise ConfigError(
                    text,
                    f"not an override ({reason})",
                    "write key=value, +key=value (add), ++key=value (add or set) or ~key "
                    "(delete); quote values with spaces or special characters: key='a b'",
                ) from err
            out.append(Override(m.group(1) or "", m.group(2), _lenient_value(m.group(4)), text))
            continue
        if parsed.is_sweep_override():
            raise ConfigError(
                text,
                "a Hydra sweep (multirun: one run per value); temper runs one config",
                f"write a list as {parsed.key_or_group}=[…], or quote a string with commas",
            )
        op = "~" if parsed.is_delete() else "+" if parsed.is_add() else ""
        op = "++" if parsed.is_force_add() else op
        key = parsed.key_or_group if parsed.package is None else text.split("=")[0].lstrip("+~")
        has_value = not (parsed.is_delete() and parsed.value() is None)
        out.append(Override(op, key, parsed.value(), text, has_value))
    return out


@functools.cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


@functools.lru_cache(maxsize=4096)
def _parse_one(text: str) -> Any:
    """Hydra's parse of one override (ANTLR, ~1 ms); an Override only describes the text,
    so parses are memoized — command lines repeat the same overrides."""
    return _parser().parse_override(text)


def parse_override(text: str) -> tuple[str, str, Any]:
    """``'+a.b=[1,2]'`` -> ``('+', 'a.b', [1, 2])``; ops are '', '+', '++', '~'."""
    o = parse_overrides([text])[0]
    return o.op, o.key, o.value if o.has_value else None


_MISSING = object()


def apply_overrides(cfg: DictConfig, overrides: Sequence[Override]) -> dict[str, str]:
    """Apply config overrides in place, with Hydra's semantics (see the module doc).

    Returns the keys that plain ``key=value`` overrides added (Hydra would refuse those).
    """
    OmegaConf.set_struct(cfg, False)
    added: dict[str, str] = {}
    for o in overrides:
        current = OmegaConf.select(
            cfg,
            o.key,
            throw_on_missing=False,
            throw_on_resolution_failure=False,
            default=_MISSING,
        )
        exists = current is not _MISSING
        if o.op == "~":
            if not exists:
                raise ConfigError(o.key, "cannot delete a key that is not set", "check the key")
            if o.has_value and o.value != current:
                raise ConfigError(
                    o.key,
                    f"cannot delete: its value is {current!r}, not {o.value!r}",
                    f"write ~{o.key} to delete whatever it holds",
                )
            parent_key, _, leaf = o.key.rpartition(".")
            parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
            del parent[leaf]
            continue
        if o.op == "+" and exists and current is not None and not isinstance(o.value, dict | list):
            raise ConfigError(
                o.key,
                f"'+' adds a key, but it is already set (to {current!r})",
                f"write {o.key}=… to change it, or ++{o.key}=… to add or change it",
            )
        if o.op == "" and not exists:
            added[o.key] = o.text
        try:
            OmegaConf.update(cfg, o.key, o.value, merge=True, force_add=True)
        except OmegaConfBaseException as err:
            raise ConfigError(o.key, f"cannot apply {o.text!r}: {_one_line(str(err))}", "") from err
    return added


# --------------------------------------------------------------------------- composition


def _searchpath(
    primary: Path, own: dict[str, Any], overrides: list[Override]
) -> tuple[list[str] | None, list[str]]:
    """Absolute ``hydra.searchpath`` entries (or None when unset) and notes on them."""
    given: Any = None
    for o in overrides:
        if o.key == "hydra.searchpath":
            given = o.value
    if given is None:
        hydra_node = own.get("hydra")
        given = hydra_node.get("searchpath") if isinstance(hydra_node, dict) else None
    if given is None:
        return None, []
    if not isinstance(given, list) or not all(isinstance(v, str) for v in given):
        raise ConfigError("hydra.searchpath", f"must be a list of strings, got {given!r}", "")
    out, notes = [], []
    for entry in given:
        scheme, sep, rest = entry.partition("://")
        bases = [Path.cwd(), primary.parent, *primary.parent.parents]
        if sep and scheme == "pkg":
            # a package's config directory (verl's fully-async configs name
            # pkg://verl.trainer.config): the checkout the file sits in holds the package's
            # source, which Hydra would import from an installed copy
            package = rest.replace(".", "/")
            local = next((b / package for b in bases if (b / package).is_dir()), None)
            if local is None:  # not in this checkout: an installed package, as Hydra reads it
                out.append(entry)
                continue
            notes.append(f"hydra.searchpath: '{entry}' read from {local.resolve()}")
            out.append(f"file://{local.resolve()}")
            continue
        if not sep or scheme != "file" or os.path.isabs(rest):
            out.append(entry)
            continue
        found = next((b / rest for b in bases if (b / rest).is_dir()), None)
        if found is None:
            raise ConfigError(
                "hydra.searchpath",
                f"'{entry}' is not a directory relative to the working directory "
                f"({Path.cwd()}) or to the config file's directory or its parents",
                "run from the directory the path is relative to (for verl: the root of the "
                "verl checkout), or make the entry absolute",
            )
        found = found.resolve()
        if found != (Path.cwd() / rest).resolve():
            notes.append(f"hydra.searchpath: '{entry}' found at {found} (above the config file)")
        out.append(f"file://{found}")
    return out, notes


def _is_group(name: str, dirs: Sequence[Path]) -> bool:
    """Whether ``name`` (``a`` or ``a/b``; a dotted name is a config key) is a Hydra config
    group under one of ``dirs``."""
    rel = name.split("@")[0]
    return bool(rel) and "." not in rel and any((d / rel).is_dir() for d in dirs)


@functools.lru_cache(maxsize=64)
def _compose_cached(
    config_dir: str, name: str, hydra_overrides: tuple[str, ...], stamp: tuple[int, ...]
) -> bytes:
    """Hydra's composition of ``name`` in ``config_dir`` (``stamp`` invalidates edits),
    pickled: a copy per use unpickles ~4× faster than a deepcopy of the DictConfig."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with warnings.catch_warnings():
        # "Defaults list is missing `_self_`": Hydra then puts the file's own keys last,
        # which is what ROLL's and verl's files mean.
        warnings.simplefilter("ignore", UserWarning)
        with initialize_config_dir(config_dir=config_dir, version_base=None, job_name="temper"):
            cfg = compose(config_name=name, overrides=list(hydra_overrides))
    GlobalHydra.instance().clear()
    return pickle.dumps(cfg)


def _compose(path: Path, own: dict[str, Any], group_overrides: list[str]) -> DictConfig:
    from hydra.errors import HydraException

    stamp = (path.stat().st_mtime_ns,)
    name = path.stem
    config_dir = str(path.parent)
    if path.suffix != ".yaml":  # Hydra reads <name>.yaml only: register the file itself
        from hydra.core.config_store import ConfigStore

        name = f"__temper_{path.stem}"
        ConfigStore.instance().store(name=name, node=OmegaConf.create(own))
    try:
        blob = _compose_cached(config_dir, name, tuple(group_overrides), stamp)
    except (HydraException, OmegaConfBaseException, yaml.YAMLError) as err:
        raise _composition_error(path, err) from err
    except UnicodeDecodeError as err:  # a file of its defaults list (its own was read)
        raise _not_text(_file_being_read(err) or f"{path}: defaults", err) from err
    cfg = pickle.loads(blob)
    assert isinstance(cfg, DictConfig)
    return cfg


def _composition_error(path: Path, err: BaseException) -> ConfigError:
    text = _one_line(str(err)).split(" See https://")[0]
    text = text.replace("Defaults list is missing `_self_`.", "").strip()
    cause = err.__cause__ or err.__context__
    if isinstance(cause, yaml.YAMLError):
        return ConfigError(str(path), f"not valid YAML: {_one_line(str(cause))}", "fix the syntax")
    if type(err).__name__ == "MissingConfigException":
        what, _, where = text.partition(" Config search path:")
        dirs = re.findall(r"path=file://(\S+)", where)
        looked = f"; looked in {', '.join(dirs)}" if dirs else ""
        return ConfigError(
            f"{path}: defaults",
            f"{what.rstrip('.')} — it does not exist{looked} (entries are relative to the "
            "file that lists them, or to a hydra.searchpath directory)",
            "fix the entry, or add the directory that holds it to hydra.searchpath",
        )
    return ConfigError(f"{path}", f"cannot compose: {text}", "fix the defaults list or overrides")


@functools.cache
def _fast_yaml_for_omegaconf() -> None:
    """OmegaConf (so Hydra) reads every YAML file with a pure-Python loader class it builds
    anew per file; composing ROLL's or verl's files spends most of its time there. Where
    libyaml is installed, the same loader — duplicate-key check, float and timestamp
    resolvers, constructors — is built once over libyaml's C parser (measured: ~3× faster
    composition of the upstream ROLL files)."""
    if not getattr(yaml, "__with_libyaml__", False):
        return
    import omegaconf._utils as oc_utils

    python_loader = oc_utils.get_yaml_loader()

    class CLoader(yaml.CSafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> Any:
            keys = set()
            for key_node, _value in node.value:
                if key_node.tag != yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    continue
                if key_node.value in keys:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value}",
                        key_node.start_mark,
                    )
                keys.add(key_node.value)
            return yaml.constructor.SafeConstructor.construct_mapping(self, node, deep=deep)

    CLoader.yaml_implicit_resolvers = python_loader.yaml_implicit_resolvers
    CLoader.yaml_constructors = dict(python_loader.yaml_constructors)
    oc_utils.get_yaml_loader = lambda: CLoader


@functools.cache
def _memoize_interpolation_parsing() -> None:
    """OmegaConf parses every ``${...}`` string with its ANTLR grammar (pure Python, about
    a millisecond each) whenever it resolves one; verl's default config holds ~200 of
    them. A parse tree is a pure function of the string, and resolution only reads it,
    so the parses are memoized (measured: resolving verl's config 0.26 s -> 0.09 s)."""
    import omegaconf.base

    omegaconf.base.parse = functools.lru_cache(maxsize=4096)(omegaconf.base.parse)


@functools.lru_cache(maxsize=64)
def _read_own(path: Path, _mtime: int) -> Any:
    return parse_yaml_text(read_config_text(path), str(path))


def read_config_text(path: Path) -> str:
    """The text of config file ``path``; a ConfigError naming the file when it cannot be
    read or is not UTF-8 text (a binary file, a Latin-1 export)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise _not_text(str(path), err) from err
    except OSError as err:
        raise ConfigError(
            str(path), f"cannot be read: {err.strerror or err}", "check the file's permissions"
        ) from err


def _file_being_read(err: BaseException) -> str | None:
    """The file Hydra was reading when ``err`` was raised: its file config source holds
    it as ``full_path`` (None if this Hydra names it otherwise)."""
    found = None
    tb = err.__traceback__
    while tb is not None:
        name = tb.tb_frame.f_locals.get("full_path")
        found = name if isinstance(name, str) else found
        tb = tb.tb_next
    return found


def _not_text(where: str, err: UnicodeDecodeError) -> ConfigError:
    byte = err.object[err.start : err.start + 1].hex()
    return ConfigError(
        where,
        f"not UTF-8 text (byte 0x{byte} at offset {err.start}): a config file is YAML text",
        "save it as UTF-8, or check that this is the config file",
    )


def load_yaml(path: str | Path, overrides: Sequence[str] | None = None) -> RawConfig:
    """Compose, override and resolve one config file into plain data."""
    _memoize_interpolation_parsing()
    _fast_yaml_for_omegaconf()
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(str(path), "config file not found", "check the path")
    own = copy.deepcopy(_read_own(path, path.stat().st_mtime_ns))
    if own is None:
        own = {}
    if not isinstance(own, dict):
        raise ConfigError(str(path), "a config file must be a mapping at the top level", "")
    parsed = parse_overrides(list(overrides or []))
    searchpath, notes = _searchpath(path, own, parsed)
    hydra_node = own.get("hydra")
    if isinstance(hydra_node, dict) and set(hydra_node) - {"searchpath"}:
        runtime = ", ".join(f"hydra.{k}" for k in hydra_node if k != "searchpath")
        notes.append(f"{runtime}: Hydra runtime settings; temper never changes directory")
    dirs = [path.parent] + [Path(p.partition("://")[2]) for p in searchpath or []]
    hydra_overrides: list[str] = []
    config_overrides: list[Override] = []
    for o in parsed:
        if o.key.startswith("hydra."):
            if o.key != "hydra.searchpath":
                notes.append(f"{o.text}: a Hydra runtime setting; temper never changes directory")
        elif "/" in o.key or "@" in o.key or _is_group(o.key, dirs):
            hydra_overrides.append(o.text)
        else:
            config_overrides.append(o)
    if searchpath is not None:
        hydra_overrides.append(f"hydra.searchpath=[{','.join(repr(p) for p in searchpath)}]")
    cfg = _compose(path, own, hydra_overrides)
    added = apply_overrides(cfg, config_overrides)
    referenced = _referenced(OmegaConf.to_container(cfg, resolve=False))
    try:
        resolved = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "") or "interpolation"
        msg = getattr(err, "msg", None) or str(err)
        raise ConfigError(
            str(key),
            f"cannot resolve: {_one_line(str(msg))}",
            "point the ${...} reference at a key that exists (or set the environment "
            "variable it reads)",
        ) from err
    assert isinstance(resolved, dict)  # a config file is a mapping
    data = {str(k): v for k, v in resolved.items()}
    own_keys = set(own) - {"defaults", "hydra"}
    from_defaults = {str(k) for k in data} - own_keys - {o.key.split(".")[0] for o in parsed}
    return RawConfig(
        data=data,
        source=str(path),
        from_defaults=from_defaults,
        notes=notes,
        added=added,
        referenced=referenced,
    )


_INTERPOLATION = re.compile(r"\$\{(?:oc\.select:)?\s*([A-Za-z_][\w\-]*)")


def _referenced(node: Any) -> set[str]:
    """First segments of the keys ``${...}`` interpolations in ``node`` read."""
    out: set[str] = set()
    if isinstance(node, dict):
        for v in node.values():
            out |= _referenced(v)
    elif isinstance(node, list):
        for v in node:
            out |= _referenced(v)
    elif isinstance(node, str) and "${" in node:
        out.update(m.group(1) for m in _INTERPOLATION.finditer(node))
    return out
