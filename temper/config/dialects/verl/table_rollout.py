"""The verl key table, part two: the rollout and data sections (see :mod:`verl.table`)."""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Call, Map, Note, Refuse, Rule, Use
from temper.config.dialects.verl import asynchronous as verl_async
from temper.config.dialects.verl import transforms as r
from temper.config.dialects.verl.table import (
    ACT,
    INTERNAL,
    MM,
    PERF,
    RO,
    _gate,
    _gather,
    _inert,
    _off,
    _profiler,
)
from temper.config.schema import RolloutConfig


def _r3(ctx: Any) -> bool:
    """Whether the actor's router replay (either spelling) is R3."""
    modes = (ctx.get(f"{ACT}.router_replay.mode"), ctx.get(f"{ACT}.megatron.router_replay.mode"))
    return "R3" in modes


def engine_kwargs(value: Any, ctx: Any) -> None:
    """``engine_kwargs.{vllm,sglang,trtllm}``: the chosen engine's dict becomes native."""
    if not isinstance(value, dict):
        raise ctx.error(f"expected a mapping of engine name -> kwargs, got {value!r}", "")
    for name, kwargs in value.items():
        if name not in ("vllm", "sglang", "trtllm"):
            raise ctx.error(f"unknown engine '{name}'", "use vllm or sglang")
        if not kwargs:
            ctx.note("empty: no engine arguments", f"{ctx.key}.{name}")
            continue
        if not isinstance(kwargs, dict):
            raise ctx.error(f"engine_kwargs.{name} must be a mapping", "")
        ctx.state.setdefault("engine_kwargs", {}).setdefault(name, {}).update(kwargs)
        ctx.state.setdefault("engine_kwargs_keys", {}).setdefault(name, []).extend(
            f"{ctx.key}.{name}.{arg}" for arg in kwargs
        )


@derivation(fields=("rollout.engine",))
def finish_engine_kwargs(ctx: Any) -> None:
    """The final pass of the ``engine_kwargs`` rows: the chosen engine's kwargs (the
    engine ``rollout.name`` wrote) become ``rollout.engine_kwargs``; the others' are
    noted."""
    ctx.key = ctx.prefix + f"{RO}.engine_kwargs"
    chosen = ctx.out.written("rollout.engine", RolloutConfig.engine).value
    kwargs = ctx.state.get("engine_kwargs", {})
    for name, keys in ctx.state.get("engine_kwargs_keys", {}).items():
        if name != chosen and kwargs.get(name):
            for key in keys:
                ctx.note(f"no effect here (used only when rollout.name is {name})", key)
    if kwargs.get(chosen):
        ctx.write("rollout.engine_kwargs", kwargs[chosen])


