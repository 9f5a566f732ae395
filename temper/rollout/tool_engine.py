"""verl ``rollout.multi_turn`` for dataset prompts: a rollout engine whose responses may
call tools.

``ToolCallingEngine`` wraps any engine. Each prompt's chat messages (``raw_prompt``,
with ``data.system_prompt`` first when set) start a conversation: the model may call
tools (in ``multi_turn.format``'s syntax, see :mod:`temper.rollout.tool_formats`) and see their results
until it answers without a call, or hits ``max_assistant_turns`` / ``max_user_turns`` /
the response budget (``rollout.response_length`` tokens after the prompt, verl's rule).
The response is the whole exchange after the prompt — model turns (mask 1) and tool
messages with their template scaffolding (mask 0) — so the reward function reads the
exchange and its final answer, and the loss trains only the model's tokens.

The prompt is re-rendered from ``raw_prompt`` with the chat template (the runner needs
the messages to render each turn's delta), so ``data.chat_template`` must be a template:
``native``, or a Jinja one, which the run's tokenizer carries.
With verl interactions (:mod:`temper.rollout.interaction_turns`), a final answer is
answered by the episode's simulated user instead of ending the episode.

Outputs follow :meth:`RolloutEngine.generate` (rows ``aabb`` by ``n``) plus
``attention_mask`` and the object column ``num_turns`` (with interactions also
``turn_scores``, copied into each row's ``extra_info``). As a partial rollout
(:meth:`ToolCallingEngine.generate_partial`, a
:data:`~temper.rollout.partial.PartialGeneration`) each model turn runs through the
segment loop and each tool result is a weight-push boundary
(:mod:`temper.rollout.multiturn`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from temper.data.batch import Batch
from temper.rollout.base import RolloutEngine, SamplingParams
from temper.rollout.interaction_turns import InteractionTurns, interaction_kwargs
from temper.rollout.multiturn import (
    EpisodeSpec,
    MultiTurnRunner,
    MultiTurnSettings,
    trajectory_tensors,
)
from temper.rollout.partial import Segments
from temper.rollout.tools import Executor, ToolLoop, ToolSettings, schema_names, tool_chat


class ToolCallingEngine(RolloutEngine):
    """Multi-turn tool calling over ``base`` (see the module docstring)."""

    def __init__(
        self,
        base: RolloutEngine,
        tokenizer: Any,
        *,
        execute: Executor,
        schemas: Sequence[dict[str, Any]],
        settings: MultiTurnSettings,
        tools: ToolSettings,
        system_prompt: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        interactions: InteractionTurns | None = None,
    ) -> None:
        """``settings.max_tokens_per_turn`` doubles as the response budget (verl's
        ``response_length`` counts the whole exchange); ``schemas`` are the offered tools;
        ``interactions`` (verl's ``interaction_config_path``) answer final answers."""
        self.base, self.system_prompt = base, system_prompt
        self.shared = base.shared  # weight sync follows the wrapped engine
        self.eos_token_ids, self.pad_token_id = base.eos_token_ids, base.pad_token_id
        self.names = schema_names(schemas)
        chat, self.tool_text = tool_chat(tokenizer, schemas, template_kwargs, tools.format)
        self.runner = MultiTurnRunner(base, chat, settings)
        self.loop = ToolLoop(execute, tools, schemas)
        self.interactions = interactions
        self.metrics: dict[str, float] = {}

    def start_messages(self, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation a prompt's exchange starts from: ``data.system_prompt`` first
        (unless the prompt has a system message), the tool instructions before the first
        user message when the template does not describe tools itself."""
        messages = [dict(m) for m in raw]
        if self.system_prompt and not (messages and messages[0]["role"] == "system"):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        if self.tool_text:
            first = next(m for m in messages if m["role"] == "user")
            first["content"] = f"{self.tool_text}\n\n{first['content']}"
        return messages

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        return self._play(prompts, params, None)

    def generate_partial(
        self, prompts: Batch, params: SamplingParams, segments: Segments, pad_token_id: int
    ) -> Batch:
        """The exchanges as a partial rollout: every model turn generated in segments
        through the base engine, the newest weights pushed between segments and before
        every turn after a tool result; ``response_versions`` holds the version of each
        model token (0 on tool messages and scaffolding)."""
        return self._play(prompts, params, segments)

    def _play(self, prompts: Batch, params: SamplingParams, segments: Segments | None) -> Batch:
        if "raw_prompt" not in prompts:
            raise ValueError("multi-turn tool calling needs the 'raw_prompt' chat messages")
        rows = prompts.repeat(params.n, interleave=True) if params.n > 1 else prompts
        budget = params.max_new_tokens
        specs = []
        for raw in rows["raw_prompt"]:
            messages = self.start_messages(raw)
            prompt_len = len(self.runner.chat.prompt(messages)[0])
            specs.append(EpisodeSpec(messages, max_len=prompt_len + budget))
        self.loop.reset_counters()  # metrics of this call only
        turns = self.interactions
        respond = self.loop.responder(turns.answer if turns else None, lambda i: self.names)
        if turns is not None:
            extra = rows["extra_info"] if "extra_info" in rows else [None] * len(specs)
            truth = rows["ground_truth"] if "ground_truth" in rows else [None] * len(specs)
            kwargs = [interaction_kwargs(e, g, turns.names) for e, g in zip(extra, truth)]
            turns.begin([spec.messages for spec in specs], kwargs)
            respond = turns.wrap(respond)
        trajs = self.runner.run(specs, respond, dataclasses.replace(params, n=1), segments)
        tensors = trajectory_tensors(trajs, self.runner.pad_token_id)
        if not params.logprobs:
            tensors.pop("rollout_log_probs", None)
        out = Batch.from_dict(tensors, dict(rows.objects), dict(rows.meta))
        out["truncated"] = [t.stop_reason == "context" for t in trajs]  # out of budget
        out["num_turns"] = [t.num_turns for t in trajs]
        self.metrics = {**self.runner.metrics, **self.loop.metrics()}
        if turns is not None:
            self.metrics.update(turns.end())
            # verl's turn_scores: the interaction's score of each of its turns, which
            # reward functions read in extra_info
            out["turn_scores"] = [list(s) for s in turns.scores]
            out["extra_info"] = [
                {**(e or {}), "turn_scores": list(s)} for e, s in zip(extra, turns.scores)
            ]
        return out

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.base.load_weights(named_tensors)

    def sleep(self) -> None:
        self.base.sleep()

    def wake_up(self) -> None:
        self.base.wake_up()

    def close(self) -> None:
        self.base.close()

    def state_dict(self) -> dict[str, Any]:
        return self.base.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.base.load_state_dict(state)
