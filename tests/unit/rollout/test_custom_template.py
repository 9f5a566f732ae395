"""A Jinja ``data.chat_template`` (verl's ``model.custom_chat_template``) is the run
tokenizer's template: dataset prompts and multi-turn continuations both render with it,
and the incremental multi-turn token sequence is still the template's rendering."""

from __future__ import annotations

import torch
from doubles import ScriptedEngine, turn_index

from temper.config.schema import TemperConfig
from temper.data import build_dataset, write_rows
from temper.data.batch import Batch
from temper.envs import tools as registry
from temper.pipelines.run import load_tokenizer
from temper.rollout.base import SamplingParams
from temper.rollout.multiturn import MultiTurnSettings
from temper.rollout.tool_engine import ToolCallingEngine
from temper.rollout.tools import ToolSettings, registry_executor

# ChatML with a visible marker opening every message the model did not write
MARKED = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] != 'assistant' %}[[MARK]] {% endif %}{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _cfg(tiny_dir: object, template: str) -> TemperConfig:
    cfg = TemperConfig()
    cfg.model.path = str(tiny_dir)
    cfg.data.chat_template = template
    cfg.data.max_prompt_length = 128
    return cfg


def test_template_changes_the_dataset_prompt_tokens(tiny_dir, tmp_path):
    rows = write_rows([{"prompt": [{"role": "user", "content": "hi"}]}], tmp_path / "d.jsonl")
    native_cfg, marked_cfg = _cfg(tiny_dir, "native"), _cfg(tiny_dir, MARKED)
    native = build_dataset(rows, native_cfg.data, load_tokenizer(native_cfg))[0]
    tok = load_tokenizer(marked_cfg)
    assert tok.chat_template == MARKED
    marked = build_dataset(rows, marked_cfg.data, tok)[0]
    assert marked.prompt_text == "<|im_start|>user\n[[MARK]] hi<|im_end|>\n<|im_start|>assistant\n"
    assert list(marked.prompt_ids) == tok(marked.prompt_text, add_special_tokens=False)["input_ids"]
    assert list(native.prompt_ids) != list(marked.prompt_ids)


def test_multi_turn_renders_with_the_template_and_stays_continuous(tiny_dir):
    tok = load_tokenizer(_cfg(tiny_dir, MARKED))
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    script = [call, "It is 42"]
    base = ScriptedEngine(tok, lambda text: script[min(turn_index(text), 1)])
    engine = ToolCallingEngine(
        base,
        tok,
        execute=registry_executor(registry.execute_tool),
        schemas=[registry.CALCULATOR_SCHEMA],
        settings=MultiTurnSettings(max_tokens_per_turn=400, max_assistant_turns=3),
        tools=ToolSettings(),
    )
    prompts = Batch.from_dict(
        {"prompt_ids": torch.zeros(1, 2, dtype=torch.long), "prompt_mask": torch.ones(1, 2)},
        {"raw_prompt": [[{"role": "user", "content": "6*7?"}]]},
    )
    out = engine.generate(prompts, SamplingParams(max_new_tokens=400))
    prompt = tok.decode(out["prompt_ids"][0][out["prompt_mask"][0].bool()])
    ids = out["response_ids"][0]
    response = tok.decode(ids[out["attention_mask"][0, -ids.shape[0] :].bool()])
    assert prompt.startswith("<|im_start|>user\n[[MARK]] ")
    # the tool turn is the template's rendering (its marker), and the model's turns are
    # the only trained tokens
    assert "<|im_start|>tool\n[[MARK]] 42<|im_end|>" in response
    assert tok.decode(ids[out["response_mask"][0].bool()]).count("[[MARK]]") == 0
    # token continuity: prompt + response re-tokenised from the messages is what was built
    assert engine.metrics["rollout/tokenization_mismatch_frac"] == 0.0
    assert engine.metrics["rollout/tokenization_drift_frac"] == 0.0
    messages = [
        {
            "role": "user",
            "content": engine.start_messages([{"role": "user", "content": "6*7?"}])[0]["content"],
        },
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "42", "name": "calculator"},
        {"role": "assistant", "content": "It is 42"},
    ]
    full = tok.apply_chat_template(messages, tokenize=False)
    assert prompt + response == full.rstrip("\n")
