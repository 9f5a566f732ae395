"""Expected translation of the keys of verl's and ROLL's SFT configs into ``pipeline: sft``:
the test table of ``test_sft_dialects.py``, in ``verl_keys.py``'s row language.

One row per line: ``<key> <value> [+<key>=<value> | -<key>]... <expectation>``, the value
(YAML, no spaces) set on the table's base file; expectations:

- ``-> native.path`` — the value arrives there unchanged; ``-> native.path = x`` — ``x``;
- ``noted`` — accepted; a note names the key;
- ``!! words`` — rejected; the ConfigError names the key and contains ``words``.

Written from verl's ``fsdp_sft_trainer.py`` / ``sft_trainer.py`` and their datasets, and
ROLL's ``sft_pipeline.py`` / ``sft_config.py``, independently of the dialect tables.
"""

from __future__ import annotations

#: verl's fsdp_sft_trainer config (2026-01 ``sft_trainer.yaml``, 8 GPUs per node).
VERL_LEGACY = """
data.train_batch_size 64 -> data.train_batch_size
data.micro_batch_size 16 noted
data.micro_batch_size_per_gpu 2 -> actor.micro_batch_size_per_device
data.train_files /d/t.parquet -> data.train_files = [/d/t.parquet]
data.val_files [/d/v.parquet] -> data.val_files
data.train_max_samples 100 -> data.train_max_samples
data.val_max_samples 10 -> data.val_max_samples
data.prompt_key q -> data.prompt_key
data.response_key a -> sft.response_key
data.prompt_dict_keys [question] +data.prompt_key=extra_info -> data.prompt_key = extra_info.question
data.response_dict_keys [answer] +data.response_key=extra_info -> sft.response_key = extra_info.answer
data.prompt_key [q,r] !! one column
data.multiturn.enable true -> data.messages_key = messages
data.multiturn.messages_key conv +data.multiturn.enable=true -> data.messages_key = conv
data.multiturn.tools_key fns +data.multiturn.enable=true -> sft.tools_key = fns
data.multiturn.enable_thinking_key think +data.multiturn.enable=true -> sft.enable_thinking_key = think
data.multiturn.tools_key fns noted
data.max_length 2048 -> sft.max_length
data.truncation left -> data.truncation
data.truncation middle !! not supported
data.balance_dp_token true noted
data.chat_template "{{x}}" -> data.chat_template
data.custom_cls.path my.py !! custom dataset
data.use_shm true noted
data.apply_chat_template_kwargs {enable_thinking:false} -> data.apply_chat_template_kwargs
model.partial_pretrain /m/base -> model.path
model.use_shm true noted
model.fsdp_config.model_dtype bf16 -> actor.master_dtype = bf16
model.fsdp_config.wrap_policy.min_num_params 1000 -> actor.fsdp.wrap_min_num_params
model.fsdp_config.cpu_offload true -> actor.fsdp.offload_policy
model.fsdp_config.offload_params true noted
model.external_lib my_lib -> model.external_lib
model.enable_gradient_checkpointing false -> model.enable_gradient_checkpointing
model.trust_remote_code true -> model.trust_remote_code
model.lora_rank 32 -> model.lora.rank
model.lora_alpha 32 -> model.lora.alpha
model.target_modules [q_proj,v_proj] -> model.lora.target_modules
model.use_liger true -> model.use_liger
model.strategy fsdp -> actor.strategy = fsdp2
model.strategy ddp !! strategy
optim.lr 2.0e-5 -> actor.optim.lr
optim.betas [0.9,0.98] -> actor.optim.betas
optim.weight_decay 0.0 -> actor.optim.weight_decay
optim.lr_warmup_steps_ratio 0.05 -> actor.optim.warmup_ratio
optim.warmup_steps_ratio 0.05 -optim.lr_warmup_steps_ratio -> actor.optim.warmup_ratio
optim.clip_grad 0.5 -> actor.grad_clip
optim.lr_scheduler linear -> actor.optim.lr_scheduler
optim.lr_scheduler wsd !! warmup-stable-decay
ulysses_sequence_parallel_size 2 -> actor.ulysses_sequence_parallel_size
use_remove_padding true -> model.use_remove_padding
trainer.default_local_dir /ckpt -> experiment.output_dir
trainer.default_hdfs_dir hdfs://x !! hdfs
trainer.project_name p -> experiment.project_name
trainer.experiment_name e -> experiment.experiment_name
trainer.total_epochs 2 -> experiment.total_epochs
trainer.total_training_steps 50 -> experiment.max_steps
trainer.logger [console] -> experiment.trackers = [console,jsonl]
trainer.seed 7 -> experiment.seed
trainer.save_freq 10 -> experiment.save_freq
trainer.save_freq after_each_epoch !! after_each_epoch
trainer.test_freq 5 -> experiment.test_freq
trainer.nnodes 2 -> resources.nnodes
trainer.n_gpus_per_node 4 -> resources.devices_per_node
trainer.max_ckpt_to_keep 3 -> experiment.max_actor_ckpt_to_keep
trainer.resume_mode disable -> experiment.resume_mode
trainer.resume_from_path /c/global_step_5 +trainer.resume_mode=resume_path -> experiment.resume_from_path
trainer.checkpoint.save_contents [model,optimizer,extra,hf_model] -trainer.checkpoint.load_contents -> actor.checkpoint_contents
trainer.checkpoint.load_contents [model] !! load_contents
trainer.device cpu -> experiment.device
"""

