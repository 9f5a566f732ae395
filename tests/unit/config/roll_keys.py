"""Expected translation of ROLL keys: the test table of ``test_roll_keys.py``.

Rows in the row language of ``key_rows.py`` (verl's table has the same), set on ROLL's
``qwen2.5-7B-rlvr_megatron/rlvr_config.yaml`` (its interpolations resolved, so a row that
changes one of two linked keys restates the other). Written from ROLL's config classes
(``roll/configs``: ``RLVRConfig``, ``PPOConfig``, ``WorkerConfig``, ``TrainingArguments``,
``GeneratingArguments``) and its example files, independently of the dialect's own table.
"""

from __future__ import annotations

AT, AI = "actor_train", "actor_infer"

ROWS = """
# ---------------------------------------------------------------- top level
seed 7 -> experiment.seed
exp_name my_run -> experiment.experiment_name
max_steps 20 -> experiment.max_steps
rollout_batch_size 16 -> data.train_batch_size
num_return_sequences_in_group 4 +actor_infer.generating_args.num_return_sequences=4 -> rollout.n
prompt_length 512 -> data.max_prompt_length
response_length 1024 +actor_infer.generating_args.max_new_tokens=1024 -> rollout.response_length
ppo_epochs 2 -> actor.ppo_epochs
adv_estimator grpo -> algorithm.reward_norm = group
adv_estimator gae -> algorithm.adv_estimator
whiten_advantages false -> algorithm.whiten_advantages
pretrain /m/policy -> model.path
track_with wandb -> experiment.trackers = [wandb, jsonl]
track_with no_such_tracker !! no_such_tracker
checkpoint_config.type remote !! file_system
num_gpus_per_node 8 -> resources.devices_per_node
# ---------------------------------------------------------------- actor_train
actor_train.training_args.learning_rate 3.0e-6 -> actor.optim.lr
actor_train.training_args.weight_decay 0.1 -> actor.optim.weight_decay
actor_train.training_args.warmup_steps 5 -> actor.optim.warmup_steps
actor_train.model_args.dtype fp16 +reference.model_args.dtype=fp16 -> model.dtype
actor_train.model_args.dtype int3 +reference.model_args.dtype=int3 !! int3
actor_train.model_args.disable_gradient_checkpointing true -> model.enable_gradient_checkpointing = false
actor_train.strategy_args.strategy_name fsdp2_train -actor_train.strategy_args.strategy_config -> actor.strategy = fsdp2
actor_train.strategy_args.strategy_name no_such_train !! no_such_train
actor_train.no_such_key 1 !! unknown ROLL key
# ---------------------------------------------------------------- actor_infer
actor_infer.generating_args.temperature 0.7 +validation.generating_args.temperature=0.7 -> rollout.temperature
actor_infer.generating_args.top_p 0.9 -> rollout.top_p
actor_infer.generating_args.top_k 20 -> rollout.top_k
actor_infer.strategy_args.strategy_name sglang -> rollout.engine
actor_infer.strategy_args.strategy_config.gpu_memory_utilization 0.5 -> rollout.gpu_memory_utilization
# ---------------------------------------------------------------- typos
no_such_top_key 1 !! unknown ROLL key
"""
