"""The tool-calling loop with a scripted policy: valid, malformed, unknown, slow tools."""

from __future__ import annotations

import time

import pytest
from doubles import ScriptedEngine, turn_index

from temper.envs import tools as registry
from temper.rollout.base import SamplingParams
from temper.rollout.chat import ChatTokenizer
from temper.rollout.multiturn import EpisodeSpec, Feedback, MultiTurnRunner, MultiTurnSettings
from temper.rollout.tools import (
    ToolLoop,
    ToolSettings,
    load_tool_schemas,
    parse_tool_calls,
    registry_executor,
    truncate_text,
)


def _sleepy(seconds: str = "5") -> str:
    time.sleep(float(seconds))
    return "woke up"


registry.register_tool(
    registry.ToolSpec(
        "test_sleep",
        _sleepy,
        {"type": "function", "function": {"name": "test_sleep", "parameters": {}}},
    )
)

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "(25 - 5) * 3"}}</tool_call>'
SCRIPT = [
    CALC,
    '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>',  # bad JSON
    '<tool_call>{"name": "web_search", "arguments": {"q": "x"}}</tool_call>',  # unknown
    '<tool_call>{"name": "test_sleep", "arguments": {"seconds": "3"}}</tool_call>',  # hangs
    "<answer>60</answer>",
]


def play(tokenizer, script, settings=None, allowed=("calculator", "test_sleep")):
    engine = ScriptedEngine(tokenizer, lambda text: script[turn_index(text)])
    loop = ToolLoop(registry_executor(registry.execute_tool), settings or ToolSettings())
    final = []

    def answer(indices, texts):
        final.extend(texts)
        return [Feedback([], reward=float("60" in t), done=True) for t in texts]

    runner = MultiTurnRunner(
        engine, ChatTokenizer(tokenizer), MultiTurnSettings(max_tokens_per_turn=128)
    )
    spec = EpisodeSpec([{"role": "user", "content": "What is (25-5)*3? Use the calculator."}])
    (traj,) = runner.run([spec], loop.responder(answer, lambda i: allowed), SamplingParams())
    return traj, loop, final


def tool_messages(traj):
    return [m["content"] for m in traj.messages if m["role"] == "tool"]


def test_tool_loop_answers_every_kind_of_call_and_never_crashes(tiny_tokenizer):
    settings = ToolSettings(tool_timeout_s=0.2)
    traj, loop, final = play(tiny_tokenizer, SCRIPT, settings)
    results = tool_messages(traj)
    assert results[0] == "60"
    assert results[1].startswith("error: tool call is not valid JSON")
    assert results[2].startswith("error: unknown tool 'web_search'")
    assert results[3].startswith("error: timed out after 0.2s")
    assert final == ["<answer>60</answer>"] and traj.episode_return == 1.0
    assert traj.num_turns == 5 and traj.user_turns == 4 and traj.stop_reason == "done"
    assert loop.calls == 4 and loop.errors == 3 and loop.timeouts == 1
    assert [i.get("tool_errors") for i in traj.infos[:4]] == [0, 1, 1, 1]
    # tool outputs are context, not trained: the masks hold only the 5 model turns
    runs = "".join(map(str, traj.response_mask)).split("0")
    assert len([r for r in runs if r]) == 5 and traj.sanity.ok


def test_tool_response_is_truncated(tiny_tokenizer):
    script = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "9**99"}}</tool_call>',
        "<answer>done</answer>",
    ]
    settings = ToolSettings(max_tool_response_length=10, tool_response_truncate_side="left")
    traj, _, _ = play(tiny_tokenizer, script, settings)
    assert tool_messages(traj)[0] == str(9**99)[:10] + "...(truncated)"


def test_parse_tool_calls_edge_cases():
    assert parse_tool_calls("no tools here") == []
    two = parse_tool_calls(CALC + " and " + CALC.replace("(25 - 5) * 3", "1+1"))
    assert [c.arguments["expression"] for c in two] == ["(25 - 5) * 3", "1+1"]
    stringified = parse_tool_calls(
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2\\"}"}</tool_call>'
    )
    assert stringified[0].arguments == {"expression": "2"} and stringified[0].error is None
    (unclosed,) = parse_tool_calls('<tool_call>{"name": "calculator"')
    assert "unclosed" in unclosed.error
    (nameless,) = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    assert nameless.error == "tool call has no 'name'"
    (listy,) = parse_tool_calls("<tool_call>[1, 2]</tool_call>")
    assert "JSON object" in listy.error


