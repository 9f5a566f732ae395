"""The native configuration schema: one typed dataclass per component.

Every field has a type, a default and a one-line doc (``field(metadata={"doc": ...})``),
so ``temper check`` can explain any key. Dialects (verl, ROLL) translate into this
schema; nothing downstream ever reads a dialect key.

Units, stated once because frameworks differ here:
- ``data.train_batch_size`` counts *prompts* per RL step (verl ``data.train_batch_size``,
  ROLL ``rollout_batch_size``).
- ``actor.mini_batch_size`` / ``critic.mini_batch_size`` count *samples* (responses)
  per optimizer step: verl's ``ppo_mini_batch_size`` (prompts) times ``rollout.n``;
  ROLL's ``per_device_train_batch_size × gradient_accumulation_steps × dp_size``.
- ``*_per_device`` micro-batch sizes count samples per forward pass on one device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any, Literal


def doc(default: Any, text: str, registry: str | None = None, off: str | None = None) -> Any:
    """A dataclass field with a default (copied for mutables) and a one-line doc.

    ``registry``: the field's values are that registry's names (``Catalog.names``; each
    item of a list field); validation checks them there, so no ``Literal`` repeats a
    registry's list. ``off``:
    the value that turns the feature off (``none``), valid besides the names.
    """
    meta: dict[str, Any] = {"doc": text}
    if registry is not None:
        meta["registry"] = registry
    if off is not None:
        meta["off"] = off
    if isinstance(default, (list, dict)):
        value = default
        return field(default_factory=lambda: type(value)(value), metadata=meta)
    return field(default=default, metadata=meta)


def sub(cls: type, text: str) -> Any:
    """A nested config section."""
    return field(default_factory=cls, metadata={"doc": text})


def degree(default: int | None, text: str, *, splits_model: bool = False) -> Any:
    """A parallel degree of :class:`MegatronConfig`, named as in Megatron-Core (the engine
    passes every degree to Megatron by its name; verl and ROLL use the same names).
    ``splits_model``: the degree splits one model replica over devices, so it is a factor
    of :attr:`MegatronConfig.model_parallel_size`."""
    return field(
        default=default, metadata={"doc": text, "degree": True, "splits_model": splits_model}
    )


#: A concrete dtype's name in temper (``auto`` is not one: each engine resolves it for its
#: device, fp32 on CPU and bf16 on GPU).
Precision = Literal["fp32", "bf16", "fp16"]
Dtype = Literal["auto", Precision]
#: The one dtype table: temper's name → the dtype's attribute name in ``torch``
#: (``torch.bfloat16``), which is also vLLM's ``dtype=`` spelling. Engines derive their
#: own tables from it; a test holds it equal to :data:`Precision`.
DTYPES: dict[Precision, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


# --------------------------------------------------------------------------- experiment


@dataclass
class ExperimentConfig:
    """Run identity, length, saving, validation cadence and logging."""

    project_name: str = doc("temper", "Project name (tracker project, output folder).")
    experiment_name: str = doc("run", "Experiment name (tracker run name, output folder).")
    output_dir: str = doc(
        "", "Run directory; empty means outputs/<project_name>/<experiment_name>."
    )
    seed: int = doc(42, "Seed for data order, sampling, initialisation; everything is seeded.")
    deterministic: bool = doc(
        False,
        "Deterministic kernels (torch.use_deterministic_algorithms, a fixed cuBLAS workspace, "
        "cuDNN's deterministic mode): on a GPU, runs of one seed and resumed runs are then "
        "bit-identical, at some speed; CPU kernels are deterministic already.",
    )
    max_steps: int | None = doc(None, "RL steps to run; None derives it from total_epochs.")
    total_epochs: int = doc(1, "Passes over the training prompts when max_steps is None.")
    save_freq: int = doc(-1, "Save a checkpoint every N steps (-1: only at the end/on signal).")
    save_every_minutes: float | None = doc(
        10.0,
        "Also save a recovery checkpoint when this many minutes passed since the last save, "
        "so a killed run loses at most that; each one replaces the previous recovery "
        "checkpoint (save_freq's are kept). null or 0: off; verl and ROLL files: off (their "
        "save_freq / save_steps is the whole cadence).",
    )
    save_on_signal: bool = doc(True, "On SIGTERM/SIGINT finish the step and save before exit.")
    max_actor_ckpt_to_keep: int | None = doc(None, "Keep the newest N actor checkpoints.")
    max_critic_ckpt_to_keep: int | None = doc(None, "Keep the newest N critic checkpoints.")
    resume_mode: Literal["auto", "disable", "resume_path"] = doc(
        "auto", "auto: latest valid checkpoint in output_dir; disable; resume_path."
    )
    resume_from_path: str | None = doc(None, "Checkpoint to resume from (resume_mode=resume_path).")
    overwrite: bool = doc(
        False,
        "A start that would not continue the run output_dir holds (resume_mode=disable, no "
        "valid checkpoint, another run's resume_from_path) moves that run to "
        "<output_dir>.old-<time> first instead of refusing; verl and ROLL have no such key: "
        "temper train --overwrite sets it for a file of any dialect.",
    )
    resume_strict: bool = doc(
        True,
        "Stop a resume whose config changes the run's meaning (model, data, batch sizes, "
        "algorithm); false: report the changes and go on.",
    )
    test_freq: int = doc(-1, "Validate every N steps (-1: never during training).")
    val_before_train: bool = doc(False, "Run validation before the first step.")
    val_after_train: bool = doc(
        False,
        "Validate after the last step even where test_freq does not (verl's SFT trainers "
        "always do; their files set it).",
    )
    val_only: bool = doc(False, "Only validate, do not train.")
    log_val_generations: int = doc(0, "Number of validation generations to log.")
    logging_steps: int = doc(1, "Log metrics every N steps.")
    trackers: list[str] = doc(
        ["console", "jsonl"],
        "Metric sinks: console, jsonl, tensorboard, wandb, mlflow, swanlab, trackio.",
        registry="tracker",
    )
    tracker_kwargs: dict[str, Any] = doc(
        {},
        "Extra arguments for the trackers (e.g. log_dir), flat or per tracker "
        "(tracker_kwargs.<name>); mlflow, swanlab and trackio refuse keys they do not read.",
    )
    rollout_data_dir: str | None = doc(None, "Dump rollouts (prompt, response, score) here.")
    validation_data_dir: str | None = doc(None, "Dump validation generations here.")
    render_save_dir: str | None = doc(None, "Agentic: write rendered episodes here.")
    checkpoint_dir: str | None = doc(
        None,
        "Where checkpoints are written; None = <output_dir>/checkpoints (ROLL checkpoint_config).",
    )
    critic_warmup: int = doc(0, "Steps that train only the critic before the actor updates.")
    balance_batch: bool = doc(True, "Reorder samples so data-parallel ranks get equal tokens.")
    device: Literal["auto", "cpu", "cuda"] = doc("auto", "Compute device; auto picks cuda if any.")
    profile_steps: list[int] | None = doc(None, "Steps to run under torch.profiler.")


# --------------------------------------------------------------------------- model


@dataclass
class LoraConfig:
    """LoRA adapters through peft (rank 0 disables them)."""

    rank: int = doc(0, "LoRA rank; 0 trains all weights.")
    alpha: int = doc(16, "LoRA alpha (scaling = alpha / rank).")
    dropout: float = doc(0.0, "Dropout on the LoRA branch.")
    target_modules: list[str] | str = doc(
        "all-linear",
        "Modules to adapt (peft names; on the megatron engine also Megatron's linear_qkv, "
        "linear_proj, linear_fc1, linear_fc2: on an MoE model every expert and the shared "
        "expert, never the router).",
    )
    exclude_modules: list[str] | str | None = doc(
        None,
        "Modules never adapted: a regex full-matched against module names, or a list of "
        "names (a name matches itself and any module ending in '.name'); peft's meaning.",
    )
    adapter_path: str | None = doc(
        None,
        "A saved peft adapter directory (adapter_config.json + weights) to train on from; "
        "its saved rank, alpha, dropout and modules become this section's.",
    )


@dataclass
class ModelConfig:
    """The policy model (actor, reference and rollout share it)."""

    path: str = doc(
        "", "Hugging Face model directory or hub id; smollm2:135m-instruct = the quickstart model."
    )
    tokenizer_path: str | None = doc(None, "Tokenizer location; None uses path.")
    trust_remote_code: bool = doc(False, "Allow the model repo's own Python code.")
    dtype: Dtype = doc("auto", "Training weights dtype; auto = fp32 on CPU, bf16 on GPU.")
    attn_implementation: str = doc("auto", "sdpa, eager, flash_attention_2; auto picks.")
    override_config: dict[str, Any] = doc({}, "Overrides applied to the model's config.")
    external_lib: str | None = doc(None, "Module imported before loading (registers models).")
    enable_gradient_checkpointing: bool = doc(False, "Recompute activations in backward.")
    enable_activation_offload: bool = doc(False, "Offload activations to CPU in training.")
    use_remove_padding: bool = doc(
        True,
        "Pack sequences (no padding) in training forwards; a prompt shared by a group's "
        "responses is packed once.",
    )
    use_liger: bool = doc(
        False,
        "Liger's fused RMSNorm, SwiGLU and rotary kernels in the HF model (torch, fsdp2 and "
        "deepspeed engines, on CUDA; needs liger-kernel). Speed only: on CPU the model "
        "keeps its own modules (a warning says so); the megatron engine ignores it.",
    )
    use_fused_kernels: bool = doc(False, "Fused log-prob/entropy kernels (GPU).")
    lora: LoraConfig = sub(LoraConfig, "LoRA settings.")


# --------------------------------------------------------------------------- data


@dataclass
class DataConfig:
    """Prompt datasets, templating and truncation."""

    train_files: list[str] = doc([], "Training files: parquet, jsonl, json, csv or a datasets dir.")
    val_files: list[str] = doc([], "Validation files (same formats).")
    prompt_key: str = doc("prompt", "Column with the prompt (a string or a chat message list).")
    messages_key: str | None = doc(None, "Column with chat messages (instead of prompt_key).")
    ground_truth_key: str = doc(
        "reward_model.ground_truth",
        "Column (dotted path) with the answer given to the reward; if absent, the row's "
        "ground_truth, then answer column.",
    )
    data_source_key: str = doc(
        "data_source",
        "Column naming the task; selects the reward fn (if absent: the data_source column).",
    )
    tag_key: str = doc("tag", "Column with a domain tag (ROLL reward routing); default: source.")
    extra_info_key: str = doc("extra_info", "Column passed to reward functions as extra_info.")
    extra_info_columns: list[str] = doc(
        [], "Row columns added to extra_info (ROLL code rows: case_type, test_cases, …)."
    )
    chat_template: str = doc(
        "native",
        "native: tokenizer.apply_chat_template; raw: plain text; a Jinja string: the "
        "tokenizer's template for the whole run (prompts, multi-turn turns, SFT, validation).",
    )
    apply_chat_template_kwargs: dict[str, Any] = doc(
        {}, "Extra arguments of apply_chat_template (e.g. enable_thinking: false)."
    )
    system_prompt: str | None = doc(None, "System message prepended to every chat prompt.")
    max_prompt_length: int = doc(512, "Longest prompt in tokens (after templating).")
    truncation: Literal["error", "left", "right", "middle"] = doc(
        "error", "What to do with longer prompts."
    )
    filter_overlong_prompts: bool = doc(False, "Drop (and count) prompts over max_prompt_length.")
    train_batch_size: int = doc(8, "Prompts per RL step.")
    gen_batch_size: int | None = doc(
        None,
        "Prompts per generation round of dynamic sampling (verl data.gen_batch_size; ROLL "
        "rollout_batch_size + max_additional_running_prompts); None = train_batch_size.",
    )
    train_max_samples: int = doc(-1, "Use only the first N training rows (-1: all).")
    val_max_samples: int = doc(-1, "Use only the first N validation rows (-1: all).")
    val_batch_size: int | None = doc(None, "Prompts per validation batch; None = all at once.")
    shuffle: bool = doc(True, "Shuffle training prompts (seeded).")
    validation_shuffle: bool = doc(False, "Shuffle validation prompts.")
    dataloader_drop_last: bool = doc(True, "Drop the last incomplete batch of an epoch.")
    bad_rows: Literal["skip", "error"] = doc("skip", "Malformed rows: report and skip, or fail.")
    source_weights: dict[str, float] = doc(
        {}, "Sampling probability per tag (ROLL domain_interleave_probs); empty = uniform."
    )
    image_key: str = doc(
        "images",
        "Column with each row's images (bytes, paths or {bytes|path|image: ...} dicts), "
        "placed where the prompt says <image>; vision-language models only.",
    )
    video_key: str = doc(
        "videos",
        "Column with each row's videos (paths, frame lists or {video: ..., fps: ...} dicts), "
        "placed where the prompt says <video>; vision-language models only.",
    )
    audio_key: str = doc("audios", "Column with audio: rows that have it are reported.")
    row_format: str = doc(
        "none",
        "Rewrite each row from a named upstream layout first (video_r1: ROLL's Video-R1 "
        "rows; roll_distill_vl: ROLL's VL distillation rows); none: rows are read as they are.",
        registry="row_format",
    )
    video_folder: str | None = doc(
        None, "Base of relative video paths; None = the directory of the data file."
    )
    video_fps: float = doc(2.0, "Frames taken per second of video (qwen-vl-utils' fps).")
    video_max_frames: int = doc(768, "At most this many frames of a video (rounded to even).")
    video_min_pixels: int | None = doc(
        None, "Each video frame at least this many pixels; None = 128 tokens' worth."
    )
    video_max_pixels: int | None = doc(
        None, "Each video frame at most this many pixels; None = 768 tokens' worth."
    )
    video_total_pixels: int | None = doc(
        None,
        "All frames of a video together at most this many pixels (shrinks the frames); "
        "None = 115200 tokens' worth, as qwen-vl-utils.",
    )
    image_folder: str | None = doc(
        None, "Base of relative image paths; None = the directory of the data file."
    )
    image_min_pixels: int | None = doc(
        None, "Resize smaller images up to this many pixels; None = the image processor's."
    )
    image_max_pixels: int | None = doc(
        None, "Resize larger images down to this many pixels; None = the image processor's."
    )
    source_domains: dict[str, list[str]] = doc(
        {}, "Domains the source_weights name instead of tags: domain -> its tags (ROLL rewards)."
    )
    source_default_domain: str | None = doc(
        None, "Domain of tags no source_domains entry lists (ROLL: math_rule); None: an error."
    )


# --------------------------------------------------------------------------- rollout


@dataclass
class SamplingConfig:
    """Sampling parameters for validation generations."""

    n: int = doc(1, "Responses per validation prompt.")
    temperature: float = doc(0.0, "Sampling temperature (0 = greedy).")
    top_p: float = doc(1.0, "Nucleus sampling mass.")
    top_k: int = doc(-1, "Top-k (-1 or 0 disables).")
    do_sample: bool = doc(False, "Sample (True) or decode greedily (False).")


@dataclass
class MultiTurnConfig:
    """verl-style multi-turn tool calling inside a rollout."""

    enable: bool = doc(False, "Enable multi-turn tool calling.")
    max_assistant_turns: int | None = doc(None, "Max model turns per episode.")
    max_user_turns: int | None = doc(None, "Max tool/user turns per episode.")
    tool_config_path: str | None = doc(None, "YAML with OpenAI function schemas of the tools.")
    interaction_config_path: str | None = doc(
        None,
        "YAML of verl interactions (simulated users that answer each final answer, with a "
        "score): a temper.rewards.interactions name or verl class path per entry.",
    )
    max_tool_response_length: int = doc(256, "Tool outputs are cut to this many characters.")
    tool_response_truncate_side: Literal["left", "right", "middle"] = doc(
        "middle", "Long tool outputs: left keeps the start, right the end, middle both ends."
    )
    tool_timeout_s: float = doc(10.0, "Seconds a tool may run.")
    use_inference_chat_template: bool = doc(False, "Use the inference-time chat template.")
    enable_tokenization_sanity_check: bool = doc(True, "Compare incremental vs full tokenization.")
    format: str = doc(
        "hermes", "Tool-call syntax and result feedback: a temper.rollout.tool_formats name."
    )


@dataclass
class RolloutConfig:
    """Generation engine and sampling."""

    engine: str = doc(
        "hf",
        "Rollout engine: hf, vllm, sglang, or auto (vllm where installed, else hf).",
        registry="rollout_engine",
    )
    n: int = doc(1, "Responses per prompt (the GRPO group size).")
    response_length: int = doc(512, "Maximum new tokens per response.")
    temperature: float = doc(1.0, "Sampling temperature.")
    top_p: float = doc(1.0, "Nucleus sampling mass.")
    top_k: int = doc(-1, "Top-k (-1 or 0 disables).")
    do_sample: bool = doc(True, "Sample (True) or greedy (False).")
    ignore_eos: bool = doc(False, "Keep generating after EOS until response_length.")
    repetition_penalty: float = doc(1.0, "Repetition penalty (1 = none).")
    stop: list[str] = doc([], "Stop strings (the stop string is kept in the response).")
    stop_token_ids: list[int] = doc([], "Extra stop token ids besides EOS.")
    infer_batch_size: int | None = doc(None, "Prompts per generate call (hf); None = all.")
    dtype: Dtype = doc("auto", "Rollout weights dtype; auto = the model dtype.")
    val: SamplingConfig = sub(SamplingConfig, "Validation sampling (verl val_kwargs).")
    # engine settings (vllm / sglang)
    gpu_memory_utilization: float = doc(0.5, "Fraction of device memory for the engine.")
    tensor_parallel_size: int = doc(1, "Tensor parallel degree of the rollout engine.")
    enforce_eager: bool = doc(True, "vLLM: no CUDA graphs.")
    free_cache_engine: bool = doc(True, "Free the KV cache between rollout and training.")
    load_format: str = doc("auto", "Initial weights: auto, or dummy (random; first sync loads).")
    max_model_len: int | None = doc(
        None,
        "Engine context length (vLLM's max_model_len) and a multi-turn episode's bound; "
        "None = the model's own context (vLLM on CPU: a sample's bound where the pipeline "
        "has one, e.g. prompt + response).",
    )
    max_num_seqs: int = doc(256, "Max sequences in flight in the engine.")
    max_num_batched_tokens: int = doc(8192, "Max tokens per engine step.")
    enable_chunked_prefill: bool = doc(True, "Chunk long prefills.")
    block_size: int = doc(16, "KV-cache block size in tokens.")
    disable_log_stats: bool = doc(True, "Silence the engine's periodic stats.")
    enable_prefix_caching: bool = doc(True, "Reuse KV of shared prompt prefixes.")
    engine_kwargs: dict[str, Any] = doc({}, "Extra engine arguments (engine_kwargs.vllm.*).")
    model_update_frequency: int = doc(1, "Sync weights to the engine every N updates.")
    update_weights_bucket_megabytes: int = doc(
        256, "Weight sync to vLLM: MiB per bucket (verl's key; ROLL model_update_buffer_size_mb)."
    )
    # log-prob recompute
    log_prob_micro_batch_size_per_device: int | None = doc(None, "Micro-batch for old log-probs.")
    log_prob_use_dynamic_bsz: bool = doc(False, "Token-budget micro-batches for old log-probs.")
    log_prob_max_token_len_per_device: int = doc(16384, "Token budget for old log-probs.")
    calculate_log_probs: bool = doc(True, "Return the sampling log-probs of generated tokens.")
    multi_turn: MultiTurnConfig = sub(MultiTurnConfig, "Multi-turn tool calling.")


# --------------------------------------------------------------------------- training roles


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule."""

    optimizer: Literal["adamw"] = doc("adamw", "Optimizer.")
    lr: float = doc(1e-6, "Peak learning rate.")
    weight_decay: float = doc(0.01, "Decoupled weight decay.")
    betas: list[float] = doc([0.9, 0.999], "Adam betas.")
    eps: float = doc(1e-8, "Adam epsilon.")
    lr_scheduler: str = doc(
        "constant",
        "Schedule after warmup (constant, linear, cosine, sqrt).",
        registry="lr_scheduler",
    )
    warmup_steps: int = doc(0, "Linear warmup optimizer steps; -1 uses warmup_ratio.")
    warmup_ratio: float = doc(0.0, "Warmup as a fraction of total optimizer steps.")
    min_lr_ratio: float = doc(0.0, "Floor of the decay as a fraction of lr.")
    num_cycles: float = doc(0.5, "Cosine cycles over the decay.")
    total_training_steps: int | None = doc(None, "Optimizer steps of the schedule; None derives.")
    zero_indexed_step: bool = doc(
        True, "Schedule counts optimizer steps from 0; false from 1 (warmup and decay alike)."
    )
    warmup_from_one: bool = doc(
        False,
        "Warmup counts the update being taken ((s+1)/W at update s, from 0) while the decay "
        "counts completed updates, as torchtitan's schedule does.",
    )