def _section_rollout() -> dict[str, Rule]:
    no_engine_par = "the rollout engine runs tensor parallelism only"
    return _gather(
        _profiler(RO),
        {
            f"{RO}.name": Map("rollout.engine", r.engine),
            f"{RO}.mode": Note("temper's engines batch continuously; sync/async is verl wiring"),
            f"{RO}.temperature": Map("rollout.temperature"),
            f"{RO}.top_k": Map("rollout.top_k", r.top_k),
            f"{RO}.top_p": Map("rollout.top_p"),
            f"{RO}.use_fire_sampling": _off(
                "plain sampling", "FIRE sampling is not supported", "set use_fire_sampling: false"
            ),
            f"{RO}.prompt_length": Map("data.max_prompt_length"),
            f"{RO}.response_length": Map("rollout.response_length"),
            f"{RO}.dtype": Map("rollout.dtype", r.dtype),
            f"{RO}.gpu_memory_utilization": Map("rollout.gpu_memory_utilization"),
            f"{RO}.ignore_eos": Map("rollout.ignore_eos"),
            f"{RO}.enforce_eager": Map("rollout.enforce_eager"),
            f"{RO}.cudagraph_capture_sizes": Note(PERF),
            # weak: verl 0.9's enable_sleep_mode=false (an engine that cannot sleep) overrides it
            f"{RO}.free_cache_engine": Map("rollout.free_cache_engine", weak=True),
            f"{RO}.tensor_model_parallel_size": Map("rollout.tensor_parallel_size"),
            f"{RO}.data_parallel_size": _inert(
                (1,), no_engine_par, "engine data parallelism is not supported", "set it to 1"
            ),
            f"{RO}.expert_parallel_size": _inert(
                (1,), no_engine_par, "engine expert parallelism is not supported", "set it to 1"
            ),
            f"{RO}.pipeline_model_parallel_size": _inert(
                (1,), no_engine_par, "engine pipeline parallelism is not supported", "set it to 1"
            ),
            f"{RO}.max_num_batched_tokens": Map("rollout.max_num_batched_tokens"),
            f"{RO}.max_model_len": Map("rollout.max_model_len"),
            f"{RO}.max_num_seqs": Map("rollout.max_num_seqs"),
            f"{RO}.enable_chunked_prefill": Map("rollout.enable_chunked_prefill"),
            f"{RO}.enable_prefix_caching": Map("rollout.enable_prefix_caching"),
            f"{RO}.logprobs_mode": _inert(
                ("processed_logprobs",),
                "log-probs after temperature/top-p processing",
                "only processed_logprobs are returned",
                "set logprobs_mode: processed_logprobs",
            ),
            f"{RO}.scheduling_policy": Note(PERF),
            f"{RO}.load_format": Map("rollout.load_format", r.load_format),
            f"{RO}.log_prob_micro_batch_size": Map(
                "rollout.log_prob_micro_batch_size_per_device",
                r.per_device(f"{ACT}.ulysses_sequence_parallel_size"),
            ),
            f"{RO}.log_prob_micro_batch_size_per_gpu": Map(
                "rollout.log_prob_micro_batch_size_per_device"
            ),
            f"{RO}.log_prob_use_dynamic_bsz": Map("rollout.log_prob_use_dynamic_bsz"),
            f"{RO}.log_prob_max_token_len_per_gpu": Map(
                "rollout.log_prob_max_token_len_per_device"
            ),
            f"{RO}.disable_log_stats": Map("rollout.disable_log_stats"),
            f"{RO}.do_sample": Map("rollout.do_sample"),
            f"{RO}.n": Map("rollout.n"),
            # verl (0.7 on, 2026-01 and 2026-08 included) declares the key and reads it
            # nowhere: the early abort (cancel the rest once (1 - rate)·n requests finish,
            # keep them as empty fully-masked rows) lived in the SGLang SPMD rollout, which
            # verl #4422 removed in Dec 2025; its async agent loop never read it
            f"{RO}.over_sample_rate": Note(
                "verl since 0.7 reads it nowhere (its early abort of the slowest requests "
                "left with the SGLang SPMD rollout): every request runs to completion, here "
                "as there"
            ),
            f"{RO}.multi_stage_wake_up": Note(PERF),
            f"{RO}.engine_kwargs": Call(engine_kwargs),
            f"{RO}.val_kwargs.top_k": Map("rollout.val.top_k", r.top_k),
            f"{RO}.val_kwargs.top_p": Map("rollout.val.top_p"),
            f"{RO}.val_kwargs.temperature": Map("rollout.val.temperature"),
            f"{RO}.val_kwargs.n": Map("rollout.val.n"),
            f"{RO}.val_kwargs.do_sample": Map("rollout.val.do_sample"),
            f"{RO}.calculate_log_probs": Map("rollout.calculate_log_probs"),
            f"{RO}.skip_tokenizer_init": Note(INTERNAL),
            f"{RO}.layered_summon": Note(PERF),
            f"{RO}.quantization": _off(
                "full-precision rollout weights",
                "rollout quantization is not supported",
                "set it to null",
            ),
            f"{RO}.quantization_config_file": _off(
                "no quantization", "rollout quantization is not supported", "set it to null"
            ),
            f"{RO}.skip_rollout": _off(
                "rollouts are generated",
                "replaying dumped rollouts is not supported",
                "set skip_rollout: false",
            ),
            f"{RO}.skip_dump_dir": _inert(
                r.when_off(f"{RO}.skip_rollout"),
                "skip_rollout is off",
                "replaying dumped rollouts is not supported",
                "set skip_rollout: false",
            ),
            f"{RO}.enable_rollout_routing_replay": Refuse(
                "the rollout returns each token's experts exactly when the actor's "
                "router_replay.mode is R3",
                "set it as the actor's router_replay.mode says (true with R3)",
                ok=lambda v, ctx: bool(v) == _r3(ctx),
                why="true with the actor's R3, false otherwise",
            ),
            f"{RO}.checkpoint_engine.backend": Use(
                "checked: verl's separate_async trainer asserts a backend other than naive",
                verl_async._separate_async,
                idle="weights sync in buckets over temper's own transport",
            ),
            f"{RO}.checkpoint_engine.update_weights_bucket_megabytes": Map(
                "rollout.update_weights_bucket_megabytes"
            ),
            f"{RO}.checkpoint_engine.engine_kwargs": Note(PERF),
            f"{RO}.agent.num_workers": Note(PERF),
            f"{RO}.agent.default_agent_loop": _inert(
                ("single_turn_agent", "tool_agent", None),
                "the agent loop follows multi_turn.enable",
                "custom agent loops are not supported",
                "use multi_turn, or pipeline: agentic natively",
            ),
            f"{RO}.agent.agent_loop_config_path": _off(
                "built-in agent loops", "custom agent loops are not supported", "set it to null"
            ),
        },
        _gate(
            f"{RO}.agent.custom_async_server",
            "path",
            (None,),
            "no custom async server",
            "custom async rollout servers are not supported",
            "set path: null",
        ),
        _gate(
            f"{RO}.trace",
            "backend",
            (None,),
            "rollout tracing is off",
            "rollout tracing backends are not supported",
            "set backend: null",
        ),
        _gate(
            f"{RO}.prometheus",
            "enable",
            (False, None),
            "Prometheus export is off",
            "Prometheus export is not supported",
            "set enable: false",
        ),
        _section_multi_turn(),
    )


