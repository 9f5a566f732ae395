"""Log-probs of chosen tokens and entropy from logits (chunked)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import Categorical

from temper.algorithms import (
    entropy_from_logits,
    logprobs_and_entropy,
    logprobs_from_logits,
    response_logprobs_from_sequence_logits,
    sum_pi_squared_from_logits,
)

T = torch.tensor


def test_logprobs_hand_values() -> None:
    # logits [0, ln 3] -> p = [1/4, 3/4]; labels [1, 0]
    logits = T([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    out = logprobs_from_logits(logits, T([[1, 0]]))
    torch.testing.assert_close(out, T([[math.log(0.75), math.log(0.25)]]))
    # temperature 2: logits [0, ln3/2] -> p ∝ [1, sqrt 3]: log p1 = ln(sqrt3/(1+sqrt3))
    out = logprobs_from_logits(logits, T([[1, 0]]), temperature=2.0)
    s3 = math.sqrt(3.0)
    torch.testing.assert_close(out, T([[math.log(s3 / (1 + s3)), math.log(1 / (1 + s3))]]))


def test_logprobs_match_log_softmax_and_chunking_is_invisible() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 17, generator=g, requires_grad=True)
    labels = torch.randint(0, 17, (3, 5), generator=g)
    ref = torch.log_softmax(logits.detach(), -1).gather(-1, labels[..., None]).squeeze(-1)
    grads = []
    for chunk in (1, 4, 7, 4096):
        logits.grad = None
        out = logprobs_from_logits(logits, labels, chunk_size=chunk)
        torch.testing.assert_close(out, ref)
        out.sum().backward()
        grads.append(logits.grad.clone())
    for gr in grads[1:]:
        torch.testing.assert_close(gr, grads[0])


def test_logprobs_bf16_upcast_and_extreme_logits() -> None:
    logits = T([[[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]]]).to(torch.bfloat16)
    out = logprobs_from_logits(logits, T([[1, 2]]))
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    # bf16 rounds 1e4 to 9984: log p = -2*9984 = -19968, very negative but finite
    assert out[0, 0].item() == pytest.approx(-19968.0)
    assert out[0, 1].item() == pytest.approx(-math.log(3.0), rel=1e-2)


def test_response_alignment_off_by_one() -> None:
    # a "model" whose logits at position p put all mass on token input_ids[p+1]
    input_ids = T([[5, 1, 2, 3, 4]])  # prompt [5, 1], response [2, 3, 4]
    V = 6
    logits = torch.full((1, 5, V), -30.0)
    for p in range(4):
        logits[0, p, input_ids[0, p + 1]] = 30.0
    out = response_logprobs_from_sequence_logits(logits, input_ids, response_len=3)
    assert out.shape == (1, 3)
    assert (out > -1e-6).all(), "each response token must be scored by the previous position"
    # the unshifted (wrong) alignment scores them as impossible
    # (the last position has uniform logits, so only the first two are checked)
    wrong = logprobs_from_logits(logits[:, 2:], input_ids[:, 2:])
    assert (wrong[:, :2] < -50).all()
    with pytest.raises(ValueError):
        response_logprobs_from_sequence_logits(logits, input_ids, response_len=5)


def test_entropy_matches_torch_distributions() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 13, generator=g) * 3
    expected = Categorical(logits=logits).entropy()
    for chunk in (1, 5, 4096):
        torch.testing.assert_close(entropy_from_logits(logits, chunk_size=chunk), expected)
    torch.testing.assert_close(
        entropy_from_logits(logits, temperature=0.5), Categorical(logits=logits / 0.5).entropy()
    )
    # hand values: uniform over 4 -> ln 4; one-hot (very peaked) -> ~0, no NaN
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4))
    peaked = entropy_from_logits(T([1e4, -1e4, -1e4]))
    assert torch.isfinite(peaked) and peaked.item() == pytest.approx(0.0, abs=1e-6)


def test_entropy_gradient_chunked_equals_unchunked() -> None:
    g = torch.Generator().manual_seed(2)
    a = torch.randn(4, 9, generator=g, requires_grad=True)
    b = a.detach().clone().requires_grad_(True)
    entropy_from_logits(a, chunk_size=1).sum().backward()
    Categorical(logits=b).entropy().sum().backward()
    torch.testing.assert_close(a.grad, b.grad)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(torch.zeros(2, 3), temperature=0.0)
    with pytest.raises(ValueError, match="labels"):
        logprobs_from_logits(torch.zeros(2, 3, 4), torch.zeros(2, 2, dtype=torch.long))
    # an empty batch gives an empty result
    assert logprobs_from_logits(
        torch.zeros(0, 3, 4), torch.zeros(0, 3, dtype=torch.long)
    ).shape == (0, 3)


def test_zero_rows_stay_on_the_graph() -> None:
    """A micro-batch with no scored token: log-probs and entropy are empty but still
    backpropagate (DeepSpeed refuses a loss without grad_fn)."""
    w = torch.randn(3, 5, requires_grad=True)
    logits = (torch.randn(2, 4, 3) @ w)[torch.zeros(2, 4, dtype=torch.bool)]  # (0, 5)
    lp = logprobs_from_logits(logits, torch.zeros(0, dtype=torch.long))
    ent = entropy_from_logits(logits)
    assert lp.shape == ent.shape == (0,)
    (lp.sum() + ent.sum()).backward()
    assert torch.equal(w.grad, torch.zeros_like(w))


def _reference(logits: torch.Tensor, labels: torch.Tensor, tau: float):
    """Plain autograd: log-softmax, gather, and the entropy from it."""
    lp = torch.log_softmax(logits.double() / tau, dim=-1)
    return lp.gather(-1, labels[..., None]).squeeze(-1), -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 3, 2048])
@pytest.mark.parametrize("which", ["both", "logp", "entropy"])
def test_fused_logprobs_and_entropy_values_and_gradients(
    tau: float, chunk: int, which: str
) -> None:
    """The fused pass gives the plain autograd values and gradients, for each output's
    gradient alone and both together, at every chunking (fp64, so exact to 1e-12)."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 5, 11, generator=g, dtype=torch.float64) * 3).requires_grad_()
    labels = torch.randint(0, 11, (2, 5), generator=g)
    w_lp = torch.randn(2, 5, generator=g, dtype=torch.float64)
    w_h = torch.randn(2, 5, generator=g, dtype=torch.float64)

    def loss(lp: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return {"both": (w_lp * lp).sum() + (w_h * h).sum(), "logp": (w_lp * lp).sum()}.get(
            which, (w_h * h).sum()
        )

    lp, h = logprobs_and_entropy(logits, labels, temperature=tau, chunk_size=chunk)
    (got,) = torch.autograd.grad(loss(lp, h), logits)
    ref_lp, ref_h = _reference(logits, labels, tau)
    (want,) = torch.autograd.grad(loss(ref_lp, ref_h), logits)
    torch.testing.assert_close(lp, ref_lp, atol=1e-12, rtol=0)
    torch.testing.assert_close(h, ref_h, atol=1e-12, rtol=0)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)


