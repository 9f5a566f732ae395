"""HFRolloutEngine on the tiny model: masks, greedy, log-probs, stops, grouping, seeds."""

from __future__ import annotations

import pytest
import torch

from temper.data.batch import Batch
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine


def reforward_log_probs(model, out: Batch, temperature: float = 1.0) -> torch.Tensor:
    """log-softmax(logits / T) of the response tokens from one full forward pass."""
    ids = torch.cat([out["prompt_ids"], out["response_ids"]], dim=1)
    mask = torch.cat([out["prompt_mask"], out["response_mask"]], dim=1)
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    prompt_len = out["prompt_ids"].shape[1]
    logp = torch.log_softmax(logits[:, prompt_len - 1 : -1].float() / temperature, dim=-1)
    picked = logp.gather(2, out["response_ids"].unsqueeze(-1)).squeeze(-1)
    return picked * out["response_mask"]


def test_shapes_masks_padding(tiny_model, tiny_tokenizer, prompts):
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    torch.manual_seed(0)
    out = engine.generate(prompts, SamplingParams(max_new_tokens=6))
    assert out["response_ids"].shape == (2, 6)
    assert out["response_mask"].shape == out["rollout_log_probs"].shape == (2, 6)
    assert out["rollout_log_probs"].dtype == torch.float32
    assert torch.equal(out["prompt_ids"], prompts["prompt_ids"])
    assert out["uid"] == ["a", "b"]
    assert len(out["truncated"]) == 2
    # padding: after the mask ends, pad ids and zero log-probs
    masked = out["response_mask"] == 0
    assert (out["response_ids"][masked] == tiny_tokenizer.pad_token_id).all()
    assert (out["rollout_log_probs"][masked] == 0).all()
    assert (out["rollout_log_probs"][~masked] < 0).all()


def test_eos_ends_mask_and_ignore_eos(tiny_model, tiny_tokenizer, prompts):
    greedy = SamplingParams(max_new_tokens=5, do_sample=False)
    first = HFRolloutEngine(tiny_model, tiny_tokenizer).generate(prompts, greedy)
    eos = int(first["response_ids"][0, 2])  # pretend row 0's third token is the EOS
    tiny_model.generation_config.eos_token_id = eos
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    out = engine.generate(prompts, greedy)
    row = first["response_ids"][0]
    end = int((row == eos).nonzero()[0])  # first occurrence (≤ 2)
    assert out["response_mask"][0].tolist() == [1] * (end + 1) + [0] * (4 - end)
    assert out["response_ids"][0, end] == eos
    assert out["truncated"][0] is False
    ignored = engine.generate(
        prompts, SamplingParams(max_new_tokens=5, do_sample=False, ignore_eos=True)
    )
    assert torch.equal(ignored["response_ids"], first["response_ids"])
    assert ignored["response_mask"].all() and ignored["truncated"] == [True, True]
    # extra stop ids still stop under ignore_eos (as in vLLM)
    stopped = engine.generate(
        prompts,
        SamplingParams(max_new_tokens=5, do_sample=False, ignore_eos=True, stop_token_ids=[eos]),
    )
    assert torch.equal(stopped["response_mask"], out["response_mask"])


def test_max_new_tokens_truncation_flag(tiny_model, tiny_tokenizer, prompts):
    out = HFRolloutEngine(tiny_model, tiny_tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=4, do_sample=False)
    )
    assert out["response_ids"].shape[1] == 4
    assert out["response_mask"].all()
    assert out["truncated"] == [True, True]


