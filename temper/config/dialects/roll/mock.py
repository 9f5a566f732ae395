"""ROLL's ``rollout_mock`` (its precision-alignment mechanism) in an RLVR or agentic file.

ROLL's rollout schedulers, with ``rollout_mock.enable``, either *dump* every step's
generated batch (``mode: dump``: a pickled ``DataProto`` per step under
``<dump_dir>/train`` and ``<dump_dir>/val``) while the run trains as usual, or *replay*
such dumps in place of generation (``mode: mock``). A dump run is an ordinary training
run that also writes what it generated: here that is ``experiment.rollout_data_dir``
and ``experiment.validation_data_dir`` (``<dump_dir>/train``, ``<dump_dir>/val``), one
``<step>.jsonl`` of rows (prompt, response, score, reward, advantage) per step — the
same generations, not ROLL's pickles. A replay needs ROLL's pickles, which temper cannot
read: it is refused.
"""

from __future__ import annotations

import os

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Rule, Use
from temper.config.dialects.roll.derive import Ctx
from temper.config.errors import ConfigError

DERIVED = "experiment.rollout_data_dir and validation_data_dir (mode dump)"
#: ROLL's RolloutMockConfig defaults.
DEFAULT_MODE, DEFAULT_DIR = "dump", "./rollout_mock_dumps"


@derivation("rollout_mock.enable", "rollout_mock.mode", "rollout_mock.dump_dir")
def rollout_mock(ctx: Ctx) -> None:
    """The dump directories of an enabled ``rollout_mock`` (module docstring)."""
    if not ctx.get("rollout_mock.enable"):
        return
    mode = ctx.get("rollout_mock.mode") or DEFAULT_MODE
    if mode != "dump":
        raise ConfigError(
            "rollout_mock.mode",
            f"'{mode}' replays ROLL's pickled batches of an earlier dump run in place of "
            "generation; temper cannot read them",
            "use mode: dump (the run generates and writes its batches), or set "
            "rollout_mock.enable: false",
        )
    where = str(ctx.get("rollout_mock.dump_dir") or DEFAULT_DIR)
    ctx.write("experiment.rollout_data_dir", os.path.join(where, "train"), "rollout_mock.dump_dir")
    ctx.write("experiment.validation_data_dir", os.path.join(where, "val"), "rollout_mock.dump_dir")
    ctx.remark(
        "rollout_mock: each step's generations go to <dump_dir>/train and <dump_dir>/val as "
        "<step>.jsonl rows (prompt, response, score, reward, advantage), not ROLL's "
        "pickled DataProto"
    )


RULES: dict[str, Rule] = {
    "rollout_mock.enable": Use(DERIVED, rollout_mock),
    "rollout_mock.mode": Use(DERIVED, rollout_mock),
    "rollout_mock.dump_dir": Use(DERIVED, rollout_mock),
}