@dataclass
class FSDPConfig:
    """FSDP2 settings (fully_shard per decoder layer)."""

    param_offload: bool = doc(False, "Keep parameters on CPU between uses.")
    optimizer_offload: bool = doc(False, "Keep optimizer state on CPU.")
    reshard_after_forward: bool = doc(True, "Free gathered params after forward.")
    fsdp_size: int = doc(-1, "Ranks per sharding group (-1: all ranks; else HSDP).")
    wrap_min_num_params: int = doc(0, "Also wrap modules with at least this many params.")
    offload_policy: bool = doc(False, "FSDP2 CPUOffloadPolicy for params/grads/optimizer.")


@dataclass
class MegatronConfig:
    """Megatron-Core parallelism and memory options (strategy=megatron).

    Degrees multiply: a role's devices = TP × PP × CP × data-parallel size. Options
    marked "CUDA" change memory or speed only, not the update; on CPU they are not
    applied and ``temper check`` says so.
    """

    tensor_model_parallel_size: int = degree(1, "Tensor parallel degree.", splits_model=True)
    pipeline_model_parallel_size: int = degree(
        1, "Pipeline parallel degree (stages; must divide the layers).", splits_model=True
    )
    virtual_pipeline_model_parallel_size: int | None = degree(
        None,
        "Interleaved (virtual) pipeline stages: model chunks per pipeline stage (PP × VPP "
        "must divide the layers; null: one).",
    )
    context_parallel_size: int = degree(
        1,
        "Context parallel degree: each sequence split over CP ranks (Megatron's "
        "load-balanced layout).",
        splits_model=True,
    )
    expert_model_parallel_size: int = degree(1, "Expert parallel degree (MoE).")
    expert_tensor_parallel_size: int | None = degree(
        None, "Tensor parallel degree of MoE experts (None: tensor_model_parallel_size)."
    )
    sequence_parallel: bool = doc(
        False,
        "Sequence parallelism at TP > 1: each TP rank holds a share of every sequence "
        "between the TP layers (always on for an MoE model at TP > 1; not with LoRA on a "
        "dense model).",
    )
    use_distributed_optimizer: bool = doc(True, "Shard optimizer state over DP (CUDA).")
    overlap_grad_reduce: bool = doc(False, "Overlap grad reduce-scatter with backward (CUDA).")
    overlap_param_gather: bool = doc(False, "Overlap param all-gather with forward (CUDA).")
    recompute_granularity: str | None = doc(None, "Activation recompute: full or selective (CUDA).")
    recompute_method: str | None = doc(None, "full recompute: uniform or block (CUDA).")
    recompute_num_layers: int | None = doc(None, "Layers per recompute chunk / block (CUDA).")
    recompute_modules: list[str] | None = doc(
        None, "selective recompute: modules (core_attn, mlp, layernorm, …) (CUDA)."
    )
    param_offload: bool = doc(False, "Keep parameters on CPU between uses (CUDA).")
    grad_offload: bool = doc(False, "Keep gradients on CPU between uses (CUDA).")
    optimizer_offload: bool = doc(False, "Keep optimizer state on CPU between steps (CUDA).")
    extra: dict[str, Any] = doc({}, "Other Megatron-Core TransformerConfig arguments.")
    dist_checkpoint_path: str | None = doc(
        None,
        "Initial weights from this Megatron-Core distributed checkpoint (verl's "
        "converter_hf_to_mcore output; any TP/PP layout) instead of converting model.path, "
        "which still gives the architecture and tokenizer.",
    )
    dist_checkpoint_prefix: str = doc("", "Key prefix of the weights in dist_checkpoint_path.")

    @property
    def model_parallel_size(self) -> int:
        """Devices one model replica spans: the product of the degrees that split it
        (TP × PP × CP); a role's data-parallel size is its device count / this."""
        return math.prod(getattr(self, name) or 1 for name in MODEL_PARALLEL_DEGREES)

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel size: ``expert_tensor_parallel_size``, TP when unset
        (Megatron-Core's default)."""
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    @property
    def expert_model_parallel_span(self) -> int:
        """Devices one copy of every expert spans (ETP × EP × PP, Megatron-Core's expert
        groups); a role's device count must be a multiple of it."""
        return self.expert_tp * self.expert_model_parallel_size * self.pipeline_model_parallel_size

    def degrees(self) -> dict[str, int | None]:
        """Every parallel degree by its Megatron-Core name (``TransformerConfig`` and
        ``parallel_state.initialize_model_parallel`` take them as keywords)."""
        return {name: getattr(self, name) for name in MEGATRON_DEGREES}


#: :class:`MegatronConfig`'s parallel degrees (its ``degree`` fields, in field order): the
#: one list of their names, which Megatron-Core, verl and ROLL spell the same way.
MEGATRON_DEGREES: tuple[str, ...] = tuple(
    f.name for f in fields(MegatronConfig) if f.metadata.get("degree")
)
#: The degrees whose product is :attr:`MegatronConfig.model_parallel_size` (TP, PP, CP).
MODEL_PARALLEL_DEGREES: tuple[str, ...] = tuple(
    f.name for f in fields(MegatronConfig) if f.metadata.get("splits_model")
)


@dataclass
class TrainEngineConfig:
    """What every trained role (actor, critic) shares: engine, batching, optimizer."""

    strategy: str = doc(
        "torch",
        "Training engine: torch (one process), fsdp2, deepspeed, megatron.",
        registry="strategy",
    )
    mini_batch_size: int | None = doc(
        None, "Samples per optimizer step; None = the whole step's batch (one update)."
    )
    micro_batch_size_per_device: int = doc(
        1,
        "Samples per forward/backward on one device (on one Ulysses sequence-parallel group "
        "when ulysses_sequence_parallel_size > 1, as verl and ROLL count it).",
    )
    use_dynamic_bsz: bool = doc(False, "Micro-batches by token budget instead of sample count.")
    max_token_len_per_device: int = doc(
        16384,
        "Token budget per micro-batch (use_dynamic_bsz), counting whole samples: a Ulysses "
        "group's ranks split its tokens (verl's per-GPU budgets are translated by × sp).",
    )
    ppo_epochs: int = doc(1, "Passes over the step's batch.")
    shuffle: bool = doc(False, "Shuffle samples between mini-batches (seeded).")
    grad_clip: float | None = doc(1.0, "Clip the global grad norm (None: no clipping).")
    master_dtype: Precision = doc(
        "fp32",
        "Dtype the trained weights (master weights) are stored in, and with them the "
        "gradients and AdamW state (verl model_dtype). bf16/fp16 halve that memory, but an "
        "update smaller than a weight's precision is lost. The model computes in "
        "model.dtype, or in this dtype when model.dtype resolves to fp32. torch and fsdp2 "
        "engines; deepspeed: bf16 with ZeRO 1-3 (its bf16 master mode); megatron: fp32.",
    )
    optim: OptimConfig = sub(OptimConfig, "Optimizer.")
    fsdp: FSDPConfig = sub(FSDPConfig, "FSDP2 settings (strategy=fsdp2).")
    megatron: MegatronConfig = sub(MegatronConfig, "Megatron settings (strategy=megatron).")
    deepspeed: dict[str, Any] = doc(
        {},
        "DeepSpeed config (strategy=deepspeed; ROLL strategy_config), e.g. zero_optimization; "
        "temper fills batch sizes, clipping and precision ('auto').",
    )
    use_torch_compile: bool = doc(False, "torch.compile the model forward.")
    ulysses_sequence_parallel_size: int = doc(
        1,
        "Ulysses sequence parallelism (fsdp2, deepspeed): groups of this many ranks split "
        "every sequence's tokens, all-to-all around attention; a group is one "
        "data-parallel rank.",
    )
    log_prob_micro_batch_size_per_device: int | None = doc(None, "Micro-batch for inference.")
    log_prob_max_token_len_per_device: int | None = doc(None, "Token budget for inference.")
    checkpoint_contents: list[str] = doc(
        ["model", "optimizer", "extra"], "What a checkpoint holds (model, optimizer, extra, hf)."
    )
    freeze_vision_tower: bool = doc(
        False, "Vision-language models: keep the vision encoder (and its merger) frozen."
    )
    freeze_module_prefix: list[str] = doc(
        [], "Freeze parameters whose names start with one of these (ROLL freeze_module_prefix)."
    )


@dataclass
class RolloutFilter:
    """One rejection rule of ``actor.rollout_rs``: a token stays in the loss iff
    ``low ≤ value ≤ high``, the value being ``stat`` aggregated at ``level``."""

    stat: str = doc(
        "ratio",
        "Mismatch statistic: ratio (π_old/π_rollout), k2, k3, prob_diff (π_old − π_rollout).",
        registry="rollout_correction.rollout_rs_stat",
    )
    level: str = doc(
        "token",
        "Aggregation: token, sequence_sum, sequence_mean, sequence_max, segment_mean "
        "(a ratio aggregates its log: sequence_sum is the product, _mean the geometric mean).",
        registry="rollout_correction.rollout_rs_level",
    )
    low: float | None = doc(None, "Lower bound of the kept values (None: open).")
    high: float | None = doc(None, "Upper bound of the kept values (None: open).")


@dataclass
class ActorConfig(TrainEngineConfig):
    """The policy being trained: PPO-style loss and its terms."""

    policy_loss: str = doc(
        "vanilla", "Policy loss (registry name, e.g. vanilla, gspo, cispo).", registry="policy_loss"
    )
    clip_ratio: float = doc(0.2, "PPO clip epsilon (both sides unless low/high set).")
    clip_ratio_low: float | None = doc(None, "Lower clip epsilon (default clip_ratio).")
    clip_ratio_high: float | None = doc(None, "Upper clip epsilon (default clip_ratio).")
    clip_ratio_c: float | None = doc(3.0, "Dual-clip constant for negative advantages (None: off).")
    policy_loss_kwargs: dict[str, Any] = doc({}, "Extra parameters of the chosen policy loss.")
    loss_agg_mode: str = doc(
        "token-mean", "Loss aggregation over tokens and sequences.", registry="loss_agg_mode"
    )
    entropy_coeff: float = doc(0.0, "Entropy bonus coefficient.")
    use_kl_loss: bool = doc(False, "Add a KL(actor||reference) loss term (GRPO style).")
    kl_loss_coef: float = doc(0.001, "Coefficient of the KL loss.")
    kl_loss_type: str = doc(
        "low_var_kl", "KL estimator of the loss (kl, abs, mse, low_var_kl).", registry="kl_penalty"
    )
    sft_loss_coef: float = doc(0.0, "NLL loss on positive samples (reward > 0).")
    rl_loss_coef: float = doc(1.0, "Coefficient of the policy-gradient loss.")
    l2_coef: float = doc(0.0, "L2 penalty on weights added to the loss (ROLL l2).")
    recompute_old_log_prob: bool = doc(
        True, "Recompute old log-probs with the trainer (False: use rollout log-probs)."
    )
    rollout_is: str = doc(
        "none",
        "Truncated importance sampling for rollout/train mismatch (none, token, sequence, "
        "geometric, segment).",
        registry="rollout_correction.rollout_is",
        off="none",
    )
    rollout_is_threshold: float = doc(2.0, "Upper bound of the truncated IS weight.")
    rollout_is_threshold_low: float | None = doc(
        None, "IcePop: IS weights outside [low, threshold] are zero (None: truncate at threshold)."
    )
    rollout_is_batch_normalize: bool = doc(False, "Divide the IS weights by their batch mean.")
    entropy_chunk_size: int = doc(
        0, "Rows per chunk of the log-prob + entropy pass (0: sized to the vocabulary)."
    )
    calculate_sum_pi_squared: bool | None = doc(
        None,
        "The old-log-prob pass also computes Σπ² over the vocabulary per token (None: iff "
        "the advantage estimator reads it, the optimal-token-baseline ones).",
    )
    rollout_rs: list[RolloutFilter] = doc(
        [],
        "Rejection sampling: tokens (or sequences, turns) failing any filter leave the loss (after advantages).",
    )
    router_replay: str = doc(
        "none",
        "MoE router replay: R2 records each token's experts in the old-log-prob forward and "
        "the update's forwards route by them; R3 routes every trainer forward by the "
        "experts the rollout engine chose (rollout.engine hf, or vllm on a GPU; pipeline "
        "rlvr, one generate call per response) (none: each forward routes by its own top-k).",
        registry="router_replay",
        off="none",
    )


@dataclass
class CriticConfig(TrainEngineConfig):
    """Value model: causal-LM backbone plus a scalar head."""

    enable: bool | None = doc(None, "None: on iff the advantage estimator needs values (gae).")
    model_path: str | None = doc(None, "Critic initialisation; None = the policy model.")
    cliprange_value: float | None = doc(0.5, "Value clipping range (None: no clipping).")
    loss_agg_mode: str = doc(
        "token-mean", "Aggregation of the value loss.", registry="loss_agg_mode"
    )
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-5), metadata={"doc": "Critic optimizer."}
    )


