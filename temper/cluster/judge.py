"""Where the LLM judge runs: a rollout engine in this process, or its own Ray role.

``reward.judge`` names a model and an engine (``hf`` or ``vllm``, temper's rollout
engines). :func:`build_judge` returns the :class:`~temper.rewards.judge.JudgeEngine`
the reward scorer talks to:

- ``resources.backend: local`` — :class:`EngineJudge`, an engine with its own copy of
  the judge model, on the actor's device;
- ``resources.backend: ray`` — :class:`RemoteJudge`, the ``judge`` worker group (one
  engine per rank, placed on ``resources.reward``, ROLL's ``llm_judge.device_mapping``;
  the actor's devices when unset) built with the other roles by ``build_ray_roles``;
  each call splits the conversations into one contiguous slice per rank.

The judge's weights never change (no weight sync). Each conversation is rendered with
the judge tokenizer's chat template (a bare user message when it has none) and cut to
``max_prompt_length`` tokens by dropping its middle (the question and the final
instruction survive); greedy unless ``reward.judge.temperature`` > 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from temper.cluster.base import WorkerGroup
from temper.cluster.rollout import prompt_slices
from temper.config.schema import JudgeConfig, TemperConfig
from temper.data.batch import Batch
from temper.data.collate import left_pad
from temper.rewards.judge import JudgeEngine
from temper.rewards.registry import JUDGE
from temper.rollout.base import RolloutEngine, SamplingParams


def judge_used(cfg: TemperConfig) -> bool:
    """Whether any sample can be routed to ``llm_judge``, or an agentic run plays an env
    that grades with the judge (``TextEnv.uses_judge``: DeepEyes)."""
    functions = [cfg.reward.function, *(r.function for r in cfg.reward.routes.values())]
    return JUDGE in functions or bool(judge_env_tags(cfg))


def judge_env_tags(cfg: TemperConfig) -> list[str]:
    """The played env tags of an agentic run whose env type grades with the judge."""
    if not cfg.pipeline.startswith("agentic"):
        return []
    from temper.envs.registry import ENV_TYPES

    agentic = cfg.agentic
    played = {t for m in (agentic.train_env_manager, agentic.val_env_manager) for t in m.tags}
    tags = []
    for tag in sorted(played):
        spec = agentic.custom_envs.get(tag)
        env_type = spec.env_type if spec is not None else ""
        if env_type in ENV_TYPES and ENV_TYPES.get(env_type).uses_judge:
            tags.append(tag)
    return tags


def judge_engine_configs(cfg: TemperConfig) -> tuple[Any, Any]:
    """(rollout config, model config) of the judge's engine."""
    judge = cfg.reward.judge
    rollout = dataclasses.replace(
        cfg.rollout,
        engine=judge.engine,
        dtype=judge.dtype,
        infer_batch_size=judge.infer_batch_size,
        gpu_memory_utilization=judge.gpu_memory_utilization,
        load_format="auto",
        max_model_len=judge.max_prompt_length + judge.max_new_tokens,
        response_length=judge.max_new_tokens,
        tensor_parallel_size=1,
        engine_kwargs={},
    )
    model = dataclasses.replace(
        cfg.model,
        path=judge.model_path or "",
        tokenizer_path=None,
        trust_remote_code=judge.trust_remote_code,
        override_config={},
        external_lib=None,
        lora=dataclasses.replace(cfg.model.lora, rank=0),
    )
    return rollout, model


def _cut_middle(ids: list[int], limit: int) -> list[int]:
    if len(ids) <= limit:
        return ids
    head = limit // 2
    return ids[:head] + ids[len(ids) - (limit - head) :]


class EngineJudge:
    """A :class:`JudgeEngine` over one rollout engine (see the module doc)."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, config: JudgeConfig) -> None:
        self.engine, self.tokenizer, self.config = engine, tokenizer, config
        self.params = SamplingParams(
            n=1,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            do_sample=config.temperature > 0,
            logprobs=False,
        )

    @classmethod
    def from_config(cls, cfg: TemperConfig, device: str | torch.device | None) -> EngineJudge:
        from transformers import AutoTokenizer

        from temper.rollout.registry import build_rollout_engine
        from temper.utils.model_path import resolve_model_path

        rollout, model = judge_engine_configs(cfg)
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(model.path), trust_remote_code=model.trust_remote_code
        )
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        engine = build_rollout_engine(rollout, model, tokenizer=tokenizer, device=device)
        return cls(engine, tokenizer, cfg.reward.judge)

    def _ids(
        self, conversation: list[dict[str, str]], template_kwargs: Mapping[str, Any]
    ) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=True, **template_kwargs
            )
            ids = tok(text, add_special_tokens=False)["input_ids"]
        else:
            ids = tok(conversation[-1]["content"])["input_ids"]
        return _cut_middle(list(ids), self.config.max_prompt_length)

    def complete(
        self,
        conversations: Sequence[list[dict[str, str]]],
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[str]:
        out: list[str] = []
        size = max(1, self.config.infer_batch_size)
        kwargs = dict(template_kwargs or {})
        for start in range(0, len(conversations), size):
            chunk = [self._ids(c, kwargs) for c in conversations[start : start + size]]
            ids, mask = left_pad(chunk, self.tokenizer.pad_token_id)
            prompts = Batch.from_dict(
                {"prompt_ids": ids, "prompt_mask": mask},
                {"uid": [str(i) for i in range(len(chunk))]},
            )
            gen = self.engine.generate(prompts, self.params)
            rows = [
                r[m.bool()].tolist()
                for r, m in zip(gen["response_ids"].cpu(), gen["response_mask"].cpu())
            ]
            out += self.tokenizer.batch_decode(rows, skip_special_tokens=True)
        return out

    def close(self) -> None:
        self.engine.close()


class JudgeRank:
    """What one rank of the Ray ``judge`` role runs: an :class:`EngineJudge`."""

    def __init__(self, cfg: TemperConfig, device: torch.device, rank: int) -> None:
        torch.manual_seed(cfg.experiment.seed + rank)
        self.judge = EngineJudge.from_config(cfg, device)

    def complete(
        self,
        conversations: Sequence[list[dict[str, str]]],
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[str]:
        return self.judge.complete(conversations, template_kwargs)

    def close(self) -> None:
        self.judge.close()


class RemoteJudge:
    """The driver's :class:`JudgeEngine` over the ``judge`` worker group."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def complete(
        self,
        conversations: Sequence[list[dict[str, str]]],
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[str]:
        if not conversations:
            return []
        slices = prompt_slices(len(conversations), self.group.world_size)
        kwargs = dict(template_kwargs or {})
        parts = self.group.call_first(
            "complete", [(list(conversations[a:b]), kwargs) for a, b in slices]
        )
        return [text for part in parts for text in part]

    def close(self) -> None:
        """Nothing: the group is shut down with the other Ray roles."""


def build_judge(
    cfg: TemperConfig, device: str | torch.device | None, remote: JudgeEngine | None
) -> JudgeEngine | None:
    """The run's judge (None when no sample goes to ``llm_judge``); ``remote``: the Ray
    ``judge`` group's handle, when ``build_ray_roles`` made one."""
    if not judge_used(cfg):
        return None
    if remote is not None:
        return remote
    return EngineJudge.from_config(cfg, device)