def _section_multi_turn() -> dict[str, Rule]:
    mt = f"{RO}.multi_turn"
    return {
        f"{mt}.enable": Map("rollout.multi_turn.enable"),
        f"{mt}.max_assistant_turns": Map("rollout.multi_turn.max_assistant_turns"),
        f"{mt}.max_turns": Map("rollout.multi_turn.max_assistant_turns"),  # verl < 0.5
        f"{mt}.max_user_turns": Map("rollout.multi_turn.max_user_turns"),
        f"{mt}.tool_config_path": Map("rollout.multi_turn.tool_config_path"),
        f"{mt}.max_parallel_calls": _inert(
            (1,), "one tool call per turn", "parallel tool calls are not supported", "set it to 1"
        ),
        f"{mt}.max_tool_response_length": Map("rollout.multi_turn.max_tool_response_length"),
        f"{mt}.tool_response_truncate_side": Map("rollout.multi_turn.tool_response_truncate_side"),
        f"{mt}.interaction_config_path": Map("rollout.multi_turn.interaction_config_path"),
        f"{mt}.use_inference_chat_template": Map("rollout.multi_turn.use_inference_chat_template"),
        f"{mt}.tokenization_sanity_check_mode": Map(
            "rollout.multi_turn.enable_tokenization_sanity_check", r.sanity_mode
        ),
        f"{mt}.enable_tokenization_sanity_check": Map(
            "rollout.multi_turn.enable_tokenization_sanity_check"
        ),
        f"{mt}.format": Map("rollout.multi_turn.format"),
        f"{mt}.completion_callback": _off(
            "the built-in turn loop",
            "custom completion callbacks are not supported",
            "set it to null",
        ),
        f"{mt}.num_repeat_rollouts": _off(
            "one rollout per sample",
            "repeated multi-turn rollouts are not supported",
            "use rollout.n",
        ),
    }


