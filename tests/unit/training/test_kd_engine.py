"""Offline distillation in the engines: a teacher's top-k logits of the response tokens,
and a student's training forward returning its own logits at those token ids — the same
whatever the micro-batching or packing, equal to a full forward's, zero where masked; and
the vocabulary-parallel versions on one megatron rank."""

from __future__ import annotations

import torch

from temper.algorithms.kd import KD_OBJECTIVES, KDParams
from temper.config.schema import ModelConfig
from temper.data.batch import Batch
from temper.training.megatron_vocab import VocabShard, gather_vocab, top_vocab
from temper.training.micro_batching import KD_INDICES, KD_LOGITS, MicroBatching
from temper.training.packing import LayoutCost

from .conftest import make_batch, make_engine

PROMPTS = [7, 3, 5, 1]
RESPONSES = [6, 2, 4, 1]


def _full_logits(model: torch.nn.Module, batch: Batch, i: int) -> torch.Tensor:
    """Sample ``i`` alone, unpadded: the logits predicting each of its response tokens."""
    prompt = batch["prompt_ids"][i][batch["prompt_mask"][i] > 0]
    n = int(batch["response_mask"][i].sum())
    ids = torch.cat([prompt, batch["response_ids"][i, :n]])[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    p = prompt.numel()
    return logits[p - 1 : p - 1 + n]


def test_top_logits_are_a_full_forwards_top_k_in_any_micro_batching(tiny_path: str) -> None:
    engine = make_engine(tiny_path, train=False)
    packed = make_engine(tiny_path, train=False)
    packed._layout_cost = lambda: LayoutCost(per_token=1.0, per_pair=0.0)  # type: ignore[method-assign]
    batch = make_batch(PROMPTS, RESPONSES, seed=2)
    values, ids = engine.top_logits(batch, 5, 2.0, MicroBatching(size=1))
    assert values.shape == ids.shape == (4, 6, 5) and ids.dtype == torch.long
    for i, n in enumerate(RESPONSES):
        want, want_ids = torch.topk(_full_logits(engine.model, batch, i) / 2.0, 5, dim=-1)
        torch.testing.assert_close(values[i, :n], want, atol=1e-4, rtol=1e-4)
        assert torch.equal(ids[i, :n], want_ids)
        assert (values[i, n:] == 0).all() and (ids[i, n:] == 0).all()
    for e, spec in ((engine, MicroBatching(size=4)), (packed, MicroBatching(size=3))):
        v, x = e.top_logits(batch, 5, 2.0, spec)
        torch.testing.assert_close(v, values, atol=1e-4, rtol=1e-4)
        assert torch.equal(x, ids)
    assert packed.layouts["packed"] > 0


def test_a_student_on_its_own_top_k_diverges_by_zero_and_still_gets_gradients(
    tiny_path: str,
) -> None:
    """The training forward's ``kd_logits`` are the model's logits at the teacher's ids:
    with the model as its own teacher every objective is 0 on every learnt token."""
    engine = make_engine(tiny_path, micro=2)
    batch = make_batch(PROMPTS, RESPONSES, seed=3)
    values, ids = engine.top_logits(batch, 8, 1.0)
    batch = batch.union(Batch.from_dict({KD_INDICES: ids, "teacher": values}))
    seen: list[torch.Tensor] = []

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]):
        mask = mb["response_mask"] > 0
        torch.testing.assert_close(out[KD_LOGITS][mask], mb["teacher"][mask], atol=1e-4, rtol=1e-4)
        for name in KD_OBJECTIVES.primary_names():
            kd = KD_OBJECTIVES.get(name)(out[KD_LOGITS], mb["teacher"], KDParams())
            seen.append(kd[mask].detach().abs().max())
        return out[KD_LOGITS][mask].sum() * 1e-3, {}

    before = [p.detach().clone() for p in engine.trainable_parameters()]
    engine.train_mini_batch(batch, loss_fn)
    assert max(float(s) for s in seen) < 1e-5
    after = list(engine.trainable_parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


def test_padded_engine_gathers_as_the_packed_one(tiny_path: str) -> None:
    padded = make_engine(
        tiny_path, train=False, model=ModelConfig(path=tiny_path, use_remove_padding=False)
    )
    engine = make_engine(tiny_path, train=False)
    batch = make_batch(PROMPTS, RESPONSES, seed=4)
    a = engine.top_logits(batch, 3, 1.0, MicroBatching(size=4))
    b = padded.top_logits(batch, 3, 1.0, MicroBatching(size=4))
    torch.testing.assert_close(a[0], b[0], atol=1e-4, rtol=1e-4)
    assert torch.equal(a[1], b[1])


def test_vocabulary_parallel_helpers_on_one_rank() -> None:
    """One rank of a padded vocabulary (10 columns, 8 real tokens): the top k are the real
    tokens' top k; k = 0 keeps every column, the padded ones at −inf; a gather at token
    ids is the logits there, with the gradient only at those columns."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 10, generator=g)
    shard = VocabShard.of(0, 1, padded=10, vocab=8)
    values, ids = top_vocab(logits, 4, shard)
    want, want_ids = torch.topk(logits[..., :8], 4, dim=-1)
    assert torch.equal(values, want) and torch.equal(ids, want_ids)
    values, ids = top_vocab(logits, 0, shard)
    assert torch.equal(values[..., :8], logits[..., :8]) and torch.isinf(values[..., 8:]).all()
    z = logits.clone().requires_grad_(True)
    picked = gather_vocab(z, want_ids, shard)
    assert torch.equal(picked, want)
    picked.sum().backward()
    assert z.grad is not None and float(z.grad.sum()) == picked.numel()


def test_top_logits_keep_to_the_tokenizers_ids(tiny_path: str) -> None:
    """``vocab``: only ids below it (an output layer's padding rows past the tokenizer's
    tokens are ids a student of another size may not have)."""
    engine = make_engine(tiny_path, train=False)
    batch = make_batch(PROMPTS, RESPONSES, seed=6)
    values, ids = engine.top_logits(batch, 4, 1.0, vocab=50)
    mask = batch["response_mask"] > 0
    assert int(ids[mask].max()) < 50
    full, _ = engine.top_logits(batch, 4, 1.0)
    assert (values[mask] <= full[mask] + 1e-6).all()
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 10, generator=g)
    shard = VocabShard.of(0, 1, padded=10, vocab=8)
    top, top_ids = top_vocab(logits, 2, shard, limit=5)
    want, want_ids = torch.topk(logits[..., :5], 2, dim=-1)
    assert torch.equal(top, want) and torch.equal(top_ids, want_ids)


def test_top_log_probs_are_normalized_over_the_tokenizers_ids(tiny_path: str) -> None:
    """``log_probs``: the same top-k ids, their log-softmax at the temperature over the ids
    below ``vocab`` (on-policy distillation's top-k loss), whatever the micro-batching."""
    engine = make_engine(tiny_path, train=False)
    batch = make_batch(PROMPTS, RESPONSES, seed=2)
    values, ids = engine.top_logits(batch, 5, 2.0, MicroBatching(size=1), vocab=50, log_probs=True)
    _, plain_ids = engine.top_logits(batch, 5, 2.0, MicroBatching(size=1), vocab=50)
    assert torch.equal(ids, plain_ids)
    for i, n in enumerate(RESPONSES):
        want = torch.log_softmax(_full_logits(engine.model, batch, i)[:, :50] / 2.0, dim=-1)
        torch.testing.assert_close(values[i, :n], want.gather(-1, ids[i, :n]), atol=1e-4, rtol=0)
    v, _ = engine.top_logits(batch, 5, 2.0, MicroBatching(size=4), vocab=50, log_probs=True)
    torch.testing.assert_close(v, values, atol=1e-4, rtol=1e-4)
