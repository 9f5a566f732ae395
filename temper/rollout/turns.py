"""One model turn of several multi-turn episodes: the engine call and what it returns.

:func:`generate_turns` left-pads each episode's ids so far into one batch and calls the
engine once (with a partial rollout's ``segments``, through the one segment loop of
:mod:`temper.rollout.partial`, each row continued up to its own turn budget); each
episode gets back a :class:`Turn`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

from temper.data.batch import Batch
from temper.rollout.base import RolloutEngine, SamplingParams
from temper.rollout.partial import RESPONSE_VERSIONS, Segments, generate_in_segments


class Turn(NamedTuple):
    """One generated model turn of an episode: its ids and sampling log-probs (None when
    the engine gave none), whether it was cut (the engine's limit or the turn budget),
    and with a partial rollout the version that sampled each token (None otherwise)."""

    ids: list[int]
    log_probs: list[float] | None
    cut: bool
    versions: list[int] | None = None


def generate_turns(
    engine: RolloutEngine,
    rows: list[list[int]],
    pad_token_id: int,
    budgets: list[int],
    params: SamplingParams,
    objects: dict[str, list[Any]] | None = None,
    segments: Segments | None = None,
) -> list[Turn]:
    """One engine call for the next turn of several episodes: ``rows`` (each episode's
    ids so far) left-padded into one batch, ``objects`` riding along (a VL episode's
    images); returns per row the generated ids and log-probs cut to its own budget, and
    whether the turn was cut (the engine's truncation or the budget). With ``segments``
    the call is a partial rollout's (the one segment loop, each row continued up to its
    own budget) and each turn carries its tokens' versions."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, r in enumerate(rows):
        ids[k, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[k, width - len(r) :] = 1
    call = dataclasses.replace(params, n=1, max_new_tokens=max(budgets))
    batch = Batch.from_dict({"prompt_ids": ids, "prompt_mask": mask}, objects)
    if segments is None:
        out = engine.generate(batch, call)
    else:
        out = generate_in_segments(engine, batch, call, segments, pad_token_id, budgets)
    lps_all = out.get("rollout_log_probs")
    versions_all = out.get(RESPONSE_VERSIONS)
    result = []
    for k, budget in enumerate(budgets):
        keep = out["response_mask"][k].bool()
        gen = out["response_ids"][k][keep].tolist()
        lps = lps_all[k][keep].tolist()[:budget] if lps_all is not None else None
        versions = versions_all[k][keep].tolist()[:budget] if versions_all is not None else None
        cut = bool(out["truncated"][k]) or len(gen) > budget
        result.append(Turn(gen[:budget], lps, cut, versions))
    return result
