"""Dynamic sampling: rounds of generation until the batch is full of groups with signal."""

from __future__ import annotations

import pytest
import torch

from temper.config.schema import AlgorithmConfig, FilterGroupsConfig
from temper.data.batch import Batch
from temper.data.padded import concat_padded
from temper.pipelines.dynamic_sampling import (
    fill_groups,
    group_keep,
    merge_round_metrics,
)
from temper.pipelines.shaping import ShapingSettings

SETTINGS = ShapingSettings(AlgorithmConfig(), response_length=8)


def scored(groups: list[list[float]], tag: str, width: int = 3) -> Batch:
    """One round: a group per list of scores (uids ``<tag><k>``), responses ``width`` long."""
    scores = [s for g in groups for s in g]
    uids = [f"{tag}{k}" for k, g in enumerate(groups) for _ in g]
    n = len(scores)
    return Batch.from_dict(
        {
            "scores": torch.tensor(scores, dtype=torch.float32),
            "prompt_ids": torch.ones(n, 2, dtype=torch.long),
            "prompt_mask": torch.ones(n, 2, dtype=torch.long),
            "response_ids": torch.ones(n, width, dtype=torch.long),
            "response_mask": torch.ones(n, width, dtype=torch.long),
        },
        {"uid": uids, "truncated": [False] * n},
    )


def rounds(*batches: Batch):
    """A round generator replaying ``batches`` (and counting the calls)."""
    calls: list[int] = []

    def generate(k: int) -> tuple[Batch, dict[str, float]]:
        calls.append(k)
        return batches[k], {"train/score_mean": batches[k]["scores"].mean().item()}

    return generate, calls


def test_refill_reaches_the_full_batch_of_groups_with_signal():
    """Round 1 has one group with signal of three; round 2 brings two more; the surplus
    of round 2 (its third group) is dropped, as verl keeps the first train_batch_size."""
    gen, calls = rounds(
        scored([[1, 1], [0, 1], [0, 0]], "a"),
        scored([[1, 0], [0, 0], [1, 0], [0, 1]], "b", width=5),
    )
    fg = FilterGroupsConfig(enable=True)
    batch, m = fill_groups(gen, 3, fg, SETTINGS)
    assert calls == [0, 1]
    assert batch["uid"] == ["a1", "a1", "b0", "b0", "b2", "b2"]
    assert batch["response_ids"].shape == (6, 5)  # rounds padded to one width
    assert batch["response_mask"].sum(-1).tolist() == [3, 3, 5, 5, 5, 5]
    assert batch["sample_mask"].tolist() == [1.0] * 6
    assert m["dynamic_sampling/rounds"] == 2 and m["dynamic_sampling/batch_full"] == 1
    assert m["dynamic_sampling/groups_kept"] == 4 and m["dynamic_sampling/groups_dropped"] == 3
    assert m["dynamic_sampling/groups_masked"] == 0


def test_stops_at_max_num_gen_batches_with_masked_filler_and_says_so(capsys):
    gen, calls = rounds(scored([[1, 1], [0, 1], [0, 0]], "a"), scored([[0, 0]] * 3, "b"))
    fg = FilterGroupsConfig(enable=True, max_num_gen_batches=2)
    batch, m = fill_groups(gen, 3, fg, SETTINGS)
    assert calls == [0, 1] and len(batch) == 6  # the configured size, never less
    assert batch["uid"][:2] == ["a1", "a1"]
    assert batch["sample_mask"].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert m["dynamic_sampling/rounds"] == 2 and m["dynamic_sampling/batch_full"] == 0
    assert m["dynamic_sampling/groups_masked"] == 2
    assert "only 1/3 groups with signal after max_num_gen_batches=2" in capsys.readouterr().out


