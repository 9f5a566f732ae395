"""verl interactions: the gsm8k user simulator, the interaction YAML, and the interaction
turns inside a multi-turn rollout (scripted model turns, the real chat template)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from doubles import ScriptedEngine, turn_index

from temper.data.batch import Batch
from temper.envs import tools as registry
from temper.rewards.interactions import Gsm8kInteraction, load_interactions
from temper.rollout.base import SamplingParams
from temper.rollout.interaction_turns import InteractionTurns, interaction_kwargs
from temper.rollout.multiturn import MultiTurnSettings
from temper.rollout.tool_engine import ToolCallingEngine
from temper.rollout.tools import ToolSettings, registry_executor

UPSTREAM = Path(__file__).resolve().parents[2] / "data" / "upstream"
VERL_YAML = (
    UPSTREAM / "verl-2026-01-b178a3c/examples/sglang_multiturn/config/interaction_config"
    "/gsm8k_interaction_config.yaml"
)


def test_gsm8k_interaction_follows_verl():
    it = Gsm8kInteraction({"name": "gsm8k"})
    it.start("a", ground_truth="72", query="…")
    wrong = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "So #### 70"}]
    assert it.respond("a", wrong) == (
        False,
        "Your response is incorrect! You need to reflect on your answer and try again.",
        0.0,
        {},
    )
    right = [
        *wrong,
        {"role": "user", "content": "retry"},
        {"role": "assistant", "content": "#### 72"},
    ]
    assert it.respond("a", right) == (True, "Your response is correct!", 1.0, {})
    # strict: the number must follow "#### "
    assert it.respond("a", [{"role": "assistant", "content": "It is 72"}])[2] == 0.0
    it.finalize("a")
    assert not it._episodes


def test_interaction_yaml(tmp_path):
    ((name, it),) = load_interactions(VERL_YAML).items()
    assert name == "gsm8k" and isinstance(it, Gsm8kInteraction)
    unnamed = tmp_path / "u.yaml"
    unnamed.write_text(
        "interaction:\n  - class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
    )
    assert list(load_interactions(unnamed)) == ["gsm8k"]  # verl's default name
    twice = tmp_path / "t.yaml"
    twice.write_text(
        "interaction:\n  - {name: a, class_name: gsm8k}\n  - {name: a, class_name: gsm8k}\n"
    )
    with pytest.raises(ValueError, match="'a' is used twice"):
        load_interactions(twice)
    mine = tmp_path / "m.yaml"
    mine.write_text("interaction:\n  - {class_name: my_pkg.MyInteraction}\n")
    with pytest.raises(ValueError, match="'my_pkg.MyInteraction' is not one temper runs"):
        load_interactions(mine)


def test_interaction_kwargs_of_a_row():
    kw = {"name": "gsm8k", "ground_truth": "3", "query": "1+2"}
    assert interaction_kwargs({"interaction_kwargs": kw}, "9", ["gsm8k"]) == kw
    assert interaction_kwargs({}, "9", ["gsm8k"]) == {"name": "gsm8k", "ground_truth": "9"}
    with pytest.raises(ValueError, match="say which one"):
        interaction_kwargs(None, "9", ["a", "b"])
    with pytest.raises(ValueError, match="must name one of the interactions"):
        interaction_kwargs({"interaction_kwargs": {"name": "x"}}, "9", ["gsm8k"])


def _engine(tok, script, **limits):
    settings = MultiTurnSettings(max_tokens_per_turn=400, **limits)
    base = ScriptedEngine(tok, lambda text: script[min(turn_index(text), len(script) - 1)])
    turns = InteractionTurns(load_interactions(VERL_YAML), settings)
    return ToolCallingEngine(
        base,
        tok,
        execute=registry_executor(registry.execute_tool),
        schemas=[registry.CALCULATOR_SCHEMA],
        settings=settings,
        tools=ToolSettings(),
        interactions=turns,
    )


def _prompts(gt="42"):
    kw = {"name": "gsm8k", "ground_truth": gt}
    return Batch.from_dict(
        {"prompt_ids": torch.zeros(1, 2, dtype=torch.long), "prompt_mask": torch.ones(1, 2)},
        {
            "raw_prompt": [[{"role": "user", "content": "6*7?"}]],
            "extra_info": [{"interaction_kwargs": kw, "index": 0}],
            "ground_truth": [gt],
        },
    )


def test_interaction_answers_final_answers_until_correct(tiny_tokenizer):
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    script = ["#### 40", call, "#### 42", "never reached"]
    engine = _engine(tiny_tokenizer, script, max_assistant_turns=6)
    out = engine.generate(_prompts(), SamplingParams(max_new_tokens=400))
    # wrong answer -> the user's retry turn; a tool call -> the tool; right answer -> done
    assert out["turn_scores"] == [[0.0, 1.0]] and out["num_turns"] == [3]
    assert out["extra_info"] == [
        {
            "interaction_kwargs": {"name": "gsm8k", "ground_truth": "42"},
            "index": 0,
            "turn_scores": [0.0, 1.0],
        }
    ]
    ids, mask = out["response_ids"][0], out["response_mask"][0].bool()
    text = tiny_tokenizer.decode(ids[out["attention_mask"][0, -ids.shape[0] :].bool()])
    retry = "<|im_start|>user\nYour response is incorrect! You need to reflect on your answer"
    assert retry in text and "<|im_start|>tool\n42<|im_end|>" in text
    assert text.endswith("#### 42<|im_end|>")  # the closing "correct!" turn is not kept
    # the interaction's (and the tool's) turns are context: only the model's are trained
    trained = tiny_tokenizer.decode(ids[mask])
    assert trained == "#### 40<|im_end|>" + call + "<|im_end|>" + "#### 42<|im_end|>"
    assert engine.metrics["interaction/turns_mean"] == 2.0
    assert engine.metrics["interaction/done_frac"] == 1.0
    assert engine.metrics["rollout/tokenization_mismatch_frac"] == 0.0
    assert not engine.interactions.interactions["gsm8k"]._episodes  # finalized


def test_no_interaction_turn_past_max_user_turns(tiny_tokenizer):
    """verl: at max_user_turns the episode ends on the model's answer, unjudged."""
    engine = _engine(tiny_tokenizer, ["#### 40", "#### 41", "#### 42"], max_user_turns=1)
    out = engine.generate(_prompts(), SamplingParams(max_new_tokens=400))
    assert out["turn_scores"] == [[0.0]] and out["num_turns"] == [2]
    text = tiny_tokenizer.decode(out["response_ids"][0][out["response_mask"][0].bool()])
    assert text == "#### 40<|im_end|>#### 41<|im_end|>"
