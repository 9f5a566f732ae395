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


# -- multi-turn episodes: every model turn in segments, a turn boundary pushes too ------


class Pushes:
    """The streaming rollout's boundary, scripted: at the k-th call (1-based) the trainer
    has published version ``at[k]``, which is pushed; otherwise the engine keeps its
    version."""

    def __init__(self, at: dict[int, int], version: int = 0) -> None:
        self.at, self.version, self.calls = at, version, 0

    def __call__(self) -> int:
        self.calls += 1
        self.version = self.at.get(self.calls, self.version)
        return self.version


def _episode(tokenizer, segments, budgets=(64,)):
    """Episodes replying "abcd" (4 tokens + EOS) then, after an observation, "xy"
    (2 + EOS); the second answer ends them."""
    from doubles import ScriptedEngine, turn_index

    from temper.rollout.chat import ChatTokenizer
    from temper.rollout.multiturn import EpisodeSpec, Feedback, MultiTurnRunner, MultiTurnSettings

    engine = ScriptedEngine(tokenizer, lambda text: ["abcd", "xy"][turn_index(text)])
    runner = MultiTurnRunner(engine, ChatTokenizer(tokenizer), MultiTurnSettings())

    def respond(indices, texts):
        return [Feedback([{"role": "user", "content": "obs"}], done=t != "abcd") for t in texts]

    specs = [
        EpisodeSpec([{"role": "user", "content": "play"}], max_tokens_per_turn=b) for b in budgets
    ]
    return runner.run(specs, respond, SamplingParams(), segments), engine


@pytest.mark.parametrize(
    ("pushes", "turn1", "turn2"),
    [
        # pushes at the 2nd boundary (inside turn 1) and the 4th (inside turn 2)
        ({2: 1, 4: 2}, [0, 0, 0, 0, 1], [1, 1, 2]),
        # a push at the 3rd boundary: the turn boundary itself
        ({3: 1}, [0, 0, 0, 0, 0], [1, 1, 1]),
    ],
)
def test_a_turn_spanning_a_push_continues_under_the_new_weights(
    tiny_tokenizer, pushes, turn1, turn2
):
    """Segments of 2 tokens: turn 1 (a b | c d | EOS), the observation, then — after the
    turn boundary's push — turn 2 (x y | EOS); 4 boundaries, 3 in turns, 1 between."""
    from temper.rollout.multiturn import trajectory_tensors

    (plain,), _ = _episode(tiny_tokenizer, None)
    boundary = Pushes(pushes)
    (traj,), engine = _episode(tiny_tokenizer, Segments(2, boundary, 0))
    eos = tiny_tokenizer.eos_token_id
    a, b, c, d, x, y = (tiny_tokenizer.convert_tokens_to_ids(t) for t in "abcdxy")
    assert engine.generated == [[a, b], [c, d], [eos], [x, y], [eos]]
    assert boundary.calls == 4
    # the same episode as in one call per turn, each model token with its version
    assert traj.response_ids == plain.response_ids and traj.log_probs == plain.log_probs
    env = len(traj.response_ids) - 8  # the observation and the template around it
    assert traj.response_mask == [1] * 5 + [0] * env + [1] * 3
    assert traj.versions == turn1 + [0] * env + turn2
    rows = trajectory_tensors([traj], 0)
    assert rows[RESPONSE_VERSIONS][0].tolist() == turn1 + [0] * env + turn2
    assert RESPONSE_VERSIONS not in trajectory_tensors([plain], 0)


def test_each_episode_is_continued_up_to_its_own_turn_budget(tiny_tokenizer):
    """Episode 0 may write 3 tokens a turn, episode 1 64: the continuation after the
    push asks for 2 more, episode 0 keeps 1 (cut at its budget), episode 1 goes on."""
    (short, long_), engine = _episode(tiny_tokenizer, Segments(2, Pushes({1: 1}), 0), (3, 64))
    eos = tiny_tokenizer.eos_token_id
    a, b, c, d = (tiny_tokenizer.convert_tokens_to_ids(t) for t in "abcd")
    assert short.response_ids[:3] == [a, b, c] and short.cut_turns == 1
    assert short.versions[:3] == [0, 0, 1]
    assert long_.response_ids[:5] == [a, b, c, d, eos] and long_.cut_turns == 0
    assert long_.versions[:5] == [0, 0, 1, 1, 1]
    assert engine.batch_sizes[:3] == [2, 2, 1]  # the cut row is not continued


