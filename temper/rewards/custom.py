"""Load a user reward function from a Python file (verl ``custom_reward_function``).

The file is imported once per process (:func:`temper.utils.user_code.import_file`);
worker processes receive the path and name, never the function object, and import it
themselves. Errors are ``ConfigError`` naming ``reward.custom_function.path``/``name``.
"""

from __future__ import annotations

import inspect
from typing import Any

from temper.utils.user_code import UserCodeError, import_file

KEY = "reward.custom_function"


def _config_error(key: str, reason: str, fix: str = "") -> Exception:
    from temper.config.errors import ConfigError

    return ConfigError(key, reason, fix)


def _import_file(path: str, key: str) -> Any:
    try:
        return import_file(path, prefix="temper_custom_reward")
    except UserCodeError as err:
        raise _config_error(f"{key}.path", err.reason, err.fix) from err


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
