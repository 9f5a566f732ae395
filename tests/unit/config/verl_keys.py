"""Expected translation of every verl key: the test table of ``test_verl_dialect.py``.

One row per line: ``<verl key> <value> [+<key>=<value> | -<key>]... <expectation>``.
The value (YAML, no spaces) is set on verl's fully expanded default config (with
``actor_rollout_ref.rollout.n=2`` and 8 GPUs); ``+k=v`` sets, ``-k`` deletes another key
first (verl's interpolations are resolved before translation, so a row that changes
one of two linked keys restates the other). Expectations:

- ``-> native.path`` — the value arrives there unchanged;
- ``-> native.path = x`` — ``x`` arrives there;
- ``noted`` — accepted; a note names the key;
- ``!! words`` — rejected; the ConfigError names the key and contains ``words``.

Written from the verl manuals (reference seeds 002-004) and verl 0.8's
``ppo_trainer.yaml``, independently of the dialect's own table.
"""

from __future__ import annotations

AR = "actor_rollout_ref"


def _words(text: str) -> list[str]:
    return text.split()


ROWS = """
# ---------------------------------------------------------------- actor_rollout_ref
actor_rollout_ref.hybrid_engine true noted
actor_rollout_ref.hybrid_engine false !! hybrid engine
actor_rollout_ref.hybrid_engine false +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
actor_rollout_ref.hybrid_engine true +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! asserts hybrid_engine is false
actor_rollout_ref.nccl_timeout 1200 noted
actor_rollout_ref.model.path /m/policy +critic.model.tokenizer_path=/m/policy -> model.path
actor_rollout_ref.model.tokenizer_path /m/tok -> model.tokenizer_path
actor_rollout_ref.model.trust_remote_code true +critic.model.trust_remote_code=true -> model.trust_remote_code
actor_rollout_ref.model.external_lib my_lib -> model.external_lib
actor_rollout_ref.model.external_libs my_lib -> model.external_lib
actor_rollout_ref.model.override_config {attention_dropout:0.1} -> model.override_config
actor_rollout_ref.model.enable_gradient_checkpointing false -> model.enable_gradient_checkpointing
actor_rollout_ref.model.enable_activation_offload true -> model.enable_activation_offload
actor_rollout_ref.model.use_remove_padding false -actor_rollout_ref.actor.use_remove_padding -> model.use_remove_padding
actor_rollout_ref.model.lora_rank 8 -> model.lora.rank
actor_rollout_ref.model.lora_alpha 32 -> model.lora.alpha
actor_rollout_ref.model.target_modules [q_proj,v_proj] -> model.lora.target_modules
actor_rollout_ref.model.use_liger true -> model.use_liger
actor_rollout_ref.model.use_fused_kernels true -actor_rollout_ref.actor.use_fused_kernels -> model.use_fused_kernels
actor_rollout_ref.model.fused_kernel_options.impl_backend triton noted
actor_rollout_ref.model.use_shm true noted
actor_rollout_ref.model.hf_config_path /cfg !! config path
actor_rollout_ref.model.custom_chat_template '{{messages}}' -> data.chat_template
actor_rollout_ref.model.exclude_modules [lm_head] -> model.lora.exclude_modules
actor_rollout_ref.model.lora_adapter_path /a -> model.lora.adapter_path
actor_rollout_ref.model.tiled_mlp.enabled true !! tiled MLP
actor_rollout_ref.model.mtp.enable true !! multi-token prediction
actor_rollout_ref.actor.strategy megatron -> actor.strategy
actor_rollout_ref.actor.strategy fsdp2 -> actor.strategy
actor_rollout_ref.actor.strategy fsdp -> actor.strategy = fsdp2
actor_rollout_ref.actor.strategy dp !! strategy
actor_rollout_ref.actor.ppo_mini_batch_size 16 -> actor.mini_batch_size = 32
actor_rollout_ref.actor.ppo_micro_batch_size 64 -> actor.micro_batch_size_per_device = 8
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu 4 -> actor.micro_batch_size_per_device
actor_rollout_ref.actor.use_dynamic_bsz true -> actor.use_dynamic_bsz
actor_rollout_ref.actor.ppo_max_token_len_per_gpu 4096 -> actor.max_token_len_per_device
actor_rollout_ref.actor.clip_ratio 0.3 -> actor.clip_ratio
actor_rollout_ref.actor.clip_ratio_low 0.1 -> actor.clip_ratio_low
actor_rollout_ref.actor.clip_ratio_high 0.28 -> actor.clip_ratio_high
actor_rollout_ref.actor.clip_ratio_c 10.0 -> actor.clip_ratio_c
actor_rollout_ref.actor.tau_pos 2.0 -> actor.policy_loss_kwargs.tau_pos
actor_rollout_ref.actor.tau_neg 3.0 -> actor.policy_loss_kwargs.tau_neg
actor_rollout_ref.actor.freeze_vision_tower true -> actor.freeze_vision_tower
actor_rollout_ref.actor.policy_loss.loss_mode gspo -> actor.policy_loss
actor_rollout_ref.actor.policy_loss.loss_mode gspo -> actor.policy_loss_kwargs.loss_agg_mode_override = seq-mean-token-mean
actor_rollout_ref.actor.policy_loss.loss_mode sapo -> actor.policy_loss_kwargs.loss_agg_mode_override = seq-mean-token-mean
actor_rollout_ref.actor.policy_loss.clip_cov_ratio 0.001 -> actor.policy_loss_kwargs.clip_cov_ratio
actor_rollout_ref.actor.policy_loss.clip_cov_lb 2.0 -> actor.policy_loss_kwargs.clip_cov_lb
actor_rollout_ref.actor.policy_loss.clip_cov_ub 6.0 -> actor.policy_loss_kwargs.clip_cov_ub
actor_rollout_ref.actor.policy_loss.kl_cov_ratio 0.003 -> actor.policy_loss_kwargs.kl_cov_ratio
actor_rollout_ref.actor.policy_loss.ppo_kl_coef 0.2 -> actor.policy_loss_kwargs.ppo_kl_coef
actor_rollout_ref.actor.policy_loss.loss_mode dppo_tv -> actor.policy_loss
actor_rollout_ref.actor.policy_loss.loss_mode dppo_kl -> actor.policy_loss
actor_rollout_ref.actor.policy_loss.loss_mode dro +actor_rollout_ref.actor.policy_loss.dro_beta=0.1 -> actor.policy_loss
actor_rollout_ref.actor.policy_loss.dro_beta 0.05 -> actor.policy_loss_kwargs.dro_beta
actor_rollout_ref.actor.policy_loss.dro_beta null -> actor.policy_loss_kwargs.dro_beta
actor_rollout_ref.actor.loss_agg_mode seq-mean-token-mean -> actor.loss_agg_mode
actor_rollout_ref.actor.loss_scale_factor 100 !! loss_scale_factor
actor_rollout_ref.actor.entropy_coeff 0.01 -> actor.entropy_coeff
actor_rollout_ref.actor.calculate_entropy true noted
actor_rollout_ref.actor.use_kl_loss true -> actor.use_kl_loss
actor_rollout_ref.actor.kl_loss_coef 0.05 -> actor.kl_loss_coef
actor_rollout_ref.actor.kl_loss_type mse -> actor.kl_loss_type
actor_rollout_ref.actor.use_prefix_grouper true noted
actor_rollout_ref.actor.use_torch_compile false -> actor.use_torch_compile
actor_rollout_ref.actor.ppo_epochs 2 -> actor.ppo_epochs
actor_rollout_ref.actor.shuffle true -> actor.shuffle
actor_rollout_ref.actor.data_loader_seed 7 !! experiment.seed
actor_rollout_ref.actor.checkpoint.save_contents [model,hf] +actor_rollout_ref.actor.checkpoint.load_contents=[model,hf] -> actor.checkpoint_contents
actor_rollout_ref.actor.checkpoint.load_contents [model] !! load_contents
actor_rollout_ref.actor.checkpoint.async_save true !! asynchronous
actor_rollout_ref.actor.use_fused_kernels true -actor_rollout_ref.model.use_fused_kernels -> model.use_fused_kernels
actor_rollout_ref.actor.profiler.enable true noted
actor_rollout_ref.actor.profiler.discrete true noted
actor_rollout_ref.actor.router_replay.mode R3 +actor_rollout_ref.rollout.enable_rollout_routing_replay=true -> actor.router_replay
actor_rollout_ref.actor.router_replay.mode R2 -> actor.router_replay
actor_rollout_ref.actor.router_replay.record_file /tmp/r.pt !! files
actor_rollout_ref.ref.router_replay.mode R2 !! only the actor
actor_rollout_ref.actor.grad_clip 0.5 -> actor.grad_clip
actor_rollout_ref.actor.ulysses_sequence_parallel_size 2 +actor_rollout_ref.ref.ulysses_sequence_parallel_size=2 -> actor.ulysses_sequence_parallel_size
actor_rollout_ref.actor.entropy_from_logits_with_chunking true -> actor.entropy_chunk_size = 2048
actor_rollout_ref.actor.entropy_checkpointing true noted
actor_rollout_ref.actor.use_remove_padding false -actor_rollout_ref.model.use_remove_padding -> model.use_remove_padding
actor_rollout_ref.actor.calculate_sum_pi_squared true -> actor.calculate_sum_pi_squared
actor_rollout_ref.actor.sum_pi_squared_checkpointing true noted
actor_rollout_ref.actor.rollout_n 3 !! must equal
actor_rollout_ref.actor.optim.optimizer AdamW -> actor.optim.optimizer = adamw
actor_rollout_ref.actor.optim.optimizer SGD !! not supported
actor_rollout_ref.actor.optim.optimizer_impl torch_npu.optim !! torch.optim
actor_rollout_ref.actor.optim.lr 3.0e-6 -> actor.optim.lr
actor_rollout_ref.actor.optim.lr_warmup_steps_ratio 0.1 -> actor.optim.warmup_ratio
actor_rollout_ref.actor.optim.total_training_steps 100 -> actor.optim.total_training_steps
actor_rollout_ref.actor.optim.total_training_steps -1 -> actor.optim.total_training_steps = null
actor_rollout_ref.actor.optim.weight_decay 0.05 -> actor.optim.weight_decay
actor_rollout_ref.actor.optim.lr_warmup_steps 10 -> actor.optim.warmup_steps
actor_rollout_ref.actor.optim.betas [0.8,0.95] -> actor.optim.betas
actor_rollout_ref.actor.optim.clip_grad 0.5 -actor_rollout_ref.actor.grad_clip -> actor.grad_clip
actor_rollout_ref.actor.optim.min_lr_ratio 0.1 -> actor.optim.min_lr_ratio
actor_rollout_ref.actor.optim.min_lr_ratio null -> actor.optim.min_lr_ratio = 0.0
actor_rollout_ref.actor.optim.num_cycles 1.5 -> actor.optim.num_cycles
actor_rollout_ref.actor.optim.lr_scheduler_type cosine -> actor.optim.lr_scheduler
actor_rollout_ref.actor.optim.warmup_style cosine -> actor.optim.lr_scheduler
actor_rollout_ref.actor.optim.warmup_style exponential !! not supported
actor_rollout_ref.actor.optim.override_optimizer_config {foo:1} !! overrides
actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params 1000 -> actor.fsdp.wrap_min_num_params
actor_rollout_ref.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap [X] noted
actor_rollout_ref.actor.fsdp_config.param_offload true -> actor.fsdp.param_offload
actor_rollout_ref.actor.fsdp_config.optimizer_offload true -> actor.fsdp.optimizer_offload
actor_rollout_ref.actor.fsdp_config.grad_offload false noted
actor_rollout_ref.actor.fsdp_config.grad_offload true !! gradient offload
actor_rollout_ref.actor.fsdp_config.offload_policy true -> actor.fsdp.offload_policy
actor_rollout_ref.actor.fsdp_config.reshard_after_forward false -> actor.fsdp.reshard_after_forward
actor_rollout_ref.actor.fsdp_config.fsdp_size 4 -> actor.fsdp.fsdp_size
actor_rollout_ref.actor.fsdp_config.forward_prefetch true noted
actor_rollout_ref.actor.fsdp_config.use_orig_params true noted
actor_rollout_ref.actor.fsdp_config.model_dtype bf16 -> actor.master_dtype = bf16
actor_rollout_ref.actor.fsdp_config.model_dtype bfloat16 -> actor.master_dtype = bf16
actor_rollout_ref.actor.fsdp_config.model_dtype float16 -> actor.master_dtype = fp16
actor_rollout_ref.actor.fsdp_config.model_dtype float32 -> actor.master_dtype = fp32
actor_rollout_ref.actor.fsdp_config.model_dtype int8 !! unknown dtype
actor_rollout_ref.actor.fsdp_config.model_dtype bf16 +actor_rollout_ref.actor.strategy=megatron noted
actor_rollout_ref.ref.fsdp_config.model_dtype bf16 noted
actor_rollout_ref.ref.fsdp_config.model_dtype fp32 noted
actor_rollout_ref.ref.fsdp_config.model_dtype bf16 +actor_rollout_ref.actor.fsdp_config.dtype=float32 +actor_rollout_ref.ref.fsdp_config.dtype=float32 +critic.model.fsdp_config.dtype=float32 !! round the weights
actor_rollout_ref.actor.fsdp_config.dtype float32 +actor_rollout_ref.ref.fsdp_config.dtype=float32 +critic.model.fsdp_config.dtype=float32 -> model.dtype = fp32
actor_rollout_ref.actor.fsdp_config.dtype bfloat16 -> model.dtype = auto
actor_rollout_ref.actor.fsdp_config.seed 7 +actor_rollout_ref.ref.fsdp_config.seed=7 +critic.model.fsdp_config.seed=7 +actor_rollout_ref.actor.data_loader_seed=7 +critic.data_loader_seed=7 -> experiment.seed
actor_rollout_ref.ref.fsdp_config.seed 7 +actor_rollout_ref.actor.fsdp_config.seed=7 +critic.model.fsdp_config.seed=7 +actor_rollout_ref.actor.data_loader_seed=7 +critic.data_loader_seed=7 -> experiment.seed
critic.model.fsdp_config.seed 7 +actor_rollout_ref.actor.fsdp_config.seed=7 +actor_rollout_ref.ref.fsdp_config.seed=7 +actor_rollout_ref.actor.data_loader_seed=7 +critic.data_loader_seed=7 -> experiment.seed
actor_rollout_ref.actor.data_loader_seed 7 +actor_rollout_ref.actor.fsdp_config.seed=7 +actor_rollout_ref.ref.fsdp_config.seed=7 +critic.model.fsdp_config.seed=7 +critic.data_loader_seed=7 -> experiment.seed
critic.data_loader_seed 7 +actor_rollout_ref.actor.fsdp_config.seed=7 +actor_rollout_ref.ref.fsdp_config.seed=7 +critic.model.fsdp_config.seed=7 +actor_rollout_ref.actor.data_loader_seed=7 -> experiment.seed
actor_rollout_ref.actor.fsdp_config.full_determinism true -> experiment.deterministic = True
actor_rollout_ref.ref.fsdp_config.full_determinism true -> experiment.deterministic = True
actor_rollout_ref.actor.fsdp_config.full_determinism false noted
actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size 2 -actor_rollout_ref.actor.ulysses_sequence_parallel_size -> actor.ulysses_sequence_parallel_size
actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking true -actor_rollout_ref.actor.entropy_from_logits_with_chunking -> actor.entropy_chunk_size = 2048
actor_rollout_ref.actor.fsdp_config.use_torch_compile false -actor_rollout_ref.actor.use_torch_compile -> actor.use_torch_compile
actor_rollout_ref.actor.fsdp_config.entropy_checkpointing true noted
actor_rollout_ref.actor.fsdp_config.forward_only true noted
actor_rollout_ref.actor.fsdp_config.strategy megatron noted
actor_rollout_ref.ref.strategy megatron -> reference.strategy
actor_rollout_ref.ref.use_torch_compile false noted
actor_rollout_ref.ref.log_prob_micro_batch_size 64 -> reference.log_prob_micro_batch_size_per_device = 8
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu 4 -> reference.log_prob_micro_batch_size_per_device
actor_rollout_ref.ref.log_prob_use_dynamic_bsz true -> reference.use_dynamic_bsz
actor_rollout_ref.ref.log_prob_max_token_len_per_gpu 4096 -> reference.log_prob_max_token_len_per_device
actor_rollout_ref.ref.ulysses_sequence_parallel_size 2 !! actor's
actor_rollout_ref.ref.rollout_n 3 !! must equal
actor_rollout_ref.ref.profiler.enable true noted
actor_rollout_ref.ref.profiler.discrete true noted
actor_rollout_ref.ref.fsdp_config.param_offload true -> reference.param_offload
actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params 100 -> reference.fsdp.wrap_min_num_params
actor_rollout_ref.ref.fsdp_config.offload_policy true -> reference.fsdp.offload_policy
actor_rollout_ref.ref.fsdp_config.reshard_after_forward false -> reference.fsdp.reshard_after_forward
actor_rollout_ref.ref.fsdp_config.fsdp_size 2 -> reference.fsdp.fsdp_size
actor_rollout_ref.ref.fsdp_config.forward_prefetch true noted
actor_rollout_ref.ref.fsdp_config.dtype float16 !! one compute dtype
actor_rollout_ref.ref.fsdp_config.strategy megatron noted
# ---------------------------------------------------------------- rollout
actor_rollout_ref.rollout.name vllm -> rollout.engine
actor_rollout_ref.rollout.name sglang -> rollout.engine
actor_rollout_ref.rollout.name hf -> rollout.engine
actor_rollout_ref.rollout.name trtllm !! TensorRT-LLM
actor_rollout_ref.rollout.mode sync noted
actor_rollout_ref.rollout.temperature 0.7 -> rollout.temperature
actor_rollout_ref.rollout.top_k 50 -> rollout.top_k
actor_rollout_ref.rollout.top_k 0 -> rollout.top_k = -1
actor_rollout_ref.rollout.top_p 0.9 -> rollout.top_p
actor_rollout_ref.rollout.use_fire_sampling false noted
actor_rollout_ref.rollout.use_fire_sampling true !! FIRE
actor_rollout_ref.rollout.prompt_length 300 -data.max_prompt_length -> data.max_prompt_length
actor_rollout_ref.rollout.prompt_length 300 !! data.max_prompt_length
actor_rollout_ref.rollout.response_length 300 -data.max_response_length -> rollout.response_length
actor_rollout_ref.rollout.response_length 300 !! rollout.response_length
actor_rollout_ref.rollout.dtype float16 -> rollout.dtype = fp16
actor_rollout_ref.rollout.gpu_memory_utilization 0.8 -> rollout.gpu_memory_utilization
actor_rollout_ref.rollout.ignore_eos true -> rollout.ignore_eos
actor_rollout_ref.rollout.enforce_eager true -> rollout.enforce_eager
actor_rollout_ref.rollout.cudagraph_capture_sizes [1,2,4] noted
actor_rollout_ref.rollout.free_cache_engine false -> rollout.free_cache_engine
actor_rollout_ref.rollout.tensor_model_parallel_size 4 -> rollout.tensor_parallel_size
actor_rollout_ref.rollout.data_parallel_size 2 noted
actor_rollout_ref.rollout.expert_parallel_size 2 noted
actor_rollout_ref.rollout.pipeline_model_parallel_size 2 !! pipeline parallelism
actor_rollout_ref.rollout.max_num_batched_tokens 4096 -> rollout.max_num_batched_tokens
actor_rollout_ref.rollout.max_model_len 4096 -> rollout.max_model_len
actor_rollout_ref.rollout.max_num_seqs 64 -> rollout.max_num_seqs
actor_rollout_ref.rollout.enable_chunked_prefill false -> rollout.enable_chunked_prefill
actor_rollout_ref.rollout.enable_prefix_caching false -> rollout.enable_prefix_caching
actor_rollout_ref.rollout.logprobs_mode raw_logprobs !! processed_logprobs
actor_rollout_ref.rollout.scheduling_policy priority noted
actor_rollout_ref.rollout.load_format dummy_dtensor -> rollout.load_format = dummy
actor_rollout_ref.rollout.load_format dummy_hf -> rollout.load_format = dummy
actor_rollout_ref.rollout.load_format dummy_megatron -> rollout.load_format = dummy
actor_rollout_ref.rollout.load_format safetensors -> rollout.load_format = auto
actor_rollout_ref.rollout.load_format hf -> rollout.load_format = auto
actor_rollout_ref.rollout.load_format dtensor -> rollout.load_format = auto
actor_rollout_ref.rollout.load_format pickle !! load_format
actor_rollout_ref.rollout.log_prob_micro_batch_size 64 -> rollout.log_prob_micro_batch_size_per_device = 8
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu 4 -> rollout.log_prob_micro_batch_size_per_device
actor_rollout_ref.rollout.log_prob_use_dynamic_bsz true -> rollout.log_prob_use_dynamic_bsz
actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu 4096 -> rollout.log_prob_max_token_len_per_device
actor_rollout_ref.rollout.disable_log_stats false -> rollout.disable_log_stats
actor_rollout_ref.rollout.do_sample false -> rollout.do_sample
actor_rollout_ref.rollout.n 4 +actor_rollout_ref.actor.rollout_n=4 +actor_rollout_ref.ref.rollout_n=4 +critic.rollout_n=4 -> rollout.n
actor_rollout_ref.rollout.over_sample_rate 0.1 noted
actor_rollout_ref.rollout.multi_stage_wake_up true noted
actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space 4 +actor_rollout_ref.rollout.name=vllm -> rollout.engine_kwargs.swap_space
actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space 4 noted
actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend flashinfer +actor_rollout_ref.rollout.name=sglang -> rollout.engine_kwargs.attention_backend
actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend flashinfer +actor_rollout_ref.rollout.name=vllm noted
actor_rollout_ref.rollout.val_kwargs.top_k 20 -> rollout.val.top_k
actor_rollout_ref.rollout.val_kwargs.top_p 0.95 -> rollout.val.top_p
actor_rollout_ref.rollout.val_kwargs.temperature 0.6 -> rollout.val.temperature
actor_rollout_ref.rollout.val_kwargs.n 4 -> rollout.val.n
actor_rollout_ref.rollout.val_kwargs.do_sample true -> rollout.val.do_sample
actor_rollout_ref.rollout.multi_turn.enable true -> rollout.multi_turn.enable
actor_rollout_ref.rollout.multi_turn.max_assistant_turns 5 -> rollout.multi_turn.max_assistant_turns
actor_rollout_ref.rollout.multi_turn.max_turns 5 -> rollout.multi_turn.max_assistant_turns
actor_rollout_ref.rollout.multi_turn.tool_config_path tools.yaml -> rollout.multi_turn.tool_config_path
actor_rollout_ref.rollout.multi_turn.max_user_turns 3 -> rollout.multi_turn.max_user_turns
actor_rollout_ref.rollout.multi_turn.max_parallel_calls 2 !! parallel tool calls
actor_rollout_ref.rollout.multi_turn.max_tool_response_length 512 -> rollout.multi_turn.max_tool_response_length
actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side left -> rollout.multi_turn.tool_response_truncate_side
actor_rollout_ref.rollout.multi_turn.interaction_config_path x.yaml +actor_rollout_ref.rollout.multi_turn.enable=true -> rollout.multi_turn.interaction_config_path
actor_rollout_ref.rollout.multi_turn.use_inference_chat_template true -> rollout.multi_turn.use_inference_chat_template
actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode disable -> rollout.multi_turn.enable_tokenization_sanity_check = false
actor_rollout_ref.rollout.multi_turn.enable_tokenization_sanity_check false -actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode -> rollout.multi_turn.enable_tokenization_sanity_check
actor_rollout_ref.rollout.multi_turn.format qwen -> rollout.multi_turn.format
actor_rollout_ref.rollout.multi_turn.completion_callback my.cb !! callbacks
actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts 2 !! repeated
actor_rollout_ref.rollout.calculate_log_probs true -> rollout.calculate_log_probs
actor_rollout_ref.rollout.agent.num_workers 2 noted
actor_rollout_ref.rollout.agent.default_agent_loop my_loop !! agent loops
actor_rollout_ref.rollout.agent.agent_loop_config_path x.yaml !! agent loops
actor_rollout_ref.rollout.agent.custom_async_server.path x.py !! async rollout servers
actor_rollout_ref.rollout.checkpoint_engine.backend nccl noted
actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes 512 -> rollout.update_weights_bucket_megabytes
actor_rollout_ref.rollout.trace.backend mlflow noted
actor_rollout_ref.rollout.skip_rollout true !! replaying
actor_rollout_ref.rollout.skip_tokenizer_init false noted
actor_rollout_ref.rollout.enable_rollout_routing_replay true !! router_replay.mode is R3
actor_rollout_ref.rollout.profiler.enable true noted
actor_rollout_ref.rollout.prometheus.enable true noted
actor_rollout_ref.rollout.quantization fp8 !! quantization
actor_rollout_ref.rollout.quantization_config_file q.json !! quantization
actor_rollout_ref.rollout.mtp.enable true !! multi-token prediction
actor_rollout_ref.rollout.layered_summon true noted
# ---------------------------------------------------------------- data
data.tokenizer /m/tok -> model.tokenizer_path
data.use_shm false noted
data.use_shm true noted
data.train_files /d/a.parquet -> data.train_files = [/d/a.parquet]
data.train_files [/d/a.parquet,/d/b.jsonl] -> data.train_files
data.val_files /d/v.parquet -> data.val_files = [/d/v.parquet]
data.train_max_samples 100 -> data.train_max_samples
data.val_max_samples 50 -> data.val_max_samples
data.prompt_key question -> data.prompt_key
data.reward_fn_key source -> data.data_source_key
data.max_prompt_length 300 -actor_rollout_ref.rollout.prompt_length -> data.max_prompt_length
data.max_response_length 300 -actor_rollout_ref.rollout.response_length -> rollout.response_length
data.train_batch_size 64 -> data.train_batch_size
data.val_batch_size 32 -> data.val_batch_size
data.tool_config_path tools.yaml -> rollout.multi_turn.tool_config_path
data.return_raw_input_ids true noted
data.return_raw_chat false noted
data.return_full_prompt true noted
data.shuffle false -> data.shuffle
data.seed 7 -> experiment.seed
data.dataloader_num_workers 2 noted
data.image_patch_size 16 noted
data.validation_shuffle true -> data.validation_shuffle
data.filter_overlong_prompts true -> data.filter_overlong_prompts
data.filter_overlong_prompts_workers 4 noted
data.truncation left -> data.truncation
data.truncation sideways !! data.truncation
data.image_key images -> data.image_key
data.image_key img -> data.image_key
data.video_key vid -> data.video_key
data.trust_remote_code true -actor_rollout_ref.model.trust_remote_code -> model.trust_remote_code
data.custom_cls.path my_ds.py !! dataset classes
data.custom_cls.name MyDataset noted
data.return_multi_modal_inputs false noted
data.sampler.class_path my.Sampler !! samplers
data.datagen.path gen.py !! data generation
data.apply_chat_template_kwargs {enable_thinking:false} -> data.apply_chat_template_kwargs
data.prompt_id_key pid !! prompt ids
data.max_prompt_id_length 32 noted
reward_manager.source importlib !! reward managers
reward_manager.name dapo -reward_model.reward_manager -> reward.reward_manager
reward_manager.module.path my_rm.py !! reward manager modules
# ---------------------------------------------------------------- critic
critic.strategy megatron -> critic.strategy
critic.enable true -> critic.enable
critic.enable false -> critic.enable
critic.rollout_n 3 !! must equal
critic.ppo_mini_batch_size 16 -> critic.mini_batch_size = 32
critic.ppo_micro_batch_size 64 -> critic.micro_batch_size_per_device = 8
critic.ppo_micro_batch_size_per_gpu 4 -> critic.micro_batch_size_per_device
critic.use_dynamic_bsz true -> critic.use_dynamic_bsz
critic.ppo_max_token_len_per_gpu 8192 -> critic.max_token_len_per_device
critic.forward_max_token_len_per_gpu 8192 -> critic.log_prob_max_token_len_per_device
critic.forward_micro_batch_size 64 -> critic.log_prob_micro_batch_size_per_device = 8
critic.forward_micro_batch_size_per_gpu 4 -> critic.log_prob_micro_batch_size_per_device
critic.ppo_epochs 2 -> critic.ppo_epochs
critic.shuffle true -> critic.shuffle
critic.data_loader_seed 7 !! experiment.seed
critic.cliprange_value 0.2 -> critic.cliprange_value
critic.loss_agg_mode seq-mean-token-mean -> critic.loss_agg_mode
critic.ulysses_sequence_parallel_size 2 -> critic.ulysses_sequence_parallel_size
critic.grad_clip 0.5 -> critic.grad_clip
critic.checkpoint.save_contents [model] +critic.checkpoint.load_contents=[model] -> critic.checkpoint_contents
critic.checkpoint.async_save true !! asynchronous
critic.profiler.enable true noted
critic.optim.optimizer adamw -> critic.optim.optimizer
critic.optim.lr 2.0e-5 -> critic.optim.lr
critic.optim.lr_warmup_steps_ratio 0.1 -> critic.optim.warmup_ratio
critic.optim.total_training_steps 100 -> critic.optim.total_training_steps
critic.optim.weight_decay 0.0 -> critic.optim.weight_decay
critic.optim.lr_warmup_steps 5 -> critic.optim.warmup_steps
critic.optim.betas [0.9,0.95] -> critic.optim.betas
critic.optim.clip_grad 0.5 -critic.grad_clip -> critic.grad_clip
critic.optim.min_lr_ratio 0.1 -> critic.optim.min_lr_ratio
critic.optim.num_cycles 1.0 -> critic.optim.num_cycles
critic.optim.lr_scheduler_type cosine -> critic.optim.lr_scheduler
critic.optim.warmup_style cosine -> critic.optim.lr_scheduler
critic.optim.override_optimizer_config {eps:1.0e-5} !! overrides
critic.model.path /m/critic -> critic.model_path
critic.model.tokenizer_path /m/other !! policy tokenizer
critic.model.override_config {a:1} !! overrides
critic.model.external_lib other_lib !! external_lib
critic.model.trust_remote_code true !! trust_remote_code
critic.model.use_shm true noted
critic.model.enable_gradient_checkpointing false noted
critic.model.enable_activation_offload true noted
critic.model.use_remove_padding true noted
critic.model.lora_rank 8 !! critic LoRA
critic.model.lora_alpha 64 noted
critic.model.tiled_mlp.enabled true !! tiled MLP
critic.model.fsdp_config.wrap_policy.min_num_params 100 -> critic.fsdp.wrap_min_num_params
critic.model.fsdp_config.param_offload true -> critic.fsdp.param_offload
critic.model.fsdp_config.optimizer_offload true -> critic.fsdp.optimizer_offload
critic.model.fsdp_config.offload_policy true -> critic.fsdp.offload_policy
critic.model.fsdp_config.reshard_after_forward false -> critic.fsdp.reshard_after_forward
critic.model.fsdp_config.fsdp_size 2 -> critic.fsdp.fsdp_size
critic.model.fsdp_config.model_dtype bfloat16 -> critic.master_dtype = bf16
critic.model.fsdp_config.model_dtype bf16 +critic.strategy=megatron noted
critic.model.fsdp_config.dtype float16 !! one compute dtype
critic.model.fsdp_config.full_determinism true -> experiment.deterministic = True
critic.model.fsdp_config.ulysses_sequence_parallel_size 2 -critic.ulysses_sequence_parallel_size -> critic.ulysses_sequence_parallel_size
critic.model.fsdp_config.use_torch_compile false -> critic.use_torch_compile
critic.model.fsdp_config.strategy megatron noted
# ---------------------------------------------------------------- reward
reward_model.enable true -> reward.model.enable
reward_model.enable_resource_pool true !! reward-model pool
reward_model.n_gpus_per_node 4 noted
reward_model.strategy megatron -> reward.model.strategy
reward_model.megatron.tensor_model_parallel_size 2 -> reward.model.megatron.tensor_model_parallel_size
reward_model.megatron.pipeline_model_parallel_size 2 -> reward.model.megatron.pipeline_model_parallel_size
reward_model.megatron.context_parallel_size 2 -> reward.model.megatron.context_parallel_size
reward_model.megatron.sequence_parallel true -> reward.model.megatron.sequence_parallel
reward_model.megatron.param_offload true -> reward.model.megatron.param_offload
reward_model.megatron.grad_offload true noted
reward_model.megatron.optimizer_offload true noted
reward_model.megatron.use_distributed_optimizer true noted
reward_model.megatron.override_mcore_model_config {a:1} !! model-config overrides
reward_model.megatron.dtype float16 !! one compute dtype
reward_model.megatron.use_mbridge true noted
reward_model.load_weight false !! load_weight
reward_model.model.input_tokenizer /m/tok -> reward.model.input_tokenizer
reward_model.model.input_tokenizer null -> reward.model.input_tokenizer
reward_model.model.path /m/rm -> reward.model.path
reward_model.model.external_lib other_lib !! external_lib
reward_model.model.trust_remote_code true -> reward.model.trust_remote_code
reward_model.model.override_config {a:1} !! overrides
reward_model.model.use_shm true noted
reward_model.model.use_remove_padding true noted
reward_model.model.use_fused_kernels true noted
reward_model.model.fsdp_config.wrap_policy.min_num_params 100 -> reward.model.fsdp.wrap_min_num_params
reward_model.model.fsdp_config.min_num_params 100 -reward_model.model.fsdp_config.wrap_policy -> reward.model.fsdp.wrap_min_num_params
reward_model.model.fsdp_config.param_offload true -> reward.model.fsdp.param_offload
reward_model.model.fsdp_config.reshard_after_forward false -> reward.model.fsdp.reshard_after_forward
reward_model.model.fsdp_config.fsdp_size 2 -> reward.model.fsdp.fsdp_size
reward_model.model.fsdp_config.forward_prefetch true noted
reward_model.micro_batch_size 64 -> reward.model.micro_batch_size_per_device = 8
reward_model.micro_batch_size_per_gpu 4 -> reward.model.micro_batch_size_per_device
reward_model.max_length 1024 -> reward.model.max_length
reward_model.use_dynamic_bsz true -> reward.model.use_dynamic_bsz
reward_model.forward_max_token_len_per_gpu 4096 -> reward.model.forward_max_token_len_per_device
reward_model.reward_manager dapo -reward_manager.name -> reward.reward_manager
reward_model.reward_manager prime -reward_manager.name -> reward.reward_manager
reward_model.reward_manager magic -reward_manager.name !! not supported
reward_model.reward_loop_source importlib !! reward loops
reward_model.reward_loop_module_path loop.py !! reward loops
reward_model.reward_loop_class_name Loop !! reward loops
reward_model.launch_reward_fn_async true -> reward.launch_async
reward_model.sandbox_fusion.url http://sandbox:8080 -> reward.sandbox_url
reward_model.sandbox_fusion.url http://sandbox:8080 -> reward.sandbox = sandbox_fusion
reward_model.sandbox_fusion.memory_limit_mb 256 +reward_model.sandbox_fusion.url=http://sb -> reward.sandbox_limits.memory_mb
reward_model.sandbox_fusion.max_concurrent 8 noted
reward_model.ulysses_sequence_parallel_size 2 !! sequence parallelism
reward_model.use_reward_loop false noted
reward_model.num_workers 4 -> reward.num_workers
reward_model.rollout.name vllm noted
reward_model.rollout.name vllm +reward_model.enable=True +reward_model.model.path=/m/rm -> reward.model.path = /m/rm
reward_model.rollout.response_length 64 +reward_model.enable=True +reward_model.rollout.name=vllm noted
reward_model.profiler.enable true noted
reward_model.profiler.discrete true noted
reward_model.overlong_buffer.enable true -> algorithm.overlong_buffer.enable
reward_model.overlong_buffer.len 128 -> algorithm.overlong_buffer.len
reward_model.overlong_buffer.penalty_factor 0.5 -> algorithm.overlong_buffer.penalty_factor
custom_reward_function.path /r/score.py -> reward.custom_function.path
custom_reward_function.path /r/score.py -> reward.function = custom
custom_reward_function.name my_score -> reward.custom_function.name
custom_reward_function.reward_kwargs {scale:2} -> reward.custom_function.kwargs
# ---------------------------------------------------------------- algorithm
algorithm.rollout_correction.rollout_is token -> actor.rollout_is
algorithm.rollout_correction.rollout_is sequence -> actor.rollout_is
algorithm.rollout_correction.rollout_is_threshold 5.0 -> actor.rollout_is_threshold
algorithm.rollout_correction.rollout_rs token !! rejection modes
algorithm.rollout_correction.rollout_rs token_k1 +algorithm.rollout_correction.rollout_rs_threshold=2.0 !! adv_estimator
algorithm.rollout_correction.rollout_rs token_k2 +algorithm.adv_estimator=grpo !! needs rollout_rs_threshold
algorithm.rollout_correction.rollout_rs token_k2 +algorithm.adv_estimator=grpo +algorithm.rollout_correction.rollout_rs_threshold='0.5_1' !! not a positive bound
algorithm.rollout_correction.rollout_rs token_k1,token_k2 +algorithm.adv_estimator=rloo +algorithm.rollout_correction.rollout_rs_threshold='1,2,3' !! 3 thresholds for 2
algorithm.rollout_correction.rollout_rs_threshold 2.0 noted
algorithm.rollout_correction.bypass_mode true +actor_rollout_ref.rollout.calculate_log_probs=true -> actor.recompute_old_log_prob = false
algorithm.rollout_correction.bypass_mode false -> actor.recompute_old_log_prob = true
algorithm.rollout_correction.bypass_mode true +actor_rollout_ref.actor.policy_loss.loss_mode=gspo !! replaces policy_loss.loss_mode
algorithm.rollout_correction.bypass_mode true +actor_rollout_ref.rollout.calculate_log_probs=false !! needs the rollout's log-probs
algorithm.rollout_correction.loss_type reinforce noted
algorithm.rollout_correction.loss_type ppo_clip +algorithm.rollout_correction.bypass_mode=true +actor_rollout_ref.rollout.calculate_log_probs=true noted
algorithm.rollout_correction.loss_type reinforce +algorithm.rollout_correction.bypass_mode=true +actor_rollout_ref.rollout.calculate_log_probs=true -> actor.policy_loss = reinforce_is
algorithm.rollout_correction.loss_type reinforce +algorithm.rollout_correction.bypass_mode=true +actor_rollout_ref.rollout.calculate_log_probs=true -> actor.policy_loss_kwargs.reinforce_is_level = none
algorithm.rollout_correction.loss_type reinforce +algorithm.rollout_correction.bypass_mode=true +actor_rollout_ref.rollout.calculate_log_probs=true +algorithm.rollout_correction.rollout_is=sequence -> actor.policy_loss_kwargs.reinforce_is_level = sequence
algorithm.rollout_correction.loss_type reinforce +algorithm.rollout_correction.bypass_mode=true +actor_rollout_ref.rollout.calculate_log_probs=true +algorithm.rollout_correction.rollout_is=token -> actor.rollout_is = none
algorithm.rollout_correction.loss_type reinforce +algorithm.rollout_correction.bypass_mode=true +actor_rollout_ref.rollout.calculate_log_probs=true +algorithm.rollout_correction.rollout_is=token +algorithm.rollout_correction.rollout_is_threshold='0.5_5.0' -> actor.policy_loss_kwargs.reinforce_is_threshold_low = 0.5
algorithm.rollout_correction.loss_type reinforce +algorithm.rollout_correction.bypass_mode=true +actor_rollout_ref.rollout.calculate_log_probs=true +algorithm.rollout_correction.rollout_is=token +algorithm.rollout_correction.rollout_is_threshold=3.0 -> actor.policy_loss_kwargs.reinforce_is_threshold = 3.0
algorithm.rollout_correction.loss_type pg +algorithm.rollout_correction.bypass_mode=true +actor_rollout_ref.rollout.calculate_log_probs=true !! ppo_clip or reinforce
algorithm.rollout_correction.rollout_is_batch_normalize true +algorithm.rollout_correction.bypass_mode=true +actor_rollout_ref.rollout.calculate_log_probs=true +algorithm.rollout_correction.loss_type=reinforce +algorithm.rollout_correction.rollout_is=token -> actor.policy_loss_kwargs.reinforce_is_batch_normalize = True
algorithm.rollout_correction.rollout_is token +algorithm.rollout_correction.bypass_mode=true +actor_rollout_ref.rollout.calculate_log_probs=true -> actor.rollout_is = none
algorithm.rollout_correction.rollout_is_threshold null noted
algorithm.rollout_correction.rollout_is_threshold null +algorithm.rollout_correction.rollout_is=token !! no IS weights
algorithm.rollout_correction.rollout_is_batch_normalize true noted
algorithm.rollout_correction.rollout_is_batch_normalize true +algorithm.rollout_correction.rollout_is=token -> actor.rollout_is_batch_normalize
algorithm.rollout_correction.rollout_is_threshold '0.5_5.0' -> actor.rollout_is_threshold_low = 0.5
algorithm.rollout_correction.rollout_is_threshold '0.5_5.0' -> actor.rollout_is_threshold = 5.0
algorithm.rollout_correction.rollout_is_threshold '3.0' -> actor.rollout_is_threshold = 3.0
algorithm.rollout_correction.rollout_is_threshold '5_0.5' !! low ≤ high
algorithm.rollout_correction.rollout_is_threshold 'a_b' !! low_high
algorithm.gamma 0.99 -> algorithm.gamma
algorithm.lam 0.95 -> algorithm.lam
algorithm.adv_estimator grpo -> algorithm.adv_estimator
algorithm.norm_adv_by_std_in_grpo false -> algorithm.norm_adv_by_std_in_grpo
algorithm.adv_estimator gdpo +algorithm.gdpo_reward_keys=[acc] -> algorithm.adv_estimator
algorithm.adv_estimator optimal_token_baseline +actor_rollout_ref.actor.calculate_sum_pi_squared=true -> algorithm.adv_estimator
algorithm.adv_estimator tir_optimal_token_baseline +actor_rollout_ref.actor.calculate_sum_pi_squared=true -> algorithm.adv_estimator
algorithm.gdpo_reward_keys [accuracy_reward,format_reward] +algorithm.adv_estimator=gdpo -> algorithm.gdpo_reward_keys
algorithm.gdpo_reward_weights [1.0,0.25] +algorithm.adv_estimator=gdpo +algorithm.gdpo_reward_keys=[a,b] -> algorithm.gdpo_reward_weights
algorithm.use_kl_in_reward true -> algorithm.use_kl_in_reward
algorithm.kl_penalty low_var_kl -> algorithm.kl_penalty
algorithm.kl_ctrl.type adaptive -> algorithm.kl_ctrl.type
algorithm.kl_ctrl.type linear !! algorithm.kl_ctrl.type
algorithm.kl_ctrl.kl_coef 0.01 -> algorithm.kl_ctrl.kl_coef
algorithm.kl_ctrl.horizon 500 -> algorithm.kl_ctrl.horizon
algorithm.kl_ctrl.target_kl 0.2 -> algorithm.kl_ctrl.target_kl
algorithm.use_pf_ppo true -> algorithm.use_pf_ppo
algorithm.pf_ppo.reweight_method max_min -> algorithm.pf_ppo.reweight_method
algorithm.pf_ppo.weight_pow 3.0 -> algorithm.pf_ppo.weight_pow
algorithm.filter_groups.enable true -> algorithm.filter_groups.enable
algorithm.filter_groups.metric acc -> algorithm.filter_groups.metric = score
algorithm.filter_groups.metric seq_reward -> algorithm.filter_groups.metric = reward
algorithm.filter_groups.max_num_gen_batches 10 -> algorithm.filter_groups.max_num_gen_batches
# ---------------------------------------------------------------- trainer, ray, profiler
trainer.balance_batch false -> experiment.balance_batch
trainer.total_epochs 3 -> experiment.total_epochs
trainer.total_training_steps 100 -> experiment.max_steps
trainer.project_name proj -> experiment.project_name
trainer.experiment_name exp1 -> experiment.experiment_name
trainer.logger [console,tracking] -> experiment.trackers = [console,wandb,jsonl]
trainer.logger [console,tensorboard] -> experiment.trackers = [console,tensorboard,jsonl]
trainer.logger console -> experiment.trackers = [console,jsonl]
trainer.logger [console,mlflow] -> experiment.trackers = [console,mlflow,jsonl]
trainer.logger [swanlab,trackio] -> experiment.trackers = [swanlab,trackio,jsonl]
trainer.logger [console,clearml] !! clearml
trainer.logger [console,vemlp_wandb] !! vemlp_wandb
trainer.log_val_generations 10 -> experiment.log_val_generations
trainer.rollout_data_dir /tmp/r -> experiment.rollout_data_dir
trainer.validation_data_dir /tmp/v -> experiment.validation_data_dir
trainer.nnodes 2 -> resources.nnodes
trainer.n_gpus_per_node 4 -> resources.devices_per_node
trainer.n_gpus_per_node 1 -> resources.backend = local
trainer.n_gpus_per_node 2 -> resources.backend = ray
trainer.save_freq 10 -> experiment.save_freq
trainer.esi_redundant_time 5 noted
trainer.resume_mode disable -> experiment.resume_mode
trainer.resume_from_path /ckpt/step_10 -> experiment.resume_from_path
trainer.val_before_train false -> experiment.val_before_train
trainer.val_only true -> experiment.val_only
trainer.test_freq 5 -> experiment.test_freq
trainer.critic_warmup 2 -> experiment.critic_warmup
trainer.default_hdfs_dir null noted
trainer.default_hdfs_dir hdfs://x/ckpt !! HDFS
trainer.del_local_ckpt_after_load true !! deleting
trainer.default_local_dir /out/run -> experiment.output_dir
trainer.max_actor_ckpt_to_keep 3 -> experiment.max_actor_ckpt_to_keep
trainer.max_critic_ckpt_to_keep 2 -> experiment.max_critic_ckpt_to_keep
trainer.ray_wait_register_center_timeout 60 noted
trainer.device cpu -> experiment.device
trainer.device npu !! not supported
trainer.use_legacy_worker_impl disable noted
trainer.profile_steps [1,2] -> experiment.profile_steps
trainer.controller_nsight_options.trace cuda,nvtx noted
trainer.controller_nsight_options.cuda-memory-usage 'true' noted
trainer.controller_nsight_options.cuda-graph-trace graph noted
trainer.worker_nsight_options.trace cuda noted
trainer.worker_nsight_options.cuda-memory-usage 'true' noted
trainer.worker_nsight_options.cuda-graph-trace graph noted
trainer.worker_nsight_options.capture-range cudaProfilerApi noted
trainer.worker_nsight_options.capture-range-end null noted
trainer.worker_nsight_options.kill none noted
global_profiler.tool nsys noted
global_profiler.steps [1] noted
transfer_queue.enable true !! transfer queue
ray_kwargs.ray_init.num_cpus 8 -> resources.ray.num_cpus
ray_kwargs.timeline_json_file /tmp/t.json -> resources.ray.timeline_json_file
ray_init.num_cpus 8 -> resources.ray.num_cpus
ray_init.timeline_json_file /tmp/t.json -> resources.ray.timeline_json_file
# ---------------------------------------------------------------- verl 0.9 (2026-08 snapshot)
# model_engine: ppo_trainer.yaml's defaults group; model_engine/{dp,megatron,torchtitan,
# veomni}.yaml; the role files it picks set strategy fsdp / megatron / torchtitan / veomni
model_engine dp -> actor.strategy = fsdp2
model_engine megatron +actor_rollout_ref.actor.strategy=megatron -> actor.strategy = megatron
model_engine megatron !! role files (strategy megatron)
model_engine veomni +actor_rollout_ref.actor.strategy=veomni -> actor.strategy = fsdp2
model_engine veomni !! role files (strategy veomni)
model_engine torchtitan +actor_rollout_ref.actor.strategy=torchtitan -> actor.strategy = fsdp2
model_engine torchtitan !! role files (strategy torchtitan)
model_engine automodel !! NeMo AutoModel
model_engine fsdp !! not supported
actor_rollout_ref.actor.model_engine megatron +model_engine=megatron +actor_rollout_ref.actor.strategy=megatron !! hydra
actor_rollout_ref.actor.strategy veomni -> actor.strategy = fsdp2
critic.strategy veomni -> critic.strategy = fsdp2
actor_rollout_ref.actor.strategy torchtitan -> actor.strategy = fsdp2
critic.strategy torchtitan -> critic.strategy = fsdp2
# verl 0.9's TorchTitan engine (engine/torchtitan.yaml: TorchtitanEngineConfig; optim/
# torchtitan.yaml): FSDP2 over shard × replicate ranks; torchtitan's LambdaLR over its own
# 10000 training steps, clipped at its max_norm (verl passes neither)
actor_rollout_ref.actor.torchtitan.param_offload true +actor_rollout_ref.actor.strategy=torchtitan -actor_rollout_ref.actor.fsdp_config -> actor.fsdp.param_offload
actor_rollout_ref.actor.torchtitan.optimizer_offload true +actor_rollout_ref.actor.strategy=torchtitan -actor_rollout_ref.actor.fsdp_config -> actor.fsdp.optimizer_offload
actor_rollout_ref.actor.torchtitan.reshard_after_forward never +actor_rollout_ref.actor.strategy=torchtitan -actor_rollout_ref.actor.fsdp_config -> actor.fsdp.reshard_after_forward = false
actor_rollout_ref.actor.torchtitan.reshard_after_forward sometimes +actor_rollout_ref.actor.strategy=torchtitan -actor_rollout_ref.actor.fsdp_config !! not supported
actor_rollout_ref.actor.torchtitan.data_parallel_shard_size 8 +actor_rollout_ref.actor.strategy=torchtitan -actor_rollout_ref.actor.fsdp_config noted
actor_rollout_ref.actor.torchtitan.data_parallel_shard_size 4 +actor_rollout_ref.actor.strategy=torchtitan -actor_rollout_ref.actor.fsdp_config +actor_rollout_ref.actor.torchtitan.data_parallel_replicate_size=2 -> actor.fsdp.fsdp_size = 4
actor_rollout_ref.actor.torchtitan.data_parallel_shard_size 1 +actor_rollout_ref.actor.strategy=torchtitan -actor_rollout_ref.actor.fsdp_config !! must cover them
actor_rollout_ref.actor.torchtitan.data_parallel_shard_size -1 +actor_rollout_ref.actor.strategy=torchtitan -actor_rollout_ref.actor.fsdp_config !! shard × replicate
actor_rollout_ref.actor.torchtitan.tensor_parallel_size 2 +actor_rollout_ref.actor.strategy=torchtitan !! tensor parallelism
actor_rollout_ref.actor.torchtitan.expert_parallel_size 1 +actor_rollout_ref.actor.strategy=torchtitan noted
actor_rollout_ref.actor.torchtitan.attn_type flex noted
actor_rollout_ref.actor.torchtitan.activation_checkpoint full noted
actor_rollout_ref.actor.torchtitan.mixed_precision false noted
actor_rollout_ref.actor.torchtitan.full_determinism true -> experiment.deterministic
actor_rollout_ref.ref.torchtitan.param_offload true -actor_rollout_ref.ref.fsdp_config -> reference.param_offload
actor_rollout_ref.ref.optim.lr 0.1 noted
critic.torchtitan.strategy torchtitan +critic.strategy=torchtitan !! language models only
critic.torchtitan.strategy torchtitan +critic.strategy=torchtitan +algorithm.adv_estimator=grpo noted
critic.torchtitan.strategy torchtitan noted
actor_rollout_ref.actor.optim.decay_type sqrt +actor_rollout_ref.actor.strategy=torchtitan -> actor.optim.lr_scheduler = sqrt
actor_rollout_ref.actor.optim.decay_type cosine +actor_rollout_ref.actor.strategy=torchtitan -> actor.optim.warmup_from_one = true
actor_rollout_ref.actor.optim.decay_type cosine +actor_rollout_ref.actor.strategy=torchtitan +actor_rollout_ref.actor.optim.min_lr_factor=0.1 -actor_rollout_ref.actor.optim.min_lr_ratio -> actor.optim.min_lr_ratio = 0.1
actor_rollout_ref.actor.optim.decay_type step +actor_rollout_ref.actor.strategy=torchtitan !! not supported
actor_rollout_ref.actor.optim.decay_type cosine noted
actor_rollout_ref.actor.optim.total_training_steps -1 +actor_rollout_ref.actor.strategy=torchtitan -> actor.optim.total_training_steps = 10000
actor_rollout_ref.actor.optim.lr_warmup_steps_ratio 0.1 +actor_rollout_ref.actor.strategy=torchtitan !! lr_warmup_steps
actor_rollout_ref.actor.optim.lr_warmup_steps_ratio 0.1 +actor_rollout_ref.actor.strategy=torchtitan +actor_rollout_ref.actor.optim.lr_warmup_steps=5 -> actor.optim.warmup_steps = 5
actor_rollout_ref.actor.optim.clip_grad 0.5 +actor_rollout_ref.actor.strategy=torchtitan -> actor.grad_clip = 1.0
actor_rollout_ref.actor.grad_clip 0.5 +actor_rollout_ref.actor.strategy=torchtitan -> actor.grad_clip = 1.0
actor_rollout_ref.actor.optim.name AdamW +actor_rollout_ref.actor.strategy=torchtitan noted
actor_rollout_ref.actor.optim.name Adam +actor_rollout_ref.actor.strategy=torchtitan !! not AdamW
actor_rollout_ref.actor.optim.name Adam +actor_rollout_ref.actor.strategy=torchtitan +actor_rollout_ref.actor.optim.weight_decay=0 noted
# verl 0.9's VeOmni engine (engine/veomni.yaml: VeOmniEngineConfig; optim/veomni.yaml):
# FSDP2 with Ulysses, whose schedule is veomni.optim.lr_scheduler's
actor_rollout_ref.actor.veomni.param_offload true +actor_rollout_ref.actor.strategy=veomni -actor_rollout_ref.actor.fsdp_config -> actor.fsdp.param_offload
actor_rollout_ref.actor.veomni.optimizer_offload true +actor_rollout_ref.actor.strategy=veomni -actor_rollout_ref.actor.fsdp_config -> actor.fsdp.optimizer_offload
actor_rollout_ref.actor.veomni.fsdp_size 4 +actor_rollout_ref.actor.strategy=veomni -actor_rollout_ref.actor.fsdp_config -> actor.fsdp.fsdp_size
actor_rollout_ref.actor.veomni.enable_full_shard false +actor_rollout_ref.actor.strategy=veomni -actor_rollout_ref.actor.fsdp_config -> actor.fsdp.reshard_after_forward
actor_rollout_ref.actor.veomni.enable_fsdp_offload true +actor_rollout_ref.actor.strategy=veomni -actor_rollout_ref.actor.fsdp_config -> actor.fsdp.offload_policy
actor_rollout_ref.actor.veomni.ulysses_parallel_size 2 -> actor.ulysses_sequence_parallel_size
actor_rollout_ref.actor.veomni.mixed_precision false +actor_rollout_ref.actor.strategy=veomni -actor_rollout_ref.actor.fsdp_config -> actor.master_dtype = bf16
actor_rollout_ref.actor.veomni.mixed_precision true noted
actor_rollout_ref.actor.veomni.seed 7 +actor_rollout_ref.actor.strategy=veomni -actor_rollout_ref.actor.fsdp_config +actor_rollout_ref.ref.fsdp_config.seed=7 +critic.model.fsdp_config.seed=7 +actor_rollout_ref.actor.data_loader_seed=7 +critic.data_loader_seed=7 -> experiment.seed
actor_rollout_ref.actor.veomni.full_determinism true -> experiment.deterministic
actor_rollout_ref.actor.veomni.expert_parallel_size 1 noted
actor_rollout_ref.actor.veomni.expert_parallel_size 8 !! expert parallelism
actor_rollout_ref.actor.veomni.attn_implementation flash_attention_2 noted
actor_rollout_ref.actor.veomni.attn_implementation veomni_flash_attention_2_with_sp noted
actor_rollout_ref.actor.veomni.attn_implementation native-sparse !! exact attention
actor_rollout_ref.actor.veomni.moe_implementation fused_triton noted
actor_rollout_ref.actor.veomni.rms_norm_implementation triton noted
actor_rollout_ref.actor.veomni.ckpt_manager dcp noted
actor_rollout_ref.actor.veomni.load_checkpoint_path /ckpt !! VeOmni checkpoint
actor_rollout_ref.actor.veomni.router_replay.mode R2 -> actor.router_replay = R2
actor_rollout_ref.ref.veomni.param_offload true -actor_rollout_ref.ref.fsdp_config -> reference.param_offload
actor_rollout_ref.ref.veomni.ulysses_parallel_size 2 !! actor's sequence parallelism
actor_rollout_ref.ref.veomni.ulysses_parallel_size 2 +actor_rollout_ref.actor.veomni.ulysses_parallel_size=2 noted
actor_rollout_ref.ref.veomni.router_replay.mode R2 !! only the actor
critic.veomni.fsdp_size 4 +critic.strategy=veomni -critic.model.fsdp_config -> critic.fsdp.fsdp_size
critic.veomni.mixed_precision false +critic.strategy=veomni -critic.model.fsdp_config -> critic.master_dtype = bf16
actor_rollout_ref.actor.optim.lr_min 0.25 +actor_rollout_ref.actor.strategy=veomni +actor_rollout_ref.actor.optim.lr=0.5 +actor_rollout_ref.actor.optim.lr_scheduler_type=cosine -actor_rollout_ref.actor.optim.min_lr_ratio -> actor.optim.min_lr_ratio = 0.5
actor_rollout_ref.actor.optim.lr_min 0.25 +actor_rollout_ref.actor.strategy=veomni +actor_rollout_ref.actor.optim.lr=0.5 +actor_rollout_ref.actor.optim.lr_scheduler_type=linear !! floors at lr_min
actor_rollout_ref.actor.optim.lr_min 1e-7 !! VeOmni engine only
actor_rollout_ref.actor.optim.lr_start 1e-7 +actor_rollout_ref.actor.strategy=veomni !! warmup starts at 0
actor_rollout_ref.actor.optim.lr_start 0.0 +actor_rollout_ref.actor.strategy=veomni noted
actor_rollout_ref.actor.optim.lr_decay_ratio 0.5 +actor_rollout_ref.actor.strategy=veomni !! last optimizer step
actor_rollout_ref.actor.optim.lr_warmup_steps 10 +actor_rollout_ref.actor.strategy=veomni -> actor.optim.warmup_steps = -1
actor_rollout_ref.actor.optim.lr_warmup_steps 10 -> actor.optim.warmup_steps = 10
# trainer.use_v1 (default true) and trainer.v1: ppo_trainer.yaml's trainer section; the
# async modes' options are read for the chosen trainer_mode only (trainer_base.py), and
# sync sampling ignores the off-policy bound (replay_buffer.py)
trainer.use_v1 true noted
trainer.use_v1 false noted
trainer.v1.trainer_mode sync noted
trainer.v1.trainer_mode colocate_async -> async_training.staleness = 1
trainer.v1.trainer_mode colocate_async +trainer.v1.colocate_async.num_warmup_batches=0 -> async_training.staleness = 0
trainer.v1.trainer_mode colocate_async +trainer.v1.colocate_async.num_warmup_batches=5 +trainer.v1.sampler.max_off_policy_threshold=3 -> async_training.staleness = 2
trainer.v1.trainer_mode separate_async +actor_rollout_ref.rollout.nnodes=1 +actor_rollout_ref.rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.checkpoint_engine.backend=nccl -> async_training.staleness = 1
trainer.v1.trainer_mode separate_async +actor_rollout_ref.rollout.nnodes=1 +actor_rollout_ref.rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.checkpoint_engine.backend=nccl -> resources.actor_infer = [8,9]
trainer.v1.trainer_mode separate_async +actor_rollout_ref.rollout.nnodes=1 +actor_rollout_ref.rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.checkpoint_engine.backend=nccl -> resources.devices_per_node = 10
trainer.v1.colocate_async.num_warmup_batches -1 +trainer.v1.trainer_mode=colocate_async !! integer >= 0
actor_rollout_ref.rollout.nnodes 0 +trainer.v1.trainer_mode=separate_async !! pool of its own
actor_rollout_ref.rollout.checkpoint_engine.backend naive +trainer.v1.trainer_mode=separate_async +actor_rollout_ref.rollout.nnodes=1 !! naive
trainer.v1.separate_async.parameter_sync_step 2 +trainer.v1.trainer_mode=separate_async +actor_rollout_ref.rollout.nnodes=1 +actor_rollout_ref.rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.checkpoint_engine.backend=nccl !! train_batch_size (1024) = parameter_sync_step (2)
trainer.v1.separate_async.parameter_sync_step 4 +trainer.v1.trainer_mode=separate_async +actor_rollout_ref.rollout.nnodes=1 +actor_rollout_ref.rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.checkpoint_engine.backend=nccl noted
trainer.v1.separate_async.hybrid_rollout.enable_switch true +trainer.v1.trainer_mode=separate_async +actor_rollout_ref.rollout.nnodes=1 +actor_rollout_ref.rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.checkpoint_engine.backend=nccl !! hybrid rollout
trainer.v1.sampler.max_off_policy_strategy wait +trainer.v1.trainer_mode=colocate_async noted
trainer.v1.sampler.max_off_policy_strategy drop +trainer.v1.trainer_mode=separate_async +actor_rollout_ref.rollout.nnodes=1 +actor_rollout_ref.rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.checkpoint_engine.backend=nccl noted
# verl's fully-async trainer (verl.experimental.fully_async_policy): its async_training
# section, its rollout pool, and what its launching scripts set (verl asserts them)
async_training.staleness_threshold 0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> async_training.staleness = 1
async_training.staleness_threshold 0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> async_training.mode = streaming
async_training.staleness_threshold 0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> async_training.max_off_policy_strategy = wait
async_training.staleness_threshold 1.5 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> async_training.staleness = 2
async_training.staleness_threshold 0 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> async_training.staleness = 0
async_training.staleness_threshold 0 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> async_training.mode = fixed
async_training.staleness_threshold -0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! >= 0
async_training.trigger_parameter_sync_step 2 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> data.train_batch_size = 512
async_training.trigger_parameter_sync_step 0 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! >= 1
async_training.require_batches 2 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> data.train_batch_size = 2048
async_training.require_batches 0 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! >= 1
async_training.partial_rollout true +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> async_training.partial_rollout_segment = 128
async_training.partial_rollout false +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> async_training.partial_rollout_segment = 0
async_training.partial_rollout 1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! true or false
async_training.use_trainer_do_validate true +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
async_training.use_trainer_do_validate false +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
async_training.use_dynamic_resource_scheduling false +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
async_training.use_dynamic_resource_scheduling true +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! dynamic resource scheduling
async_training.dynamic_schedule_policy default +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
async_training.dynamic_schedule_deactivate_ratio 0.3 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
async_training.dynamic_schedule_enable_rebalance true +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
async_training.concurrent_samples_per_replica 16 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
rollout.total_rollout_steps 5120 +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> experiment.max_steps = 5
rollout.total_rollout_steps 100 +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! fewer than one step's
rollout.total_rollout_steps null +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
rollout.n 4 +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
rollout.n_gpus_per_node 2 +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> resources.actor_infer = [8,9]
rollout.nnodes 0 +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! positive integer
data.gen_batch_size 1 +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
data.gen_batch_size 2 +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! asserts gen_batch_size is 1
data.train_batch_size 64 +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! asserts it is 0
actor_rollout_ref.hybrid_engine true +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! asserts hybrid_engine is false
actor_rollout_ref.rollout.calculate_log_probs false +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 !! computes its log-probs
actor_rollout_ref.actor.use_rollout_log_probs true +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
actor_rollout_ref.rollout.standalone_gpu_memory_utilization 0.5 +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true -> rollout.gpu_memory_utilization = 0.5
actor_rollout_ref.rollout.standalone_gpu_memory_utilization null noted
reward_model.enable true +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true !! reward model
trainer.v1.trainer_mode separate_async +async_training.staleness_threshold=0.1 +actor_rollout_ref.hybrid_engine=false +data.train_batch_size=0 +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.rollout.calculate_log_probs=true noted
rollout.nnodes 1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.hybrid_engine=false -> async_training.staleness = 1
rollout.n_gpus_per_node 2 +rollout.nnodes=1 +actor_rollout_ref.hybrid_engine=false -> resources.actor_infer = [8,9]
rollout.n_gpus_per_node 8 +rollout.nnodes=2 +actor_rollout_ref.hybrid_engine=false -> resources.nnodes = 3
rollout.nnodes 2 +rollout.n_gpus_per_node=4 +actor_rollout_ref.hybrid_engine=false !! does not fit
rollout.nnodes 0 +rollout.n_gpus_per_node=4 +actor_rollout_ref.hybrid_engine=false !! positive integer
trainer.v1.trainer_mode separate_async +rollout.nnodes=1 +rollout.n_gpus_per_node=2 +actor_rollout_ref.hybrid_engine=false noted
trainer.v1.trainer_mode separate_async +trainer.use_v1=false noted
trainer.v1.trainer_mode fully_async !! not supported
trainer.v1.sync {} noted
trainer.v1.sync {x:1} !! no options
trainer.v1.colocate_async.num_warmup_batches 2 noted
trainer.v1.separate_async.num_warmup_batches 2 noted
trainer.v1.separate_async.parameter_sync_step 8 noted
trainer.v1.separate_async.hybrid_rollout.enable_switch true noted
trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio 0.5 noted
trainer.v1.separate_async.hybrid_rollout.adaptive_switch_threshold false noted
trainer.v1.separate_async.hybrid_rollout.switch_threshold_step_up 0.1 noted
trainer.v1.separate_async.hybrid_rollout.switch_threshold_step_down 0.1 noted
trainer.v1.separate_async.hybrid_rollout.switch_threshold_release_steps 3 noted
trainer.v1.separate_async.hybrid_rollout.switch_cost_window_size 5 noted
trainer.v1.separate_async.hybrid_rollout.switch_ratio 0.5 !! unknown verl key
trainer.v1.sampler.max_off_policy_threshold 4 noted
trainer.v1.sampler.max_off_policy_threshold 0 !! positive integer
trainer.v1.sampler.max_off_policy_strategy wait noted
trainer.v1.sampler.max_off_policy_strategy keep !! drop or wait
trainer.v1.sampler.sync_refill_failed_groups false noted
trainer.v1.sampler.sync_refill_failed_groups true !! failed groups
trainer.v1.sampler.custom_sampler.path /s.py !! custom samplers
trainer.v1.sampler.custom_sampler.name MySampler noted
trainer.v1.sampler.sampler_kwargs {} noted
# reward (reward/reward.yaml) beside the legacy sections (legacy_reward_impl.yaml: all
# null); migrate_legacy_reward_impl copies each non-null legacy value over the new key,
# so the rows null the legacy key that verl 0.8's file sets
reward.num_workers 4 +reward_model.num_workers=null -> reward.num_workers
reward.num_workers 4 noted
reward.custom_reward_function.path /r/score.py -> reward.custom_function.path
reward.custom_reward_function.path /r/score.py -> reward.function = custom
reward.custom_reward_function.name my_score +custom_reward_function.name=null -> reward.custom_function.name
reward.custom_reward_function.reward_kwargs {scale:2} -> reward.custom_function.kwargs
reward.reward_manager.name dapo +reward_model.reward_manager=null -reward_manager.name -> reward.reward_manager
reward.reward_manager.name magic +reward_model.reward_manager=null -reward_manager.name !! not supported
reward.reward_manager.source register noted
reward.reward_manager.source importlib !! custom reward managers
reward.reward_manager.module.path /m.py !! custom reward manager modules
reward.reward_manager.module.name MyManager noted
reward.reward_model.enable true +reward_model.enable=null -> reward.model.enable
reward.reward_model.model_path /m/rm +reward_model.model.path=null -> reward.model.path
reward.reward_model.model_path /m/rm noted
reward.reward_model.enable_resource_pool true !! reward-model pool
reward.reward_model.n_gpus_per_node 4 noted
reward.reward_model.nnodes 1 noted
reward.reward_model.rollout.name vllm noted
reward.reward_model.rollout.name vllm +reward_model.enable=null +reward_model.model.path=null +reward.reward_model.enable=true +reward.reward_model.model_path=/m/rm -> reward.model.path = /m/rm
reward.reward_model.rollout.name vllm +reward_model.enable=null +reward.reward_model.enable=true +custom_reward_function.path=/r/genrm.py !! generative reward model
reward.reward_model.rollout.tensor_model_parallel_size 2 noted
reward.reward_kwargs {"overlong_buffer_cfg":{"enable":true,"len":128}} -> algorithm.overlong_buffer.len = 128
reward.reward_kwargs {"max_resp_len":7} !! response length
reward.sandbox_fusion.url http://sandbox:8080 -> reward.sandbox_url
reward.sandbox_fusion.url http://sandbox:8080 -> reward.sandbox = sandbox_fusion
reward.sandbox_fusion.memory_limit_mb 256 +reward.sandbox_fusion.url=http://sb -> reward.sandbox_limits.memory_mb
reward.sandbox_fusion.max_concurrent 8 noted
sandbox_fusion.url http://sandbox:8080 -> reward.sandbox_url
sandbox_fusion.url http://sandbox:8080 +reward.sandbox_fusion.url=http://other:1 -> reward.sandbox_url = http://sandbox:8080
sandbox_fusion.max_concurrent 8 noted
# token budgets count one sequence-parallel rank's tokens: dp_actor.py / dp_critic.py
# (max_token_len = ppo_max_token_len_per_gpu * ulysses_sequence_parallel_size), 0.9's
# engine/utils.py prepare_micro_batches (× sp_size: Ulysses for FSDP, context-parallel
# for Megatron); the role-level size (deprecated) overrides fsdp_config's when above 1
actor_rollout_ref.actor.ppo_max_token_len_per_gpu 5632 +actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 +actor_rollout_ref.ref.ulysses_sequence_parallel_size=4 -> actor.max_token_len_per_device = 22528
actor_rollout_ref.actor.ppo_max_token_len_per_gpu 5632 +trainer.use_legacy_worker_impl=disable +actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4 -> actor.max_token_len_per_device = 22528
actor_rollout_ref.actor.ppo_max_token_len_per_gpu 4096 +actor_rollout_ref.actor.strategy=megatron +actor_rollout_ref.actor.megatron.context_parallel_size=2 -> actor.max_token_len_per_device = 8192
actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu 4096 +actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 +actor_rollout_ref.ref.ulysses_sequence_parallel_size=2 -> rollout.log_prob_max_token_len_per_device = 8192
actor_rollout_ref.ref.log_prob_max_token_len_per_gpu 4096 +actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 +actor_rollout_ref.ref.ulysses_sequence_parallel_size=2 -> reference.log_prob_max_token_len_per_device = 8192
critic.ppo_max_token_len_per_gpu 4096 +critic.ulysses_sequence_parallel_size=2 -> critic.max_token_len_per_device = 8192
critic.forward_max_token_len_per_gpu 4096 +critic.ulysses_sequence_parallel_size=2 -> critic.log_prob_max_token_len_per_device = 8192
# (the engine workers read fsdp_config's size; the legacy workers, 0.8's default, only the role's)
actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size 4 +trainer.use_legacy_worker_impl=disable -> actor.ulysses_sequence_parallel_size
actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size 4 -> actor.ulysses_sequence_parallel_size = 1
actor_rollout_ref.actor.ulysses_sequence_parallel_size 1 +trainer.use_legacy_worker_impl=disable +actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2 -> actor.ulysses_sequence_parallel_size = 2
actor_rollout_ref.actor.ulysses_sequence_parallel_size 4 +actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2 +actor_rollout_ref.ref.ulysses_sequence_parallel_size=4 -> actor.ulysses_sequence_parallel_size = 4
critic.model.fsdp_config.ulysses_sequence_parallel_size 2 +trainer.use_legacy_worker_impl=disable -> critic.ulysses_sequence_parallel_size
"""

