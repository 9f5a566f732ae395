"""Loss aggregation: hand values, and split invariance of the gradient.

The invariance tests build a tiny differentiable "model" (a linear map from features to
logits for the actor, to values for the critic) and check that the gradient of an
aggregated loss over one mini-batch is the same (fp32 tolerance) whether the mini-batch
is processed whole, as 4 micro-batches (gradient accumulation), or as 2 simulated
data-parallel ranks × 2 micro-batches (gradients averaged over ranks, as DDP/FSDP do).
Micro-batches are also trimmed to their own longest response, as dynamic padding does.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from temper.algorithms import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    GlobalNormalizers,
    LossAggregator,
    PolicyLossParams,
    actor_loss,
    compute_global_normalizers,
    compute_policy_loss,
    entropy_from_logits,
    entropy_loss,
    kl_loss,
    logprobs_from_logits,
    sft_loss,
    value_loss,
)

T = torch.tensor

# ----------------------------------------------------------------------------- hand values

L = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
M = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # third row: zero-length


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 valid tokens
        ("token-sum", 7.0),  # 1 + 2 + 4
        ("seq-mean-token-sum", 3.5),  # ((1+2) + 4) / 2 non-empty sequences
        ("seq-mean-token-mean", 2.75),  # ((1+2)/2 + 4/1) / 2 = (1.5 + 4)/2
        ("seq-mean-token-sum-norm", 7 / 6),  # ((1+2) + 4) / (2 sequences * H=3)
    ],
)
def test_modes_hand_values(mode: str, expected: float) -> None:
    agg = LossAggregator.from_mask(mode, M)
    assert agg(L, M).item() == pytest.approx(expected, rel=1e-6)


def test_sequence_weights_and_padding_garbage() -> None:
    # inf/NaN on padding must not leak into the loss
    dirty = L.clone()
    dirty[0, 2], dirty[2, 0] = float("inf"), float("nan")
    agg = LossAggregator.from_mask("token-mean", M)
    assert agg(dirty, M).item() == pytest.approx(7 / 3)
    # weights w = [2, 1, 5]: (2*(1+2) + 1*4 + 5*0) / 3 = 10/3
    assert agg(L, M, T([2.0, 1.0, 5.0])).item() == pytest.approx(10 / 3)


def test_norm_length_and_dp_scale() -> None:
    agg = LossAggregator.from_mask("seq-mean-token-sum-norm", M, norm_length=10, dp_size=4)
    # (3 + 4) / (2 * 10) * 4 ranks = 1.4
    assert agg(L, M).item() == pytest.approx(1.4)
    assert agg.with_mode("token-sum")(L, M).item() == pytest.approx(28.0)


def test_empty_minibatch_is_zero_not_nan() -> None:
    z = torch.zeros(2, 3)
    for mode in LOSS_AGG_MODES.names():
        assert LossAggregator.from_mask(mode, z)(L[:2], z).item() == 0.0


def test_global_normalizers_sum_over_shards() -> None:
    g = compute_global_normalizers(M)
    assert (g.num_tokens, g.num_seqs, g.max_len) == (3.0, 2.0, 3)
    a, b = compute_global_normalizers(M[:1]), compute_global_normalizers(M[1:])
    assert a.num_tokens + b.num_tokens == g.num_tokens
    assert a.num_seqs + b.num_seqs == g.num_seqs


def test_unknown_mode_lists_valid_ones() -> None:
    with pytest.raises(KeyError, match="did you mean 'token-mean'"):
        LossAggregator.from_mask("token_mean", M)


# ----------------------------------------------------------------------------- invariance

B, TT, D, V = 8, 6, 4, 5
LENGTHS = [6, 1, 3, 0, 5, 2, 6, 4]  # row 3 is a zero-length response
MICRO = [[0, 5], [1, 2], [3, 7], [4, 6]]  # non-contiguous, as after length balancing
DP = [[MICRO[0], MICRO[1]], [MICRO[2], MICRO[3]]]


class Batch:
    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(B, TT, D, generator=g)
        self.labels = torch.randint(0, V, (B, TT), generator=g)
        self.mask = (torch.arange(TT)[None, :] < torch.tensor(LENGTHS)[:, None]).float()
        self.mask[0, 2] = 0.0  # an observation token inside a multi-turn response
        self.adv = torch.randn(B, TT, generator=g)
        self.returns = torch.randn(B, TT, generator=g)
        self.positive = torch.tensor([1, 0, 1, 1, 0, 1, 0, 1])
        self.w = torch.randn(D, V, generator=g, requires_grad=True)
        self.wv = torch.randn(D, generator=g, requires_grad=True)
        with torch.no_grad():
            base = logprobs_from_logits(self.x @ self.w, self.labels)
            self.old = base + 0.3 * torch.randn(B, TT, generator=g)
            self.ref = base + 0.3 * torch.randn(B, TT, generator=g)
            self.old_values = self.x @ self.wv + 0.3 * torch.randn(B, TT, generator=g)

    def rows(self, idx: list[int]) -> dict[str, torch.Tensor]:
        """A micro-batch trimmed to its longest response (dynamic padding)."""
        used_cols = self.mask[idx].sum(0).nonzero()
        width = int(used_cols.max().item()) + 1 if used_cols.numel() else 1
        sl = (idx, slice(0, width))
        return {
            "x": self.x[idx, :width],
            "labels": self.labels[sl],
            "mask": self.mask[sl],
            "adv": self.adv[sl],
            "returns": self.returns[sl],
            "old": self.old[sl],
            "ref": self.ref[sl],
            "old_values": self.old_values[sl],
            "positive": self.positive[idx],
        }


LossFn = Callable[[Batch, dict[str, torch.Tensor], LossAggregator, LossAggregator], torch.Tensor]


def policy_fn(name: str) -> LossFn:
    def fn(
        b: Batch, r: dict[str, torch.Tensor], agg: LossAggregator, _: LossAggregator
    ) -> torch.Tensor:
        logp = logprobs_from_logits(r["x"] @ b.w, r["labels"])
        loss, _m = compute_policy_loss(
            name,
            logp,
            r["old"],
            r["adv"],
            r["mask"],
            PolicyLossParams(dro_beta=0.1),
            agg,
            None,
            {"sample_positive": r["positive"]},  # read by the losses that declare it
        )
        return loss

    return fn


def full_actor_fn(
    b: Batch, r: dict[str, torch.Tensor], agg: LossAggregator, sft_agg: LossAggregator
) -> torch.Tensor:
    logits = r["x"] @ b.w
    logp = logprobs_from_logits(logits, r["labels"])
    pg, _ = compute_policy_loss(
        "vanilla", logp, r["old"], r["adv"], r["mask"], PolicyLossParams(), agg
    )
    kl, _ = kl_loss(logp, r["ref"], r["mask"], agg, "low_var_kl")
    ent = entropy_loss(entropy_from_logits(logits), r["mask"], agg)
    sft = sft_loss(logp, r["mask"], r["positive"], sft_agg)
    return actor_loss(
        pg,
        kl_loss=kl,
        kl_loss_coef=0.1,
        entropy=ent,
        entropy_coef=0.01,
        sft_loss=sft,
        sft_loss_coef=0.5,
        rl_loss_coef=0.9,
    )


def critic_fn(
    b: Batch, r: dict[str, torch.Tensor], agg: LossAggregator, _: LossAggregator
) -> torch.Tensor:
    loss, _m = value_loss(r["x"] @ b.wv, r["returns"], r["old_values"], r["mask"], agg, 0.2)
    return loss


LOSSES: dict[str, LossFn] = {
    **{
        f"policy:{n}": policy_fn(n)
        for n in POLICY_LOSSES.names()
        if n not in ("clip_cov", "kl_cov")
    },
    "actor:pg+kl+entropy+sft": full_actor_fn,
    "critic:value": critic_fn,
}


def grads(b: Batch, fn: LossFn, mode: str, ranks: list[list[list[int]]]) -> torch.Tensor:
    """Per-rank gradient accumulation over micro-batches, then the DDP average."""
    dp = len(ranks)
    # the driver computes each rank's counts; one all-reduce (here: a sum) gives the global ones
    shards = [
        compute_global_normalizers(b.mask[[i for idx in rank for i in idx]]) for rank in ranks
    ]
    g = GlobalNormalizers(sum(s.num_tokens for s in shards), sum(s.num_seqs for s in shards), TT)
    agg = LossAggregator.from_normalizers(mode, g, dp_size=dp)
    sft_agg = LossAggregator.from_mask(mode, b.mask * b.positive[:, None], dp_size=dp)
    per_rank = []
    for rank in ranks:
        b.w.grad = None
        b.wv.grad = None
        for idx in rank:
            fn(b, b.rows(idx), agg, sft_agg).backward()
        gw = b.w.grad if b.w.grad is not None else torch.zeros_like(b.w)
        gv = b.wv.grad if b.wv.grad is not None else torch.zeros_like(b.wv)
        per_rank.append(torch.cat([gw.reshape(-1), gv.reshape(-1)]))
    return torch.stack(per_rank).mean(0)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES.names())
@pytest.mark.parametrize("loss_name", list(LOSSES))
def test_gradient_invariant_to_micro_batching_and_dp(mode: str, loss_name: str) -> None:
    b = Batch()
    fn = LOSSES[loss_name]
    whole = grads(b, fn, mode, [[list(range(B))]])
    micro4 = grads(b, fn, mode, [MICRO])
    dp2x2 = grads(b, fn, mode, DP)
    assert whole.abs().sum() > 0
    torch.testing.assert_close(micro4, whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dp2x2, whole, rtol=1e-5, atol=1e-6)


def test_local_normalizers_would_break_invariance() -> None:
    """Sanity check that the invariance test can fail: per-micro-batch token counts
    (the classic gradient-accumulation bug) give a different gradient."""
    b = Batch()
    fn = LOSSES["policy:vanilla"]
    whole = grads(b, fn, "token-mean", [[list(range(B))]])
    b.w.grad = None
    for idx in MICRO:
        r = b.rows(idx)
        local = LossAggregator.from_mask("token-mean", r["mask"])
        (fn(b, r, local, local) / len(MICRO)).backward()
    assert not torch.allclose(b.w.grad.reshape(-1), whole[: D * V], rtol=1e-3)
