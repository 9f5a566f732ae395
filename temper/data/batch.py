"""The one container roles exchange: per-sample tensors plus per-sample Python objects.

``Batch.tensors`` is a ``TensorDict`` whose leading dimension is the sample axis;
``Batch.objects`` maps names to lists (one entry per sample: uid, data_source,
ground truth, texts, …); ``Batch.meta`` holds batch-wide values (temperature, step).

Tensor keys used across temper (shapes with B samples, P prompt and R response tokens):

==================== ======= ====================================================
``prompt_ids``        (B, P)  left-padded prompt tokens
``prompt_mask``       (B, P)  1 on real prompt tokens
``response_ids``      (B, R)  right-padded generated tokens
``response_mask``     (B, R)  1 on tokens the policy generated and is trained on
``input_ids``         (B, P+R) prompt ‖ response
``attention_mask``    (B, P+R) prompt_mask ‖ (response tokens present)
``rollout_log_probs`` (B, R)  log-probs the rollout engine sampled with
``old_log_probs``     (B, R)  trainer log-probs before the update
``ref_log_probs``     (B, R)  reference log-probs
``values``            (B, R)  critic values
``token_level_scores``/``token_level_rewards``/``advantages``/``returns`` (B, R)
==================== ======= ====================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict


@dataclasses.dataclass
class Batch:
    """Per-sample tensors (TensorDict) + per-sample objects + batch-wide meta."""

    tensors: TensorDict
    objects: dict[str, list[Any]] = dataclasses.field(default_factory=dict)
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self)
        for key, values in self.objects.items():
            if len(values) != n:
                raise ValueError(f"object column '{key}' has {len(values)} rows, batch has {n}")

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        objects: Mapping[str, Sequence[Any]] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Batch:
        tensors = tensors or {}
        columns = {k: list(v) for k, v in (objects or {}).items()}
        if tensors:
            size = next(iter(tensors.values())).shape[0]
        else:
            size = len(next(iter(columns.values()))) if columns else 0
        return cls(TensorDict(tensors, batch_size=[size]), columns, dict(meta or {}))

    def __len__(self) -> int:
        return int(self.tensors.batch_size[0]) if self.tensors.batch_dims else 0

    def __contains__(self, key: str) -> bool:
        return key in self.tensors.keys() or key in self.objects  # noqa: SIM118 (TensorDict keys)

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors.keys():  # noqa: SIM118 (TensorDict keys)
            return self.tensors[key]
        return self.objects[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The column ``key`` (tensor or objects), or ``default`` when absent."""
        return self[key] if key in self else default  # noqa: SIM401 (this is get)

    def __setitem__(self, key: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            self.tensors[key] = value
        else:
            values = list(value)
            if len(values) != len(self):
                raise ValueError(f"'{key}' has {len(values)} rows, batch has {len(self)}")
            self.objects[key] = values

    def pop(self, key: str) -> Any:
        if key in self.tensors.keys():  # noqa: SIM118 (TensorDict keys)
            return self.tensors.pop(key)
        return self.objects.pop(key)

    def select(self, index: Sequence[int] | torch.Tensor) -> Batch:
        """Rows at ``index`` (in that order)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        rows = idx.tolist()
        return Batch(
            self.tensors[idx],
            {k: [v[i] for i in rows] for k, v in self.objects.items()},
            dict(self.meta),
        )

    def slice(self, start: int, stop: int) -> Batch:
        return Batch(
            self.tensors[start:stop],
            {k: v[start:stop] for k, v in self.objects.items()},
            dict(self.meta),
        )

    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of ``size`` rows (the last may be shorter)."""
        if size <= 0:
            raise ValueError("split size must be positive")
        return [self.slice(i, min(i + size, len(self))) for i in range(0, len(self), size)]

    def chunk(self, n: int) -> list[Batch]:
        """``n`` consecutive pieces of equal size; ``len(self)`` must divide by ``n``."""
        if len(self) % n:
            raise ValueError(f"cannot chunk {len(self)} rows into {n} equal parts")
        return self.split(len(self) // n)

    def __iter__(self) -> Iterator[str]:
        yield from (str(k) for k in self.tensors.keys())  # noqa: SIM118 (TensorDict keys)
        yield from self.objects

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Rows of all ``batches`` in order; meta of the first."""
        if not batches:
            raise ValueError("concat of no batches")
        keys = set(batches[0].objects)
        for b in batches[1:]:
            if set(b.objects) != keys:
                raise ValueError("cannot concat batches with different object columns")
        tensors = TensorDict.cat([b.tensors for b in batches], dim=0)
        objects = {k: [x for b in batches for x in b.objects[k]] for k in batches[0].objects}
        return Batch(tensors, objects, dict(batches[0].meta))

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each row ``n`` times: ``aabb`` when interleaved, else ``abab``."""
        rows = torch.arange(len(self))
        index = rows.repeat_interleave(n) if interleave else rows.repeat(n)
        return self.select(index)

    def union(self, other: Batch) -> Batch:
        """Columns of both (same rows); ``other`` wins on equal keys."""
        if len(other) != len(self):
            raise ValueError(f"union of batches with {len(self)} and {len(other)} rows")
        tensors = self.tensors.clone(recurse=False)
        tensors.update(other.tensors)
        return Batch(tensors, {**self.objects, **other.objects}, {**self.meta, **other.meta})

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.tensors.to(device), self.objects, self.meta)
