"""Generation dumps: ``rollout_data_dir`` / ``validation_data_dir`` as ``<step>.jsonl``.

One row per response: prompt, response, score, and — for training rollouts — the
sequence reward (after shaping) and the advantage (mean over response tokens; GRPO's
advantage is constant over a response, GAE's is not). Reading them back is how one
sees what the policy actually wrote at a step without rerunning anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from temper.data.batch import Batch


def _per_sample(batch: Batch, key: str) -> list[float] | None:
    if key not in batch:
        return None
    values = batch[key].float()
    if values.dim() == 1:
        return values.tolist()
    mask = batch["response_mask"].float()
    if key == "advantages":
        return ((values * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    return (values * mask).sum(-1).tolist()


def _jsonable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.tolist()
    try:
        json.dumps(value)
    except TypeError:
        return str(value)
    return value


def generation_rows(batch: Batch, step: int) -> list[dict[str, Any]]:
    """The dump rows of a scored batch (advantage/reward when the batch has them)."""
    columns = {
        "score": _per_sample(batch, "scores"),
        "reward": _per_sample(batch, "token_level_rewards"),
        "advantage": _per_sample(batch, "advantages"),
    }
    lengths = batch["response_mask"].sum(-1).tolist()
    rows = []
    for i in range(len(batch)):
        row: dict[str, Any] = {"step": step}
        for key in ("uid", "data_source", "prompt_text", "response_text", "ground_truth"):
            if key in batch.objects:
                row[key.removesuffix("_text")] = _jsonable(batch[key][i])
        row["response_length"] = int(lengths[i])
        row.update({k: v[i] for k, v in columns.items() if v is not None})
        rows.append(row)
    return rows


def dump_generations(directory: str | Path, step: int, rows: list[dict[str, Any]]) -> Path:
    """Write ``<directory>/<step>.jsonl`` (replacing a partial one from a killed run)."""
    out = Path(directory).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{step}.jsonl"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    tmp.replace(path)
    return path
