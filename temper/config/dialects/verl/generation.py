"""The verl key tables of ``main_generation`` (``generation.yaml``), verl 0.9's
``main_generation_server`` (``ppo_trainer.yaml``) and ``main_eval`` (``evaluation.yaml``,
recipe r1's too), translated into ``pipeline: generate`` and ``pipeline: eval``.

Told apart from a trainer's config by shape (:func:`is_generation`, :func:`is_evaluation`):
no ``actor_rollout_ref``, and a ``rollout`` section with ``data.output_path``, or a
``data.response_key`` (an SFT trainer's data has one too: :func:`verl_sft.is_sft` first).
Rows reuse the PPO table's where the keys mean the same under another prefix (the
``rollout`` section is the PPO table's ``actor_rollout_ref.rollout``).

``main_generation_server`` composes the PPO trainer's file, so its file has no shape of
its own: ``temper generate`` says it (``RawConfig.command``), ``temper train`` on the same
file trains. Its table (:data:`SERVER`) is the PPO table with every key noted as not read
except the ones the server reads: ``data.train_files`` / ``prompt_key`` / ``output_path``,
``actor_rollout_ref.model`` (what its engine loads) and ``.rollout`` (the engine and its
sampling), and ``trainer.nnodes`` / ``n_gpus_per_node``.

What differs from verl, stated where it applies:

- ``data.n_samples`` responses per prompt are one engine call with ``rollout.n`` (verl
  calls its engine ``n_samples`` times with ``rollout.n`` 1, and breaks with another n);
- the engines are verl's: one per ``rollout.tensor_model_parallel_size`` of the
  ``nnodes × n_gpus_per_node`` devices, on Ray when that is more than one device
  (:mod:`temper.cluster.generation`), each call's prompts split among them;
- prompts are templated and cut as temper's RL prompts (verl: ``apply_chat_template``
  with ``truncation=True``, the tokenizer's side, right by default): right here too;
- the scores of ``main_eval`` are temper's reward functions (a ``custom_reward_function``
  as in verl; without one, the built-in reward of each row's data source).
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Call, Map, Note, Rule
from temper.config.dialects.verl.sections import TABLE as RL_TABLE
from temper.config.dialects.verl.sft import is_sft
from temper.config.dialects.verl.table import PERF, RO
from temper.config.dialects.verl.table_rollout import finish_engine_kwargs

MOD = "actor_rollout_ref.model"

NO_TRAINING = "the actor section of verl's worker, which trains nothing here"


def is_generation(data: dict[str, Any]) -> bool:
    """A ``main_generation`` config: a top-level ``rollout`` section and ``data.output_path``."""
    section = data.get("data")
    return (
        "actor_rollout_ref" not in data
        and "rollout" in data
        and isinstance(section, dict)
        and "output_path" in section
    )


def is_evaluation(data: dict[str, Any]) -> bool:
    """A ``main_eval`` config: ``data.response_key`` outside an SFT trainer's config."""
    section = data.get("data")
    return (
        "actor_rollout_ref" not in data
        and isinstance(section, dict)
        and "response_key" in section
        and not is_sft(data)
    )


def _rl(prefix: str, keys: list[str], into: str) -> dict[str, Rule]:
    """The PPO table's rows of ``prefix.<key>`` as ``into.<key>``."""
    return {f"{into}.{k}": RL_TABLE[f"{prefix}.{k}"] for k in keys}


def _ray() -> dict[str, Rule]:
    """The PPO table's rows of Ray's sections: a generation over several devices starts
    Ray as a trainer does (``resources.ray.*``)."""
    return {k: rule for k, rule in RL_TABLE.items() if k.startswith(("ray_init", "ray_kwargs"))}


# ----------------------------------------------------------------- main_generation


def _n_samples(value: Any, ctx: Any) -> None:
    """``data.n_samples``: the responses per prompt (``rollout.n``; verl's own
    ``rollout.n`` must stay 1)."""
    ctx.write("rollout.n", value)


def _rollout_n(value: Any, ctx: Any) -> None:
    """verl's generation calls its engine ``data.n_samples`` times and reads one response
    per prompt each time: its ``rollout.n`` is 1."""
    if value not in (1, None):
        raise ctx.error(
            f"verl's main_generation reads one response per prompt per engine call (got "
            f"rollout.n={value!r})",
            "set rollout.n=1 and the responses per prompt with data.n_samples",
        )
    ctx.note("accepted at its inert value (responses per prompt: data.n_samples)")


def _load_format(value: Any, ctx: Any) -> None:
    """verl's generation worker loads the model and syncs it into the engine, whatever
    ``load_format`` says; temper's engine loads ``model.path`` itself."""
    ctx.note(
        "no effect here (verl's worker fills dummy engine weights from its FSDP model; "
        "temper's engine loads model.path)"
    )


