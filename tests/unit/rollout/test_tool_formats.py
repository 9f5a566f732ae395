"""Tool-call formats: each parser on well-formed, malformed and several calls (hand-written
model turns), and how each feeds results back."""

from __future__ import annotations

import torch
from doubles import ScriptedEngine, turn_index

from temper.envs import tools as registry
from temper.rollout.base import SamplingParams
from temper.rollout.tool_formats import TOOL_CALL_FORMATS, ToolCall
from temper.rollout.tools import ToolSettings, parse_tool_calls, registry_executor, tool_prompt

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {"type": "array"},
                "topk": {"type": "integer"},
                "score": {"type": "number"},
                "exact": {"type": "boolean"},
                "note": {"type": "string"},
            },
        },
    },
}


def test_registry_is_the_list_of_formats():
    assert TOOL_CALL_FORMATS.primary_names() == ["hermes", "qwen", "qwen3_coder", "llama3_json"]


def test_hermes_and_qwen_parse_the_same_calls():
    two = (
        'Let me look. <tool_call>{"name": "search", "arguments": {"query_list": ["a"]}}'
        '</tool_call>\n<tool_call>{"name": "calc", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    expected = [ToolCall("search", {"query_list": ["a"]}), ToolCall("calc", {"x": 1})]
    assert parse_tool_calls(two, "hermes") == expected
    assert parse_tool_calls(two, "qwen") == expected
    assert parse_tool_calls("The answer is 4.", "qwen") == []
    (bad,) = parse_tool_calls("<tool_call>{name: search}</tool_call>", "qwen")
    assert bad.name is None and bad.error.startswith("tool call is not valid JSON")
    ok, cut = parse_tool_calls(
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"na', "hermes"
    )
    assert ok == ToolCall("a", {}) and cut.error.startswith("unclosed <tool_call>")


def test_qwen3_coder_xml_calls_are_typed_by_the_schema():
    text = (
        "I will search.\n<tool_call>\n<function=search>\n"
        '<parameter=query_list>\n["capital of France", "Paris"]\n</parameter>\n'
        "<parameter=topk>\n3\n</parameter>\n<parameter=score>\n2.0\n</parameter>\n"
        "<parameter=exact>\nTrue\n</parameter>\n<parameter=note>\n 42 \n</parameter>\n"
        "<parameter=extra>\nfree text\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=calc>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>"
    )
    first, second = parse_tool_calls(text, "qwen3_coder", [SEARCH])
    assert first == ToolCall(
        "search",
        {
            "query_list": ["capital of France", "Paris"],
            "topk": 3,
            "score": 2,  # an integral number is an int (as verl converts it)
            "exact": True,
            "note": " 42 ",  # a string keeps its text; only one newline each side is markup
            "extra": "free text",  # not in the schema: text
        },
    )
    assert second == ToolCall("calc", {"x": "1"})  # unknown tool: every value is text
    (bad_int,) = parse_tool_calls(
        "<tool_call><function=search><parameter=topk>many</parameter></function></tool_call>",
        "qwen3_coder",
        [SEARCH],
    )
    assert bad_int == ToolCall("search", {"topk": "many"})  # the tool sees what was written
    (nofn,) = parse_tool_calls("<tool_call>search(q)</tool_call>", "qwen3_coder")
    assert nofn.error == "tool call has no <function=NAME>…</function>"
    assert parse_tool_calls("no call <function=x></function>", "qwen3_coder") == []


def test_llama3_json_calls():
    one = '<|python_tag|>{"name": "search", "parameters": {"query_list": ["a"]}}'
    assert parse_tool_calls(one, "llama3_json") == [ToolCall("search", {"query_list": ["a"]})]
    two = '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {}}'
    assert parse_tool_calls(two, "llama3_json") == [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    assert parse_tool_calls('The JSON is {"name": "a"}', "llama3_json") == []  # prose: answer
    ok, bad = parse_tool_calls('{"name": "a", "parameters": {}}; {"name": "b", ', "llama3_json")
    assert ok == ToolCall("a", {}) and bad.error.startswith("tool call is not valid JSON")
    (nameless,) = parse_tool_calls('{"parameters": {}}', "llama3_json")
    assert nameless.error == "tool call has no 'name'"


def test_results_go_back_as_the_format_says():
    results = [("search", "Paris"), (None, "error: bad")]
    assert TOOL_CALL_FORMATS.get("hermes").results(results) == [
        {"role": "tool", "content": "Paris", "name": "search"},
        {"role": "tool", "content": "error: bad"},
    ]
    assert TOOL_CALL_FORMATS.get("qwen").results(results) == [
        {
            "role": "user",
            "content": "<tool_response>\nParis\n</tool_response>\n"
            "<tool_response>\nerror: bad\n</tool_response>",
        }
    ]
    assert "<function=<tool>>" in tool_prompt([SEARCH], "qwen3_coder")
    assert '"parameters"' in tool_prompt([SEARCH], "llama3_json")


def test_qwen_format_renders_verl_qwen_tokens_in_a_multi_turn_rollout(tiny_tokenizer):
    """Two calls in one turn: their results arrive as one user turn of
    <tool_response> blocks (verl's qwen format), masked out of the loss."""
    from temper.data.batch import Batch
    from temper.rollout.multiturn import MultiTurnSettings
    from temper.rollout.tool_engine import ToolCallingEngine

    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'
    script = [call % "2+3" + call % "4*5", "Done: 5 and 20"]
    base = ScriptedEngine(tiny_tokenizer, lambda text: script[min(turn_index(text), 1)])
    engine = ToolCallingEngine(
        base,
        tiny_tokenizer,
        execute=registry_executor(registry.execute_tool),
        schemas=[registry.CALCULATOR_SCHEMA],
        settings=MultiTurnSettings(max_tokens_per_turn=300, max_assistant_turns=3),
        tools=ToolSettings(format="qwen"),
    )
    prompts = Batch.from_dict(
        {"prompt_ids": torch.zeros(1, 2, dtype=torch.long), "prompt_mask": torch.ones(1, 2)},
        {"raw_prompt": [[{"role": "user", "content": "Compute."}]]},
    )
    out = engine.generate(prompts, SamplingParams(max_new_tokens=300))
    ids, mask = out["response_ids"][0], out["response_mask"][0].bool()
    text = tiny_tokenizer.decode(ids[out["attention_mask"][0, -ids.shape[0] :].bool()])
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
        "<tool_response>\n20\n</tool_response><|im_end|>" in text
    )
    assert tiny_tokenizer.decode(ids[mask]) == script[0] + "<|im_end|>" + script[1] + "<|im_end|>"