def test_greedy_equals_manual_argmax_loop(tiny_model, tiny_tokenizer, prompts):
    steps = 8
    out = HFRolloutEngine(tiny_model, tiny_tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=steps, temperature=0.0)
    )
    ids, mask = prompts["prompt_ids"], prompts["prompt_mask"]
    with torch.no_grad():
        for _ in range(steps):
            pos = (mask.cumsum(1) - 1).clamp(min=0)
            logits = tiny_model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
    assert torch.equal(out["response_ids"], ids[:, -steps:])
    # greedy log-probs are the raw (temperature 1) ones
    torch.testing.assert_close(
        out["rollout_log_probs"], reforward_log_probs(tiny_model, out), atol=1e-4, rtol=0
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_probs_match_reforward(tiny_model, tiny_tokenizer, prompts, temperature):
    torch.manual_seed(1)
    out = HFRolloutEngine(tiny_model, tiny_tokenizer).generate(
        prompts, SamplingParams(n=2, max_new_tokens=10, temperature=temperature)
    )
    expected = reforward_log_probs(tiny_model, out, temperature)
    torch.testing.assert_close(out["rollout_log_probs"], expected, atol=1e-4, rtol=0)


def filtered_log_probs(model, out: Batch, top_k: int, top_p: float) -> torch.Tensor:
    """Log-probs after top-k then top-p filtering (nucleus: keep the tokens whose
    higher-ranked mass is below top_p), from one full forward pass."""
    ids = torch.cat([out["prompt_ids"], out["response_ids"]], dim=1)
    mask = torch.cat([out["prompt_mask"], out["response_mask"]], dim=1)
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)
        ).logits
    logits = logits[:, out["prompt_ids"].shape[1] - 1 : -1].float()
    kth = logits.topk(top_k, dim=-1).values[..., -1:]
    logits = logits.masked_fill(logits < kth, float("-inf"))
    probs, order = logits.softmax(-1).sort(dim=-1, descending=True)
    drop_sorted = (probs.cumsum(-1) - probs) >= top_p
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    logp = logits.masked_fill(drop, float("-inf")).log_softmax(-1)
    return logp.gather(2, out["response_ids"].unsqueeze(-1)).squeeze(-1) * out["response_mask"]


def test_top_k_top_p_log_probs_are_renormalized(tiny_model, tiny_tokenizer, prompts):
    torch.manual_seed(2)
    out = HFRolloutEngine(tiny_model, tiny_tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=6, top_k=5, top_p=0.5)
    )
    expected = filtered_log_probs(tiny_model, out, top_k=5, top_p=0.5)
    torch.testing.assert_close(out["rollout_log_probs"], expected, atol=1e-4, rtol=0)
    # and they differ from the unfiltered ones: filtering renormalizes
    assert (out["rollout_log_probs"] > reforward_log_probs(tiny_model, out) + 1e-3).all()


def test_n_grouping_and_infer_batch_size(tiny_model, tiny_tokenizer, prompts):
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer, infer_batch_size=1)
    torch.manual_seed(3)
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=5))
    assert out["uid"] == ["a", "a", "a", "b", "b", "b"]
    assert torch.equal(out["prompt_ids"], prompts["prompt_ids"].repeat_interleave(3, dim=0))
    assert out["response_ids"].shape == (6, 5)
    # samples within a group differ (random tiny model, 5 tokens)
    assert not torch.equal(out["response_ids"][0], out["response_ids"][1])
    # chunking does not change the greedy result
    greedy = SamplingParams(n=2, max_new_tokens=5, do_sample=False)
    a = engine.generate(prompts, greedy)
    b = HFRolloutEngine(tiny_model, tiny_tokenizer).generate(prompts, greedy)
    assert torch.equal(a["response_ids"], b["response_ids"])
    assert torch.equal(a["response_ids"][0], a["response_ids"][1])


def _printable_window(tokenizer, ids: list[int], width: int = 2) -> int:
    for j in range(2, len(ids) - width):
        text = tokenizer.decode(ids[j : j + width])
        if len(text) == width and text.isascii() and text.isprintable():
            return j
    raise AssertionError("no printable window in the sample")


def test_stop_string_truncation(tiny_model, tiny_tokenizer, prompts):
    single = prompts.slice(0, 1)
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    for seed in range(10):  # find a sample with two printable ASCII tokens in a row
        torch.manual_seed(seed)
        free = engine.generate(single, SamplingParams(max_new_tokens=24))
        ids = free["response_ids"][0].tolist()
        try:
            j = _printable_window(tiny_tokenizer, ids)
            break
        except AssertionError:
            continue
    stop = tiny_tokenizer.decode(ids[j : j + 2])
    # byte-level tokens: the stop string first completes at the first such token pair
    end = next(i + 2 for i in range(len(ids) - 1) if ids[i : i + 2] == ids[j : j + 2])
    torch.manual_seed(seed)
    out = engine.generate(single, SamplingParams(max_new_tokens=24, stop=[stop]))
    assert int(out["response_mask"].sum()) == end
    assert out["response_ids"][0, :end].tolist() == ids[:end]
    assert out["truncated"] == [False]
    text = tiny_tokenizer.decode(out["response_ids"][0, :end].tolist())
    assert text.endswith(stop) and text.count(stop) == 1