def _section_data() -> dict[str, Rule]:
    D = "data"
    return _gather(
        {
            f"{D}.tokenizer": Map("model.tokenizer_path"),
            f"{D}.use_shm": _off(
                "data loads from disk",
                "shared-memory data loading is not supported",
                "set use_shm: false",
            ),
            f"{D}.train_files": Map("data.train_files", r.file_list),
            f"{D}.val_files": Map("data.val_files", r.file_list),
            f"{D}.train_max_samples": Map(
                "data.train_max_samples", lambda v, _c: -1 if v is None else v
            ),
            f"{D}.val_max_samples": Map(
                "data.val_max_samples", lambda v, _c: -1 if v is None else v
            ),
            f"{D}.prompt_key": Map("data.prompt_key"),
            f"{D}.reward_fn_key": Map("data.data_source_key"),
            f"{D}.max_prompt_length": Map("data.max_prompt_length"),
            f"{D}.max_response_length": Map("rollout.response_length"),
            f"{D}.train_batch_size": Map("data.train_batch_size"),
            f"{D}.gen_batch_size": Map("data.gen_batch_size"),  # DAPO: prompts per round
            f"{D}.val_batch_size": Map("data.val_batch_size"),
            f"{D}.tool_config_path": Map("rollout.multi_turn.tool_config_path", weak=True),
            f"{D}.return_raw_input_ids": Note(
                "the reward model re-templates from text when reward_model.model.input_tokenizer is set"
            ),
            f"{D}.return_raw_chat": Note("raw chats are always kept alongside token ids"),
            f"{D}.return_full_prompt": Note("full prompts are always kept"),
            f"{D}.shuffle": Map("data.shuffle"),
            f"{D}.seed": Map("experiment.seed"),
            f"{D}.dataloader_num_workers": Note(PERF),
            f"{D}.image_patch_size": Note(
                "images are resized to the grid of the model's image processor (patch_size × "
                "merge_size); bounds: data.image_min_pixels / image_max_pixels"
            ),
            f"{D}.validation_shuffle": Map("data.validation_shuffle"),
            f"{D}.filter_overlong_prompts": Map("data.filter_overlong_prompts"),
            f"{D}.filter_overlong_prompts_workers": Note(PERF),
            f"{D}.truncation": Map("data.truncation"),
            f"{D}.image_key": Map("data.image_key", lambda v, _c: v or "images"),
            f"{D}.video_key": Map("data.video_key", lambda v, _c: v or "videos"),
            f"{D}.return_multi_modal_inputs": Note(
                f"{MM}; each row's multi_modal_inputs travel with it to every forward"
            ),
            f"{D}.trust_remote_code": Map("model.trust_remote_code", weak=True),
            f"{D}.apply_chat_template_kwargs": Map("data.apply_chat_template_kwargs"),
            f"{D}.prompt_id_key": _off(
                "no V1 prompt ids", "V1 prompt ids are not supported", "remove it"
            ),
            f"{D}.max_prompt_id_length": _inert(
                r.when_off(f"{D}.prompt_id_key"),
                "prompt_id_key is unset",
                "V1 prompt ids are not supported",
                "remove it",
            ),
        },
        _gate(
            f"{D}.custom_cls",
            "path",
            (None,),
            "the built-in dataset is used",
            "custom dataset classes are not supported",
            "convert the data to parquet/jsonl rows",
        ),
        _gate(
            f"{D}.sampler",
            "class_path",
            (None,),
            "the built-in (seeded) sampler is used",
            "custom samplers are not supported",
            "set class_path: null",
        ),
        _gate(
            f"{D}.datagen",
            "path",
            (None,),
            "no dynamic data generation",
            "dynamic data generation is not supported",
            "set path: null",
        ),
    )