def test_tool_calls_in_a_partial_rollout_version_the_model_tokens_only(tiny_tokenizer):
    """verl's multi-turn rlvr as a partial rollout: the tool call turn at version 2, the
    tool result a boundary that pushes version 3, the answer at 3; the tool message and
    template tokens are masked with version 0; the exchange is the one call's."""
    from doubles import ScriptedEngine, turn_index

    from temper.envs import tools as registry
    from temper.rollout.multiturn import MultiTurnSettings
    from temper.rollout.tool_engine import ToolCallingEngine
    from temper.rollout.tools import ToolSettings, registry_executor

    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
    script = [call, "#### 42"]
    base = ScriptedEngine(tiny_tokenizer, lambda text: script[min(turn_index(text), 1)])
    engine = ToolCallingEngine(
        base,
        tiny_tokenizer,
        execute=registry_executor(registry.execute_tool),
        schemas=[registry.CALCULATOR_SCHEMA],
        settings=MultiTurnSettings(max_tokens_per_turn=300, max_assistant_turns=4),
        tools=ToolSettings(),
    )
    raw = [[{"role": "user", "content": "What is 6*7?"}]]
    prompts = Batch.from_dict(
        {"prompt_ids": torch.zeros(1, 2, dtype=torch.long), "prompt_mask": torch.ones(1, 2)},
        {"uid": ["a"], "raw_prompt": raw},
    )
    params = SamplingParams(max_new_tokens=300)
    whole = engine.generate(prompts, params)
    boundary = Pushes({1: 3})
    out = engine.generate_partial(prompts, params, Segments(1000, boundary, 2), 0)
    assert boundary.calls == 1  # one turn boundary, no turn longer than a segment
    assert torch.equal(out["response_ids"], whole["response_ids"])
    assert torch.equal(out["response_mask"], whole["response_mask"])
    assert out["num_turns"] == [2]
    mask = out["response_mask"][0].bool()
    versions = out[RESPONSE_VERSIONS][0]
    first = len(tiny_tokenizer(call, add_special_tokens=False)["input_ids"]) + 1  # + EOS
    second = len(tiny_tokenizer("#### 42", add_special_tokens=False)["input_ids"]) + 1
    assert versions[mask].tolist() == [2] * first + [3] * second
    assert not versions[~mask].any()
    text = tiny_tokenizer.decode(out["response_ids"][0][~mask])
    assert "<|im_start|>tool\n42<|im_end|>" in text  # the tool answered between the turns


def test_an_episode_with_no_room_for_a_turn_still_has_versions(tiny_tokenizer):
    """Groups of one stream are concatenated: an episode of a partial rollout that ends
    before its first turn (no room in its context) still has a ``response_versions`` row."""
    from doubles import ScriptedEngine

    from temper.rollout.chat import ChatTokenizer
    from temper.rollout.multiturn import (
        EpisodeSpec,
        MultiTurnRunner,
        MultiTurnSettings,
        trajectory_tensors,
    )

    engine = ScriptedEngine(tiny_tokenizer, lambda text: "abcd")
    runner = MultiTurnRunner(engine, ChatTokenizer(tiny_tokenizer), MultiTurnSettings())
    spec = EpisodeSpec([{"role": "user", "content": "play"}], max_len=1)
    (traj,) = runner.run([spec], lambda i, t: [], SamplingParams(), Segments(2, Pushes({}), 0))
    assert traj.stop_reason == "context" and traj.num_turns == 0 and engine.batch_sizes == []
    assert trajectory_tensors([traj], 0)[RESPONSE_VERSIONS].tolist() == [[0]]
