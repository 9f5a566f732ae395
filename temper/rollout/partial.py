"""Partial rollout: a generation continued across weight updates, each token recording the
policy version that sampled it.

:func:`generate_in_segments` generates ``params.max_new_tokens`` through any engine's
``generate`` (:class:`~temper.rollout.base.RolloutEngine`) ``segment`` tokens at a time.
Between segments it calls ``boundary()``, which pushes the trainer's newest weights when
there are any (the streaming rollout's hook) and returns the version the engine holds;
every response still running then continues from its prompt and the tokens it has so far,
under those weights — what verl's and ROLL's partial rollout do when they abort requests
for a weight update and resume them (the prefix is prefilled again). A response that
ended (EOS or a stop token), or reached its own ``limits`` entry, is not continued.

Multi-turn episodes (tool calls, environment turns: :mod:`temper.rollout.multiturn`)
generate each model turn through this same loop, and a turn boundary is a segment
boundary too: :meth:`Segments.next_turn` pushes the newest weights before the next turn
and starts it with the version the engine then holds, so a turn that spans a push
continues under the new weights and the tokens of every turn carry their own versions
(tool and environment tokens are not sampled: version 0, masked).

The result keeps the engine contract (rows grouped per prompt, ``response_ids`` /
``response_mask`` / ``rollout_log_probs`` / ``truncated``) and adds ``response_versions``
(B·n, R): the version of each response token's weights (0 where masked). The sampled
tokens' log-probs are those of the weights that sampled them, so an importance-sampling
correction against ``rollout_log_probs`` stays exact token by token.

Stop *strings* are not supported: the engine matches them within one call's text, and one
could straddle a segment boundary (``temper check`` refuses them together).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

from temper.config.errors import ConfigError
from temper.data.batch import Batch
from temper.data.vision import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS
from temper.rollout.base import RolloutEngine, SamplingParams

#: (B·n, R) long: the policy version that sampled each response token
RESPONSE_VERSIONS = "response_versions"


def _left_pad(rows: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` (1-D) left-padded to one width: ids and their 0/1 mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=rows[0].dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            ids[i, width - len(r) :] = r
            mask[i, width - len(r) :] = 1
    return ids, mask


def _right_pad(rows: list[torch.Tensor], width: int, value: float) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=rows[0].dtype)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


@dataclasses.dataclass(frozen=True)
class Segments:
    """How a partial rollout runs: ``tokens`` per segment; ``boundary()`` pushes newer
    weights if there are any and returns the engine's version; ``version``: the weights
    of the first segment."""

    tokens: int
    boundary: Callable[[], int]
    version: int

    def next_turn(self) -> Segments:
        """The segments of an episode's next model turn: the turn boundary (a tool result
        or an environment observation) pushes newer weights as a segment boundary does,
        and the turn starts with the version the engine then holds."""
        return dataclasses.replace(self, version=self.boundary())


#: A partial rollout's generation of whole responses: ``(prompts, params, segments,
#: pad_token_id) -> batch`` with ``response_versions`` — this module's loop over a token
#: engine, or a tool-calling engine's (each of its model turns through the loop)
PartialGeneration = Callable[[Batch, SamplingParams, Segments, int], Batch]


def generate_in_segments(
    engine: RolloutEngine,
    prompts: Batch,
    params: SamplingParams,
    segments: Segments,
    pad_token_id: int,
    limits: Sequence[int] | None = None,
) -> Batch:
    """``params.n`` responses per prompt, generated ``segments.tokens`` at a time with the
    weights ``segments.boundary()`` leaves in the engine before each continuation; see
    the module docstring. ``limits`` (one per response row, each at most
    ``params.max_new_tokens``): a row is not continued past its own limit (a multi-turn
    episode's turn budget); a row that reached it with no EOS stays ``truncated``."""
    segment, boundary, version = segments.tokens, segments.boundary, segments.version
    if MULTI_MODAL_DATA in prompts.objects or MULTI_MODAL_INPUTS in prompts.objects:
        raise ConfigError(
            "async_training.partial_rollout_segment",
            "a partial rollout continues text-only prompts; these prompts carry images or "
            "video, which the continuation would drop",
            "set it to 0 for vision-language data",
        )
    if segment < 1:
        raise ValueError(f"segment must be >= 1 (got {segment})")
    total = params.max_new_tokens
    rows = len(prompts) * params.n
    limit = [min(int(x), total) for x in limits] if limits is not None else [total] * rows
    if len(limit) != rows:
        raise ValueError(f"{len(limit)} limits for {rows} response rows")
    first = engine.generate(
        prompts, dataclasses.replace(params, max_new_tokens=min(segment, total))
    )
    ids = [first["response_ids"].new_zeros(0)] * rows
    has_logps = "rollout_log_probs" in first
    logps = [first["rollout_log_probs"].new_zeros(0) if has_logps else torch.zeros(0)] * rows
    versions = [torch.zeros(0, dtype=torch.long)] * rows
    truncated = [False] * rows

    def take(i: int, out: Batch, j: int, version: int) -> bool:
        """Append row ``j`` of the call ``out`` to response ``i`` (at most up to its
        limit); True while it runs on: cut by the call, below its limit."""
        room = limit[i] - len(ids[i])
        m = out["response_mask"][j].bool()
        new = out["response_ids"][j][m][:room]
        ids[i] = torch.cat([ids[i], new])
        if has_logps:
            logps[i] = torch.cat([logps[i], out["rollout_log_probs"][j][m][:room]])
        versions[i] = torch.cat([versions[i], torch.full((len(new),), version)])
        truncated[i] = bool(out["truncated"][j]) or int(m.sum()) > room  # no EOS yet
        return truncated[i] and len(ids[i]) < limit[i]

    running = [i for i in range(rows) if take(i, first, i, version)]
    prompt_rows = [row[m.bool()] for row, m in zip(first["prompt_ids"], first["prompt_mask"])]
    more = dataclasses.replace(params, n=1)
    while running:
        version = boundary()
        left = max(limit[i] - len(ids[i]) for i in running)  # rows past theirs are cut
        cont_ids, cont_mask = _left_pad(
            [torch.cat([prompt_rows[i], ids[i]]) for i in running], pad_token_id
        )
        cont = engine.generate(
            Batch.from_dict({"prompt_ids": cont_ids, "prompt_mask": cont_mask}),
            dataclasses.replace(more, max_new_tokens=min(segment, left)),
        )
        running = [i for j, i in enumerate(running) if take(i, cont, j, version)]
    width = max(1, max(len(r) for r in ids))
    out = Batch(first.tensors.clone(recurse=False), dict(first.objects), dict(first.meta))
    out["response_ids"] = _right_pad(ids, width, pad_token_id)
    dtype = first["response_mask"].dtype
    out["response_mask"] = _right_pad([torch.ones(len(r), dtype=dtype) for r in ids], width, 0)
    if has_logps:
        out["rollout_log_probs"] = _right_pad(logps, width, 0.0)
    out[RESPONSE_VERSIONS] = _right_pad(versions, width, 0)
    out["truncated"] = truncated
    return out
