"""ROLL's ``rewards.<domain>`` sections: one reward worker per domain -> ``reward.routes``.

===================================  ================  ==============================
ROLL worker                          temper function   what else it sets
===================================  ================  ==============================
``MathRuleRewardWorker``             ``math``
``CrossThinkQARuleRewardWorker``     ``crossthinkqa``  ``reward_type``, length coef
``CodeSandboxRewardWorker``          ``code``          the row's ``case_type``,
                                                       ``test_cases``,
                                                       ``test_case_function`` reach it
                                                       (``data.extra_info_columns``);
                                                       ``use_local: false`` +
                                                       ``code_url``: a SandboxFusion
                                                       service (``reward.sandbox*``)
``GeneralRuleRewardWorker``          ``ifeval``        (ROLL's ``func_name`` rows)
``LLMJudgeRewardWorker``             ``llm_judge``     ``reward.judge``: the worker's
                                                       model, dtype, engine
                                                       (``vllm``/``hf_infer``),
                                                       ``generating_args``,
                                                       ``judge_prompt``; its
                                                       ``device_mapping`` places the
                                                       judge (``resources.reward``)
``VideoR1RewardWorker``              ``video_r1``      the row's ``reward_model``
                                                       (its problem type) reaches it
                                                       (``data.extra_info_columns``)
``DetectionRewardWorker``            ``detection``     the row's ``reward_model``
                                                       reaches it
                                                       (``data.extra_info_columns``);
                                                       ``DET_IOU_THRESHOLD`` of
                                                       ``system_envs`` →
                                                       ``kwargs.iou_threshold``
===================================  ================  ==============================

Rule workers load only a tokenizer in ROLL, so their ``model_args``,
``strategy_args`` and ``generating_args`` are noted. ROLL's API judge
(``judge_model_type: api``) is refused: temper's judge runs on its own rollout engines.

An agentic file's ``reward`` section (singular; ROLL's ``InferWorker`` by default) is the
generating cluster its envs ask for verdicts (DeepEyes' LLM judge): it maps onto the same
``reward.judge`` as an ``LLMJudgeRewardWorker`` (:func:`agentic_judge`), its
``device_mapping`` onto ``resources.reward``; sampling keys the file omits take ROLL's
``GeneratingArguments`` defaults, which that worker samples with.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core import paths
from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.roll.transforms import (
    CROSSTHINKQA_REWARD_TYPES,
    DET_IOU_MODES,
    DET_IOU_THRESHOLDS,
    DTYPES,
    FUNCTION_KWARGS,
    GENERATING_ARGS,
    REWARD_WORKERS,
    ROUTE_KWARGS,
    choice,
)
from temper.config.errors import ConfigError

# ROLL's judge_prompt names (roll/utils/prompt.py prompt_maps) -> temper's template
# (None: the schema default, which is that prompt).
JUDGE_PROMPTS: dict[str, str | None] = {"Qwen2.5-7B-Instruct-RLVR-prompt": None}
JUDGE_ENGINES = {"vllm": "vllm", "hf_infer": "hf"}
CODE_COLUMNS = ["case_type", "test_cases", "test_case_function"]
# ROLL's detection worker reads the whole reward_model of a row (ratios, verifier_parm)
DETECTION_COLUMNS = ["reward_model"]
VIDEO_R1_COLUMNS = ["reward_model"]
DET_ENV = "DET_IOU_THRESHOLD"
MODEL_PATH = "model_args.model_name_or_path"
RULE_NOTE = "ROLL's rule reward workers load only a tokenizer"
# the keys of a rewards.<domain> section that only a judge reads (the table's Use rows)
JUDGE_KEYS = (
    "model_args.model_name_or_path",
    "model_args.dtype",
    "model_args.model_type",
    "strategy_args.strategy_name",
    "strategy_args.strategy_config",
    "generating_args",
    "infer_batch_size",
)
JUDGE_GENERATION = {
    "max_new_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
}


# ROLL's GeneratingArguments defaults (roll/configs/generating_args.py): what an agentic
# file's reward worker samples with where its generating_args say nothing
ROLL_GENERATION_DEFAULTS = {"temperature": 0.95, "top_p": 0.7, "top_k": 50, "max_new_tokens": 8192}


def is_agentic(ctx: Any) -> bool:
    """An agentic file (its episodes played by env managers, trained or not)."""
    return ctx.native_get("pipeline") in ("agentic", "agentic_rollout")


@derivation(
    "reward.{judge}",
    "reward.generating_args.{gen}",
    "reward.model_args.trust_remote_code",
    judge=[k for k in JUDGE_KEYS if k != "generating_args"],
    gen=GENERATING_ARGS,
)
def agentic_judge(ctx: Any) -> None:
    """An agentic file's ``reward`` worker -> ``reward.judge`` (module doc)."""
    spec = dict(ctx.get("reward") or {})
    if not spec:
        return
    gen = dict(spec.get("generating_args") or {})
    given = set(gen)
    if gen.get("do_sample") is False:
        given.add("temperature")
    spec["generating_args"] = {
        **{k: v for k, v in ROLL_GENERATION_DEFAULTS.items() if k not in given},
        **gen,
    }
    _judge(ctx, "reward", spec)
    for k in sorted(set(ROLL_GENERATION_DEFAULTS) - given):
        ctx.note(
            f"not in the file; ROLL's default {ROLL_GENERATION_DEFAULTS[k]} applies "
            f"(reward.judge.{JUDGE_GENERATION[k]})",
            f"reward.generating_args.{k}",
        )