def test_fused_hand_values() -> None:
    """Two equal logits and a third at -inf-ish: p = (1/2, 1/2, 0), H = ln 2; the
    gradient of log p(y=0) is onehot − p = (1/2, −1/2, 0)."""
    logits = torch.tensor([[0.0, 0.0, -1e4]], dtype=torch.float64, requires_grad=True)
    lp, h = logprobs_and_entropy(logits, torch.tensor([0]))
    assert lp.item() == pytest.approx(-math.log(2), abs=1e-12)
    assert h.item() == pytest.approx(math.log(2), abs=1e-12)
    lp.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[0.5, -0.5, 0.0]], dtype=torch.float64))


def test_fused_log_probs_are_bit_identical_and_bf16_gradients_stay_bf16() -> None:
    """fp32: the fused log-probs equal logprobs_from_logits bit for bit and the entropy
    is at least as close to the fp64 value as entropy_from_logits'; bf16 logits: fp32 outputs, a bf16 gradient that
    matches the fp32 computation to bf16 precision."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(37, 300, generator=g) * 4
    labels = torch.randint(0, 300, (37,), generator=g)
    lp, h = logprobs_and_entropy(logits, labels, temperature=0.9, chunk_size=8)
    assert torch.equal(lp, logprobs_from_logits(logits, labels, temperature=0.9, chunk_size=8))
    exact = entropy_from_logits(logits.double(), temperature=0.9)
    plain = entropy_from_logits(logits, temperature=0.9)  # lse − Σ p c: cancels in fp32
    assert (h.double() - exact).abs().max() <= (plain.double() - exact).abs().max()
    torch.testing.assert_close(h.double(), exact, atol=1e-5, rtol=0)
    low = logits.bfloat16().requires_grad_()
    lp16, h16 = logprobs_and_entropy(low, labels, chunk_size=8)
    assert lp16.dtype == h16.dtype == torch.float32
    (lp16.sum() + h16.sum()).backward()
    assert low.grad is not None and low.grad.dtype == torch.bfloat16
    full = low.detach().float().requires_grad_()
    lp32, h32 = logprobs_and_entropy(full, labels, chunk_size=8)
    (lp32.sum() + h32.sum()).backward()
    torch.testing.assert_close(low.grad.float(), full.grad, atol=2e-2, rtol=2e-2)


def test_fused_detached_entropy_and_zero_rows() -> None:
    """A detached entropy (the metric) leaves the log-prob gradient as it is; zero rows
    give (0,)-shaped outputs that still backpropagate."""
    logits = torch.randn(4, 9, requires_grad=True)
    labels = torch.randint(0, 9, (4,))
    lp, h = logprobs_and_entropy(logits, labels)
    assert not h.detach().requires_grad
    lp.sum().backward()
    ref = logits.detach().clone().requires_grad_()
    logprobs_from_logits(ref, labels).sum().backward()
    torch.testing.assert_close(logits.grad, ref.grad)
    empty = torch.zeros(0, 9, requires_grad=True)
    lp0, h0 = logprobs_and_entropy(empty, torch.zeros(0, dtype=torch.long))
    assert lp0.shape == h0.shape == (0,)
    (lp0.sum() + h0.sum()).backward()
    assert empty.grad is not None and empty.grad.shape == (0, 9)


def test_sum_pi_squared_hand_values() -> None:
    """Σ_v π_v²: logits (0, ln 3) give π = (1/4, 3/4), 1/16 + 9/16 = 5/8; at τ = 2,
    π ∝ (1, √3), (1 + 3)/(1 + √3)² = 2/(2 + √3); uniform over 4 tokens, 1/4; one token
    far ahead (logit 1e4, no overflow), 1."""
    logits = T([[0.0, math.log(3.0)], [0.0, 0.0], [1e4, 0.0]])
    got = sum_pi_squared_from_logits(logits)
    torch.testing.assert_close(got, T([0.625, 0.5, 1.0]))
    tempered = sum_pi_squared_from_logits(logits[:1], temperature=2.0)
    torch.testing.assert_close(tempered, T([2.0 / (2.0 + math.sqrt(3.0))]))
    torch.testing.assert_close(sum_pi_squared_from_logits(torch.zeros(1, 4)), T([0.25]))


def test_sum_pi_squared_matches_softmax_chunked_and_in_bf16() -> None:
    """Chunking is invisible; bf16 logits are upcast; leading dims are kept; no graph."""
    logits = torch.randn(3, 7, 50, generator=torch.Generator().manual_seed(3)) * 3
    want = (torch.softmax(logits / 0.6, dim=-1) ** 2).sum(-1)
    for chunk in (1, 5, 4096):
        got = sum_pi_squared_from_logits(logits, temperature=0.6, chunk_size=chunk)
        torch.testing.assert_close(got, want)
    half = sum_pi_squared_from_logits(logits.bfloat16(), temperature=0.6)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, want, atol=2e-2, rtol=2e-2)
    grad = sum_pi_squared_from_logits(logits.requires_grad_(), temperature=0.6)
    assert not grad.requires_grad
    assert sum_pi_squared_from_logits(torch.zeros(0, 5)).shape == (0,)


def test_fused_chunks_on_a_cpu_are_a_few_mb_of_at_least_32_rows() -> None:
    from temper.algorithms.logprobs import fused_chunk_rows

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert fused_chunk_rows(49152, cpu) == 64  # SmolLM2: 12 MB of fp32 per chunk
    assert fused_chunk_rows(151936, cpu) == 32  # Qwen: the row floor, not 20 rows
    assert fused_chunk_rows(151936, cuda) == 64 * 2**20 // 151936
    assert fused_chunk_rows(0, cpu) == 3 * 2**20  # no vocabulary: no division by zero
