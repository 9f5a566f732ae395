"""The multi-turn runner: masks token by token, template deltas, sanity check, limits."""

from __future__ import annotations

import pytest
from doubles import LOG_PROB, ScriptedEngine, turn_index

from temper.rollout.base import SamplingParams
from temper.rollout.chat import ChatTokenizer, TokenizationMismatch
from temper.rollout.multiturn import EpisodeSpec, Feedback, MultiTurnRunner, MultiTurnSettings

REPLIES = ["<answer>Up</answer>", "<answer>Left</answer>", "<answer>Down</answer>"]


def three_turn_respond(indices, texts):
    """Observation after each turn; the third turn ends the episode."""
    out = []
    for i, text in zip(indices, texts):
        turn = REPLIES.index(text)
        done = turn == 2
        out.append(Feedback([{"role": "user", "content": f"obs {i}.{turn + 1}"}], 1.0, done))
    return out


def run(tokenizer, policy, respond, n=1, settings=None, template=None):
    if template is not None:
        tokenizer = _with_template(tokenizer, template)
    engine = ScriptedEngine(tokenizer, policy)
    chat = ChatTokenizer(tokenizer)
    runner = MultiTurnRunner(engine, chat, settings or MultiTurnSettings(max_tokens_per_turn=64))
    specs = [
        EpisodeSpec([{"role": "user", "content": f"play {i}\nobs {i}.0"}], {"i": i})
        for i in range(n)
    ]
    return runner.run(specs, respond, SamplingParams()), engine, runner


def _with_template(tokenizer, template):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = template
    return tok


def test_three_turn_masks_cover_exactly_the_generated_tokens(tiny_tokenizer):
    policy = lambda text: REPLIES[turn_index(text)]  # noqa: E731
    (traj,), engine, _ = run(tiny_tokenizer, policy, three_turn_respond)
    assert traj.num_turns == 3 and traj.stop_reason == "done"
    gen = engine.generated
    assert len(gen) == 3
    # expected sequence, token by token: model turn (1) | template delta + obs (0) | …
    delta = [
        tiny_tokenizer(
            f"\n<|im_start|>user\nobs 0.{k}<|im_end|>\n<|im_start|>assistant\n",
            add_special_tokens=False,
        )["input_ids"]
        for k in (1, 2)
    ]
    expected = gen[0] + delta[0] + gen[1] + delta[1] + gen[2]
    mask = [1] * len(gen[0]) + [0] * len(delta[0]) + [1] * len(gen[1])
    mask += [0] * len(delta[1]) + [1] * len(gen[2])
    assert traj.response_ids == expected
    assert traj.response_mask == mask
    for tok, m, lp in zip(traj.response_ids, traj.response_mask, traj.log_probs):
        assert lp == (LOG_PROB if m else 0.0), tok
    # the generated ids end with EOS and are kept as generated (no re-tokenization)
    assert all(g[-1] == tiny_tokenizer.eos_token_id for g in gen)
    ends = [len(gen[0]) - 1, len(gen[0] + delta[0] + gen[1]) - 1, len(expected) - 1]
    assert traj.turn_ends == ends
    assert traj.turn_rewards == [1.0, 1.0, 1.0] and traj.episode_return == 3.0
    # prompt = first user message + generation prompt; whole = tokenizing the full chat
    first = tiny_tokenizer.apply_chat_template(
        traj.messages[:1], tokenize=False, add_generation_prompt=True
    )
    assert traj.prompt_ids == tiny_tokenizer(first, add_special_tokens=False)["input_ids"]
    full = tiny_tokenizer.apply_chat_template(traj.messages, tokenize=False)
    full_ids = tiny_tokenizer(full, add_special_tokens=False)["input_ids"]
    assert full_ids[: len(traj)] == traj.prompt_ids + traj.response_ids
    assert traj.sanity is not None and traj.sanity.ok
    assert [m["role"] for m in traj.messages] == ["user", "assistant"] * 3 + ["user"] * 0


def test_all_live_episodes_share_one_generate_call_per_turn(tiny_tokenizer):
    def respond(indices, texts):  # episode i lasts i + 1 turns
        return [
            Feedback([{"role": "user", "content": "next"}], 0.0, turn_count[i] >= i)
            for i in indices
            if not turn_count.__setitem__(i, turn_count.get(i, -1) + 1)
        ]

    turn_count: dict[int, int] = {}
    trajs, engine, runner = run(tiny_tokenizer, lambda t: "<answer>Up</answer>", respond, n=3)
    assert [t.num_turns for t in trajs] == [1, 2, 3]
    assert engine.batch_sizes == [3, 2, 1]
    assert runner.metrics["rollout/generate_calls"] == 3