def _worker(spec: Any) -> tuple[Any, str | None]:
    cls = (spec or {}).get("worker_cls")
    return cls, (str(cls).rsplit(".", 1)[-1] if cls else None)


@derivation(
    "rewards.*.worker_cls",
    "rewards.*.world_size",
    "rewards.*.{kwarg}",
    "rewards.*.{judge}",
    "rewards.*.model_args.trust_remote_code",
    "rewards.*.generating_args.{gen}",
    "rewards.*.system_envs",
    "system_envs",
    "actor_train.data_args.tag",
    kwarg=ROUTE_KWARGS,
    judge=[k for k in JUDGE_KEYS if k != "generating_args"],
    gen=GENERATING_ARGS,
    fields=(
        "data.extra_info_columns",
        "model.path",
        "pipeline",
    ),
)
def rewards(ctx: Any) -> None:
    """Routes, judge and sandbox settings of every ``rewards.<domain>`` (module doc)."""
    domains = ctx.get("rewards") or {}
    workers = 0
    judge_domain: str | None = None
    for name, spec in domains.items():
        spec = spec or {}
        key = f"rewards.{name}"
        cls, short = _worker(spec)
        if short not in REWARD_WORKERS:
            known = ", ".join(sorted(REWARD_WORKERS))
            raise ConfigError(
                f"{key}.worker_cls",
                f"'{cls}' is not a ROLL reward worker temper can replace (known: {known})",
                "use one of those workers, or a native config with reward.custom_function",
            )
        function = REWARD_WORKERS[short]
        ctx.write(f"reward.routes.{name}.function", function, f"{key}.worker_cls")
        for k in ROUTE_KWARGS:
            if k not in spec:
                continue
            if k in FUNCTION_KWARGS.get(function, ()):
                ctx.write(f"reward.routes.{name}.kwargs.{k}", spec[k], f"{key}.{k}")
            elif function == "llm_judge" and k.startswith("judge_"):
                continue  # read by _judge below
            elif function == "code" and k in ("use_local", "code_url"):
                continue  # read by _code below
            else:
                ctx.inert(f"{short} does not read it", f"{key}.{k}")
        reward_type = spec.get("reward_type")
        if function == "crossthinkqa" and reward_type not in (None, *CROSSTHINKQA_REWARD_TYPES):
            raise ConfigError(
                f"{key}.reward_type",
                f"'{reward_type}' is not a CrossThinkQA reward type",
                f"use one of: {', '.join(CROSSTHINKQA_REWARD_TYPES)}",
            )
        if function == "code":
            _code(ctx, key, spec)
        if function == "detection":
            _detection(ctx, name, spec)
        if function == "video_r1":  # ROLL's Video-R1 rows hold the problem type there
            _add_columns(ctx, VIDEO_R1_COLUMNS, f"{key}.worker_cls")
        if function == "llm_judge":
            if judge_domain is not None:
                raise ConfigError(
                    f"{key}.worker_cls",
                    f"a second LLM judge (rewards.{judge_domain} is one): temper runs one judge",
                    "route both domains' tags to one llm_judge domain",
                )
            judge_domain = name
            _judge(ctx, key, spec)
        else:
            for path in JUDGE_KEYS:
                if function == "detection" and path == MODEL_PATH:
                    continue  # read by _detection
                if ctx.has(f"{key}.{path}"):
                    for leaf in paths.leaves(ctx.get(f"{key}.{path}"), f"{key}.{path}"):
                        ctx.inert(RULE_NOTE, leaf)
        if function != "llm_judge":  # a judge's world_size counts its engine ranks
            workers = max(workers, int(spec.get("world_size") or 0))
    if workers:
        ctx.write("reward.num_workers", workers, "rewards.*.world_size")
    if is_agentic(ctx):
        agentic_judge(ctx)
    if domains:  # ROLL rows name no data source; their tag is what metrics and failures name
        tag = ctx.get("actor_train.data_args.tag") or "tag"
        ctx.write("data.data_source_key", tag, "rewards")