@dataclass
class ReferenceConfig:
    """Frozen reference policy for KL."""

    enable: bool | None = doc(None, "None: on iff a KL term (loss or reward) is used.")
    strategy: str = doc("torch", "Engine.", registry="strategy")
    log_prob_micro_batch_size_per_device: int | None = doc(None, "Micro-batch size.")
    use_dynamic_bsz: bool = doc(False, "Token-budget micro-batches.")
    log_prob_max_token_len_per_device: int = doc(16384, "Token budget per micro-batch.")
    param_offload: bool = doc(False, "Keep reference weights on CPU between uses.")
    fsdp: FSDPConfig = sub(FSDPConfig, "FSDP2 settings (strategy=fsdp2).")
    megatron: MegatronConfig = sub(MegatronConfig, "Megatron settings.")
    deepspeed: dict[str, Any] = doc(
        {}, "DeepSpeed config (strategy=deepspeed; ROLL deepspeed_infer strategy_config)."
    )


# --------------------------------------------------------------------------- reward


@dataclass
class CustomRewardFunctionConfig:
    """A user function ``compute_score(data_source, solution_str, ground_truth, extra_info)``."""

    path: str | None = doc(None, "Python file defining the function.")
    name: str = doc("compute_score", "Function name in that file.")
    kwargs: dict[str, Any] = doc({}, "Extra keyword arguments passed to the function.")