# Every key the verl manuals (reference seeds 002, 003, 004) name, including keys that
# document 002 gives only inside its YAML block. Document 003's keys carry the vendor
# prefix ``backend_config.``; they are tested with it, and their verl part is here too.
SEED_KEYS = _words(
    """
data.tokenizer data.train_files data.val_files data.prompt_key data.max_prompt_length
data.max_response_length data.train_batch_size data.val_batch_size data.return_raw_input_ids
data.return_raw_chat data.truncation data.prompt_id_key data.max_prompt_id_length data.use_shm
data.reward_fn_key data.return_full_prompt data.shuffle data.validation_shuffle
data.filter_overlong_prompts data.filter_overlong_prompts_workers data.image_key data.video_key
data.trust_remote_code data.custom_cls.path data.custom_cls.name
actor_rollout_ref.hybrid_engine actor_rollout_ref.model.path actor_rollout_ref.model.external_lib
actor_rollout_ref.model.external_libs actor_rollout_ref.model.override_config
actor_rollout_ref.model.enable_gradient_checkpointing actor_rollout_ref.model.use_shm
actor_rollout_ref.model.enable_activation_offload actor_rollout_ref.model.use_remove_padding
actor_rollout_ref.model.use_liger actor_rollout_ref.model.use_fused_kernels
actor_rollout_ref.model.fused_kernel_options.impl_backend actor_rollout_ref.model.trust_remote_code
actor_rollout_ref.actor.strategy actor_rollout_ref.actor.ppo_mini_batch_size
actor_rollout_ref.actor.ppo_micro_batch_size actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
actor_rollout_ref.actor.use_dynamic_bsz actor_rollout_ref.actor.ppo_max_token_len_per_gpu
actor_rollout_ref.actor.grad_clip actor_rollout_ref.actor.clip_ratio actor_rollout_ref.actor.clip_ratio_low
actor_rollout_ref.actor.clip_ratio_high actor_rollout_ref.actor.clip_ratio_c
actor_rollout_ref.actor.loss_agg_mode actor_rollout_ref.actor.entropy_coeff
actor_rollout_ref.actor.use_kl_loss actor_rollout_ref.actor.use_torch_compile
actor_rollout_ref.actor.kl_loss_coef actor_rollout_ref.actor.kl_loss_type
actor_rollout_ref.actor.ppo_epochs actor_rollout_ref.actor.shuffle
actor_rollout_ref.actor.ulysses_sequence_parallel_size
actor_rollout_ref.actor.entropy_from_logits_with_chunking actor_rollout_ref.actor.entropy_checkpointing
actor_rollout_ref.actor.checkpoint.save_contents actor_rollout_ref.actor.checkpoint.load_contents
actor_rollout_ref.actor.optim.lr actor_rollout_ref.actor.optim.lr_warmup_steps
actor_rollout_ref.actor.optim.lr_warmup_steps_ratio actor_rollout_ref.actor.optim.min_lr_ratio
actor_rollout_ref.actor.optim.num_cycles actor_rollout_ref.actor.optim.warmup_style
actor_rollout_ref.actor.optim.total_training_steps actor_rollout_ref.actor.optim.weight_decay
actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params
actor_rollout_ref.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap
actor_rollout_ref.actor.fsdp_config.param_offload actor_rollout_ref.actor.fsdp_config.grad_offload
actor_rollout_ref.actor.fsdp_config.optimizer_offload actor_rollout_ref.actor.fsdp_config.offload_policy
actor_rollout_ref.actor.fsdp_config.reshard_after_forward actor_rollout_ref.actor.fsdp_config.fsdp_size
actor_rollout_ref.actor.fsdp_config.forward_prefetch
actor_rollout_ref.actor.profiler.discrete actor_rollout_ref.actor.profiler.all_ranks
actor_rollout_ref.actor.profiler.ranks
actor_rollout_ref.ref.strategy actor_rollout_ref.ref.fsdp_config.param_offload
actor_rollout_ref.ref.fsdp_config.reshard_after_forward actor_rollout_ref.ref.fsdp_config.forward_prefetch
actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params actor_rollout_ref.ref.log_prob_micro_batch_size
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu actor_rollout_ref.ref.log_prob_max_token_len_per_gpu
actor_rollout_ref.ref.profiler.discrete actor_rollout_ref.ref.profiler.all_ranks
actor_rollout_ref.ref.profiler.ranks
actor_rollout_ref.rollout.name actor_rollout_ref.rollout.temperature actor_rollout_ref.rollout.top_k
actor_rollout_ref.rollout.top_p actor_rollout_ref.rollout.use_fire_sampling actor_rollout_ref.rollout.n
actor_rollout_ref.rollout.ignore_eos actor_rollout_ref.rollout.prompt_length
actor_rollout_ref.rollout.response_length actor_rollout_ref.rollout.dtype
actor_rollout_ref.rollout.gpu_memory_utilization actor_rollout_ref.rollout.free_cache_engine
actor_rollout_ref.rollout.enforce_eager actor_rollout_ref.rollout.load_format
actor_rollout_ref.rollout.tensor_model_parallel_size actor_rollout_ref.rollout.max_num_batched_tokens
actor_rollout_ref.rollout.max_model_len actor_rollout_ref.rollout.max_num_seqs
actor_rollout_ref.rollout.enable_chunked_prefill actor_rollout_ref.rollout.disable_log_stats
actor_rollout_ref.rollout.log_prob_micro_batch_size actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
actor_rollout_ref.rollout.do_sample actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend
actor_rollout_ref.rollout.multi_turn.enable actor_rollout_ref.rollout.multi_turn.max_turns
actor_rollout_ref.rollout.multi_turn.tool_config_path actor_rollout_ref.rollout.multi_turn.completion_callback
actor_rollout_ref.rollout.multi_turn.use_inference_chat_template
actor_rollout_ref.rollout.multi_turn.enable_tokenization_sanity_check
actor_rollout_ref.rollout.val_kwargs.top_k actor_rollout_ref.rollout.val_kwargs.top_p
actor_rollout_ref.rollout.val_kwargs.temperature actor_rollout_ref.rollout.val_kwargs.n
actor_rollout_ref.rollout.val_kwargs.do_sample
critic.ppo_mini_batch_size critic.ppo_micro_batch_size critic.ppo_micro_batch_size_per_gpu
critic.ppo_max_token_len_per_gpu critic.forward_max_token_len_per_gpu
critic.forward_micro_batch_size_per_gpu critic.use_dynamic_bsz
reward_model.enable reward_model.strategy reward_model.model.input_tokenizer reward_model.model.path
reward_model.model.use_shm reward_model.model.external_lib reward_model.model.use_remove_padding
reward_model.model.use_fused_kernels reward_model.model.trust_remote_code
reward_model.model.fsdp_config.min_num_params reward_model.model.fsdp_config.wrap_policy.min_num_params
reward_model.model.fsdp_config.param_offload reward_model.model.fsdp_config.reshard_after_forward
reward_model.model.fsdp_config.fsdp_size reward_model.model.fsdp_config.forward_prefetch
reward_model.micro_batch_size reward_model.micro_batch_size_per_gpu reward_model.max_length
reward_model.forward_max_token_len_per_gpu reward_model.use_dynamic_bsz reward_model.reward_manager
reward_model.launch_reward_fn_async reward_model.sandbox_fusion.url
reward_model.sandbox_fusion.max_concurrent reward_model.profiler.discrete
custom_reward_function.path custom_reward_function.name
algorithm.gamma algorithm.lam algorithm.adv_estimator algorithm.norm_adv_by_std_in_grpo
algorithm.use_kl_in_reward algorithm.kl_penalty algorithm.kl_ctrl.type algorithm.kl_ctrl.kl_coef
algorithm.kl_ctrl.horizon algorithm.kl_ctrl.target_kl algorithm.use_pf_ppo
algorithm.pf_ppo.reweight_method algorithm.pf_ppo.weight_pow
trainer.total_epochs trainer.project_name trainer.experiment_name trainer.logger trainer.nnodes
trainer.n_gpus_per_node trainer.save_freq trainer.test_freq trainer.critic_warmup
trainer.default_hdfs_dir trainer.default_local_dir trainer.val_before_train trainer.resume_mode
trainer.resume_from_path trainer.balance_batch trainer.total_training_steps trainer.profile_steps
trainer.controller_nsight_options.trace trainer.controller_nsight_options.cuda-memory-usage
trainer.controller_nsight_options.cuda-graph-trace trainer.worker_nsight_options.trace
trainer.worker_nsight_options.cuda-memory-usage trainer.worker_nsight_options.cuda-graph-trace
trainer.worker_nsight_options.capture-range trainer.worker_nsight_options.capture-range-end
trainer.worker_nsight_options.kill trainer.log_val_generations trainer.rollout_data_dir
trainer.validation_data_dir trainer.val_only trainer.del_local_ckpt_after_load
trainer.max_actor_ckpt_to_keep trainer.max_critic_ckpt_to_keep
trainer.ray_wait_register_center_timeout trainer.device
ray_init.num_cpus ray_init.timeline_json_file
"""
)