def _tags(spec: Any) -> list[str]:
    tags = (spec or {}).get("tag_included") or []
    return [str(t) for t in (tags if isinstance(tags, list) else [tags])]


def _add_columns(ctx: Any, columns: list[str], src: str) -> None:
    """Add row ``columns`` to ``data.extra_info_columns`` (several domains may each add)."""
    dst = "data.extra_info_columns"
    have = list(ctx.native_get(dst) or [])
    # the first domain that added columns stays the source
    ctx.replace(dst, [*have, *(c for c in columns if c not in have)], ctx.out.source(dst, src))


def _code(ctx: Any, key: str, spec: dict[str, Any]) -> None:
    _add_columns(ctx, CODE_COLUMNS, f"{key}.worker_cls")
    use_local = spec.get("use_local", True)
    url = spec.get("code_url")
    if use_local:
        if url:
            ctx.inert("use_local is true: the local sandbox runs the code", f"{key}.code_url")
        return
    if not url:
        raise ConfigError(
            f"{key}.code_url",
            "use_local is false but no code_url names the sandbox service",
            "set use_local: true (temper's bubblewrap sandbox) or code_url",
        )
    ctx.write("reward.sandbox", "sandbox_fusion", f"{key}.use_local")
    ctx.write("reward.sandbox_url", str(url), f"{key}.code_url")


def _detection(ctx: Any, name: str, spec: dict[str, Any]) -> None:
    """The row's ``reward_model`` reaches the reward; ROLL's IoU threshold, an environment
    variable of its reward worker, becomes the route's ``iou_threshold``."""
    key = f"rewards.{name}"
    _add_columns(ctx, DETECTION_COLUMNS, f"{key}.worker_cls")
    # ROLL's worker reads its model's processor: Qwen2.5 models answer in pixels; temper
    # reads the policy model's type, which is that one only when the paths agree
    path, policy = ctx.get(f"{key}.{MODEL_PATH}"), ctx.native_get("model.path")
    if path is not None:
        if policy and str(path) != str(policy):
            raise ConfigError(
                f"{key}.{MODEL_PATH}",
                f"'{path}' differs from the policy model '{policy}'; the detection reward "
                "reads the box coordinates' convention (pixels for Qwen2.5) of the policy",
                f"remove it or set it to '{policy}'",
            )
        ctx.inert("the detection reward reads the policy model's type", f"{key}.{MODEL_PATH}")
    found = [
        (src, value)
        for src, value in (
            (f"{key}.system_envs.{DET_ENV}", (spec.get("system_envs") or {}).get(DET_ENV)),
            (f"system_envs.{DET_ENV}", (ctx.get("system_envs") or {}).get(DET_ENV)),
        )
        if value is not None
    ]
    if not found:
        return  # ROLL's default, average, is the function's
    src, value = found[0]
    if isinstance(value, str) and value in DET_IOU_MODES:
        threshold: float | str = value
    else:
        try:
            threshold = float(value)
        except (TypeError, ValueError):
            threshold = float("nan")
        if threshold not in DET_IOU_THRESHOLDS:
            valid = ", ".join([*map(str, DET_IOU_THRESHOLDS), *DET_IOU_MODES])
            raise ConfigError(
                src,
                f"'{value}' is not an IoU threshold of ROLL's detection verifier (ROLL "
                "would log an error and use average)",
                f"use one of {valid}, or remove it for average",
            )
    ctx.write(f"reward.routes.{name}.kwargs.iou_threshold", threshold, src)