@dataclass
class RewardModelConfig:
    """A sequence-classification reward model."""

    enable: bool = doc(False, "Score responses with a reward model.")
    path: str | None = doc(None, "AutoModelForSequenceClassification directory.")
    input_tokenizer: str | None = doc(None, "Policy tokenizer, if the RM's template differs.")
    trust_remote_code: bool = doc(False, "Allow the RM repo's own code.")
    strategy: str = doc("torch", "Engine.", registry="strategy")
    micro_batch_size_per_device: int | None = doc(None, "Micro-batch size for scoring.")
    use_dynamic_bsz: bool = doc(False, "Token-budget micro-batches.")
    forward_max_token_len_per_device: int = doc(16384, "Token budget per micro-batch.")
    max_length: int | None = doc(None, "Truncate RM inputs to this many tokens.")
    fsdp: FSDPConfig = sub(FSDPConfig, "FSDP2 settings (strategy=fsdp2).")
    megatron: MegatronConfig = sub(
        MegatronConfig,
        "Megatron settings (strategy=megatron): on resources.backend=ray the reward model "
        "scores on a worker group of its own (resources.reward), split TP × PP × CP; on "
        "local in the driver process, one rank, so its degrees stay 1.",
    )


@dataclass
class RewardRoute:
    """Which reward function scores the samples of some tags (ROLL ``rewards.<name>``)."""

    function: str = doc(
        "auto",
        "Reward function name (gsm8k, math, countdown, format, custom).",
        registry="reward_function",
    )
    tags: list[str] = doc([], "Data tags this route scores; empty = every tag.")
    kwargs: dict[str, Any] = doc({}, "Keyword arguments of the reward function.")


@dataclass
class SandboxLimitsConfig:
    """What one sandboxed execution (one test of the code reward) may use."""

    wall_time_s: float = doc(5.0, "Wall-clock seconds per execution (then SIGKILL).")
    cpu_time_s: float = doc(5.0, "CPU seconds per execution (RLIMIT_CPU).")
    memory_mb: int = doc(512, "Address space in MiB (RLIMIT_AS).")
    max_processes: int = doc(32, "Processes and threads (RLIMIT_NPROC of the sandbox uid).")
    max_open_files: int = doc(64, "Open file descriptors (RLIMIT_NOFILE).")
    max_output_bytes: int = doc(1 << 20, "stdout + stderr bytes before the program is killed.")
    max_file_bytes: int = doc(16 << 20, "Size of the writable temp dir (and of one file).")


