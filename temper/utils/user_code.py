"""Import the user's own code: a Python file, or a module by its dotted name.

Reward functions (``reward.custom_function.path``) and pipelines (``pipeline:
my_pkg.my_module:NAME`` or ``path/to/file.py:NAME``) come from the user's code. A file
is imported under a module name derived from its absolute path (two files with the same
stem do not collide; dataclasses and pickling find it in ``sys.modules``) and cached per
process. A dotted module is imported from ``sys.path`` or, as ``python -m`` would find
it, from the working directory. Failures raise :class:`UserCodeError` (the reason and
the fix), which the caller turns into a ``ConfigError`` naming its key.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_FILES: dict[str, ModuleType] = {}


class UserCodeError(Exception):
    """The user's code could not be imported or found: ``reason`` and ``fix``."""

    def __init__(self, reason: str, fix: str = "") -> None:
        self.reason, self.fix = reason, fix
        super().__init__(reason)


def import_file(path: str, prefix: str = "temper_user") -> ModuleType:
    """The module the Python file ``path`` defines (imported once per process)."""
    resolved = str(Path(path).expanduser().resolve())
    if resolved in _FILES:
        return _FILES[resolved]
    if not Path(resolved).is_file():
        raise UserCodeError(
            f"file '{path}' does not exist (relative paths start at {Path.cwd()})",
            "point it at a Python file",
        )
    digest = hashlib.sha1(resolved.encode()).hexdigest()[:12]
    name = f"{prefix}_{Path(resolved).stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"'{path}' cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(name, None)
        raise UserCodeError(
            f"importing '{path}' raised {type(err).__name__}: {err}", "fix that file"
        ) from err
    _FILES[resolved] = module
    return module


def import_dotted(module: str) -> ModuleType:
    """Module ``module`` from ``sys.path``, else from the working directory."""
    try:
        return _import(module)
    except ModuleNotFoundError as err:
        here = Path.cwd()
        top = module.split(".")[0]
        missing_top = err.name == top and str(here) not in sys.path
        if not missing_top or not ((here / top).is_dir() or (here / f"{top}.py").is_file()):
            raise UserCodeError(
                f"cannot import {module}: {err}",
                "put its package on PYTHONPATH (or run from the directory that holds it)",
            ) from err
    sys.path.insert(0, str(here))  # as `python -m` would: the working directory
    return _import(module)


def _import(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise
    except Exception as err:
        raise UserCodeError(
            f"importing {module} raised {type(err).__name__}: {err}", "fix that module"
        ) from err
