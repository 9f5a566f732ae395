"""Partial rollout (rollout.partial): generations continued across weight pushes in
segments, every token recording the version that sampled it."""

from __future__ import annotations

import pytest
import torch

from temper.config.errors import ConfigError
from temper.data.batch import Batch
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine
from temper.rollout.partial import RESPONSE_VERSIONS, Segments, generate_in_segments


class Counter:
    """A boundary that 'pushes' a new version every time it is called."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        self.version += 1
        return self.version


def test_greedy_segments_equal_one_call_and_record_each_tokens_version(
    tiny_model, tiny_tokenizer, prompts
):
    """With weights that do not change, continuing from the prefix is the same generation:
    greedy tokens equal one call's, log-probs equal to fp32 noise."""
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    greedy = SamplingParams(n=2, max_new_tokens=10, do_sample=False, ignore_eos=True)
    whole = engine.generate(prompts, greedy)
    boundary = Counter()
    pad = tiny_tokenizer.pad_token_id
    parts = generate_in_segments(engine, prompts, greedy, Segments(3, boundary, 0), pad)
    assert torch.equal(parts["response_ids"], whole["response_ids"])
    assert torch.equal(parts["response_mask"], whole["response_mask"])
    torch.testing.assert_close(parts["rollout_log_probs"], whole["rollout_log_probs"])
    assert parts["truncated"] == whole["truncated"] == [True] * 4
    assert parts["uid"] == ["a", "a", "b", "b"]  # the engine contract: rows per prompt
    assert torch.equal(parts["prompt_ids"], whole["prompt_ids"])
    # 10 tokens in segments of 3: versions 0,0,0 | 1,1,1 | 2,2,2 | 3
    assert parts[RESPONSE_VERSIONS][0].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert boundary.calls == 3


class Scripted:
    """An engine whose responses are scripted per prompt (by the prompt's last token):
    ``ends[t]`` tokens then EOS-like stop; it records every call's prompts and limit."""

    pad_token_id = 0

    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends
        self.calls: list[tuple[list[list[int]], int, int]] = []

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        rows = prompts.repeat(params.n) if params.n > 1 else prompts
        seqs = [r[m.bool()].tolist() for r, m in zip(rows["prompt_ids"], rows["prompt_mask"])]
        self.calls.append((seqs, params.max_new_tokens, params.n))
        out_ids, masks, logps, truncated = [], [], [], []
        for seq in seqs:
            start = seq[0]  # the original prompt's first token names its script
            made = len(seq) - 1  # prompts here are one token long
            left = self.ends[start] - made
            k = min(params.max_new_tokens, left)
            ids = [100 + made + j for j in range(k)]
            out_ids.append(ids + [0] * (params.max_new_tokens - k))
            masks.append([1] * k + [0] * (params.max_new_tokens - k))
            logps.append([-0.5] * k + [0.0] * (params.max_new_tokens - k))
            truncated.append(k == params.max_new_tokens and left > k)
        out = Batch(rows.tensors.clone(recurse=False), dict(rows.objects), dict(rows.meta))
        out["response_ids"] = torch.tensor(out_ids)
        out["response_mask"] = torch.tensor(masks)
        out["rollout_log_probs"] = torch.tensor(logps)
        out["truncated"] = truncated
        return out


def _prompts(*firsts: int) -> Batch:
    ids = torch.tensor([[f] for f in firsts])
    return Batch.from_dict(
        {"prompt_ids": ids, "prompt_mask": torch.ones_like(ids)}, {"uid": list("ab")[: len(firsts)]}
    )


def test_ended_responses_stop_and_running_ones_continue_from_their_prefix():
    engine = Scripted({1: 2, 2: 7})  # prompt 1 ends after 2 tokens, prompt 2 after 7
    out = generate_in_segments(
        engine,  # type: ignore[arg-type]
        _prompts(1, 2),
        SamplingParams(max_new_tokens=8),
        Segments(3, Counter(5), 5),
        0,
    )
    assert out["response_mask"].sum(-1).tolist() == [2, 7]
    assert out["response_ids"][1, :7].tolist() == [100, 101, 102, 103, 104, 105, 106]
    assert out["truncated"] == [False, False]  # both ended before the limit
    assert out[RESPONSE_VERSIONS][1, :7].tolist() == [5, 5, 5, 6, 6, 6, 7]
    assert out[RESPONSE_VERSIONS][0].tolist()[:2] == [5, 5]
    # only the running row is continued, from its prompt and its tokens so far
    assert engine.calls[1] == ([[2, 100, 101, 102]], 3, 1)
    assert engine.calls[2] == ([[2, 100, 101, 102, 103, 104, 105]], 2, 1)  # 8 - 6 left


def test_a_response_at_the_limit_is_truncated_and_never_passes_it():
    engine = Scripted({1: 50})
    out = generate_in_segments(
        engine,  # type: ignore[arg-type]
        _prompts(1),
        SamplingParams(max_new_tokens=7),
        Segments(3, Counter(), 0),
        0,
    )
    assert out["response_mask"].sum().item() == 7 and out["truncated"] == [True]
    assert [c[1] for c in engine.calls] == [3, 3, 1]


def test_images_are_refused_in_one_line():
    batch = _prompts(1)
    batch.objects["multi_modal_data"] = [{}]
    with pytest.raises(ConfigError, match="partial_rollout_segment"):
        generate_in_segments(
            Scripted({1: 2}),  # type: ignore[arg-type]
            batch,
            SamplingParams(max_new_tokens=4),
            Segments(2, Counter(), 0),
            0,
        )
