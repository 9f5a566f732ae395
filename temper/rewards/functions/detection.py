"""Object-detection reward: ROLL's ``DetectionRewardWorker`` (the ``cv_detection`` domain).

The rule is One-RL-to-See-Them-All's detection verifier, as ROLL runs it. A response
and its ground truth each hold an ``<answer>`` with a list of labelled boxes
(:mod:`temper.rewards.functions.boxes`); the metrics are those of
:mod:`temper.rewards.functions.box_metrics`.

``score = (accuracy_ratio · accuracy + format_ratio · format) / (accuracy_ratio +
format_ratio)``, where ``format`` is 1 when the response has ROLL's answer layout and
at least one box (:func:`~temper.rewards.functions.boxes.format_ok`), and

``accuracy = penalty · Σ_k w_k · s_k / Σ_k w_k`` over the terms ``k`` of
``det_reward_ratio`` — ``iou_max_iou_first`` and ``iou_max_label_first`` (the weighted
match score of the *iou first* / *label first* matching at the IoU threshold) and
``map``, ``map50``, ``map75`` (COCO AP) — with ``penalty = 0.6^|P - G|`` for ``P``
predicted and ``G`` true boxes, and ``det_reward_ratio.iou_completeness`` the
completeness weight of the match scores. A weight that is missing counts 0, one outside
``[0, 1]`` counts 0 (ROLL's rule; reported in ``detection_problem``); all weights 0 give
accuracy 0. ``iou_threshold``: ``"average"`` (ROLL's default) averages the match score
over the thresholds ``0.5, 0.55, …, 0.95, 0.99``; a number picks one of them;
``"dynamic"`` uses 0.85 while ``progress`` (step / total steps) ≤ 0.1, 0.95 while ≤ 0.25,
then 0.99. Accuracy is 0 when the response or the ground truth holds no box (a ground
truth without one is reported in ``detection_problem``, and ``truth_has_boxes`` is 0).

Where the settings come from: each row's ``reward_model`` (ROLL's data, e.g.
One-RL-to-See-Them-All/Orsta-Data-47k), which reaches the function as
``extra_info["reward_model"]`` (``data.extra_info_columns: [reward_model]``; the ROLL
dialect sets it): ``format_ratio`` (default 0.1), ``accuracy_ratio`` (1.0) and
``verifier_parm`` with ``det_reward_ratio`` and ``det_verifier_normalized``. The keyword
arguments of the same names are the values for rows that do not carry them; a row with
neither a ``verifier_parm`` nor a ``det_reward_ratio`` argument fails (ROLL raises on
it), as does one whose ratios sum to 0.

Coordinates: ground truths are on the 0–1000 grid. Models of the Qwen2.5 family
(``model_type`` ``qwen2_5_vl``, ``qwen2_5_omni``: ROLL tests for a ``Qwen2_5…``
processor) answer in pixels of the image they were shown, so when the row says
``det_verifier_normalized`` their boxes are put on the 0–1000 grid with the size of the
row's first image as the model saw it (``image_sizes``, ``(width, height)`` after the
resize to the model's grid); other models answer on the grid already.

``model_type``, ``image_sizes`` and ``progress`` are not settings: the reward manager
passes them (this function's registry entry declares it needs them).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from temper.rewards.functions.box_metrics import (
    Match,
    MatchScore,
    iou_matrix,
    match_iou_first,
    match_label_first,
    match_score,
    mean_average_precision,
)
from temper.rewards.functions.boxes import Box, answer_boxes, format_ok, rescale_to_thousand

MATCH_THRESHOLDS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99)
IOU_THRESHOLD_MODES = ("average", "dynamic")
# the terms of det_reward_ratio that weigh a score; iou_completeness weighs inside them
SCORE_TERMS = ("iou_max_iou_first", "iou_max_label_first", "map", "map50", "map75")
RATIO_KEYS = (*SCORE_TERMS, "iou_completeness")
# the keyword arguments that are settings (the module doc)
SETTINGS = (
    "iou_threshold",
    "format_ratio",
    "accuracy_ratio",
    "det_reward_ratio",
    "det_verifier_normalized",
)
SIZE_PENALTY_BASE = 0.6
# model types whose boxes are in pixels of the shown image (ROLL: a "Qwen2_5…" processor)
PIXEL_BOX_MODELS = frozenset({"qwen2_5_vl", "qwen2_5_omni"})
# verifier_parm keys ROLL's verifier takes besides the two read here: it reads none of
# them for scoring (image_path, verifier_style) or overwrites them from the batch
VERIFIER_PARM_UNREAD = frozenset(
    {"image_path", "verifier_style", "is_training", "step", "total_steps", "image_grid_thw"}
)
# ROLL's report fields: (name, matching, threshold) -> pure IoU, precision, recall
REPORTS = (
    ("iou_50_iou_match", "iou_first", 0.5),
    ("iou_95_iou_match", "iou_first", 0.95),
    ("iou_50_label_match", "label_first", 0.5),
    ("iou_75_label_match", "label_first", 0.75),
    ("iou_95_label_match", "label_first", 0.95),
    ("iou_99_label_match", "label_first", 0.99),
)
# what detection_accuracy reports besides final_score: 0 when there is nothing to match
# (ROLL reports zeros then too, so the metrics average over every sample)
ZERO_PARTS = {
    **dict.fromkeys(
        (
            "size_penalty",
            "pure_iou_score_max_iou",
            "pure_iou_score_max_label",
            "pure_map_score",
            "pure_map50_score",
            "pure_map75_score",
        ),
        0.0,
    ),
    **{f"report_{n}_{f}": 0.0 for n, _, _ in REPORTS for f in ("pure", "precision", "recall")},
}


def check_iou_threshold(value: Any) -> float | str:
    """``value`` as an IoU threshold setting; ``ValueError`` naming the valid ones."""
    if isinstance(value, str) and value in IOU_THRESHOLD_MODES:
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if number in MATCH_THRESHOLDS:
        return number
    valid = ", ".join([*map(str, MATCH_THRESHOLDS), *IOU_THRESHOLD_MODES])
    raise ValueError(f"iou_threshold {value!r} is not one of {valid}")


def check_kwargs(kwargs: Mapping[str, Any]) -> None:
    """``ValueError`` naming the first keyword argument :func:`compute_score` cannot take
    as a setting (``model_type``, ``image_sizes``, ``progress`` are the manager's)."""
    for name, value in kwargs.items():
        if name not in SETTINGS:
            raise ValueError(
                f"detection has no setting {name!r} (its settings: {', '.join(SETTINGS)})"
            )
        if name == "iou_threshold":
            check_iou_threshold(value)
        elif name == "det_reward_ratio":
            reward_ratios(value)
        elif name in ("format_ratio", "accuracy_ratio") and (
            isinstance(value, bool) or not isinstance(value, numbers.Real)
        ):
            raise ValueError(f"{name} is {value!r}, not a number")
        elif name == "det_verifier_normalized" and not isinstance(value, bool):
            raise ValueError(f"det_verifier_normalized is {value!r}, not true or false")


def dynamic_threshold(progress: float) -> float:
    """The ``dynamic`` IoU threshold at ``progress`` (step / total steps) of training."""
    if progress <= 0.1:
        return 0.85
    if progress <= 0.25:
        return 0.95
    return 0.99


def reward_ratios(raw: Any) -> tuple[dict[str, float], list[str]]:
    """``det_reward_ratio`` with ROLL's defaults: every key of :data:`RATIO_KEYS`, a
    missing or out-of-``[0, 1]`` weight as 0; and the problems found (for the record)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"det_reward_ratio must be a mapping, got {type(raw).__name__}")
    ratios: dict[str, float] = {}
    problems: list[str] = []
    for key in RATIO_KEYS:
        value = raw.get(key)
        if value is None:
            ratios[key] = 0.0
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"det_reward_ratio.{key} is {value!r}, not a number")
        weight = float(value)
        if not 0.0 <= weight <= 1.0:
            problems.append(f"det_reward_ratio.{key}={value} is outside [0, 1]: counted 0")
            weight = 0.0
        ratios[key] = weight
    unknown = sorted(str(k) for k in set(raw) - set(RATIO_KEYS))
    if unknown:  # ROLL reads only its keys
        problems.append(f"det_reward_ratio keys {unknown} weigh nothing")
    if sum(ratios[k] for k in SCORE_TERMS) <= 0.0:
        problems.append("det_reward_ratio weighs no score term: accuracy is 0")
    return ratios, problems


def _matrix(boxes: Sequence[Box]) -> np.ndarray:
    return np.array([b[:4] for b in boxes], dtype=np.float64).reshape(-1, 4)


def match_scores(
    pred: Sequence[Box], truth: Sequence[Box], completeness_weight: float
) -> dict[str, dict[float, MatchScore]]:
    """Match scores of both matchings (``iou_first``, ``label_first``) at every threshold
    of :data:`MATCH_THRESHOLDS`."""
    iou = iou_matrix(_matrix(pred), _matrix(truth))
    same = np.array([[p.label == t.label for t in truth] for p in pred], dtype=bool)
    same = same.reshape(len(pred), len(truth))
    out: dict[str, dict[float, MatchScore]] = {}
    for name, matcher in (("iou_first", match_iou_first), ("label_first", match_label_first)):
        per: dict[float, MatchScore] = {}
        for t in MATCH_THRESHOLDS:
            matches: list[Match] = matcher(iou, same, t)
            per[t] = match_score(matches, len(pred), len(truth), completeness_weight)
        out[name] = per
    return out


def detection_accuracy(
    pred: Sequence[Box],
    truth: Sequence[Box],
    ratios: Mapping[str, float],
    iou_threshold: float | str,
    progress: float = 0.0,
) -> dict[str, float]:
    """``final_score`` (the module doc's accuracy) and its parts, for ``P, G ≥ 1`` boxes."""
    penalty = SIZE_PENALTY_BASE ** abs(len(pred) - len(truth))
    scores = match_scores(pred, truth, ratios["iou_completeness"])
    if iou_threshold == "average":
        pure = {
            name: float(np.mean([s.weighted for s in per.values()])) for name, per in scores.items()
        }
    else:
        t = dynamic_threshold(progress) if iou_threshold == "dynamic" else float(iou_threshold)
        pure = {name: per[t].weighted for name, per in scores.items()}
    ap = mean_average_precision(
        _matrix(pred), [p.label for p in pred], _matrix(truth), [t.label for t in truth]
    )
    terms = {
        "iou_max_iou_first": pure["iou_first"],
        "iou_max_label_first": pure["label_first"],
        "map": ap.map,
        "map50": ap.map50,
        "map75": ap.map75,
    }
    total = sum(ratios[k] for k in SCORE_TERMS)
    final = sum(ratios[k] * terms[k] * penalty for k in SCORE_TERMS) / total if total else 0.0
    out = {
        "final_score": final,
        "size_penalty": penalty,
        "pure_iou_score_max_iou": pure["iou_first"],
        "pure_iou_score_max_label": pure["label_first"],
        "pure_map_score": ap.map,
        "pure_map50_score": ap.map50,
        "pure_map75_score": ap.map75,
    }
    for name, matching, t in REPORTS:
        s = scores[matching][t]
        out[f"report_{name}_pure"] = s.mean_iou
        out[f"report_{name}_precision"] = s.precision
        out[f"report_{name}_recall"] = s.recall
    return out


def _row_settings(
    extra_info: Any, format_ratio: float, accuracy_ratio: float, verifier_parm: Mapping[str, Any]
) -> tuple[float, float, dict[str, Any]]:
    """``(format_ratio, accuracy_ratio, verifier_parm)`` of the row, else the arguments'."""
    row = extra_info.get("reward_model") if isinstance(extra_info, Mapping) else None
    if row is None:
        return format_ratio, accuracy_ratio, dict(verifier_parm)
    if not isinstance(row, Mapping):
        raise ValueError(f"the row's reward_model is a {type(row).__name__}, not an object")
    parm = row.get("verifier_parm")
    if parm is not None and not isinstance(parm, Mapping):
        raise ValueError(f"reward_model.verifier_parm is a {type(parm).__name__}")
    merged = {**verifier_parm, **{k: v for k, v in (parm or {}).items() if v is not None}}
    fmt = row.get("format_ratio")
    acc = row.get("accuracy_ratio")
    return (
        format_ratio if fmt is None else float(fmt),
        accuracy_ratio if acc is None else float(acc),
        merged,
    )


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    iou_threshold: float | str = "average",
    format_ratio: float = 0.1,
    accuracy_ratio: float = 1.0,
    det_reward_ratio: Mapping[str, float] | None = None,
    det_verifier_normalized: bool = False,
    model_type: str | None = None,
    image_sizes: Sequence[Sequence[float]] = (),
    progress: float = 0.0,
) -> dict[str, Any]:
    """``{"score", "format_reward", "accuracy_reward", …}`` of one response (module doc)."""
    threshold = check_iou_threshold(iou_threshold)
    defaults: dict[str, Any] = {"det_verifier_normalized": det_verifier_normalized}
    if det_reward_ratio is not None:
        defaults["det_reward_ratio"] = det_reward_ratio
    fmt_ratio, acc_ratio, parm = _row_settings(extra_info, format_ratio, accuracy_ratio, defaults)
    if "det_reward_ratio" not in parm:
        raise ValueError(
            "the row has no reward_model.verifier_parm.det_reward_ratio (ROLL's detection "
            "verifier needs its weights) and no det_reward_ratio argument gives one"
        )
    unknown = sorted(set(parm) - {"det_reward_ratio", "det_verifier_normalized"})
    unknown = [k for k in unknown if k not in VERIFIER_PARM_UNREAD]
    if unknown:
        raise ValueError(
            f"reward_model.verifier_parm has keys the verifier does not take: {unknown}"
        )
    if fmt_ratio + acc_ratio == 0:
        raise ValueError("format_ratio + accuracy_ratio is 0: the reward is undefined")
    ratios, problems = reward_ratios(parm["det_reward_ratio"])

    fmt = 1.0 if format_ok(solution_str) else 0.0
    truth = answer_boxes(str(ground_truth or ""))
    pred = answer_boxes(solution_str)
    parts: dict[str, float] = dict(ZERO_PARTS)
    if truth is None:
        problems.append("the ground truth holds no <answer> with boxes: accuracy is 0")
    elif pred is not None:
        if parm.get("det_verifier_normalized") and model_type in PIXEL_BOX_MODELS:
            if image_sizes:
                width, height = image_sizes[0][:2]
                pred = rescale_to_thousand(pred, float(width), float(height))
            else:
                problems.append("no image size to put pixel boxes on the 0-1000 grid")
        parts = detection_accuracy(pred, truth, ratios, threshold, progress)
    accuracy = parts.pop("final_score", 0.0)
    score = (accuracy * acc_ratio + fmt * fmt_ratio) / (acc_ratio + fmt_ratio)
    return {
        "score": score,
        "format_reward": fmt,
        "accuracy_reward": accuracy,
        # a number, so a data set whose truths hold no boxes shows in the metrics
        "truth_has_boxes": float(truth is not None),
        **parts,
        "detection_problem": "; ".join(problems) or None,
    }
