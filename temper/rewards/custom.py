"""Load a user reward function from a Python file (verl ``custom_reward_function``).

The file is imported with ``importlib`` under a module name derived from its absolute
path (so two files with the same stem do not collide) and cached per process; worker
processes receive the path and name, never the function object, and import it
themselves. Errors are ``ConfigError`` naming ``reward.custom_function.path``/``name``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

KEY = "reward.custom_function"
_MODULES: dict[str, ModuleType] = {}


def _config_error(key: str, reason: str, fix: str = "") -> Exception:
    from temper.config.errors import ConfigError

    return ConfigError(key, reason, fix)


def _import_file(path: str, key: str) -> ModuleType:
    resolved = str(Path(path).expanduser().resolve())
    if resolved in _MODULES:
        return _MODULES[resolved]
    if not Path(resolved).is_file():
        raise _config_error(
            f"{key}.path", f"file '{path}' does not exist", "point it at a Python file"
        )
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:12]
    module_name = f"temper_custom_reward_{Path(resolved).stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise _config_error(f"{key}.path", f"'{path}' cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(module_name, None)
        raise _config_error(
            f"{key}.path", f"importing '{path}' raised {type(err).__name__}: {err}"
        ) from err
    _MODULES[resolved] = module
    return module


def load_custom_function(path: str | None, name: str, key: str = KEY) -> Any:
    """The callable ``name`` defined in the file ``path``."""
    if not path:
        raise _config_error(
            f"{key}.path",
            "is not set but the custom reward function is selected",
            "set it to the Python file that defines the function",
        )
    module = _import_file(path, key)
    if not hasattr(module, name):
        defined = sorted(
            n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
        )
        raise _config_error(
            f"{key}.name",
            f"'{name}' is not defined in '{path}'",
            f"use one of: {', '.join(defined)}" if defined else "define it in that file",
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise _config_error(
            f"{key}.name", f"'{name}' in '{path}' is a {type(fn).__name__}, not a function"
        )
    return fn