def test_turn_limits_and_context_budget(tiny_tokenizer):
    forever = lambda idx, texts: [Feedback([{"role": "user", "content": "go"}]) for _ in idx]  # noqa: E731
    settings = MultiTurnSettings(max_tokens_per_turn=64, max_assistant_turns=2)
    (t,), _, _ = run(tiny_tokenizer, lambda _: "<answer>Up</answer>", forever, settings=settings)
    assert t.num_turns == 2 and t.stop_reason == "max_turns"
    assert t.response_mask[-1] == 1  # ends on the model's last token
    settings = MultiTurnSettings(max_tokens_per_turn=64, max_user_turns=1)
    (t,), _, _ = run(tiny_tokenizer, lambda _: "<answer>Up</answer>", forever, settings=settings)
    assert t.num_turns == 2 and t.user_turns == 1 and t.stop_reason == "max_user_turns"
    settings = MultiTurnSettings(max_tokens_per_turn=64, max_model_len=120)
    (t,), _, _ = run(tiny_tokenizer, lambda _: "x" * 30, forever, settings=settings)
    assert t.stop_reason == "context" and len(t) <= 120
    assert t.response_mask[-1] == 1 and t.sanity.ok


def test_turn_cut_at_token_limit_gets_the_template_closing(tiny_tokenizer):
    forever = lambda idx, texts: [Feedback([{"role": "user", "content": "go"}]) for _ in idx]  # noqa: E731
    settings = MultiTurnSettings(max_tokens_per_turn=5, max_assistant_turns=2)
    (t,), engine, _ = run(
        tiny_tokenizer, lambda _: "<answer>Up</answer>", forever, settings=settings
    )
    assert t.cut_turns == 2 and engine.generated[0] == tiny_tokenizer("<answ")["input_ids"]
    closing = tiny_tokenizer.decode(t.response_ids[5 : 5 + 2])
    assert closing.startswith("<|im_end|>")  # the template closes the cut turn (mask 0)
    assert t.response_mask[5:7] == [0, 0] and t.sanity.ok


TRIMMING = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LAST_MARKED = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] }}"
    "{% if loop.last %}{{ ' (latest)' }}{% endif %}{{ '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.mark.parametrize("template", [TRIMMING, LAST_MARKED], ids=["trims", "not-prefix-stable"])
def test_sanity_check_catches_a_broken_template(tiny_tokenizer, template):
    policy = lambda text: "  " + REPLIES[turn_index(text)] + "  "  # noqa: E731
    respond = lambda idx, texts: three_turn_respond(idx, [t.strip() for t in texts])  # noqa: E731
    with pytest.raises(TokenizationMismatch, match="enable_tokenization_sanity_check"):
        run(tiny_tokenizer, policy, respond, template=template)
    # the same episode with the check off runs (and warns) — and with the good template passes
    settings = MultiTurnSettings(max_tokens_per_turn=64, strict=False)
    (t,), _, runner = run(tiny_tokenizer, policy, respond, settings=settings, template=template)
    assert not t.sanity.ok and not t.sanity.drift
    assert runner.metrics["rollout/tokenization_mismatch_frac"] == 1.0
    (t,), _, _ = run(tiny_tokenizer, policy, respond)
    assert t.sanity.ok


# Qwen3-style: earlier assistant turns lose their <think>…</think> when rendered
THINK_STRIPPING = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and not loop.last %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + content + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_inference_chat_template_generates_from_the_rendered_conversation(tiny_tokenizer):
    """verl use_inference_chat_template: later turns are generated from the template's
    rendering (earlier thinking dropped), the trained sequence keeps every generated
    token, and the sampling log-probs (taken on another context) are dropped."""
    seen: list[str] = []

    def policy(text):
        seen.append(text)
        return f"<think>plan {turn_index(text)}</think>" + REPLIES[turn_index(text)]

    def respond(idx, texts):
        return three_turn_respond(idx, [t.split("</think>")[-1] for t in texts])

    on = MultiTurnSettings(max_tokens_per_turn=64, sanity_check=False, inference_template=True)
    (t,), _, runner = run(tiny_tokenizer, policy, respond, settings=on, template=THINK_STRIPPING)
    assert t.num_turns == 3 and len(seen) == 3
    # the third turn's context, as an inference server renders it: no earlier thinking
    assert "plan 0" not in seen[2] and "plan 1" not in seen[2]
    assert seen[2].endswith("obs 0.2<|im_end|>\n<|im_start|>assistant\n")
    # … while the trained sequence has every generated token, thinking included
    trained = tiny_tokenizer.decode([i for i, m in zip(t.response_ids, t.response_mask) if m])
    assert all(f"<think>plan {k}</think>" in trained for k in range(3))
    assert t.rerendered_turns == 2 and not t.has_log_probs
    assert runner.metrics["rollout/inference_template_rerender_frac"] == 1.0
    # off (the default): every turn is generated from the trained sequence itself
    off = MultiTurnSettings(max_tokens_per_turn=64, sanity_check=False)
    seen.clear()
    (t_off,), _, _ = run(tiny_tokenizer, policy, respond, settings=off, template=THINK_STRIPPING)
    assert "plan 0" in seen[2] and t_off.has_log_probs and t_off.rerendered_turns == 0
    assert t_off.response_ids == t.response_ids  # same tokens trained either way
    # a prefix-stable template renders exactly the trained sequence: nothing changes
    seen.clear()
    (t_chatml,), _, _ = run(tiny_tokenizer, policy, respond, settings=on)
    assert t_chatml.rerendered_turns == 0 and t_chatml.has_log_probs and "plan 0" in seen[2]
