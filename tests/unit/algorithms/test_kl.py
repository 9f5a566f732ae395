"""KL estimators, full KL, KL in the reward / as a loss, KL controllers."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from temper.algorithms import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLNeedsLogitsError,
    LossAggregator,
    apply_kl_penalty,
    full_kl_from_logits,
    kl_estimator_needs_logits,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)

T = torch.tensor

# x = log pi - log pi_ref at two tokens: x = [ln 2, -ln 2]
LOGP = T([[math.log(2.0), 0.0]])
REF = T([[0.0, math.log(2.0)]])


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("kl", [math.log(2), -math.log(2)]),  # k1 = x
        ("k1", [math.log(2), -math.log(2)]),
        ("abs", [math.log(2), math.log(2)]),  # |x|
        ("mse", [0.5 * math.log(2) ** 2] * 2),  # x^2/2 = 0.240227
        ("k2", [0.5 * math.log(2) ** 2] * 2),
        # k3 = e^{-x} + x - 1: x = ln2 -> 1/2 + 0.693147 - 1 = 0.193147
        #                      x = -ln2 -> 2 - 0.693147 - 1 = 0.306853
        ("low_var_kl", [0.5 + math.log(2) - 1, 2 - math.log(2) - 1]),
        ("k3", [0.5 + math.log(2) - 1, 2 - math.log(2) - 1]),
    ],
)
def test_estimators_hand_values(name: str, expected: list[float]) -> None:
    torch.testing.assert_close(kl_penalty(LOGP, REF, name), T([expected]))
    # the straight-through variant has the same forward value
    torch.testing.assert_close(kl_penalty(LOGP, REF, name + "+"), T([expected]))


@pytest.mark.parametrize("name", ["kl+", "k1+", "abs+", "low_var_kl+", "k3+", "k2+", "mse+"])
def test_straight_through_has_k2_gradient(name: str) -> None:
    logp = LOGP.clone().requires_grad_(True)
    kl_penalty(logp, REF, name).sum().backward()
    # d/dx (x^2/2) = x = [ln2, -ln2]
    torch.testing.assert_close(logp.grad, T([[math.log(2), -math.log(2)]]))


def test_k3_clamps_and_nonnegative() -> None:
    logp = torch.linspace(-1e4, 50, 101).reshape(1, -1)
    ref = torch.zeros_like(logp)
    k3 = kl_penalty(logp, ref, "k3")
    assert torch.isfinite(k3).all()
    assert (k3 >= 0).all() and (k3 <= 10).all()
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1000, generator=g) * 5, torch.randn(1000, generator=g) * 5
    assert (kl_penalty(a, b, "k3") >= 0).all()


@pytest.mark.parametrize("name", [n for n in KL_ESTIMATORS.names() if n != "full"])
def test_estimators_finite_for_very_negative_logprobs(name: str) -> None:
    logp = T([[-1e4, 0.0, -30.0]], requires_grad=True)
    ref = T([[0.0, -1e4, -1e4]])
    out = kl_penalty(logp, ref, name)
    out.sum().backward()
    assert torch.isfinite(logp.grad).all()
    if name not in ("kl", "k1", "abs", "mse", "k2", "kl+", "k1+", "abs+", "mse+", "k2+"):
        assert torch.isfinite(out).all()


def test_full_registry_entry_explains_logits() -> None:
    assert kl_estimator_needs_logits("full")
    assert not kl_estimator_needs_logits("k3")
    with pytest.raises(KLNeedsLogitsError, match="full_kl_from_logits"):
        kl_penalty(LOGP, REF, "full")


def test_full_kl_matches_torch_distributions() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 4, 11, generator=g) * 2
    ref = torch.randn(3, 4, 11, generator=g) * 2
    expected = kl_divergence(Categorical(logits=logits), Categorical(logits=ref))
    for chunk in (1, 5, 4096):  # chunking must not change the result
        torch.testing.assert_close(full_kl_from_logits(logits, ref, chunk_size=chunk), expected)
    # temperature divides both models' logits
    expected_t = kl_divergence(Categorical(logits=logits / 0.7), Categorical(logits=ref / 0.7))
    torch.testing.assert_close(full_kl_from_logits(logits, ref, temperature=0.7), expected_t)
    mask = torch.ones(3, 4)
    mask[1, 2:] = 0
    out = full_kl_from_logits(logits, ref, mask)
    assert (out[1, 2:] == 0).all()
    torch.testing.assert_close(out[0], expected[0])


def test_full_kl_gradient_matches_brute_force_and_handles_zero_probs() -> None:
    g = torch.Generator().manual_seed(2)
    a = torch.randn(2, 3, 7, generator=g, requires_grad=True)
    ref = torch.randn(2, 3, 7, generator=g)
    full_kl_from_logits(a, ref, chunk_size=2).sum().backward()
    b = a.detach().clone().requires_grad_(True)
    kl_divergence(Categorical(logits=b), Categorical(logits=ref)).sum().backward()
    torch.testing.assert_close(a.grad, b.grad)
    # a token with probability exactly 0 under pi contributes 0 (no 0 * inf = NaN)
    logits = T([[[0.0, float("-inf"), 1.0]]])
    ref_logits = T([[[0.0, float("-inf"), 0.0]]])
    assert torch.isfinite(full_kl_from_logits(logits, ref_logits)).all()


def test_full_kl_chunked_over_the_vocabulary_matches_torch_distributions() -> None:
    """Vocabulary chunks of 3 (and 1) over 11 tokens: the same values, and the same
    gradients for both models' logits, as torch.distributions on the whole vocabulary."""
    g = torch.Generator().manual_seed(4)
    a = (torch.randn(2, 3, 11, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    r = (torch.randn(2, 3, 11, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    for vchunk in (1, 3, 11):
        got = full_kl_from_logits(a, r, temperature=0.8, chunk_size=4, vocab_chunk_size=vchunk)
        ga, gr = torch.autograd.grad(got.sum(), (a, r))
        b, q = a.detach().clone().requires_grad_(True), r.detach().clone().requires_grad_(True)
        want = kl_divergence(Categorical(logits=b / 0.8), Categorical(logits=q / 0.8))
        wa, wr = torch.autograd.grad(want.sum(), (b, q))
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(ga, wa)
        torch.testing.assert_close(gr, wr)


def test_k3_is_unbiased_and_close_to_full_for_nearby_distributions() -> None:
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 50, generator=g)
    ref = logits + 0.1 * torch.randn(5, 50, generator=g)  # a nearby reference policy
    full = full_kl_from_logits(logits, ref)  # (5,)
    logp_all = torch.log_softmax(logits, -1)
    logq_all = torch.log_softmax(ref, -1)
    # exact expectation of k3 under pi equals the full KL: sum_y p(y) k3(y) = KL(p || q)
    k3_all = kl_penalty(logp_all, logq_all, "k3")
    torch.testing.assert_close((logp_all.exp() * k3_all).sum(-1), full, rtol=1e-4, atol=1e-6)
    # Monte Carlo: the mean of k3 over sampled tokens approaches the full KL
    y = torch.multinomial(logp_all.exp(), 20000, replacement=True, generator=g)
    k3 = kl_penalty(logp_all.gather(1, y), logq_all.gather(1, y), "k3")
    torch.testing.assert_close(k3.mean(-1), full, rtol=0.1, atol=1e-4)
    assert (k3 >= 0).all()
    # and k3 is much closer to the KL than k1 on single samples (low variance)
    k1 = kl_penalty(logp_all.gather(1, y), logq_all.gather(1, y), "k1")
    assert k3.var() < k1.var()


# ----------------------------------------------------------------------------- reward / loss


def test_apply_kl_penalty_in_reward() -> None:
    scores = T([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    old = T([[0.5, 0.2, 0.1], [0.3, 0.3, 9.0]])
    ref = T([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rewards, kld, current = apply_kl_penalty(
        scores, old, ref, mask, kl_coef=0.1, kl_penalty_name="kl"
    )
    # k1 = old - ref; r = score - 0.1 * k1 on valid tokens; the padding KL (9.0) is masked out
    torch.testing.assert_close(rewards, T([[-0.05, -0.02, 0.99], [-0.03, 1.97, 0.0]]))
    torch.testing.assert_close(kld, T([[0.5, 0.2, 0.1], [0.3, 0.3, 0.0]]))
    # per-sequence means: (0.5+0.2+0.1)/3 = 0.266667, (0.3+0.3)/2 = 0.3 -> mean 0.283333
    assert current.item() == pytest.approx((0.8 / 3 + 0.3) / 2, rel=1e-6)


def test_kl_loss_aggregates_estimator() -> None:
    logp = T([[math.log(2.0), 0.0]], requires_grad=True)
    mask = torch.ones(1, 2)
    loss, m = kl_loss(logp, REF, mask, LossAggregator.from_mask("token-mean", mask), "low_var_kl")
    # mean of k3 values = (0.193147 + 0.306853)/2 = 0.25
    assert loss.item() == pytest.approx(0.25, rel=1e-6)
    assert m["kl_loss"].item() == pytest.approx(0.25, rel=1e-6)


# ----------------------------------------------------------------------------- controllers


def test_fixed_controller() -> None:
    c = make_kl_controller("fixed", kl_coef=0.05)
    assert isinstance(c, FixedKLController)
    c.update(current_kl=10.0, n_steps=256)
    assert c.value == 0.05


def test_adaptive_controller_hand_values() -> None:
    c = make_kl_controller("adaptive", kl_coef=0.1, target_kl=0.1, horizon=1000)
    assert isinstance(c, AdaptiveKLController)
    # KL 0.15: error = clip(0.15/0.1 - 1, -0.2, 0.2) = 0.2; beta *= 1 + 0.2*100/1000 = 1.02
    c.update(0.15, 100)
    assert c.value == pytest.approx(0.102)
    # KL 0.09: error = -0.1; beta *= 1 - 0.1*500/1000 = 0.95 -> 0.0969
    c.update(0.09, 500)
    assert c.value == pytest.approx(0.102 * 0.95)
    state = c.state_dict()
    d = make_kl_controller("adaptive", kl_coef=1.0, target_kl=0.1, horizon=1000)
    d.load_state_dict(state)
    assert d.value == c.value
    with pytest.raises(ValueError, match="target_kl"):
        make_kl_controller("adaptive", kl_coef=0.1, target_kl=None)
    with pytest.raises(KeyError, match="did you mean 'adaptive'"):
        make_kl_controller("adaptve", kl_coef=0.1)
    assert KL_CONTROLLERS.names() == ["adaptive", "fixed"]