JUDGE_PROMPT = """\
Given a problem, determine whether the final answer in the provided (incomplete) \
solution process matches the reference answer.
The reference answer may be one single option character (e.g., A, B, C, D), a \
numerical value, an expression, or a list of answers if multiple questions are involved.
Your task:
- Compare the final output of the solution process with the reference answer.
- If they match exactly, output YES.
- If they do not match, output NO.
- If the solution process is unclear, incomplete, or ambiguous, assume it is incorrect \
and output NO.

Your output must be strictly 'YES' or 'NO', with no additional words, punctuation, or \
explanation.

Question:
{question}

Solution Process (Final Step Only):
{response}

Reference Answer:
{reference}

Output:
"""


@dataclass
class JudgeConfig:
    """An LLM that grades responses (ROLL ``llm_judge``, verl generative reward model), or
    an agentic env's episode ends (DeepEyes; ROLL: an agentic file's ``reward`` worker)."""

    model_path: str | None = doc(None, "Judge model: HF directory, hub id or temper alias.")
    engine: str = doc("hf", "Rollout engine that runs the judge.", registry="rollout_engine")
    dtype: Dtype = doc("auto", "Judge weights dtype (auto: model.dtype).")
    prompt_template: str = doc(
        JUDGE_PROMPT, "User message; {question}, {response}, {reference} are filled in."
    )
    parser: str = doc(
        "yes_no",
        "yes_no (YES 1, NO 0), score ('Score: N' / score_scale), or a regex whose first "
        "group is the score (/ score_scale).",
    )
    score_scale: float = doc(10.0, "Divisor of parsed numeric scores (score, regex).")
    max_new_tokens: int = doc(100, "Longest verdict in tokens.")
    max_prompt_length: int = doc(4096, "Longest judge prompt in tokens (the response is cut).")
    temperature: float = doc(0.0, "Judge sampling temperature (0: greedy).")
    top_p: float = doc(1.0, "Judge nucleus sampling mass.")
    top_k: int = doc(-1, "Judge top-k (-1: off).")
    infer_batch_size: int = doc(8, "Judge prompts per generate call.")
    trust_remote_code: bool = doc(False, "Allow the judge repo's own code.")
    gpu_memory_utilization: float = doc(0.3, "vLLM judge: share of device memory.")


@dataclass
class RewardConfig:
    """How responses are scored."""

    function: str = doc(
        "auto",
        "Reward function; auto picks by data_source (gsm8k, math, …).",
        registry="reward_function",
    )
    function_kwargs: dict[str, Any] = doc({}, "Keyword arguments of the reward function.")
    custom_function: CustomRewardFunctionConfig = sub(
        CustomRewardFunctionConfig, "User reward function (verl custom_reward_function)."
    )
    routes: dict[str, RewardRoute] = doc({}, "Reward functions per data tag (ROLL rewards).")
    reward_manager: Literal["naive", "batch", "dapo", "prime"] = doc(
        "naive", "How per-sample scores become token-level rewards."
    )
    num_workers: int = doc(
        2, "Processes that run reward functions (0: in this process, for debugging)."
    )
    timeout_s: float | None = doc(
        10.0,
        "Seconds one sample's reward may take (null: no deadline, only with num_workers 0).",
    )
    failure_score: float = doc(0.0, "Score of a sample whose reward raised or timed out.")
    launch_async: bool = doc(False, "Compute rewards while log-probs are computed.")
    format_penalty: float = doc(0.0, "Added to the score when the response breaks the format.")
    model: RewardModelConfig = sub(RewardModelConfig, "Reward model.")
    sandbox: Literal["bwrap", "none", "sandbox_fusion"] = doc(
        "bwrap",
        "Where the code reward (and the sandboxed envs: sokoban_sandbox) runs programs: "
        "bwrap (bubblewrap sandbox), sandbox_fusion (a SandboxFusion service at "
        "sandbox_url) or none (NO isolation; see README).",
    )
    sandbox_url: str | None = doc(None, "SandboxFusion service URL (sandbox=sandbox_fusion).")
    sandbox_limits: SandboxLimitsConfig = sub(SandboxLimitsConfig, "Limits per execution.")
    judge: JudgeConfig = sub(JudgeConfig, "LLM judge (function llm_judge).")
    max_failure_fraction: float = doc(
        0.5, "A training step whose share of failed rewards exceeds this is a failed step."
    )
    max_failed_steps: int = doc(2, "Stop the run after this many failed steps in a row.")


# --------------------------------------------------------------------------- algorithm


@dataclass
class KLControlConfig:
    """Coefficient of the KL penalty in the reward."""

    type: str = doc("fixed", "fixed or adaptive (Ziegler et al.).", registry="kl_ctrl.type")
    kl_coef: float = doc(0.001, "Initial (or fixed) KL coefficient.")
    target_kl: float = doc(0.1, "Adaptive: target KL.")
    horizon: int = doc(10000, "Adaptive: horizon in samples.")


@dataclass
class PFPPOConfig:
    """Preference-feedback PPO sample reweighting."""

    reweight_method: str = doc(
        "pow", "Reweighting rule (pow, max_min, max_random).", registry="pf_ppo.reweight_method"
    )
    weight_pow: float = doc(2.0, "Exponent of the pow rule.")


@dataclass
class FilterGroupsConfig:
    """Dynamic sampling: generate until the batch is full of groups with signal (DAPO)."""

    enable: bool = doc(False, "Drop groups without signal and generate more to refill.")
    metric: str = doc("score", "Per-sample value inspected: score, or reward (+ shaping terms).")
    std_threshold: float = doc(0.0, "Drop groups whose std is <= this (negative: keep all).")
    mean_low: float | None = doc(None, "Drop groups whose mean is <= this.")
    mean_high: float | None = doc(None, "Drop groups whose mean is >= this.")
    max_num_gen_batches: int = doc(
        0,
        "Generation rounds per step at most (<= 0: no limit, as verl); then masked filler. "
        "Streaming: prompt batches drawn per step's batch.",
    )


@dataclass
class OverlongBufferConfig:
    """DAPO soft overlong punishment."""

    enable: bool = doc(False, "Penalise responses that enter the last `len` tokens.")
    len: int = doc(0, "Buffer length in tokens before response_length.")
    penalty_factor: float = doc(1.0, "Penalty at the very end of the buffer.")


@dataclass
class AlgorithmConfig:
    """Advantages, KL in the reward, and reward/advantage shaping."""

    adv_estimator: str = doc(
        "grpo", "Advantage estimator (gae, grpo, rloo, reinforce, …).", registry="adv_estimator"
    )
    gamma: float = doc(1.0, "Discount factor.")
    lam: float = doc(1.0, "GAE lambda.")
    norm_adv_by_std_in_grpo: bool = doc(True, "GRPO: divide by the group std (False: Dr.GRPO).")
    gdpo_reward_keys: list[str] = doc(
        [], "GDPO: the reward function's extra fields, each normalized in its group."
    )
    gdpo_reward_weights: list[float] | None = doc(
        None, "GDPO: weight of each gdpo_reward_keys component (None: all 1)."
    )
    gigpo_step_gamma: float = doc(
        0.95, "GiGPO: discount of env step rewards into step returns (ROLL step_reward_gamma)."
    )
    gigpo_episode_weight: float = doc(
        1.0, "GiGPO: weight of the episode-level advantage (ROLL episode_reward_weight)."
    )
    gigpo_step_weight: float = doc(
        1.0, "GiGPO: weight ω of the step-level advantage (ROLL step_reward_weight)."
    )
    gae_whiten: bool = doc(True, "GAE: whiten advantages in the estimator (verl; ROLL: false).")
    sppo_beta: float = doc(
        1.0,
        "SPPO: temperature β of the soft-mean baseline over the batch (verl algorithm.sppo_eta;"
        " 0: the plain mean).",
    )
    use_kl_in_reward: bool = doc(False, "Subtract kl_coef × KL(actor||ref) from token rewards.")
    kl_penalty: str = doc(
        "kl",
        "KL estimator in the reward (kl, abs, mse, low_var_kl, full).",
        registry="kl_penalty",
    )
    kl_ctrl: KLControlConfig = sub(KLControlConfig, "KL coefficient controller.")
    reward_norm: str = doc(
        "none",
        "Normalise scores over the batch, the prompt group, or running stats (none: off).",
        registry="reward_norm",
        off="none",
    )
    reward_shift: bool = doc(False, "Normalisation subtracts the mean only.")
    reward_scale: bool = doc(False, "Normalisation divides by the std only.")
    reward_clip: float | None = doc(None, "Clip rewards to [-c, c].")
    whiten_rewards: bool = doc(False, "Whiten token rewards before advantages.")
    whiten_advantages: bool = doc(False, "Whiten advantages over the batch.")
    advantage_clip: float | None = doc(None, "Clip advantages to [-c, c].")
    add_len_reward: bool = doc(False, "Add a response-length reward term.")
    use_reward_scaling: bool = doc(
        False, "Divide scores by a running std (ROLL use_reward_scaling)."
    )
    use_reward_norm: bool = doc(
        False, "With use_reward_scaling, also subtract the running mean (ROLL use_reward_norm)."
    )
    difficulty_loss_weight: bool = doc(False, "Weight samples by prompt difficulty.")
    length_loss_weight: bool = doc(False, "Weight samples by response length.")
    difficulty_mask: bool = doc(False, "Drop prompts whose mean score is outside thresholds.")
    difficulty_low_threshold: float = doc(0.0, "difficulty_mask lower bound of the mean score.")
    difficulty_high_threshold: float = doc(1.0, "difficulty_mask upper bound of the mean score.")
    max_len_mask: bool = doc(False, "Mask the loss of responses cut at response_length.")
    use_pf_ppo: bool = doc(False, "Reweight samples by reward (PF-PPO).")
    pf_ppo: PFPPOConfig = sub(PFPPOConfig, "PF-PPO settings.")
    filter_groups: FilterGroupsConfig = sub(FilterGroupsConfig, "Dynamic sampling filter.")
    overlong_buffer: OverlongBufferConfig = sub(OverlongBufferConfig, "DAPO overlong penalty.")


