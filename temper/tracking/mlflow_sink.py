"""MLflow sink: metrics and text of one MLflow run, in a local SQLite store by default.

Where it logs: ``MLFLOW_TRACKING_URI`` when set (a server, a database, a file store — the
user's choice, as in verl), else ``tracker_kwargs.mlflow.tracking_uri``, else
``sqlite:///<output_dir>/mlflow/mlflow.db`` with artifacts (text) under
``<output_dir>/mlflow/artifacts``. No server runs: the SQLite store is MLflow's
maintained local backend (its plain-directory file store is in maintenance mode and
refuses to open unless ``MLFLOW_ALLOW_FILE_STORE`` is set). ``mlflow ui
--backend-store-uri sqlite:///<output_dir>/mlflow/mlflow.db`` shows the run.

Names as verl gives them: the MLflow experiment is the project, the run is named after
the experiment. ``MLFLOW_RUN_ID`` (set by hosted MLflow services) attaches to that run, as
verl does; a resumed temper run continues the run whose id it kept in
``<output_dir>/mlflow_run_id``.

Metric keys are sanitized where MLflow would reject them (:func:`sanitize_key`). Text
(validation generations) becomes one artifact file per tag and step. The client is
MLflow's ``MlflowClient`` with an explicit run id: no process-global active run, so two
sinks (or the user's own ``mlflow`` calls) do not interfere.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from temper.tracking.scalars import scalars

#: characters MLflow accepts in a metric key (``mlflow.utils.validation``, POSIX)
_INVALID = re.compile(r"[^/\w.\- :]")
#: MLflow's longest key
MAX_KEY = 250
#: MLflow's most metrics in one ``log_batch``
MAX_BATCH = 1000


@dataclasses.dataclass
class MlflowArgs:
    """``tracker_kwargs`` of the mlflow tracker (``MLFLOW_TRACKING_URI`` wins over
    ``tracking_uri``; ``MLFLOW_RUN_ID`` over a new run)."""

    tracking_uri: str | None = None
    experiment_name: str | None = None  # default: the project
    run_name: str | None = None  # default: the experiment name


def sanitize_key(key: str) -> str:
    """``key`` as MLflow accepts it.

    As verl: ``@`` becomes ``_at_``, runs of ``/`` one ``/``, any other character outside
    letters, digits, ``_ . - : /`` and space becomes ``_``. Beyond verl, what MLflow's
    path check refuses too: an empty, ``.`` or ``..`` segment (a leading or trailing
    ``/``, ``a/./b``) is dropped or becomes ``_``, and a key over 250 characters is cut
    and ends with a hash of the whole key (two long keys stay apart).
    """
    out = _INVALID.sub("_", key.replace("@", "_at_"))
    parts = [("_" if p in (".", "..") else p) for p in out.split("/") if p]
    out = "/".join(parts) or "_"
    if len(out) > MAX_KEY:
        digest = hashlib.sha1(key.encode()).hexdigest()[:10]
        out = f"{out[: MAX_KEY - 11]}_{digest}"
    return out


class MlflowTracker:
    def __init__(
        self,
        output_dir: str | Path,
        project: str,
        name: str,
        args: MlflowArgs,
        start_step: int = 0,
    ) -> None:
        from mlflow.tracking import MlflowClient

        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or args.tracking_uri
        artifacts: str | None = None
        if not uri:
            store = out / "mlflow"
            store.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{store.resolve() / 'mlflow.db'}"
            # MLflow's default artifact root is ./mlruns in the working directory
            artifacts = (store / "artifacts").resolve().as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        self.tracking_uri = uri
        id_file = out / "mlflow_run_id"
        run_id = os.environ.get("MLFLOW_RUN_ID")
        if not run_id and start_step > 0 and id_file.is_file():
            run_id = id_file.read_text(encoding="utf-8").strip()
        if run_id:
            self.run_id = self.client.get_run(run_id).info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = args.experiment_name or project
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = (
                found.experiment_id
                if found is not None
                else self.client.create_experiment(experiment, artifact_location=artifacts)
            )
            run = self.client.create_run(experiment_id, run_name=args.run_name or name)
            self.run_id = run.info.run_id
        id_file.write_text(self.run_id, encoding="utf-8")
        self._keys: dict[str, str] = {}  # metric key -> its MLflow key
        self._taken: dict[str, str] = {}  # MLflow key -> the metric key that has it

    def key(self, key: str) -> str:
        """The MLflow key of ``key``, sanitized once and kept apart from another key
        that sanitizes the same (``a@b`` and ``a_at_b``: the second gets ``_2``)."""
        if key not in self._keys:
            base = clean = sanitize_key(key)
            n = 1
            while self._taken.get(clean, key) != key:
                n += 1
                clean = f"{base}_{n}"
            if clean != key:
                print(f"mlflow: metric {key!r} is logged as {clean!r}", flush=True)
            self._keys[key] = clean
            self._taken[clean] = key
        return self._keys[key]

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(self.key(k), v, now, step) for k, v in scalars(metrics).items()]
        for i in range(0, len(batch), MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i : i + MAX_BATCH])

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.client.log_text(self.run_id, text, f"{sanitize_key(tag)}/step_{step}.txt")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
