"""Box-set metrics of the detection reward: IoU, ROLL's two greedy matchings, and COCO AP.

All take corner boxes ``(x1, y1, x2, y2)``; labels are compared as given (the answers
are lower-cased when read, :mod:`temper.rewards.functions.boxes`).

- **IoU** ``|A ∩ B| / |A ∪ B|``, 0 when the boxes do not overlap with positive area.
- **Matchings** pair predictions ``p`` with ground-truth boxes ``g`` at an IoU threshold
  ``τ``; a pair's score is its IoU, or 0 when its labels differ:

  - *iou first*: repeatedly take the unmatched pair of highest IoU (the first in
    prediction-then-truth order at a tie) while that IoU is ``≥ τ``, labels or not;
  - *label first*: for each truth box in order, the unmatched prediction of the same
    label with the highest IoU (the first at a tie), kept when its IoU is ``≥ τ``.

- **Match score** of ``M`` pairs among ``P`` predictions and ``G`` truths, completeness
  weight ``c``: ``mean_iou = Σ score / G``, ``miss = (G - M) / G``,
  ``false_alarm = (P - M) / P`` (0 when ``P = 0``), ``completeness = 1 - (miss +
  false_alarm) / 2``, ``weighted = (1 - c)·mean_iou + c·completeness``; precision
  ``1 - false_alarm``, recall ``1 - miss``.
- **COCO AP** of one image, every prediction at confidence 1 (ROLL's answers carry
  none), as pycocotools' ``COCOeval`` for ``bbox`` with ROLL's one area range
  ``[0, 1e10]``: per truth label (predictions of other labels are not scored), the first
  100 predictions in answer order each take the unmatched truth of highest IoU ``≥ t``
  (the last such at a tie); precision ``TP / (TP + FP)`` is made non-increasing from the
  right and read at the 101 recalls ``0, 0.01, …, 1`` (0 past the largest recall). mAP
  averages over labels, the 10 thresholds ``t = 0.5, 0.55, …, 0.95`` and the recalls;
  mAP50 and mAP75 over labels and recalls at ``t = 0.5`` and ``0.75``; all three are 0
  when no prediction has a truth label. Boxes whose area
  is outside the range are ignored, as COCO ignores them; when every truth box is, the
  three are ``-1`` (COCO's "no ground truth").

ROLL's *iou first* loop records, as written, the last unmatched pair of its lists with
the highest IoU's value, not the pair that has it (its loop variables shadow the
argmax); here the pair that has the highest IoU is matched, as its docstring describes.
The rows of ROLL's examples weigh that term 0; it shows in the ``report_iou_*_iou_match``
fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

COCO_IOU_THRESHOLDS = np.linspace(0.5, 0.95, 10)  # pycocotools' values, 0.75 exactly at [5]
RECALL_POINTS = np.linspace(0.0, 1.0, 101)
MAX_DETECTIONS = 100  # per label, COCO's last maxDets
AREA_RANGE = (0.0, 1e10)  # ROLL keeps only COCO's "all" range


class Match(NamedTuple):
    pred: int
    truth: int
    iou: float  # 0 when the labels differ


class MatchScore(NamedTuple):
    mean_iou: float
    completeness: float
    precision: float
    recall: float
    weighted: float


class MeanAP(NamedTuple):
    map: float
    map50: float
    map75: float


def iou_matrix(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """``(P, G)`` IoUs of corner boxes ``pred (P, 4)`` and ``truth (G, 4)`` (module doc)."""
    p, t = pred[:, None, :], truth[None, :, :]
    w = np.minimum(p[..., 2], t[..., 2]) - np.maximum(p[..., 0], t[..., 0])
    h = np.minimum(p[..., 3], t[..., 3]) - np.maximum(p[..., 1], t[..., 1])
    overlap = (w > 0) & (h > 0)
    inter = np.where(overlap, w * h, 0.0)
    area_p = (p[..., 2] - p[..., 0]) * (p[..., 3] - p[..., 1])
    area_t = (t[..., 2] - t[..., 0]) * (t[..., 3] - t[..., 1])
    union = np.where(overlap, area_p + area_t - inter, 1.0)  # 1: no 0/0 where inter is 0
    return np.asarray(inter / union, dtype=np.float64).reshape(len(pred), len(truth))


def match_iou_first(iou: np.ndarray, same_label: np.ndarray, threshold: float) -> list[Match]:
    """*iou first* matching (module doc) of an ``(P, G)`` IoU and label-equality matrix."""
    free = np.ones(iou.shape, dtype=bool)
    matches: list[Match] = []
    while free.any():
        masked = np.where(free, iou, -1.0)
        p, g = divmod(int(np.argmax(masked)), iou.shape[1])  # argmax: first in row-major order
        best = float(masked[p, g])
        if best < threshold:
            break
        matches.append(Match(p, g, best if same_label[p, g] else 0.0))
        free[p, :] = False
        free[:, g] = False
    return matches


def match_label_first(iou: np.ndarray, same_label: np.ndarray, threshold: float) -> list[Match]:
    """*label first* matching (module doc) of an ``(P, G)`` IoU and label-equality matrix."""
    taken = np.zeros(iou.shape[0], dtype=bool)
    matches: list[Match] = []
    for g in range(iou.shape[1]):
        candidates = np.flatnonzero(same_label[:, g] & ~taken)
        if candidates.size == 0:
            continue
        p = int(candidates[np.argmax(iou[candidates, g])])
        if iou[p, g] >= threshold:
            matches.append(Match(p, g, float(iou[p, g])))
            taken[p] = True
    return matches


def match_score(
    matches: Sequence[Match], n_pred: int, n_truth: int, completeness_weight: float
) -> MatchScore:
    """The match score (module doc) of ``matches`` among ``n_pred`` and ``n_truth ≥ 1``."""
    mean_iou = sum(m.iou for m in matches) / n_truth
    miss = (n_truth - len(matches)) / n_truth
    false_alarm = (n_pred - len(matches)) / n_pred if n_pred else 0.0
    completeness = 1.0 - (miss + false_alarm) / 2.0
    weighted = mean_iou * (1.0 - completeness_weight) + completeness * completeness_weight
    return MatchScore(mean_iou, completeness, 1.0 - false_alarm, 1.0 - miss, weighted)


def _outside(areas: np.ndarray) -> np.ndarray:
    return (areas < AREA_RANGE[0]) | (areas > AREA_RANGE[1])


def label_precision(pred: np.ndarray, truth: np.ndarray) -> np.ndarray | None:
    """COCO's interpolated precision ``(10, 101)`` of one label's predictions ``(D, 4)``
    (answer order) against its truths ``(G, 4)``; None when every truth is ignored."""
    pred = pred[:MAX_DETECTIONS]
    truth_ignored = _outside((truth[:, 2] - truth[:, 0]) * (truth[:, 3] - truth[:, 1]))
    order = np.argsort(truth_ignored, kind="stable")  # ignored truths last, as COCO
    truth, truth_ignored = truth[order], truth_ignored[order]
    n_real = int((~truth_ignored).sum())
    if n_real == 0:
        return None
    iou = iou_matrix(pred, truth)
    n_det, n_truth = iou.shape
    matched = np.zeros((len(COCO_IOU_THRESHOLDS), n_det), dtype=bool)
    ignored = np.zeros_like(matched)
    for ti, t in enumerate(COCO_IOU_THRESHOLDS):
        taken = np.zeros(n_truth, dtype=bool)
        for d in range(n_det):
            best, m = min(float(t), 1 - 1e-10), -1
            for g in range(n_truth):
                if taken[g]:
                    continue
                if m > -1 and not truth_ignored[m] and truth_ignored[g]:
                    break  # a real match beats any ignored truth
                if iou[d, g] < best:
                    continue
                best, m = float(iou[d, g]), g
            if m > -1:
                matched[ti, d], ignored[ti, d], taken[m] = True, truth_ignored[m], True
    pred_outside = _outside((pred[:, 2] - pred[:, 0]) * (pred[:, 3] - pred[:, 1]))
    ignored |= ~matched & pred_outside[None, :]
    tp = np.cumsum(matched & ~ignored, axis=1, dtype=np.float64)
    fp = np.cumsum(~matched & ~ignored, axis=1, dtype=np.float64)
    out = np.zeros((len(COCO_IOU_THRESHOLDS), len(RECALL_POINTS)))
    for ti in range(len(COCO_IOU_THRESHOLDS)):
        recall = tp[ti] / n_real
        precision = tp[ti] / (tp[ti] + fp[ti] + np.spacing(1))
        precision = np.maximum.accumulate(precision[::-1])[::-1]
        at = np.searchsorted(recall, RECALL_POINTS, side="left")
        reached = at < n_det
        out[ti, reached] = precision[at[reached]]
    return out


def mean_average_precision(
    pred: np.ndarray, pred_labels: Sequence[str], truth: np.ndarray, truth_labels: Sequence[str]
) -> MeanAP:
    """COCO mAP, mAP50, mAP75 (module doc) of one image's boxes ``(P, 4)``, ``(G ≥ 1, 4)``."""
    labels = list(dict.fromkeys(truth_labels))
    if not set(pred_labels) & set(labels):  # ROLL scores this 0 without running COCO
        return MeanAP(0.0, 0.0, 0.0)
    per_label = []
    for label in labels:
        mine = np.array([lab == label for lab in pred_labels], dtype=bool)
        theirs = np.array([lab == label for lab in truth_labels], dtype=bool)
        table = label_precision(pred[mine].reshape(-1, 4), truth[theirs].reshape(-1, 4))
        if table is not None:
            per_label.append(table)
    if not per_label:
        return MeanAP(-1.0, -1.0, -1.0)
    stacked = np.stack(per_label)  # (K, 10, 101)
    at75 = int(np.flatnonzero(COCO_IOU_THRESHOLDS == 0.75)[0])
    return MeanAP(
        float(stacked.mean()), float(stacked[:, 0].mean()), float(stacked[:, at75].mean())
    )
