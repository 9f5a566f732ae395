"""trackio sink: metrics and text of one trackio run, in trackio's local SQLite database.

trackio is local-first: ``trackio.init`` writes ``<TRACKIO_DIR>/<project>.db`` and runs no
server (``trackio show`` opens the dashboard on it later). ``TRACKIO_DIR`` is read once,
when trackio is imported: where the user has not set it and trackio is not imported yet,
temper sets it to ``<output_dir>/trackio`` first, so a run's record stays in its output
directory; otherwise the database is where that setting says (printed at start).

Names as verl and ROLL give them: the trackio project is the project, the run is named
after the experiment (``tracker_kwargs`` ``project`` / ``name`` override them, as ROLL's
do). ``group``, ``auto_log_gpu`` and ``gpu_log_interval`` go to ``trackio.init``, and so
do ``space_id`` / ``dataset_id`` (trackio then also syncs to that Hugging Face Space or
dataset: a network, which temper's tests do not have). A resumed run (``start_step`` >
0) continues the trackio run of that name (``resume="allow"``).

Text (validation generations) is logged as ``trackio.Markdown`` in a code block, so the
dashboard shows it verbatim.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from temper.tracking.scalars import scalars


@dataclasses.dataclass
class TrackioArgs:
    """``tracker_kwargs`` of the trackio tracker (ROLL's ``TrackioTracker`` keys)."""

    project: str | None = None  # default: the project
    name: str | None = None  # default: the experiment name
    group: str | None = None
    space_id: str | None = None
    dataset_id: str | None = None
    auto_log_gpu: bool | None = None  # None: trackio's default (on where a GPU is seen)
    gpu_log_interval: float = 10.0


class TrackioTracker:
    def __init__(
        self,
        output_dir: str | Path,
        project: str,
        name: str,
        args: TrackioArgs,
        start_step: int = 0,
    ) -> None:
        if "trackio" not in sys.modules and not os.environ.get("TRACKIO_DIR"):
            os.environ["TRACKIO_DIR"] = str((Path(output_dir) / "trackio").resolve())
        import trackio
        from trackio.utils import TRACKIO_DIR

        self.trackio = trackio
        self.dir = Path(TRACKIO_DIR)
        self.project = args.project or project
        print(f"trackio: logging to {self.dir} (project {self.project!r})", flush=True)
        self.run = trackio.init(
            project=self.project,
            name=args.name or name,
            group=args.group,
            space_id=args.space_id,
            dataset_id=args.dataset_id,
            resume="allow" if start_step > 0 else "never",
            auto_log_gpu=args.auto_log_gpu,
            gpu_log_interval=args.gpu_log_interval,
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(scalars(metrics), step=step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        fence = "````" if "```" in text else "```"
        self.run.log({tag: self.trackio.Markdown(f"{fence}\n{text}\n{fence}")}, step=step)

    def close(self) -> None:
        self.run.finish()