ROLLOUT_KEYS = [
    "name",
    "mode",
    "temperature",
    "top_k",
    "top_p",
    "prompt_length",
    "response_length",
    "dtype",
    "gpu_memory_utilization",
    "ignore_eos",
    "enforce_eager",
    "free_cache_engine",
    "tensor_model_parallel_size",
    "data_parallel_size",
    "max_num_batched_tokens",
    "max_model_len",
    "max_num_seqs",
    "use_fire_sampling",
    "do_sample",
    "disable_log_stats",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "calculate_log_probs",
]


@derivation("trainer.nnodes", "trainer.n_gpus_per_node")
def finish_devices(ctx: Any) -> None:
    """``resources.backend``: Ray for more than one device (``nnodes × n_gpus_per_node``,
    one engine per tensor-parallel group of them), this process for one — as verl's
    trainers are translated."""
    devices = ctx.get("trainer.nnodes", 1) * ctx.get("trainer.n_gpus_per_node", 1)
    ctx.write("resources.backend", "ray" if devices > 1 else "local", key="trainer.n_gpus_per_node")


GENERATION: dict[str, Rule] = {
    "trainer.nnodes": Map("resources.nnodes"),
    "trainer.n_gpus_per_node": Map("resources.devices_per_node"),
    "trainer.device": RL_TABLE["trainer.device"],
    "data.path": Map("generate.files", lambda v, _c: [v] if isinstance(v, str) else v),
    "data.prompt_key": Map("data.prompt_key"),
    "data.n_samples": Call(_n_samples),
    "data.output_path": Map("generate.output_path"),
    "data.batch_size": Map("generate.batch_size"),
    "data.trust_remote_code": Map("model.trust_remote_code", weak=True),
    "data.apply_chat_template_kwargs": Map("data.apply_chat_template_kwargs"),
    "model.path": Map("model.path"),
    "model.external_lib": Map("model.external_lib"),
    "model.trust_remote_code": Map("model.trust_remote_code"),
    **_rl(RO, ROLLOUT_KEYS, "rollout"),
    "rollout.n": Call(_rollout_n),
    "rollout.load_format": Call(_load_format),
    "rollout.log_prob_micro_batch_size": Note(
        "the log-probs written are the sampling ones: nothing is recomputed"
    ),
    "rollout.log_prob_micro_batch_size_per_gpu": Note(
        "the log-probs written are the sampling ones: nothing is recomputed"
    ),
    "actor": Note(NO_TRAINING),
    **_ray(),
}


# ----------------------------------------------------------- main_generation_server

SERVER_NOT_READ = (
    "not read by verl's main_generation_server, which composes ppo_trainer.yaml and reads "
    "only the prompts, the model, the rollout engine and the node count of it"
)
#: ``actor_rollout_ref.rollout`` keys the server reads: its sampling (the requests send
#: temperature, top_p and response_length as max_tokens; the engine's generation-config
#: defaults hold top_k), the engine it starts (vLLM's arguments) and ``n`` (requests per
#: prompt). The rest (validation, multi-turn, log-prob recomputation, weight sync) is
#: the trainer's.
SERVER_ROLLOUT_KEYS = [
    "name",
    "temperature",
    "top_k",
    "top_p",
    "response_length",
    "n",
    "dtype",
    "gpu_memory_utilization",
    "enforce_eager",
    "tensor_model_parallel_size",
    "data_parallel_size",
    "expert_parallel_size",
    "pipeline_model_parallel_size",
    "max_num_batched_tokens",
    "max_model_len",
    "max_num_seqs",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "disable_log_stats",
    "logprobs_mode",
    "quantization",
    "quantization_config_file",
    "cudagraph_capture_sizes",
    "scheduling_policy",
    "seed",
    "full_determinism",
    "mtp",
    "enable_rollout_routing_replay",
    "engine_kwargs",
]
#: ``actor_rollout_ref.model`` keys the server's engine reads.
SERVER_MODEL_KEYS = ["path", "trust_remote_code", "external_lib", "custom_chat_template"]


def _server_load_format(value: Any, ctx: Any) -> None:
    """``rollout.load_format``: verl's server starts its engine with it, and its default
    ``dummy`` (random weights a trainer would overwrite) generates from random weights:
    refused; a real format loads ``model.path`` as temper's engine does."""
    if isinstance(value, str) and value.startswith("dummy"):
        raise ctx.error(
            f"verl's generation server would generate from random weights (load_format "
            f"{value!r}: no trainer syncs real ones in a generation-only run)",
            "set actor_rollout_ref.rollout.load_format=auto, as verl's generation example does",
        )
    ctx.note("accepted: temper's engine loads model.path (auto)")


