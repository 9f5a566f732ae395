"""SwanLab sink: metrics and text of one SwanLab run, offline under the output dir by default.

Mode: ``tracker_kwargs`` ``mode`` if given, else ``SWANLAB_MODE`` (verl's variable), else
``offline``: the run is written to ``<logdir>/run-…/`` (a ``.swanlab`` record file,
media, config) with no server and no account; ``swanlab sync <that dir>`` uploads it
later. verl's and SwanLab's ``cloud`` is SwanLab's ``online``; ``local`` also needs the
``swanboard`` dashboard package. Directory: ``tracker_kwargs`` ``logdir``, else
``SWANLAB_LOG_DIR`` (verl's), else ``<output_dir>/swanlog``.

Login, in online mode only (offline needs no account): ``login_kwargs`` (ROLL's, passed
to ``swanlab.login``), else ``SWANLAB_API_KEY`` (verl's), else SwanLab's saved login.

Names as verl and ROLL give them: the SwanLab project is the project, the experiment is
the experiment name (``tracker_kwargs`` ``project`` / ``experiment_name`` override them,
as ROLL's do); ``workspace``, ``description`` and ``tags`` go to ``swanlab.init``. The run
id is kept in ``<output_dir>/swanlab_run_id``: a resumed run (``start_step`` > 0)
continues that SwanLab run.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from temper.tracking.scalars import scalars

#: SwanLab's modes (``swanlab.init``); verl's ``cloud`` is ``online``
MODES = ("online", "offline", "local", "disabled")


@dataclasses.dataclass
class SwanlabArgs:
    """``tracker_kwargs`` of the swanlab tracker (ROLL's ``SwanlabTracker`` keys, and
    ``mode``)."""

    project: str | None = None  # default: the project
    experiment_name: str | None = None  # default: the experiment name
    workspace: str | None = None
    description: str | None = None
    tags: list[str] | None = None
    logdir: str | None = None
    mode: str | None = None
    login_kwargs: dict[str, Any] | None = None


def resolve_mode(args: SwanlabArgs) -> str:
    """The run's mode: ``args.mode``, else ``SWANLAB_MODE``, else ``offline``."""
    mode = (args.mode or os.environ.get("SWANLAB_MODE") or "offline").lower()
    return "online" if mode == "cloud" else mode


class SwanlabTracker:
    def __init__(
        self,
        output_dir: str | Path,
        project: str,
        name: str,
        args: SwanlabArgs,
        start_step: int = 0,
    ) -> None:
        import swanlab

        out = Path(output_dir)
        mode = resolve_mode(args)
        if mode == "online":
            if args.login_kwargs:
                swanlab.login(**args.login_kwargs)
            elif os.environ.get("SWANLAB_API_KEY"):
                swanlab.login(api_key=os.environ["SWANLAB_API_KEY"])
        log_dir = args.logdir or os.environ.get("SWANLAB_LOG_DIR") or str(out / "swanlog")
        id_file = out / "swanlab_run_id"
        resume: dict[str, Any] = {}
        if start_step > 0 and id_file.is_file():
            resume = {"id": id_file.read_text(encoding="utf-8").strip(), "resume": "allow"}
        self.run = swanlab.init(
            project=args.project or project,
            name=args.experiment_name or name,
            workspace=args.workspace,
            description=args.description,
            tags=args.tags,
            log_dir=log_dir,
            mode=mode,
            **resume,
        )
        self.text = swanlab.Text
        id_file.write_text(str(self.run.id), encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(scalars(metrics), step=step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.run.log({tag: self.text(text)}, step=step)

    def close(self) -> None:
        self.run.finish()