@pytest.mark.parametrize(
    ("side", "expected"),
    [
        ("left", "abcd...(truncated)"),
        ("right", "(truncated)...wxyz"),
        ("middle", "ab...(truncated)...yz"),
    ],
)
def test_truncate_sides(side, expected):
    assert truncate_text("abcdefghijklmnopqrstuvwxyz", 4, side) == expected
    assert truncate_text("abc", 4, side) == "abc"


def test_tool_config_yaml_in_verl_format(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n"
        "  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n"
        "    config: {type: native}\n"
        "    tool_schema:\n"
        "      type: function\n"
        "      function:\n"
        "        name: calculator\n"
        "        description: arithmetic\n"
        "        parameters: {type: object, properties: {expression: {type: string}}}\n"
    )
    (schema,) = load_tool_schemas(path)
    assert schema["function"]["name"] == "calculator"
    path.write_text("- name: calculator\n  parameters: {}\n")
    assert load_tool_schemas(path)[0]["type"] == "function"
    path.write_text("tools:\n  - config: {}\n")
    with pytest.raises(ValueError, match="no function name"):
        load_tool_schemas(path)


def test_tool_calling_engine_for_dataset_prompts(tiny_tokenizer):
    import torch

    from temper.data.batch import Batch
    from temper.rollout.tool_engine import ToolCallingEngine

    script = [CALC, "The answer is #### 60"]
    base = ScriptedEngine(tiny_tokenizer, lambda text: script[min(turn_index(text), 1)])
    engine = ToolCallingEngine(
        base,
        tiny_tokenizer,
        execute=registry_executor(registry.execute_tool),
        schemas=[registry.CALCULATOR_SCHEMA],
        settings=MultiTurnSettings(max_tokens_per_turn=200, max_assistant_turns=4),
        tools=ToolSettings(),
        system_prompt="Be brief.",
    )
    raw = [[{"role": "user", "content": "What is (25-5)*3?"}], [{"role": "user", "content": "Hi"}]]
    prompts = Batch.from_dict(
        {"prompt_ids": torch.zeros(2, 3, dtype=torch.long), "prompt_mask": torch.ones(2, 3)},
        {"uid": ["a", "b"], "raw_prompt": raw},
    )
    out = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=200))
    assert out["uid"] == ["a", "a", "b", "b"] and out["num_turns"] == [2, 2, 2, 2]
    text = tiny_tokenizer.decode(
        out["response_ids"][0][out["attention_mask"][0, -out["response_ids"].shape[1] :].bool()]
    )
    assert text.startswith(CALC) and "<|im_start|>tool\n60<|im_end|>" in text
    assert text.endswith("#### 60<|im_end|>")
    prompt = tiny_tokenizer.decode(out["prompt_ids"][0][out["prompt_mask"][0].bool()])
    assert prompt.startswith("<|im_start|>system\nBe brief.") and "<tools>" in prompt
    # only model tokens are trained on
    mask = out["response_mask"][0].bool()
    trained = tiny_tokenizer.decode(out["response_ids"][0][mask])
    assert trained == CALC + "<|im_end|>" + "The answer is #### 60<|im_end|>"
    # the response budget counts the whole exchange (verl's response_length)
    out = engine.generate(prompts.slice(0, 1), SamplingParams(max_new_tokens=100))
    assert out["truncated"] == [True] and out["response_ids"].shape[1] <= 100


def test_multi_turn_format_must_be_one_the_parser_reads():
    from temper.config.errors import ConfigError
    from temper.config.schema import MultiTurnConfig
    from temper.rollout.tools import check_multi_turn

    check_multi_turn(MultiTurnConfig(enable=True, format="hermes"))
    check_multi_turn(MultiTurnConfig(enable=True, format="qwen"))
    check_multi_turn(MultiTurnConfig(enable=False, format="gpt-oss"))  # no tools: unused
    with pytest.raises(ConfigError) as err:
        check_multi_turn(MultiTurnConfig(enable=True, format="gpt-oss"))
    assert err.value.key == "rollout.multi_turn.format"
    assert "'gpt-oss'" in err.value.reason and "hermes" in err.value.fix
    with pytest.raises(ConfigError, match="did you mean 'hermes'"):
        check_multi_turn(MultiTurnConfig(format="hermess"), tools=True)
    with pytest.raises(ConfigError, match="multi-turn rollout, which is off") as err:
        check_multi_turn(MultiTurnConfig(interaction_config_path="i.yaml"))
    assert err.value.key == "rollout.multi_turn.interaction_config_path"