def _server_prompt_length(value: Any, ctx: Any) -> None:
    """``rollout.prompt_length``: temper's prompt bound (``data.max_prompt_length``)."""
    ctx.write("data.max_prompt_length", value)
    ctx.note(
        "verl's server sends each prompt whole (a prompt past the engine's max_model_len "
        "fails its request); here it bounds the prompts, and a longer one stops the load "
        "naming its file and row (data.truncation=error)"
    )


SERVER_OUTPUT = (
    "verl's server writes the input rows and their 'responses' only (no log-probs), "
    "whatever it says; so does temper generate for it (rollout.calculate_log_probs=false)"
)


def _server_log_probs(value: Any, ctx: Any) -> None:
    """``rollout.calculate_log_probs``: not read for the output (:func:`finish_server`)."""
    ctx.note(SERVER_OUTPUT)


SERVER: dict[str, Rule] = {
    **{key: Note(SERVER_NOT_READ) for key in RL_TABLE},
    "trainer.nnodes": GENERATION["trainer.nnodes"],
    "trainer.n_gpus_per_node": GENERATION["trainer.n_gpus_per_node"],
    # the server's engines run on the accelerator Ray gives them; trainer.device is how a
    # verl file names it (verl's trainers read it), so it places temper's engine
    "trainer.device": RL_TABLE["trainer.device"],
    "data.train_files": Map("generate.files", lambda v, _c: [v] if isinstance(v, str) else v),
    "data.prompt_key": Map("data.prompt_key"),
    "data.output_path": Map("generate.output_path"),
    **{f"{MOD}.{k}": RL_TABLE[f"{MOD}.{k}"] for k in SERVER_MODEL_KEYS},
    **{f"{RO}.{k}": RL_TABLE[f"{RO}.{k}"] for k in SERVER_ROLLOUT_KEYS},
    f"{RO}.load_format": Call(_server_load_format),
    f"{RO}.prompt_length": Call(_server_prompt_length),
    f"{RO}.calculate_log_probs": Call(_server_log_probs),
}


@derivation()
def finish_server(ctx: Any) -> None:
    """``pipeline: generate``, the server's output (rows and responses, no log-probs:
    with any verl version's default of ``calculate_log_probs``), and the chosen engine's
    ``engine_kwargs`` as the PPO trainer's translation passes them."""
    ctx.write("pipeline", "generate", key="data.train_files")
    ctx.write("rollout.calculate_log_probs", False, key=f"{RO}.calculate_log_probs")
    finish_engine_kwargs(ctx)
    finish_devices(ctx)


@derivation()
def finish_generation(ctx: Any) -> None:
    """``pipeline: generate``; prompts are cut as verl's ``apply_chat_template(...,
    truncation=True)`` cuts them, keeping the start (the tokenizer's default side)."""
    ctx.write("pipeline", "generate", key="data.output_path")
    ctx.write("data.truncation", "right", key="rollout.prompt_length")
    finish_devices(ctx)
    ctx.note(
        "verl cuts longer prompts to it (apply_chat_template truncation=True, the "
        "tokenizer's side: right by default); data.truncation=right here",
        "rollout.prompt_length",
    )


# ----------------------------------------------------------------- main_eval


def _reward_model_key(value: Any, ctx: Any) -> None:
    """``data.reward_model_key``: the column whose ``ground_truth`` field verl passes to
    the reward function."""
    ctx.write("data.ground_truth_key", f"{value}.ground_truth")


EVALUATION: dict[str, Rule] = {
    "data.path": Map("evaluate.files", lambda v, _c: [v] if isinstance(v, str) else v),
    "data.prompt_key": Map("data.prompt_key"),
    "data.response_key": Map("evaluate.response_key"),
    "data.data_source_key": Map("data.data_source_key"),
    "data.reward_model_key": Call(_reward_model_key),
    "data.use_shm": Note(PERF),
    "custom_reward_function.path": RL_TABLE["custom_reward_function.path"],
    "custom_reward_function.name": RL_TABLE["custom_reward_function.name"],
    "custom_reward_function.reward_kwargs": RL_TABLE["custom_reward_function.reward_kwargs"],
    "ray_init": Note("temper scores the file in this process; verl starts Ray for its workers"),
    "ray_kwargs": Note("temper scores the file in this process; verl starts Ray for its workers"),
}


@derivation(fields=("reward.custom_function.path",))
def finish_evaluation(ctx: Any) -> None:
    """``pipeline: eval``; a custom function file scores every response (the PPO
    trainer's rule: its path selects ``reward.function: custom``)."""
    ctx.write("pipeline", "eval", key="data.response_key")
    path, key, _weak = ctx.out.written("reward.custom_function.path")
    if path:
        ctx.write("reward.function", "custom", key=key)