# --------------------------------------------------------------------------- resources


@dataclass
class RayConfig:
    """Ray cluster connection."""

    address: str | None = doc(None, "Existing cluster address; None starts a local one.")
    num_cpus: int | None = doc(None, "CPUs Ray may use (local cluster).")
    rpc_timeout: float = doc(3600.0, "Seconds a remote call may take before the run stops.")
    system_envs: dict[str, str] = doc({}, "Environment variables for every worker.")
    timeline_json_file: str | None = doc(None, "Write a Ray timeline here at the end.")


@dataclass
class ResourcesConfig:
    """Where roles run. A device is a GPU, or on CPU a process slot."""

    backend: Literal["local", "ray"] = doc("local", "local: one process; ray: worker groups.")
    nnodes: int = doc(1, "Nodes.")
    devices_per_node: int = doc(1, "Devices (GPUs, or CPU slots) per node.")
    actor_train: list[int] | None = doc(None, "Device ids of the actor trainer (None: all).")
    actor_infer: list[int] | None = doc(None, "Device ids of the rollout engine (None: colocated).")
    reference: list[int] | None = doc(None, "Device ids of the reference (None: with actor).")
    critic: list[int] | None = doc(None, "Device ids of the critic (None: with actor).")
    reward: list[int] | None = doc(
        None, "Device ids of the reward model's or the LLM judge's ranks (None: the actor's)."
    )
    devices_per_infer_worker: int = doc(1, "Devices per rollout engine instance.")
    ray: RayConfig = sub(RayConfig, "Ray settings (backend=ray).")


# --------------------------------------------------------------------------- agentic


@dataclass
class EnvToolWrapperConfig:
    """Tools in front of a tag's envs (ROLL ``custom_envs.<tag>.tool_wrapper``, GEM's
    ``ToolEnvWrapper``): each answer is offered to the tools before the env."""

    tools: dict[str, dict[str, Any]] = doc(
        {},
        "Env tools by id (python_code, search), tried in this order, each with its "
        "arguments (python_code: timeout, sandbox, keep_error_last_line, tool_instruction, "
        "patterns, memory_mb; search: search_url, topk, timeout); empty = no wrapper.",
    )
    tool_reward: float = doc(0.0, "Reward of a turn whose answer made a tool call.")
    tool_success_reward: float = doc(0.0, "Added to tool_reward when the call ran without error.")
    max_tool_uses: int | None = doc(
        10, "Tool calls per episode; later calls go to the env (null: no limit)."
    )


@dataclass
class EnvTagConfig:
    """One environment kind (ROLL ``custom_envs.<tag>``)."""

    env_type: str = doc(
        "sokoban", "Registered environment (sokoban, frozen_lake, …).", registry="env_type"
    )
    max_turns: int = doc(5, "Max model turns per episode.")
    max_tokens_per_turn: int = doc(128, "Max new tokens per model turn.")
    env_instruction: str = doc("", "Instruction shown before the first observation.")
    action_pattern: str = doc(r"<answer>(.*?)</answer>", "Regex extracting the action.")
    format_penalty: float = doc(-0.1, "Reward added for an unparsable or invalid action.")
    env_config: dict[str, Any] = doc({}, "Environment parameters (grid size, boxes, …).")
    max_words: int | None = doc(None, "Word limit stated in the turn prompt (ROLL max_tokens).")
    turn_prompt: str = doc(
        "", "Text after every observation: the question the model answers each turn."
    )
    system_template: str = doc(
        "", "System message of every episode (ROLL agent_system_template); empty = none."
    )
    turn_template: str = doc(
        "",
        "Each turn's user message (ROLL agent_template): {observation}, {turn_idx}, "
        "{actions_left}, {max_response_length}, {suffix}; with agentic.env_manager=step "
        "{env_instruction}, {history}, {step_count}, {history_length}, {current_step}, "
        "{current_observation}, {max_response_length}; empty = observation + turn_prompt.",
    )
    pre_step_template: str = doc(
        "",
        "agentic.env_manager=vl_trajectory: each turn's text before the observation image "
        "(ROLL VLTrajEnvManager pre_step_template): {turn_idx}; the first turn's is "
        "prefixed with the env instruction.",
    )
    next_step_template: str = doc(
        "",
        "agentic.env_manager=vl_trajectory: each turn's text after the observation image "
        "(ROLL next_step_template): {actions_left}, {max_response_length}.",
    )
    history_length: int | None = doc(
        None,
        "Step env manager: a step's prompt shows the window of the last history_length "
        "steps ending at the current one, i.e. up to history_length - 1 earlier steps "
        "(0: all; None: none) (ROLL history_length).",
    )
    tool_wrapper: EnvToolWrapperConfig = sub(
        EnvToolWrapperConfig, "Tools offered before the env sees an answer (GEM envs)."
    )


@dataclass
class EnvManagerConfig:
    """A pool of environments played in parallel (ROLL train/val_env_manager)."""

    num_env_groups: int = doc(8, "Environment groups per step.")
    group_size: int = doc(8, "Episodes per group; same seed and config within a group.")
    tags: list[str] = doc(["SimpleSokoban"], "Environment tags (keys of agentic.custom_envs).")
    n_groups: list[int] | None = doc(None, "Groups per tag; None splits evenly.")
    max_traj_per_env: int = doc(-1, "Episodes per environment instance (-1: unlimited).")
    format_penalty: float | None = doc(None, "Override the tags' format penalty.")


@dataclass
class RewardNormalizationConfig:
    """How episode returns are normalised (ROLL reward_normalization)."""

    grouping: Literal["batch", "state", "tag", "inductive"] = doc("state", "Normalise within.")
    method: str = doc(
        "identity",
        "How (identity, mean_std, asym_clip, mean).",
        registry="reward_normalization.method",
    )
    norm_mean_type: Literal["batch", "group"] | None = doc(
        None, "Where the mean comes from (ROLL ≥ 2025-07); set either type to override method."
    )
    norm_std_type: Literal["batch", "group"] | None = doc(
        None, "Where the std comes from (group = the grouping's groups); None: no division."
    )


@dataclass
class AgenticConfig:
    """Multi-turn episodes in text environments."""

    train_env_manager: EnvManagerConfig = sub(EnvManagerConfig, "Training environments.")
    val_env_manager: EnvManagerConfig = sub(EnvManagerConfig, "Validation environments.")
    custom_envs: dict[str, EnvTagConfig] = doc({}, "Environment tags and their settings.")
    reward_normalization: RewardNormalizationConfig = sub(
        RewardNormalizationConfig, "Return normalisation."
    )
    max_actions_per_traj: int | None = doc(None, "Cap on actions per trajectory.")
    use_turn_rewards: bool = doc(False, "Per-turn rewards discounted by algorithm.gamma.")
    enable_think: bool = doc(
        False, "Ask for <think>…</think> before each <answer> (ROLL enable_think)."
    )
    action_sep: str = doc("||", "Separator of several actions in one answer (ROLL action_sep).")
    env_manager: str = doc(
        "trajectory",
        "How episodes become samples: trajectory (one multi-turn sample per episode, ROLL "
        "TrajEnvManager), step (one sample per env step with its anchor state, ROLL "
        "StepEnvManager, for gigpo) or step_concat (step samples whose prompt concatenates "
        "the episode's observations, ROLL StepConcatEnvManager, GEM's games).",
        registry="env_manager",
    )
    step_score: Literal["episode", "return_to_go"] = doc(
        "episode",
        "Step env managers: a step sample's score (what reward_normalization normalizes): "
        "episode (its episode's return) or return_to_go (the discounted sum of its "
        "episode's step rewards from this step on, ROLL adv_estimator step_reinforce).",
    )
    step_score_gamma: float = doc(
        1.0, "Discount of step_score=return_to_go per env step (ROLL step_reward_gamma)."
    )


# --------------------------------------------------------------------------- sft


@dataclass
class SFTConfig:
    """Supervised fine-tuning data (pipeline=sft): what a row's response is and how long
    a sample may be. The prompt is ``data.prompt_key`` (or a whole conversation in
    ``data.messages_key``, every assistant turn learnt), templated as RL prompts are."""

    response_key: str = doc(
        "response",
        "Column (dotted path) with the response to learn after the prompt (verl "
        "data.response_key + response_dict_keys; ROLL response_key).",
    )
    query_key: str | None = doc(
        None, "Column appended to the prompt after a newline, when a row has it (ROLL query_key)."
    )
    system_key: str | None = doc(
        None, "Column with a row's system prompt (ROLL system_key); None: data.system_prompt."
    )
    tools_key: str = doc(
        "tools",
        "Column with a row's tools (OpenAI function schemas) given to the chat template; "
        "rows without it have none (verl data.multiturn.tools_key).",
    )
    enable_thinking_key: str = doc(
        "enable_thinking",
        "Column with a row's enable_thinking for the chat template; rows without it use "
        "data.apply_chat_template_kwargs (verl data.multiturn.enable_thinking_key).",
    )
    max_length: int = doc(
        1024,
        "Longest sample in tokens, prompt and response together (verl data.max_length; "
        "ROLL sequence_length); longer ones follow data.truncation.",
    )
    learn_prompt: bool = doc(
        False,
        "Learn the prompt's tokens too: every token after a sample's first, image and "
        "video placeholders excepted (ROLL distill_on_prompt; its VL distill pipeline).",
    )


