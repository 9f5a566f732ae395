"""The reward manager: a ``Batch`` of responses in, scores and token-level rewards out.

``RewardScorer.score_batch(batch, tokenizer)``:

1. decodes ``response_ids`` (tokens present per ``attention_mask``'s response part, else
   ``response_mask``; special tokens skipped) into ``batch.objects["response_text"]``;
2. picks each sample's function: the route whose ``tags`` hold the sample's ``tag``,
   else a route with empty ``tags`` (catch-all), else ``reward.function``
   (``custom`` / a set ``custom_function.path`` → the user function);
3. runs the calls on the ``RewardExecutor`` (worker processes, per-call timeout); a call
   that raises, hangs, crashes its worker or returns something that is not a finite
   number / a dict with a finite ``"score"`` scores ``failure_score`` and is listed in
   ``failures``;
4. adds ``format_penalty`` to samples whose result says ``format_ok: False``;
5. adds the reward model's score when one is enabled (below);
6. puts each score on the last ``response_mask`` token (``placement``).

Reward managers: ``naive`` calls per sample; ``batch`` calls a custom function with
verl's batch signature ``fn(data_sources, solution_strs, ground_truths, extra_infos,
**kwargs) -> list`` on one chunk per worker (timeout ``timeout_s`` × chunk size; a
failing chunk fails its samples; built-ins stay per sample); ``dapo`` scores like
``naive`` — its overlong penalty is the algorithm layer's
(``temper.algorithms.overlong_penalty`` under ``algorithm.overlong_buffer``); ``prime``
is rejected (``ConfigError``).

Reward model: with ``reward.model.enable`` the RM score is the score when no rule is
configured (``function: auto``, no custom path, no routes — verl's behaviour), and is
added to the rule score otherwise.

Per-sample object columns read: ``data_source``, ``ground_truth``, ``extra_info``, ``tag``
(missing columns read as ``"unknown"``/None). Written: ``response_text`` and
``reward_extra_info`` (the function's extra fields, plus ``reward_failure``).

A built-in that declares needs (``temper.rewards.registry``) also gets, per call:
``model_type`` (the scorer's, read from ``model.path`` by ``from_config``),
``image_sizes`` (from the sample's ``multi_modal_data`` images) and ``progress``
(``batch.meta["progress"]``, which the RLVR producer sets; 0 when absent).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from temper.config.errors import ConfigError
from temper.config.schema import ModelConfig, RewardConfig, TemperConfig
from temper.data.batch import Batch
from temper.rewards.custom import load_custom_function
from temper.rewards.executor import CallKind, CallResult, RewardCall, RewardExecutor
from temper.rewards.failures import FailureGuard
from temper.rewards.functions.auto import DATA_SOURCES, function_name_for
from temper.rewards.judge import JudgeEngine, LLMJudge, check_judge_config, question_of
from temper.rewards.placement import place_at_last_token
from temper.rewards.preflight import check_sandbox, kwargs_key, sandbox_settings
from temper.rewards.registry import (
    CUSTOM,
    IMAGE_SIZES,
    JUDGE,
    MODEL_TYPE,
    PROGRESS,
    SANDBOXED,
    check_reward_kwargs,
    reward_function_needs,
)
from temper.rewards.worker import FunctionSpec

logger = logging.getLogger(__name__)

DATA_SOURCE, GROUND_TRUTH, EXTRA_INFO, TAG = "data_source", "ground_truth", "extra_info", "tag"


@dataclass(frozen=True)
class RewardFailure:
    """A sample whose reward could not be computed (it scored ``failure_score``)."""

    index: int
    data_source: str
    function: str
    kind: str  # error | timeout | crash | invalid
    reason: str


class RewardOutput(NamedTuple):
    scores: Tensor  # (B,) float32
    token_level_scores: Tensor  # (B, R) float32
    metrics: dict[str, float]
    failures: list[RewardFailure]


def _spec(function: str, kwargs: Mapping[str, Any], config: RewardConfig, key: str) -> FunctionSpec:
    custom = config.custom_function
    batched = config.reward_manager == "batch"
    if function == CUSTOM or (function == "auto" and custom.path and key == "reward.function"):
        load_custom_function(custom.path, custom.name)  # fail now, with the key, if broken
        return FunctionSpec(custom.name, custom.path, {**kwargs, **custom.kwargs}, batched)
    if function == JUDGE:
        check_judge_config(config.judge)
        return FunctionSpec(JUDGE, None, {}, False)
    needs = reward_function_needs(function, key)
    check_reward_kwargs(function, kwargs, kwargs_key(key))
    if function == "code":
        check_sandbox(config)
    if function in SANDBOXED:
        kwargs = {**kwargs, "sandbox": sandbox_settings(config)}
    if custom.path and key == "reward.function":
        raise ConfigError(
            "reward.custom_function.path",
            f"is set but reward.function is '{function}'",
            "set reward.function=custom (or auto) to use the file, or unset the path",
        )
    return FunctionSpec(function, None, dict(kwargs), False, needs)


#: The largest magnitude a score may have: scores are float32 tensors, where a larger
#: float becomes inf (and the step's advantages NaN).
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def normalize_result(value: Any) -> tuple[float, dict[str, Any]]:
    """``(score, extra fields)`` of a reward function's return; ``ValueError`` if invalid
    (not a number, not finite, or beyond float32)."""
    extras: dict[str, Any] = {}
    if isinstance(value, Mapping):
        if "score" not in value:
            raise ValueError(f"reward dict has no 'score' key (keys: {sorted(value)})")
        extras = {k: v for k, v in value.items() if k != "score"}
        value = value["score"]
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise ValueError(f"reward is a {type(value).__name__}, not a number")
    try:
        score = float(value)
    except OverflowError as err:  # an int such as 10**400
        raise ValueError(f"reward is too large for a float ({err})") from err
    except Exception as err:  # the user's own __float__ may raise anything
        raise ValueError(f"reward {type(value).__name__} has no float: {err!r}") from err
    if not math.isfinite(score):
        raise ValueError(f"reward is not finite ({score})")
    if abs(score) > FLOAT32_MAX:
        raise ValueError(f"reward {score:g} is outside float32, the scores' type")
    return score, extras


def _metric_value(value: Any) -> float | None:
    """A reward's extra field as a metric: a finite float, or None (not a number)."""
    if not isinstance(value, (bool, int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


class RewardScorer:
    """Scores batches with rule/custom functions (in worker processes) and optionally an RM."""

    def __init__(
        self,
        config: RewardConfig,
        *,
        reward_model: Any | None = None,
        judge: JudgeEngine | None = None,
        start_method: str = "spawn",
        preload: Sequence[str] = ("math_verify",),
        model: ModelConfig | None = None,
    ) -> None:
        """``model``: the policy model, whose ``model_type`` is read (config file only)
        when a function needs it (``temper.rewards.registry``)."""
        if config.reward_manager == "prime":
            raise ConfigError(
                "reward.reward_manager",
                "'prime' (PRIME implicit process rewards) is not supported",
                "use naive, batch or dapo",
            )
        self.config = config
        self.reward_model = reward_model
        self.default = _spec(config.function, config.function_kwargs, config, "reward.function")
        self.by_tag: dict[str, FunctionSpec] = {}
        self.catch_all: FunctionSpec | None = None
        owner: dict[str, str] = {}
        for name, route in config.routes.items():
            key = f"reward.routes.{name}"
            spec = _spec(route.function, route.kwargs, config, f"{key}.function")
            if not route.tags:
                if self.catch_all is not None:
                    raise ConfigError(f"{key}.tags", "a second route with no tags (catch-all)")
                self.catch_all = spec
            for tag in route.tags:
                if tag in owner:
                    raise ConfigError(
                        f"{key}.tags", f"tag '{tag}' is already routed by '{owner[tag]}'"
                    )
                owner[tag], self.by_tag[tag] = name, spec
        rule_configured = (
            config.function != "auto" or bool(config.custom_function.path) or bool(config.routes)
        )
        self.use_rules = reward_model is None or rule_configured
        specs = [self.default, *self.by_tag.values(), *([self.catch_all] if self.catch_all else [])]
        self.judge: LLMJudge | None = None
        if any(spec.name == JUDGE and not spec.path for spec in specs):
            if judge is None:
                raise ConfigError(
                    "reward.judge.model_path",
                    "llm_judge scores some samples but no judge engine was built",
                    "build the scorer with RewardScorer.from_config (or pass judge=)",
                )
            self.judge = LLMJudge(config.judge, judge)
        needed = MODEL_TYPE in frozenset().union(*(spec.needs for spec in specs))
        self.model_type = model_type_of(model) if needed and model is not None else None
        self.executor = RewardExecutor(config.num_workers, start_method, preload)
        self.guard = FailureGuard(config.max_failure_fraction, config.max_failed_steps)
        self._warned_sources: set[str] = set()

    @classmethod
    def from_config(
        cls,
        config: TemperConfig,
        *,
        device: str | torch.device = "cpu",
        judge: JudgeEngine | None = None,
        reward_model: Any | None = None,
    ) -> RewardScorer:
        """The scorer of a run (loads the reward model when ``reward.model.enable``, unless
        ``reward_model`` — one built on a training engine or a worker group,
        ``temper.cluster.reward.run_reward_model`` — is given); ``judge``: the engine of the LLM judge
        (``temper.cluster.judge.build_judge``)."""
        rm = reward_model
        if rm is None and config.reward.model.enable:
            from temper.rewards.model import RewardModel

            rm = RewardModel.from_config(config.reward.model, device=device)
        return cls(config.reward, reward_model=rm, judge=judge, model=config.model)

    def close(self) -> None:
        """Stop the reward worker processes and the judge's engine (idempotent)."""
        self.executor.close()
        if self.judge is not None:
            self.judge.engine.close()
            self.judge = None

    def __enter__(self) -> RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ checks

    def spec_for(self, tag: Any) -> FunctionSpec:
        """The function that scores a sample with this tag."""
        if tag in self.by_tag:
            return self.by_tag[tag]
        return self.catch_all or self.default

    def check_data_sources(self, sources: Sequence[str], tags: Sequence[Any] | None = None) -> None:
        """``ConfigError`` if an ``auto``-scored sample has a data_source auto does not know."""
        if not self.use_rules:
            return
        tags = tags if tags is not None else [None] * len(sources)
        unknown = sorted(
            {
                s
                for s, t in zip(sources, tags)
                if self.spec_for(t).name == "auto"
                and not self.spec_for(t).path
                and function_name_for(s) is None
            }
        )
        if unknown:
            raise ConfigError(
                "reward.function",
                f"auto has no reward for data_source {', '.join(map(repr, unknown))}",
                f"set reward.function (or routes); auto knows {', '.join(sorted(DATA_SOURCES))}",
            )
        if any(
            self.spec_for(t).name == "auto" and function_name_for(s) == "code"
            for s, t in zip(sources, tags)
        ):
            check_sandbox(self.config)

    # ------------------------------------------------------------------ scoring

    def score_batch(self, batch: Batch, tokenizer: Any, *, prefix: str = "train") -> RewardOutput:
        """Score every response of ``batch`` (see the module doc). Never raises for a
        misbehaving reward function; metrics keys use ``prefix`` (``train``/``val``)."""
        n = len(batch)
        batch.objects["response_text"] = decode_responses(batch, tokenizer)
        scores, extra_info, failures = self.score_texts(batch)
        sources = [str(s) for s in _column(batch, DATA_SOURCE, "unknown")]
        rm_scores = None
        if self.reward_model is not None and n:
            rm_scores = self.reward_model.score(batch, tokenizer).float().cpu()
            scores = scores + rm_scores
        batch.objects["reward_extra_info"] = extra_info
        token_level = place_at_last_token(scores, batch["response_mask"].cpu())
        metrics = _metrics(scores, sources, extra_info, failures, rm_scores, prefix)
        if prefix == "train":
            self.guard.observe(n, failures)
        return RewardOutput(scores, token_level, metrics, failures)

    def score_texts(
        self, batch: Batch
    ) -> tuple[torch.Tensor, list[dict[str, Any]], list[RewardFailure]]:
        """The reward functions' part of :meth:`score_batch`, on texts: the scores
        (``(B,)``), extra fields and failures of the samples of ``batch``, whose objects
        hold ``response_text`` and what the functions read (``data_source``,
        ``ground_truth``, ``extra_info``, ``tag``; the judge's ``raw_prompt`` or
        ``prompt_text``). No reward model: it scores token ids. ``temper eval`` scores a
        file's responses so, with no tensors at all."""
        n = len(batch)
        texts = [str(t) for t in batch.objects["response_text"]]
        sources = [str(s) for s in _column(batch, DATA_SOURCE, "unknown")]
        truths, extras_in = _column(batch, GROUND_TRUTH, None), _column(batch, EXTRA_INFO, None)
        tags = _column(batch, TAG, None)
        scores = torch.zeros(n, dtype=torch.float32)
        extra_info: list[dict[str, Any]] = [{} for _ in range(n)]
        failures: list[RewardFailure] = []
        if self.use_rules and n:
            specs = [self.spec_for(t) for t in tags]
            inputs = self._inputs(batch, specs)
            results = self._run(specs, sources, texts, truths, extras_in, inputs)
            self._judge(batch, specs, texts, truths, results)
            for i, (spec, res) in enumerate(zip(specs, results)):
                kind, reason = res.kind, res.reason
                if kind == "ok":
                    try:
                        score, extra = normalize_result(res.value)
                    except (ValueError, TypeError) as err:
                        kind, reason = "invalid", f"{type(err).__name__}: {err}"
                    else:
                        if extra.get("format_ok") is False:
                            score += self.config.format_penalty
                        scores[i], extra_info[i] = score, dict(extra)
                if kind != "ok":
                    scores[i] = self.config.failure_score
                    failures.append(RewardFailure(i, sources[i], spec.label, kind, reason))
                    self._warn_unknown_source(sources[i], reason)
                extra_info[i]["reward_failure"] = None if kind == "ok" else reason
        return scores, extra_info, failures

    def _judge(
        self,
        batch: Batch,
        specs: list[FunctionSpec],
        texts: list[str],
        truths: list[Any],
        results: list[CallResult],
    ) -> None:
        """Scores of the samples routed to ``llm_judge``, into ``results``."""
        rows = [i for i, s in enumerate(specs) if s.name == JUDGE and not s.path]
        if not rows or self.judge is None:
            return
        raw, prompt_text = _column(batch, "raw_prompt", None), _column(batch, "prompt_text", None)
        questions = [question_of(raw[i], prompt_text[i]) for i in rows]
        verdicts = self.judge.score(questions, [texts[i] for i in rows], [truths[i] for i in rows])
        for i, (score, verdict, reason) in zip(rows, verdicts):
            if score is None:
                kind: CallKind = "invalid" if verdict else "error"
                results[i] = CallResult(kind, reason=reason)
            else:
                results[i] = CallResult("ok", value={"score": score, "judge_verdict": verdict})

    def _inputs(self, batch: Batch, specs: list[FunctionSpec]) -> list[dict[str, Any]]:
        """Per sample, the inputs its function needs (module doc), by their names."""
        media = _column(batch, "multi_modal_data", None)
        progress = float(batch.meta.get("progress", 0.0))
        out: list[dict[str, Any]] = []
        for spec, mm in zip(specs, media):
            given: dict[str, Any] = {}
            if MODEL_TYPE in spec.needs:
                given[MODEL_TYPE] = self.model_type
            if IMAGE_SIZES in spec.needs:
                images = mm.get("image", []) if isinstance(mm, Mapping) else []
                given[IMAGE_SIZES] = [tuple(image.size) for image in images]
            if PROGRESS in spec.needs:
                given[PROGRESS] = progress
            out.append(given)
        return out

    def _run(
        self,
        specs: list[FunctionSpec],
        sources: list[str],
        texts: list[str],
        truths: list[Any],
        extras: list[Any],
        inputs: list[dict[str, Any]],
    ) -> list[CallResult]:
        timeout = self.config.timeout_s
        per_sample = [i for i, s in enumerate(specs) if not s.batched and s.name != JUDGE]
        calls = [
            RewardCall(
                specs[i],
                {
                    "data_source": sources[i],
                    "solution_str": texts[i],
                    "ground_truth": truths[i],
                    "extra_info": extras[i],
                    **inputs[i],
                },
                timeout,
            )
            for i in per_sample
        ]
        chunks: list[list[int]] = []
        groups: dict[FunctionSpec, list[int]] = defaultdict(list)
        for i, s in enumerate(specs):
            if s.batched and s.name != JUDGE:
                groups[s].append(i)
        pieces = max(1, self.config.num_workers)
        for spec, rows in groups.items():
            size = math.ceil(len(rows) / pieces)
            for start in range(0, len(rows), size):
                chunk = rows[start : start + size]
                chunks.append(chunk)
                arguments = {
                    "data_sources": [sources[i] for i in chunk],
                    "solution_strs": [texts[i] for i in chunk],
                    "ground_truths": [truths[i] for i in chunk],
                    "extra_infos": [extras[i] for i in chunk],
                }
                chunk_timeout = None if timeout is None else timeout * len(chunk)
                calls.append(RewardCall(spec, arguments, chunk_timeout))
        raw = self.executor.run(calls)
        out: list[CallResult] = [CallResult("crash")] * len(specs)
        for i, res in zip(per_sample, raw):
            out[i] = res
        for chunk, res in zip(chunks, raw[len(per_sample) :]):
            values = res.value if res.kind == "ok" else None
            if res.kind == "ok" and (not isinstance(values, Sequence) or len(values) != len(chunk)):
                got = (
                    f"{len(values)} items"
                    if isinstance(values, Sequence)
                    else type(values).__name__
                )
                res = CallResult(
                    "invalid",
                    reason=f"ValueError: batch reward returned {got} for {len(chunk)} samples",
                )
            for j, i in enumerate(chunk):
                if res.kind == "ok" and isinstance(values, Sequence):
                    out[i] = CallResult("ok", values[j], seconds=res.seconds)
                else:
                    out[i] = res
        return out

    def _warn_unknown_source(self, source: str, reason: str) -> None:
        if reason.startswith("UnknownDataSourceError") and source not in self._warned_sources:
            self._warned_sources.add(source)
            logger.warning(
                "reward: %s (samples scored failure_score=%s)", reason, self.config.failure_score
            )


def model_type_of(model: ModelConfig) -> str | None:
    """``config.model_type`` of the policy model (its config file only), or None when
    there is none to read (the model loader reports a missing model)."""
    from transformers import AutoConfig

    from temper.utils.model_path import resolve_model_path

    if not model.path:
        return None
    try:
        config = AutoConfig.from_pretrained(
            resolve_model_path(model.path), trust_remote_code=model.trust_remote_code
        )
    except (OSError, ValueError):
        return None
    return str(getattr(config, "model_type", "") or "") or None


def _column(batch: Batch, key: str, default: Any) -> list[Any]:
    return list(batch.objects[key]) if key in batch.objects else [default] * len(batch)


def decode_responses(batch: Batch, tokenizer: Any) -> list[str]:
    """Response texts: the tokens present in each row, special tokens skipped."""
    ids = batch["response_ids"]
    width = ids.shape[-1]
    if "attention_mask" in batch and batch["attention_mask"].shape[-1] >= width:
        present = batch["attention_mask"][:, -width:]
    else:
        present = batch["response_mask"]
    rows = [row[mask.bool()].tolist() for row, mask in zip(ids.cpu(), present.cpu())]
    return list(tokenizer.batch_decode(rows, skip_special_tokens=True))


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _metrics(
    scores: torch.Tensor,
    sources: list[str],
    extra_info: list[dict[str, Any]],
    failures: list[RewardFailure],
    rm_scores: torch.Tensor | None,
    prefix: str,
) -> dict[str, float]:
    """``<prefix>/score_mean|max|min``, ``<prefix>/reward_failures|timeouts``,
    ``[<prefix>/]reward/<source>/mean``, ``[<prefix>/]reward_extra/<field>`` (numeric fields
    averaged over the samples that report them); the bracket is dropped for ``train``."""
    sub = "" if prefix == "train" else f"{prefix}/"
    values = scores.tolist()
    m: dict[str, float] = {
        f"{prefix}/score_mean": _mean(values),
        f"{prefix}/score_max": max(values, default=0.0),
        f"{prefix}/score_min": min(values, default=0.0),
        f"{prefix}/reward_failures": float(len(failures)),
        f"{prefix}/reward_timeouts": float(sum(f.kind == "timeout" for f in failures)),
    }
    if rm_scores is not None:
        m[f"{prefix}/rm_score_mean"] = _mean(rm_scores.tolist())
    per_source: dict[str, list[float]] = defaultdict(list)
    for s, v in zip(sources, values):
        per_source[s].append(v)
    for s, vs in sorted(per_source.items()):
        m[f"{sub}reward/{s}/mean"] = _mean(vs)
    fields: dict[str, list[float]] = defaultdict(list)
    for extra in extra_info:
        for k, v in extra.items():
            number = _metric_value(v)
            if number is not None:
                fields[k].append(number)
    for k, vs in sorted(fields.items()):
        m[f"{sub}reward_extra/{k}"] = _mean(vs)
    return m
