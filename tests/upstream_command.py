"""An upstream example script's command — its config file and overrides — for the tests
that run one (the shell reading lives with the replay, in ``unit/config/upstream_scripts``)."""

from __future__ import annotations

import sys
from pathlib import Path

UPSTREAM = Path(__file__).resolve().parent / "data" / "upstream"
_SCRIPTS = str(Path(__file__).resolve().parent / "unit" / "config")
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)

from upstream_scripts import script_commands  # noqa: E402  (needs the path above)


def script_command(
    rel: str, index: int = 0, env: dict[str, str] | None = None
) -> tuple[Path, list[str]]:
    """The config and overrides of the ``index``-th trainer command of script ``rel``
    (``<snapshot>/<path>`` under ``tests/data/upstream``; ``env``: variables the user sets
    when running it)."""
    snap, _, path = rel.partition("/")
    cmd = script_commands(UPSTREAM / snap / path, UPSTREAM / snap, env=env)[index]
    return cmd.config, list(cmd.overrides)