#: verl 0.9's engine-based sft_trainer (2026-08 ``sft_trainer_engine.yaml``).
VERL_ENGINE = """
data.messages_key conv -> data.messages_key
data.tools_key fns -> sft.tools_key
data.enable_thinking_key think -> sft.enable_thinking_key
data.enable_thinking_default false -> data.apply_chat_template_kwargs = {enable_thinking: false}
data.use_dynamic_bsz false -> actor.use_dynamic_bsz
data.max_token_len_per_gpu 4096 -> actor.max_token_len_per_device
data.pad_mode right noted
data.num_workers 2 noted
data.ignore_input_ids_mismatch true noted
model.path /m/base -> model.path
model.tokenizer_path /m/tok -> model.tokenizer_path
model.use_remove_padding false -> model.use_remove_padding
model.mtp.enable true !! multi-token prediction
model.lora.rank 8 !! Megatron-Bridge
engine.strategy fsdp2 -> actor.strategy
engine.param_offload true -> actor.fsdp.param_offload
engine.ulysses_sequence_parallel_size 1 -> actor.ulysses_sequence_parallel_size
engine.dtype float32 -> model.dtype = fp32
engine.model_dtype bfloat16 -> actor.master_dtype = bf16
engine.full_determinism true -> experiment.deterministic = True
engine.qat.enable true !! quantization-aware
engine.pad_to_length true noted
optim.lr 1.0e-5 -> actor.optim.lr
optim.lr_scheduler_type cosine -> actor.optim.lr_scheduler
optim.min_lr_ratio 0.1 -> actor.optim.min_lr_ratio
optim.zero_indexed_step false +optim.lr_scheduler_type=cosine -> actor.optim.zero_indexed_step = False
optim.zero_indexed_step false +optim.lr_scheduler_type=constant noted
checkpoint.save_contents [model,optimizer,extra] -> actor.checkpoint_contents
profiler.enable true !! profilers
trainer.balance_batch false -> experiment.balance_batch
trainer.profile_interval [1,2] !! profiler
"""

#: ROLL's SFT pipeline (2026-08 ``qwen3-30BA3B-sft_fsdp2/sft_config.yaml``, 8 devices).
ROLL = """
exp_name e -> experiment.experiment_name
seed 3 -> experiment.seed
output_dir /out -> experiment.output_dir
save_steps 20 -> experiment.save_freq
logging_steps 2 -> experiment.logging_steps
eval_steps 5 -> experiment.test_freq
max_steps 40 -> experiment.max_steps
max_steps -1 -> experiment.max_steps = null
max_ckpt_to_keep 2 -> experiment.max_actor_ckpt_to_keep
max_grad_norm 0.5 -> actor.grad_clip
sequence_length 1024 -> sft.max_length
pretrain /m/base -> model.path
prompt_key q -> data.prompt_key
query_key extra -> sft.query_key
response_key a -> sft.response_key
system_key sys -> sft.system_key
rollout_batch_size 64 noted
track_with wandb -> experiment.trackers = [wandb,jsonl]
track_with trackio -> experiment.trackers = [trackio,jsonl]
track_with ml_tracker !! ml_tracker
sft_train.model_args.dtype fp16 -sft_train.strategy_args.strategy_config.param_dtype -> model.dtype
sft_train.model_args.ulysses_size 1 -> actor.ulysses_sequence_parallel_size
sft_train.training_args.num_train_epochs 2 -> experiment.total_epochs
sft_train.training_args.learning_rate 1.0e-5 -> actor.optim.lr
sft_train.training_args.per_device_train_batch_size 2 -> actor.micro_batch_size_per_device
sft_train.training_args.per_device_train_batch_size 2 -> data.train_batch_size = 8
sft_train.training_args.gradient_accumulation_steps 4 -> data.train_batch_size = 16
sft_train.data_args.file_name [a.json,b.json] -> data.train_files
sft_train.data_args.eval_file_name [e.json] noted
sft_train.data_args.eval_file_name [e.json] -> data.val_files = [./data/code_alpaca_500.json]
sft_train.data_args.template qwen2_5 -> data.chat_template = native
sft_train.data_args.preprocessing_num_workers 2 noted
sft_train.data_args.prompt instruction noted
sft_train.strategy_args.strategy_name deepspeed_train -sft_train.strategy_args.strategy_config -> actor.strategy = deepspeed
sft_train.use_sequence_packing false -> model.use_remove_padding
sft_train.device_mapping list(range(0,4)) -> resources.actor_train = [0,1,2,3]
sft_train.infer_batch_size 4 -> actor.log_prob_micro_batch_size_per_device
sft_train.worker_cls my.Worker !! custom ROLL worker class
sft_train.generating_args.temperature 0.5 noted
validation.data_args.file_name v.json -> data.val_files = [v.json]
validation.infer_batch_size 8 noted
"""