# --------------------------------------------------------------------------- dpo


@dataclass
class DPOConfig:
    """Direct preference optimization (pipeline=dpo): a row's prompt (``data.prompt_key``,
    templated as RL prompts are), its preferred and its dispreferred response, and the loss
    on the pair against the frozen reference."""

    chosen_key: str = doc("chosen", "Column with the preferred response (ROLL chosen_key).")
    rejected_key: str = doc(
        "rejected", "Column with the dispreferred response (ROLL rejected_key)."
    )
    loss_type: str = doc(
        "sigmoid",
        "Preference loss (registry name): sigmoid (DPO) or ipo (ROLL ipo: true).",
        registry="dpo_loss",
    )
    beta: float = doc(0.1, "Strength of the pull towards the reference, β (ROLL beta).")
    label_smoothing: float = doc(
        0.0,
        "Probability that a pair's label is flipped, in [0, 0.5) (sigmoid loss; ROLL "
        "label_smoothing).",
    )
    max_length: int = doc(
        1024,
        "Longest sequence in tokens, the prompt with either response (ROLL "
        "sequence_length); longer ones follow data.truncation.",
    )


@dataclass
class SpinConfig:
    """Online DPO (pipeline=spin, verl's SPIN recipe): each step generates ``rollout.n``
    responses per prompt, pairs consecutive responses by their reward (the higher chosen)
    and takes a DPO update against the reference, which is replaced by the policy's weights
    every ``ref_update_freq`` steps."""

    loss_type: str = doc(
        "sigmoid",
        "Preference loss (registry name): sigmoid (DPO) or ipo (verl algorithm.dpo_loss_type).",
        registry="dpo_loss",
    )
    beta: float = doc(0.1, "Strength of the pull towards the reference, β (verl actor.dpo_beta).")
    label_smoothing: float = doc(
        0.0,
        "Probability that a pair's label is flipped, in [0, 0.5) (sigmoid loss; verl "
        "algorithm.dpo_label_smoothing).",
    )
    ref_update_freq: int = doc(
        1,
        "At the start of step g with g % ref_update_freq == 0 the reference becomes the "
        "policy's current weights; 0: a fixed reference (verl trainer.ref_update_freq).",
    )


@dataclass
class KDConfig:
    """Offline knowledge distillation (pipeline=distill): the student learns given
    responses (the SFT data, ``sft`` section) from their NLL and from the teacher's
    distribution over its top-k tokens at the same positions. The teacher is the one entry
    of ``distill.teachers`` (its model), built as the reference is (``reference.strategy``,
    its micro-batching, devices ``resources.reference``)."""

    objective: str = doc(
        "forward_kl",
        "Divergence of the student from the teacher at each learnt token: forward_kl, "
        "reverse_kl, skewed_forward_kl, skewed_reverse_kl, js_divergence, adaptive_kl "
        "(ROLL kd_objective).",
        registry="kd_objective",
    )
    topk: int = doc(
        64,
        "The teacher's most likely tokens both distributions are restricted to (each "
        "renormalised over them); 0: the whole vocabulary (ROLL logits_topk).",
    )
    loss_weight: float = doc(
        0.5,
        "w in (1 − w)·NLL + w·KD, both token-means over the learnt tokens (ROLL "
        "distill_loss_weight).",
    )
    temperature: float = doc(
        1.0, "T dividing both models' logits before the divergence (ROLL kd_temperature)."
    )
    teacher_temperature: float = doc(
        1.0, "A further divisor of the teacher's logits (ROLL teacher_temperature)."
    )
    adaptive_alpha: float = doc(
        0.5,
        "adaptive_kl's tail: the teacher's least likely tokens up to this cumulative "
        "probability (ROLL adaptive_kl_alpha).",
    )
    skew_lambda: float = doc(
        0.1, "λ of the skewed KLs' mixture of teacher and student (ROLL skew_lambda)."
    )


@dataclass
class TeacherConfig:
    """A teacher of on-policy distillation: a frozen model that scores the student's
    sampled tokens (a forward pass, built as the reference is: engine
    ``reference.strategy``, its micro-batching, its devices ``resources.reference`` — in
    this process on the local backend, a worker group of its own on Ray)."""

    model_path: str = doc(
        "", "The teacher's weights (a directory or hub id; ROLL teacher model_name_or_path)."
    )
    kl_coef: float = doc(1.0, "Weight of this teacher's KL in the signal, c_i (ROLL opd_kl_coef).")
    tags: list[str] = doc(
        [],
        "Data tags (data.tag_key) of the samples this teacher scores; empty: every sample "
        "(ROLL tag_included).",
    )


@dataclass
class DistillConfig:
    """On-policy distillation (pipelines rlvr and agentic): the student samples, every
    teacher routed to a sample scores its tokens, and the per-token signal
    ``−Σ_i c_i·KL_i`` (estimator ``kl_penalty`` of the student's old log-probs against the
    teacher's) is the advantage (``pure``) or is added to the RL advantage — or, with
    ``direct_gradient``, a loss term of the actor (GKD), on the sampled token or over the
    teachers' top-``topk`` tokens."""

    teachers: dict[str, TeacherConfig] = doc(
        {}, "Teachers by name; empty: no distillation (ROLL teacher, single or a dict)."
    )
    pure: bool = doc(
        True,
        "True: the advantage is the distillation signal alone and the task reward is only "
        "reported (ROLL is_pure_opd); False: the signal is added to the estimator's "
        "advantage (ROLL use_opd).",
    )
    kl_penalty: str = doc(
        "kl",
        "Per-token estimator of the student's KL to a teacher on the sampled token: kl "
        "(log π − log π_t), abs, mse, low_var_kl (ROLL kl_penalty; verl loss_mode).",
        registry="kl_penalty",
    )
    log_prob_min_clamp: float | None = doc(
        None, "Clamp both models' log-probs from below first (verl log_prob_min_clamp)."
    )
    loss_max_clamp: float | None = doc(
        None, "Clip each teacher's per-token estimate to [−M, M] (verl loss_max_clamp)."
    )
    direct_gradient: bool = doc(
        False,
        "True: the weighted divergence is a loss term differentiated through the "
        "student's log-probs (GKD; verl use_policy_gradient: false), aggregated with "
        "actor.loss_agg_mode and added to the actor's loss, and no part of the advantage "
        "(pure: the advantage is 0, so the policy-gradient term vanishes); kl_penalty "
        "kl/k1 is refused (its gradient does not depend on the teacher). False: the "
        "signal is (part of) the advantage.",
    )
    topk: int = doc(
        0,
        "0: the divergence is kl_penalty on the sampled token. k > 0 (direct_gradient "
        "only): the forward KL over each teacher's k most likely tokens at every response "
        "position, Σ π_t (log π_t − log π), both log-probs normalized over the vocabulary "
        "and floored at log_prob_min_clamp, the sum floored at 0 (verl loss_mode "
        "forward_kl_topk, topk).",
    )


# --------------------------------------------------------------------------- async


@dataclass
class AsyncTrainingConfig:
    """Asynchronous RL (pipelines rlvr and agentic): the producer generates and scores the
    next batches while the trainer updates on the current one, at most ``staleness``
    policy versions behind. ``mode: fixed`` (default): batch s is generated with the
    weights after max(0, s − 1 − staleness) updates, whatever the timing, so a resumed run
    equals an uninterrupted one. ``mode: streaming`` (rlvr, agentic): the rollout generates
    groups in chunks and hands each finished group to training, the newest weights pushed
    before every chunk; a resumed run regenerates the groups not yet trained."""

    staleness: int = doc(
        0,
        "Policy versions the rollout may run ahead of training, k: batch s is generated "
        "with the weights after max(0, s − 1 − k) updates while the steps before it train. "
        "0: synchronous; 1: one-step-off (verl's one_step_off recipe, ROLL "
        "async_generation_ratio 1).",
    )
    wait_timeout: float = doc(
        1800.0,
        "Seconds the trainer waits for a batch (or a checkpoint for the batches ahead) "
        "before the run stops with one line naming the rollout and the batch.",
    )
    mode: Literal["fixed", "streaming"] = doc(
        "fixed",
        "fixed: whole batches on the schedule above (bit-exact resume). streaming: groups "
        "are handed to training as they finish, generated stream_chunk at a time with the "
        "newest pushed weights; a group more than staleness versions old at training is "
        "dropped or never started (max_off_policy_strategy). Pipelines rlvr and agentic.",
    )
    max_off_policy_strategy: Literal["wait", "drop"] = doc(
        "wait",
        "Streaming: wait — a chunk starts only when every group in it will be trained at "
        "most staleness versions after its weights (none is dropped); drop — the rollout "
        "runs until (staleness + 1) batches of groups are buffered and groups past the "
        "bound are dropped at training (async/dropped_groups; verl's V1 sampler option).",
    )
    partial_rollout_segment: int = doc(
        0,
        "Streaming: partial rollout — generations run this many tokens at a time, and "
        "between segments the newest published weights are pushed, so a response in "
        "flight continues under them (each token records its version: "
        "response_versions). Multi-turn episodes (tool calls, env turns) generate each "
        "model turn so, and every turn boundary pushes too. 0: off (a chunk finishes with "
        "the weights it started with).",
    )
    stream_chunk: int = doc(
        0,
        "Streaming: groups per generation call (a prompt's rollout.n responses, an env "
        "group's episodes); smaller hands groups over sooner, larger batches the engine "
        "better. 0: a quarter of the groups a step trains on (at least 1).",
    )
    max_ahead_batches: float = doc(
        0.0,
        "Streaming: the most groups queued or in flight ahead of the trainer, in batches "
        "(a step's groups): a chunk starts only when the groups then waiting stay within "
        "it, unless the trainer's next batch is still short (verl fully-async's (1 + "
        "staleness_threshold) cycles). 0: no cap but the staleness bound; else >= 1.",
    )


