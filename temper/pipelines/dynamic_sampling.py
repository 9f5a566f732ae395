"""Dynamic sampling: generate until the step's batch is full of groups with signal.

DAPO (arXiv:2503.14476; verl ``algorithm.filter_groups``) and ROLL (its query filters,
with ``is_use_additional_prompts`` running extra prompts beside the batch) drop the
prompt groups whose responses carry no learning signal — all scored alike — and keep
generating until ``train_batch_size`` groups with signal are collected. A producer calls
:func:`fill_groups` with a function that generates one *round* (a scored batch of whole
groups: ``data.gen_batch_size`` prompts × ``n``, or every env group of the manager):

* a group is kept when its ``filter_groups.metric`` values (``score``, or ``reward`` =
  score + overlong penalty + length reward) have a std above ``std_threshold`` and a mean
  strictly between ``mean_low`` and ``mean_high`` (each optional); a group of one response
  has neither and is always kept (verl and ROLL do the same);
* kept groups are collected in generation order until there are enough; the surplus of
  the last round is dropped (verl keeps the first ``train_batch_size``);
* after ``max_num_gen_batches`` rounds (≤ 0: no limit, as verl) the batch is filled up
  with dropped groups whose loss is masked (``sample_mask`` 0: ROLL's way of keeping a
  batch's size without training on it), and a line says how far it got.

Without ``filter_groups.enable`` one round is the batch, untouched. Metrics:
``dynamic_sampling/rounds``, ``…/groups_kept`` (collected, before trimming to the
batch), ``…/groups_dropped`` (filtered out), ``…/groups_masked`` (filled in masked),
``…/batch_full`` (1 when no masked group was needed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from temper import algorithms as A
from temper.config.schema import FilterGroupsConfig
from temper.data.batch import Batch
from temper.data.padded import concat_padded
from temper.pipelines.shaping import ShapingSettings, added_terms

Round = Callable[[int], tuple[Batch, dict[str, float]]]


def group_keep(batch: Batch, fg: FilterGroupsConfig, s: ShapingSettings) -> Tensor:
    """Bool ``(B,)``: the rows of the groups that pass the filter (module docstring)."""
    values = batch["scores"].float() if fg.metric == "score" else added_terms(batch, s)
    st = A.group_stats(values, batch["uid"])
    keep = st.std > fg.std_threshold
    if fg.mean_low is not None:
        keep &= st.mean > fg.mean_low
    if fg.mean_high is not None:
        keep &= st.mean < fg.mean_high
    return keep | (st.count <= 1)


def _groups(batch: Batch) -> list[list[int]]:
    """Row indices of each group, groups in order of first appearance."""
    rows: dict[Any, list[int]] = {}
    for i, uid in enumerate(batch["uid"]):
        rows.setdefault(uid, []).append(i)
    return list(rows.values())


def merge_round_metrics(rounds: Sequence[dict[str, float]]) -> dict[str, float]:
    """One step's producer metrics from its rounds': ``*_max``/``*_min`` as such, counts
    (``*failures``, ``*timeouts``, ``*calls``) summed, everything else averaged."""
    if len(rounds) == 1:
        return dict(rounds[0])
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for r in rounds for k in r):
        values = [r[key] for r in rounds if key in r]
        if key.endswith("_max"):
            out[key] = max(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        elif key.endswith(("failures", "timeouts", "calls")):
            out[key] = float(sum(values))
        else:
            out[key] = sum(values) / len(values)
    return out


def _unique_uids(batch: Batch, seen: set[Any], round_: int) -> None:
    """Rename groups whose uid an earlier round used (the same prompt drawn again)."""
    uids = list(batch["uid"])
    if seen.isdisjoint(uids):
        return
    batch["uid"] = [f"{u}#r{round_}" if u in seen else u for u in uids]


def fill_groups(
    generate: Round,
    groups_wanted: int,
    fg: FilterGroupsConfig,
    settings: ShapingSettings,
    pad_token_id: int = 0,
) -> tuple[Batch, dict[str, float]]:
    """The step's batch of ``groups_wanted`` groups and the producer's metrics."""
    if not fg.enable:
        return generate(0)
    kept: list[Batch] = []
    dropped: list[Batch] = []
    round_metrics: list[dict[str, float]] = []
    seen: set[Any] = set()
    n_kept = n_dropped = 0
    while True:
        batch, metrics = generate(len(round_metrics))
        _unique_uids(batch, seen, len(round_metrics))
        seen.update(batch["uid"])
        round_metrics.append(metrics)
        keep = group_keep(batch, fg, settings)
        for rows in _groups(batch):
            if bool(keep[rows[0]]):
                kept.append(batch.select(rows))
                n_kept += 1
            else:
                dropped.append(batch.select(rows))
                n_dropped += 1
        rounds = len(round_metrics)
        if n_kept >= groups_wanted:
            break
        if 0 < fg.max_num_gen_batches <= rounds:
            break
        limit = fg.max_num_gen_batches if fg.max_num_gen_batches > 0 else "no limit"
        print(
            f"dynamic sampling: {n_kept}/{groups_wanted} groups with signal after {rounds} "
            f"generation round(s) (max_num_gen_batches: {limit}); generating more",
            flush=True,
        )
    parts = kept[:groups_wanted]
    masked = groups_wanted - len(parts)
    if masked:
        print(
            f"dynamic sampling: only {len(parts)}/{groups_wanted} groups with signal after "
            f"max_num_gen_batches={fg.max_num_gen_batches} rounds; {masked} filtered-out "
            "group(s) fill the batch with their loss masked (raise max_num_gen_batches, "
            "set it to 0 for no limit, or relax algorithm.filter_groups)",
            flush=True,
        )
    filler = dropped[-masked:] if masked else []
    for g in parts:
        g["sample_mask"] = torch.ones(len(g))
    for g in filler:
        g["sample_mask"] = torch.zeros(len(g))
    out = concat_padded([*parts, *filler], pad_token_id)
    metrics = merge_round_metrics(round_metrics)
    metrics.update(
        {
            "dynamic_sampling/rounds": float(rounds),
            "dynamic_sampling/groups_kept": float(n_kept),
            "dynamic_sampling/groups_dropped": float(n_dropped),
            "dynamic_sampling/groups_masked": float(masked),
            "dynamic_sampling/batch_full": float(masked == 0),
        }
    )
    return out, metrics