def test_seeded_determinism(tiny_model, tiny_tokenizer, prompts):
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer)
    params = SamplingParams(n=2, max_new_tokens=8, temperature=0.9, top_p=0.95)
    torch.manual_seed(7)
    a = engine.generate(prompts, params)
    torch.manual_seed(7)
    b = engine.generate(prompts, params)
    torch.manual_seed(8)
    c = engine.generate(prompts, params)
    assert torch.equal(a["response_ids"], b["response_ids"])
    assert torch.equal(a["rollout_log_probs"], b["rollout_log_probs"])
    assert not torch.equal(a["response_ids"], c["response_ids"])


def test_train_mode_restored_with_gradient_checkpointing(tiny_model, tiny_tokenizer, prompts):
    enable = getattr(tiny_model, "activation_checkpointing_enable", None)
    (enable or tiny_model.gradient_checkpointing_enable)()
    tiny_model.config.use_cache = False
    tiny_model.train()
    saved = tiny_model.generation_config
    out = HFRolloutEngine(tiny_model, tiny_tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=3)
    )
    assert out["response_ids"].shape == (2, 3)
    assert tiny_model.training and tiny_model.generation_config is saved


def test_logprobs_off_leaves_key_out(tiny_model, tiny_tokenizer, prompts):
    out = HFRolloutEngine(tiny_model, tiny_tokenizer).generate(
        prompts, SamplingParams(max_new_tokens=3, logprobs=False)
    )
    assert "rollout_log_probs" not in out and out["response_ids"].shape == (2, 3)


def test_load_weights_owned_and_shared(tiny_dir, tiny_model, tiny_tokenizer):
    owned = HFRolloutEngine.from_pretrained(str(tiny_dir), device="cpu")
    assert not owned.shared
    new = {name: p.detach() + 1.0 for name, p in tiny_model.named_parameters()}
    owned.load_weights(new.items())
    for name, p in owned.module.named_parameters():
        torch.testing.assert_close(p.detach(), new[name])
    with pytest.raises(KeyError, match="nope"):
        owned.load_weights([("nope.weight", torch.zeros(1))])
    shared = HFRolloutEngine(tiny_model, tiny_tokenizer)
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    shared.load_weights(new.items())  # no-op: the module is the trainer's
    assert all(torch.equal(v, tiny_model.state_dict()[k]) for k, v in before.items())


def test_owned_engine_on_cpu_generates_with_grouped_heads_uncopied(tiny_dir, prompts):
    """An owned CPU engine that would run sdpa loads with the segment kernel (sdpa's sums,
    grouped key/value heads not copied per query head); greedy tokens and log-probs equal
    an eager-attention engine's. An explicit other implementation is kept."""
    from temper.training.segment_attention import SEGMENT_KERNEL

    owned = HFRolloutEngine.from_pretrained(str(tiny_dir), device="cpu")
    eager = HFRolloutEngine.from_pretrained(
        str(tiny_dir), device="cpu", attn_implementation="eager"
    )
    assert owned.module.config._attn_implementation == SEGMENT_KERNEL
    assert eager.module.config._attn_implementation == "eager"
    assert owned.module.config.num_key_value_heads < owned.module.config.num_attention_heads
    params = SamplingParams(n=2, max_new_tokens=10, temperature=0.0)
    got, want = owned.generate(prompts, params), eager.generate(prompts, params)
    assert torch.equal(got["response_ids"], want["response_ids"])
    torch.testing.assert_close(
        got["rollout_log_probs"], want["rollout_log_probs"], atol=1e-5, rtol=0
    )