def test_every_group_without_signal_still_gives_a_batch():
    gen, _ = rounds(scored([[0, 0], [1, 1]], "a"))
    batch, m = fill_groups(gen, 2, FilterGroupsConfig(enable=True, max_num_gen_batches=1), SETTINGS)
    assert len(batch) == 4 and batch["sample_mask"].sum() == 0
    assert m["dynamic_sampling/groups_masked"] == 2


def test_without_the_filter_one_round_is_the_batch_untouched():
    first = scored([[0, 0], [1, 1]], "a")
    gen, calls = rounds(first)
    batch, m = fill_groups(gen, 2, FilterGroupsConfig(), SETTINGS)
    assert batch is first and calls == [0] and "dynamic_sampling/rounds" not in m


def test_a_prompt_drawn_again_gets_its_own_group():
    gen, _ = rounds(scored([[1, 0], [0, 0]], "a"), scored([[0, 1]], "a"))
    batch, _ = fill_groups(gen, 2, FilterGroupsConfig(enable=True), SETTINGS)
    assert batch["uid"] == ["a0", "a0", "a0#r1", "a0#r1"]


@pytest.mark.parametrize(
    ("fg", "keep"),
    [
        (FilterGroupsConfig(enable=True), [False, True, False, True]),
        (FilterGroupsConfig(enable=True, std_threshold=0.6), [False, True, False, True]),
        (FilterGroupsConfig(enable=True, std_threshold=0.8), [False, False, False, True]),
        # ROLL mean_filter: no std test, drop mean <= down or >= up
        (
            FilterGroupsConfig(enable=True, std_threshold=-1, mean_high=1.0),
            [False, True, True, True],
        ),
        (
            FilterGroupsConfig(enable=True, std_threshold=-1, mean_low=0.0),
            [True, True, False, True],
        ),
    ],
)
def test_group_keep_rules(fg, keep):
    # groups: all 1 (std 0, mean 1), 0/1 (std .71), all 0, singleton 1 (always passes std)
    b = scored([[1, 1], [0, 1], [0, 0], [1]], "g")
    rows = group_keep(b, fg, SETTINGS).tolist()
    assert [rows[0], rows[2], rows[4], rows[6]] == keep


def test_reward_metric_sees_the_overlong_penalty():
    """Equal scores, unequal lengths: no signal in the score, some in score + penalty."""
    b = scored([[1, 1]], "g", width=8)
    b["response_mask"][1, 6:] = 0  # 6 and 8 tokens; the buffer starts at 8 - 4
    algo = AlgorithmConfig()
    algo.overlong_buffer.enable, algo.overlong_buffer.len = True, 4
    settings = ShapingSettings(algo, response_length=8)
    assert not group_keep(b, FilterGroupsConfig(enable=True, metric="score"), settings).any()
    assert group_keep(b, FilterGroupsConfig(enable=True, metric="reward"), settings).all()


def test_round_metrics_merge():
    m = merge_round_metrics(
        [
            {"train/score_mean": 0.2, "train/score_max": 1.0, "train/reward_failures": 1.0},
            {"train/score_mean": 0.4, "train/score_max": 0.5, "train/reward_failures": 2.0},
        ]
    )
    assert m == pytest.approx(
        {"train/score_mean": 0.3, "train/score_max": 1.0, "train/reward_failures": 3.0}
    )


def test_concat_padded_splits_the_attention_mask_at_the_prompt():
    a = scored([[1]], "a", width=2)
    a["attention_mask"] = torch.ones(1, 4, dtype=torch.long)
    b = scored([[1]], "b", width=3)
    b["prompt_ids"], b["prompt_mask"] = torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3)
    b["attention_mask"] = torch.ones(1, 6, dtype=torch.long)
    out = concat_padded([a, b], pad_token_id=9)
    assert out["prompt_ids"][0].tolist() == [9, 1, 1] and out["response_ids"][0].tolist() == [
        1,
        1,
        9,
    ]
    assert out["attention_mask"][0].tolist() == [0, 1, 1, 1, 1, 0]