# --------------------------------------------------------------------------- generate, eval


@dataclass
class GenerateConfig:
    """Batch generation to a file (pipeline=generate, ``temper generate``; verl's
    ``main_generation``): ``rollout.n`` responses to every prompt of ``files`` (templated
    and cut as RL prompts are, ``data.*``), sampled with ``rollout.*``."""

    files: list[str] = doc([], "Prompt files: parquet, jsonl, json, csv (verl data.path).")
    output_path: str = doc(
        "",
        "File written: every input row's columns plus 'responses' (a list of rollout.n "
        "texts) and 'response_log_probs' (their sampled tokens' log-probs); parquet, jsonl "
        "or json by suffix (verl data.output_path).",
    )
    batch_size: int = doc(128, "Prompts per generate call (verl data.batch_size).")


@dataclass
class EvaluateConfig:
    """Scoring of a file of responses (pipeline=eval, ``temper eval``; verl's
    ``main_eval``): every response of a row is scored by the run's reward (``reward.*``,
    with the row's ``data.data_source_key`` / ``ground_truth_key`` / ``extra_info_key``),
    and mean@n and pass@k are reported per data source."""

    files: list[str] = doc([], "Files of responses (verl data.path).")
    response_key: str = doc(
        "responses",
        "Column (dotted path) with a row's responses: a list of strings, or one string "
        "(verl data.response_key).",
    )
    k: list[int] = doc(
        [], "The k of pass@k; empty: 1, 2, 4, … up to the responses per row, and that number."
    )
    pass_threshold: float = doc(
        1.0, "A response passes (counts as correct for pass@k) when its score is at least this."
    )
    output_path: str = doc(
        "",
        "Also write the metrics here as JSON (verl prints them only); empty: print only.",
    )


# --------------------------------------------------------------------------- rm


@dataclass
class RewardModelTrainingConfig:
    """Reward-model training (pipeline=reward_model): preference pairs as for DPO (a row's
    prompt, ``data.prompt_key``, its preferred and its dispreferred response), a scalar
    head on the policy's backbone, and a loss on the pair's two scores."""

    chosen_key: str = doc("chosen", "Column with the preferred response.")
    rejected_key: str = doc("rejected", "Column with the dispreferred response.")
    loss_type: str = doc(
        "bradley_terry",
        "Pair loss on the two scores (registry name): bradley_terry, −log σ(r_c − r_r).",
        registry="reward_model_loss",
    )
    center_rewards_coef: float = doc(
        0.0,
        "Weight c of the centring term c·(r_c + r_r)² that keeps scores near 0 (TRL "
        "center_rewards_coefficient); 0: none.",
    )
    max_length: int = doc(
        1024,
        "Longest sequence in tokens, the prompt with either response; longer ones follow "
        "data.truncation.",
    )


@dataclass
class PRMConfig(TrainEngineConfig):
    """PRIME's implicit process reward model: a causal LM trained during RL (its own
    engine, batching and optimizer), scored against a frozen copy of its first weights."""

    model_path: str | None = doc(
        None, "Weights the PRM starts from; None = the policy model (verl reward_model.model.path)."
    )
    ref_path: str | None = doc(
        None,
        "Weights of the PRM's frozen reference π_ref; None = model_path (verl "
        "reward_model.model.ref_path).",
    )
    beta_train: float = doc(
        0.05, "β of the implicit reward r_t = β·log(π_rm/π_ref) and of its loss (verl beta_train)."
    )
    loss_type: Literal["ce"] = doc(
        "ce", "PRM loss: ce, the cross-entropy of σ(β·Σ_t q_t) with the outcome label."
    )
    update: Literal["before", "after", "none"] = doc(
        "before",
        "before: train the PRM, then score with it; after: score with the forward of its "
        "update (before the step); none: score only, never train.",
    )
    mini_batch_size: int | None = doc(
        None, "Samples per PRM optimizer step; None = the actor's mini-batch."
    )
    grad_clip: float | None = doc(10.0, "Clip the PRM's global grad norm.")
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=1e-6, weight_decay=0.0),
        metadata={"doc": "PRM optimizer (verl reward_model.model.optim)."},
    )


@dataclass
class PrimeConfig:
    """PRIME (pipeline=prime, verl's recipe/prime): the policy is trained on the implicit
    PRM's token rewards and the outcome reward, each with its own RLOO baseline; prompts are
    oversampled and groups of mid accuracy kept."""

    prm: PRMConfig = sub(PRMConfig, "The implicit process reward model.")
    granularity: Literal["token", "whole"] = doc(
        "token",
        "token: β·q_t at each response token (but the last); whole: their sum at the last "
        "token (verl reward_model.prime_granularity).",
    )
    norm: Literal["batch_norm", "none"] = doc(
        "batch_norm",
        "batch_norm: implicit rewards divided by the batch's largest |return-to-go| (verl "
        "reward_model.prime_norm).",
    )
    reward_dpo_coef: float = doc(5.0, "Weight of the implicit rewards' RLOO advantage.")
    reward_gt_coef: float = doc(5.0, "Weight of the outcome reward's RLOO advantage.")
    oversample_factor: float = doc(
        1.0,
        "Prompts drawn per step: train_batch_size × factor; train_batch_size groups are "
        "kept, those passing the filters first (verl data.oversample_factor).",
    )
    filter_accuracy: bool = doc(
        False, "Prefer groups whose mean outcome lies in [accuracy_lower_bound, upper]."
    )
    accuracy_lower_bound: float = doc(0.0, "Lowest mean outcome of a preferred group.")
    accuracy_upper_bound: float = doc(1.0, "Highest mean outcome of a preferred group.")
    filter_truncate: bool = doc(
        False, "Prefer groups none of whose responses reaches response_length − 1 tokens."
    )


# --------------------------------------------------------------------------- root


@dataclass
class TemperConfig:
    """A whole run."""

    pipeline: str = doc(
        "rlvr",
        "rlvr: single-turn; agentic: multi-turn; sft: supervised fine-tuning; dpo: "
        "preference pairs; spin: online DPO on the policy's own ranked responses; prime: RL on "
        "an implicit process reward model trained alongside; generate: "
        "responses to a file (temper generate); eval: scores "
        "of a file of responses (temper eval); reward_model: a Bradley–Terry reward "
        "model; distill: a student on a teacher's logits (offline distillation); or your own, "
        "as a dotted path "
        "(my_pkg.my_module:MyPipeline) or a file (path/to/pipeline.py:MyPipeline).",
    )
    experiment: ExperimentConfig = sub(ExperimentConfig, "Run identity, length, logging.")
    model: ModelConfig = sub(ModelConfig, "Policy model.")
    data: DataConfig = sub(DataConfig, "Datasets.")
    rollout: RolloutConfig = sub(RolloutConfig, "Generation.")
    actor: ActorConfig = sub(ActorConfig, "Policy training.")
    critic: CriticConfig = sub(CriticConfig, "Value model.")
    reference: ReferenceConfig = sub(ReferenceConfig, "Reference policy.")
    reward: RewardConfig = sub(RewardConfig, "Rewards.")
    algorithm: AlgorithmConfig = sub(AlgorithmConfig, "Advantages and shaping.")
    resources: ResourcesConfig = sub(ResourcesConfig, "Placement.")
    agentic: AgenticConfig = sub(AgenticConfig, "Agentic pipeline (pipeline=agentic).")
    sft: SFTConfig = sub(SFTConfig, "Supervised fine-tuning data (pipeline=sft).")
    dpo: DPOConfig = sub(DPOConfig, "Direct preference optimization (pipeline=dpo).")
    spin: SpinConfig = sub(SpinConfig, "Online DPO with a refreshed reference (pipeline=spin).")
    prime: PrimeConfig = sub(PrimeConfig, "Implicit process rewards (pipeline=prime).")
    distill: DistillConfig = sub(DistillConfig, "On-policy distillation from teachers.")
    kd: KDConfig = sub(KDConfig, "Offline knowledge distillation (pipeline=distill).")
    async_training: AsyncTrainingConfig = sub(
        AsyncTrainingConfig, "Rollout ahead of training by a bounded number of policy versions."
    )
    generate: GenerateConfig = sub(GenerateConfig, "Batch generation (pipeline=generate).")
    evaluate: EvaluateConfig = sub(EvaluateConfig, "Scoring a file of responses (pipeline=eval).")
    rm: RewardModelTrainingConfig = sub(
        RewardModelTrainingConfig, "Reward-model training (pipeline=reward_model)."
    )