# Document 003 (a vendor's verl page): the keys under ``backend_config`` with its example
# values, plus the wrapper's own keys, and where each must arrive (None: noted).
DOC_003 = {
    "af_output_dir": ("/home/ma-user/verl", "experiment.output_dir"),
    "backend_config.data.train_files": ("/data/geometry3k/train.parquet", "data.train_files"),
    "backend_config.data.val_files": ("/data/geometry3k/test.parquet", "data.val_files"),
    f"backend_config.{AR}.model.path": ("/model/Qwen2.5-VL-32B-Instruct", "model.path"),
    "backend_config.data.train_batch_size": (32, "data.train_batch_size"),
    f"backend_config.{AR}.actor.ppo_mini_batch_size": (8, "actor.mini_batch_size"),
    f"backend_config.{AR}.actor.ppo_micro_batch_size_per_gpu": (
        1,
        "actor.micro_batch_size_per_device",
    ),
    f"backend_config.{AR}.rollout.log_prob_micro_batch_size_per_gpu": (
        1,
        "rollout.log_prob_micro_batch_size_per_device",
    ),
    f"backend_config.{AR}.ref.log_prob_micro_batch_size_per_gpu": (
        1,
        "reference.log_prob_micro_batch_size_per_device",
    ),
    "backend_config.trainer.total_epochs": (5, "experiment.total_epochs"),
    f"backend_config.{AR}.rollout.tensor_model_parallel_size": (4, "rollout.tensor_parallel_size"),
    "backend_config.data.image_key": ("images", "data.image_key"),
    "engine_kwargs.vllm.disable_mm_preprocessor_cache": (
        True,
        "rollout.engine_kwargs.disable_mm_preprocessor_cache",
    ),
    "backend_config.data.max_prompt_length": (1024, "data.max_prompt_length"),
    "backend_config.data.max_response_length": (1024, "rollout.response_length"),
    f"backend_config.{AR}.rollout.max_num_batched_tokens": (
        18432,
        "rollout.max_num_batched_tokens",
    ),
    f"backend_config.{AR}.actor.ulysses_sequence_parallel_size": (
        1,
        "actor.ulysses_sequence_parallel_size",
    ),
    "backend_config.data.shuffle": (True, "data.shuffle"),
    "backend_config.data.truncation": ("error", "data.truncation"),
    f"backend_config.{AR}.actor.optim.lr": (1e-6, "actor.optim.lr"),
    f"backend_config.{AR}.model.use_remove_padding": (True, "model.use_remove_padding"),
    f"backend_config.{AR}.actor.use_kl_loss": (True, "actor.use_kl_loss"),
    f"backend_config.{AR}.actor.kl_loss_coef": (0.01, "actor.kl_loss_coef"),
    f"backend_config.{AR}.actor.kl_loss_type": ("low_var_kl", "actor.kl_loss_type"),
    f"backend_config.{AR}.actor.entropy_coeff": (0, "actor.entropy_coeff"),
    f"backend_config.{AR}.actor.use_torch_compile": (False, "actor.use_torch_compile"),
    f"backend_config.{AR}.model.enable_gradient_checkpointing": (
        True,
        "model.enable_gradient_checkpointing",
    ),
    f"backend_config.{AR}.rollout.name": ("vllm", "rollout.engine"),
    f"backend_config.{AR}.rollout.gpu_memory_utilization": (0.4, "rollout.gpu_memory_utilization"),
    f"backend_config.{AR}.rollout.n": (4, "rollout.n"),
    "backend_config.trainer.logger": (["console", "tensorboard"], "experiment.trackers"),
    "backend_config.trainer.val_before_train": (False, "experiment.val_before_train"),
    "backend_config.trainer.resume_mode": ("auto", "experiment.resume_mode"),
    "backend_config.trainer.resume_from_path": (None, "experiment.resume_from_path"),
    "backend_config.trainer.save_freq": (-1, "experiment.save_freq"),
    f"backend_config.{AR}.actor.ppo_max_token_len_per_gpu": (
        2048,
        "actor.max_token_len_per_device",
    ),
}
