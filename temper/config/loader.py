"""Read a YAML config the way Hydra composes it, then apply command-line overrides.

- ``defaults:`` lists are composed like Hydra 1.1+: each entry is loaded (relative to
  the file that names it) and merged in order; ``_self_`` marks where the file's own
  keys go (at the end when absent). ``path@_here_`` / ``path@_global_`` merge at the
  root, ``path@pkg`` under ``pkg``, ``group: option`` loads ``group/option.yaml`` under
  ``group``; ``optional`` and ``override`` prefixes are understood.
- Overrides use Hydra's syntax: ``a.b=1``, ``+a.b=1`` (add), ``++a.b=1`` (add or set),
  ``~a.b`` (delete); values are parsed as YAML (``[1,2]``, ``null``, ``1e-6``).
- ``${...}`` interpolations (``${response_length}``, ``${oc.env:HOME}``) are resolved
  after overrides, so an override of ``response_length`` reaches every reference.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from temper.config.errors import ConfigError

_HYDRA_ROOT_PACKAGES = {"_here_", "_global_", ""}


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads ``1e-6`` as a float (YAML 1.1 needs a dot: ``1.0e-6``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def parse_yaml_text(text: str, where: str = "<string>") -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())  # one line, whatever the parser printed
        raise ConfigError(where, f"not valid YAML: {detail}", "fix the YAML syntax") from err


def parse_override_value(raw: str, key: str) -> Any:
    """An override's value: YAML where it parses, else Hydra's looser grammar.

    Hydra accepts unquoted strings YAML's flow syntax rejects (``[task:x?n=1]``), so a
    value that is not YAML is a plain string, or a list of them when bracketed.
    """
    try:
        return yaml.load(raw, Loader=_Loader)
    except yaml.YAMLError:
        pass
    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        items = [item.strip() for item in text[1:-1].split(",") if item.strip()]
        return [parse_override_value(item, key) for item in items]
    return raw


@dataclasses.dataclass
class RawConfig:
    """A composed, override-applied, resolved config as plain Python data."""

    data: dict[str, Any]
    source: str
    from_defaults: set[str] = dataclasses.field(default_factory=set)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(str(path), "config file not found", "check the path")
    data = parse_yaml_text(path.read_text(encoding="utf-8"), str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "a config file must be a mapping at the top level", "")
    return data


def _resolve_entry_path(base: Path, name: str) -> Path:
    candidate = (base / name).resolve()
    if candidate.suffix not in (".yaml", ".yml"):
        for ext in (".yaml", ".yml"):
            with_ext = candidate.with_name(candidate.name + ext)
            if with_ext.is_file():
                return with_ext
        return candidate.with_name(candidate.name + ".yaml")
    return candidate


def _nest(package: str, data: dict[str, Any]) -> dict[str, Any]:
    for part in reversed([p for p in package.split(".") if p]):
        data = {part: data}
    return data


def compose(path: str | Path) -> tuple[DictConfig, set[str]]:
    """Load ``path`` with its defaults list composed; returns (config, keys from defaults)."""
    path = Path(path).expanduser().resolve()
    return _compose(path, stack=())


def _compose(path: Path, stack: tuple[Path, ...]) -> tuple[DictConfig, set[str]]:
    if path in stack:
        chain = " -> ".join(str(p) for p in (*stack, path))
        raise ConfigError("defaults", f"defaults form a cycle: {chain}", "remove the cycle")
    own = _read_yaml(path)
    defaults = own.pop("defaults", None) or []
    if not isinstance(defaults, list):
        raise ConfigError(f"{path}: defaults", "must be a list", "write defaults as a YAML list")
    pieces: list[dict[str, Any]] = []
    from_defaults: set[str] = set()
    self_index = None
    for i, entry in enumerate(defaults):
        if entry == "_self_":
            self_index = len(pieces)
            continue
        optional = False
        if isinstance(entry, dict):
            if len(entry) != 1:
                raise ConfigError(f"{path}: defaults[{i}]", "an entry maps one group", "")
            ((group, option),) = entry.items()
            group = str(group)
            for prefix in ("optional ", "override "):
                if group.startswith(prefix):
                    optional = optional or prefix == "optional "
                    group = group[len(prefix) :]
            if option is None:
                continue
            group, _, package = group.partition("@")
            target = _resolve_entry_path(path.parent, f"{group}/{option}")
            package = package or group.replace("/", ".")
        else:
            name = str(entry)
            if name.startswith("optional "):
                optional, name = True, name[len("optional ") :]
            name, _, package = name.partition("@")
            target = _resolve_entry_path(path.parent, name)
        if not target.is_file():
            if optional:
                continue
            raise ConfigError(
                f"{path}: defaults[{i}]",
                f"'{entry}' names {target}, which does not exist",
                "fix the path (relative to the file that lists it)",
            )
        sub, _ = _compose(target, (*stack, path))
        sub_data = OmegaConf.to_container(sub, resolve=False)
        if package not in _HYDRA_ROOT_PACKAGES:
            sub_data = _nest(package, sub_data)
        from_defaults.update(sub_data.keys())
        pieces.append(sub_data)
    if self_index is None:
        self_index = len(pieces)
    pieces.insert(self_index, own)
    merged = OmegaConf.create({})
    for piece in pieces:
        merged = OmegaConf.merge(merged, OmegaConf.create(piece))
    return merged, from_defaults - set(own.keys())


def parse_override(text: str) -> tuple[str, str, Any]:
    """``'+a.b=[1,2]'`` -> ``('+', 'a.b', [1, 2])``; ops are '', '+', '++', '~'."""
    op = ""
    for prefix in ("++", "+", "~"):
        if text.startswith(prefix):
            op, text = prefix, text[len(prefix) :]
            break
    key, eq, raw = text.partition("=")
    key = key.strip()
    if not key or (not eq and op != "~"):
        raise ConfigError(
            text, "not an override", "write overrides as key=value, +key=value or ~key"
        )
    value = parse_override_value(raw, key) if eq else None
    if isinstance(value, float) and math.isnan(value):
        value = raw
    return op, key, value


def apply_overrides(cfg: DictConfig, overrides: list[str]) -> None:
    """Apply Hydra-syntax overrides in place."""
    for text in overrides:
        op, key, value = parse_override(text)
        exists = (
            OmegaConf.select(cfg, key, throw_on_missing=False, default=_MISSING) is not _MISSING
        )
        if op == "~":
            if not exists:
                raise ConfigError(key, "cannot delete a key that is not set", "check the key")
            parent_key, _, leaf = key.rpartition(".")
            parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
            del parent[leaf]
            continue
        if op == "+" and exists:
            raise ConfigError(
                key, "'+' adds a new key but this key is already set", f"write {key}=…"
            )
        # Like verl's own entry point, a plain override may set a key the file omits:
        # the schema (not the file) decides which keys exist.
        OmegaConf.update(cfg, key, value, merge=False, force_add=True)


_MISSING = object()


def load_yaml(path: str | Path, overrides: list[str] | None = None) -> RawConfig:
    """Compose, override and resolve one config file into plain data."""
    cfg, from_defaults = compose(path)
    apply_overrides(cfg, list(overrides or []))
    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "") or "interpolation"
        raise ConfigError(
            str(key),
            f"cannot resolve: {err.msg if hasattr(err, 'msg') else err}",
            "point the ${...} reference at a key that exists",
        ) from err
    return RawConfig(data=data, source=str(path), from_defaults=from_defaults)