def _judge(ctx: Any, key: str, spec: dict[str, Any]) -> None:
    kind = spec.get("judge_model_type", "inference")
    if kind != "inference":
        raise ConfigError(
            f"{key}.judge_model_type",
            f"'{kind}' judges (an OpenAI-compatible API) are not supported: temper runs the "
            "judge model on its own rollout engines",
            "set judge_model_type: inference and model_args.model_name_or_path",
        )
    for k in ("judge_model_name", "judge_api_url", "judge_api_key"):
        if k in spec:
            ctx.inert("used only by API judges", f"{key}.{k}")
    prompt = spec.get("judge_prompt")
    if prompt is not None:
        if prompt not in JUDGE_PROMPTS:
            raise ConfigError(
                f"{key}.judge_prompt",
                f"'{prompt}' is not one of ROLL's judge prompts ({', '.join(JUDGE_PROMPTS)})",
                "use that name, or a native config with reward.judge.prompt_template",
            )
        template = JUDGE_PROMPTS[prompt]
        if template is not None:
            ctx.write("reward.judge.prompt_template", template, f"{key}.judge_prompt")
    model = spec.get("model_args") or {}
    path = model.get("model_name_or_path")
    if path:
        ctx.write("reward.judge.model_path", path, f"{key}.model_args.model_name_or_path")
    if model.get("dtype") is not None:
        dtype = choice(DTYPES, f"{key}.model_args.dtype")(model["dtype"])
        ctx.write("reward.judge.dtype", dtype, f"{key}.model_args.dtype")
    if model.get("trust_remote_code") is not None:
        ctx.write(
            "reward.judge.trust_remote_code",
            bool(model["trust_remote_code"]),
            f"{key}.model_args.trust_remote_code",
        )
    if model.get("model_type") is not None:
        ctx.inert("the judge loads with AutoModelForCausalLM", f"{key}.model_args.model_type")
    strategy = spec.get("strategy_args") or {}
    engine = strategy.get("strategy_name", "hf_infer")
    ctx.write(
        "reward.judge.engine",
        choice(JUDGE_ENGINES, f"{key}.strategy_args.strategy_name")(engine),
        f"{key}.strategy_args.strategy_name",
    )
    for k, v in (strategy.get("strategy_config") or {}).items():
        if k == "gpu_memory_utilization":
            ctx.write("reward.judge.gpu_memory_utilization", v, f"{key}.strategy_args.{k}")
        else:
            ctx.inert("judge engine speed/memory", f"{key}.strategy_args.strategy_config.{k}")
    gen = spec.get("generating_args") or {}
    for k, v in gen.items():
        src = f"{key}.generating_args.{k}"
        if k in JUDGE_GENERATION and v is not None:
            ctx.write(f"reward.judge.{JUDGE_GENERATION[k]}", v, src)
        elif k == "do_sample":
            if v is False:
                ctx.write("reward.judge.temperature", 0.0, src)
        elif k in ("num_beams", "num_return_sequences"):
            if v not in (None, 1):
                raise ConfigError(src, "the judge gives one verdict per sample", f"set {k}: 1")
        else:
            ctx.inert("not a judge sampling setting", src)
    if spec.get("infer_batch_size"):
        ctx.write(
            "reward.judge.infer_batch_size",
            int(spec["infer_batch_size"]),
            f"{key}.infer_batch_size",
        )
