"""The actor as a reward model in training (plan part ``score_head``): the update is the
mean Bradley–Terry loss of its scores whatever the micro-batch split or packing, and the
model it saves loads as ``AutoModelForSequenceClassification`` with the same scores."""

from __future__ import annotations

import pytest
import torch

from temper.algorithms.reward_model import RewardLossParams, bradley_terry_loss
from temper.config.validate import validate
from temper.data.preference import PairDataset, PairExample, scored_pairs
from temper.data.sft import SFTExample
from temper.pipelines.catalog import CATALOG
from temper.roles import build_roles

from .conftest import PAD, make_config

#: (prompt, chosen, rejected) token ids of 3 pairs of different lengths
PAIRS = [
    ((5, 6, 7), (8, 9), (10,)),
    ((11,), (12, 13, 14, 15), (16, 17)),
    ((18, 19, 20, 21, 22), (23,), (24, 25, 26)),
]


def _pairs() -> PairDataset:
    def sample(prompt: tuple[int, ...], response: tuple[int, ...]) -> SFTExample:
        return SFTExample(prompt, response, (1,) * len(response), "test")

    pairs = [PairExample(sample(p, c), sample(p, r)) for p, c, r in PAIRS]
    return scored_pairs(PairDataset(pairs, PAD, "train", [], len(pairs)))


def _scorer(tiny_path: str, micro: int = 6, budget: int | None = None, packed: bool = False):
    cfg = make_config(tiny_path)
    cfg.pipeline = "reward_model"
    cfg.actor.micro_batch_size_per_device = micro
    cfg.actor.use_dynamic_bsz = budget is not None
    cfg.actor.max_token_len_per_device = budget or 16384
    cfg.model.use_remove_padding = packed
    cfg.actor.optim.eps = 1.0  # update linear in the gradient (see the engine tests)
    cfg.data.train_batch_size = 3
    return build_roles(cfg, validate(cfg, CATALOG), "cpu").actor


def test_scored_layout_puts_the_whole_sequence_before_one_slot() -> None:
    batch = _pairs().make_batch([0, 1, 2])
    assert batch["chosen"].tolist() == [1, 0, 1, 0, 1, 0]
    assert batch["response_ids"].tolist() == [[PAD]] * 6
    assert batch["response_mask"].tolist() == [[1]] * 6
    row0 = batch["prompt_ids"][0][batch["prompt_mask"][0] > 0].tolist()
    assert row0 == [5, 6, 7, 8, 9]  # the prompt, then the chosen response


def test_reward_update_is_the_pair_loss_whatever_the_split_or_packing(tiny_path: str) -> None:
    """The update's loss is the mean BT loss of the scores (computed here from the
    scorer's own forward); micro-batches of 6 rows, of 1 (a pair's rows apart), a token
    budget packed, and packed whole give the same loss, gradient norm and weights."""
    batch = _pairs().make_batch([0, 1, 2])
    params = RewardLossParams(center_coef=0.05)
    results = []
    for micro, budget, packed in (
        (6, None, False),
        (1, None, False),
        (1, 9, True),
        (6, None, True),
    ):
        actor = _scorer(tiny_path, micro, budget, packed)
        assert not hasattr(actor.engine.model, "lm_head")  # a backbone with a score head
        scores = actor.compute_scores(batch)["scores"].double()
        expected = bradley_terry_loss(scores[0::2], scores[1::2], params).mean()
        metrics = actor.reward_update(batch, "bradley_terry", params)
        assert metrics["actor/loss"] == pytest.approx(float(expected), rel=1e-5)
        margin = (scores[0::2] - scores[1::2]).mean()
        assert metrics["actor/rewards/margin"] == pytest.approx(float(margin), rel=1e-5, abs=1e-7)
        results.append((metrics, dict(actor.engine.model.named_parameters())))
    m0, w0 = results[0]
    for m, w in results[1:]:
        for key in ("actor/loss", "actor/grad_norm"):
            assert m[key] == pytest.approx(m0[key], rel=1e-5, abs=1e-7), key
        for name, p in w.items():
            torch.testing.assert_close(p, w0[name], atol=1e-8, rtol=0, msg=name)
    assert results[2][0]["actor/packed_fraction"] > 0  # the packed runs did pack


def test_saved_scorer_loads_as_sequence_classification_with_the_same_scores(
    tiny_path: str, tmp_path
) -> None:
    """After an update, ``save_hf`` writes a directory that
    ``AutoModelForSequenceClassification`` loads (num_labels=1, no fresh weights), whose
    logit at each sequence's last token is the trained model's score — read alone, and
    through temper's reward-model role (left-padded batches) — and which a new
    reward-model run starts from whole (head included)."""
    from transformers import AutoModelForSequenceClassification

    from temper.config.schema import RewardModelConfig
    from temper.rewards.model import RewardModel

    actor = _scorer(tiny_path)
    batch = _pairs().make_batch([0, 1, 2])
    actor.reward_update(batch, "bradley_terry", RewardLossParams())
    trained = actor.compute_scores(batch)["scores"]
    out = tmp_path / "rm"
    actor.engine.save_hf(str(out))
    model, info = AutoModelForSequenceClassification.from_pretrained(
        out, num_labels=1, output_loading_info=True
    )
    assert type(model).__name__ == "LlamaForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    sequences = [
        row[mask > 0].tolist() for row, mask in zip(batch["prompt_ids"], batch["prompt_mask"])
    ]
    with torch.no_grad():
        alone = torch.stack([model(input_ids=torch.tensor([s])).logits[0, 0] for s in sequences])
    torch.testing.assert_close(alone, trained, rtol=1e-5, atol=1e-5)
    served = RewardModel.from_config(RewardModelConfig(enable=True, path=str(out)), "cpu")
    torch.testing.assert_close(served.score_sequences(sequences), trained, rtol=1e-5, atol=1e-5)
    # a reward-model run from the saved model goes on with its backbone and its head
    again = _scorer(str(out)).compute_scores(batch)["scores"]
    torch.testing.assert_close(again, trained, rtol=1e-5, atol=1e-5)
