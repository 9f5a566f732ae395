"""``auto``: pick the built-in reward by ``data_source``.

=========================================================== =============
data_source                                                  function
=========================================================== =============
``openai/gsm8k``, ``gsm8k``                                  ``gsm8k``
``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``,  ``math``
``HuggingFaceH4/MATH-500``, anything starting with ``math``
``arithmetic``                                               ``arithmetic``
``countdown``, ``Jiayi-Pan/Countdown-Tasks-3to4``            ``countdown``
``codecontests``, ``apps``, ``codeforces``, ``taco``,        ``code``
``primeintellect``, ``livecodebench`` (verl's code sources)
``ifeval``, ``google/IFEval``                                ``ifeval``
``visual_color`` (an image task)                             ``visual_color``
``hiyouga/geometry3k``, ``geometry3k``, ``geo3k``            ``geo3k``
=========================================================== =============

An unknown data_source raises ``UnknownDataSourceError`` (listing the known ones); the
reward manager records it as that sample's failure (``failure_score``) and warns once
per source, so one stray row does not stop a run. ``RewardScorer.check_data_sources``
turns the same condition into a ``ConfigError`` before training, for pipelines that
want to fail at load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temper.rewards.functions import arithmetic, code, countdown, gsm8k, ifeval, math_boxed, visual

DATA_SOURCES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math": "math",
    "arithmetic": "arithmetic",
    "countdown": "countdown",
    "Jiayi-Pan/Countdown-Tasks-3to4": "countdown",
    **{s: "code" for s in ("codecontests", "apps", "codeforces", "taco", "primeintellect")},
    "livecodebench": "code",
    "ifeval": "ifeval",
    "google/IFEval": "ifeval",
    "visual_color": "visual_color",
    "hiyouga/geometry3k": "geo3k",
    "geometry3k": "geo3k",
    "geo3k": "geo3k",
}
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "gsm8k": gsm8k.compute_score,
    "math": math_boxed.compute_score,
    "arithmetic": arithmetic.compute_score,
    "countdown": countdown.compute_score,
    "code": code.compute_score,
    "ifeval": ifeval.compute_score,
    "visual_color": visual.visual_color_score,
    "geo3k": visual.geo3k_score,
}


class UnknownDataSourceError(KeyError):
    """``auto`` has no reward function for this data_source."""

    def __init__(self, data_source: str) -> None:
        self.data_source = data_source
        known = ", ".join(sorted(DATA_SOURCES))
        super().__init__(
            f"no built-in reward for data_source {data_source!r}; auto knows: {known}, "
            "and any source starting with 'math'. Set reward.function or reward.routes"
        )

    def __str__(self) -> str:
        return str(self.args[0])


def function_name_for(data_source: str) -> str | None:
    """Name of the built-in reward for ``data_source``, or None."""
    if data_source in DATA_SOURCES:
        return DATA_SOURCES[data_source]
    if str(data_source).lower().startswith("math"):
        return "math"
    return None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    **kwargs: Any,
) -> float | dict[str, Any]:
    """Score with the function ``data_source`` selects (kwargs are passed through)."""
    name = function_name_for(data_source)
    if name is None:
        raise UnknownDataSourceError(data_source)
    if name != "code":  # only the code reward runs programs
        kwargs.pop("sandbox", None)
    return FUNCTIONS[name](data_source, solution_str, ground_truth, extra_info, **kwargs)
