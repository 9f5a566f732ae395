"""Log-probabilities, entropy, exact KL and Σπ² from logits, chunked for large vocabularies.

Logits are ``(..., V)``; every function flattens the leading dims to ``N`` rows and works
on ``chunk_size`` rows at a time, upcasting each chunk to fp32, so a 150k vocabulary
never materializes a full ``(N, V)`` fp32 log-softmax copy for bf16/fp16 logits (peak extra memory is
``chunk_size × V`` fp32). ``temperature`` divides the logits first (the same temperature
the rollout engine sampled with, so train log-probs match rollout log-probs).
"""

from __future__ import annotations

import torch
from torch import Tensor

DEFAULT_CHUNK = 2048


def _rows(x: Tensor) -> Tensor:
    return x.reshape(-1, x.shape[-1])


def _scaled(chunk: Tensor, temperature: float) -> Tensor:
    # upcast half precision to fp32; fp32/fp64 stay as they are
    c = chunk if chunk.dtype in (torch.float32, torch.float64) else chunk.float()
    return c / temperature if temperature != 1.0 else c


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _empty(flat: Tensor) -> Tensor:
    """The ``(0,)`` result of zero rows, still attached to ``flat``'s graph: a loss over
    no scored token must backpropagate (zeros), not lose its ``grad_fn``."""
    return flat.sum(dim=-1).float()


def logprobs_from_logits(
    logits: Tensor,
    labels: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
) -> Tensor:
    """Log-probability of each chosen token.

    Shapes: ``logits (..., V)``, ``labels (...)`` int64 -> ``(...)`` fp32.
    Formula: ``log p(y) = l_y/τ - logsumexp(l/τ)``, computed per chunk of rows with
    ``gather`` and ``logsumexp`` (no full log-softmax). Labels must already be aligned
    with the logits (``logits[t]`` scores ``labels[t]``); see
    :func:`response_logprobs_from_sequence_logits` for the shift.
    """
    _check_temperature(temperature)
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    flat, lab = _rows(logits), labels.reshape(-1, 1).long()
    out = []
    for i in range(0, flat.shape[0], chunk_size):
        c = _scaled(flat[i : i + chunk_size], temperature)
        out.append(c.gather(-1, lab[i : i + chunk_size]).squeeze(-1) - torch.logsumexp(c, dim=-1))
    res = torch.cat(out) if out else _empty(flat)
    return res.reshape(labels.shape)


def response_logprobs_from_sequence_logits(
    logits: Tensor,
    input_ids: Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
) -> Tensor:
    """Log-probs of the response tokens from a causal LM's full-sequence logits.

    Shapes: ``logits (B, L, V)``, ``input_ids (B, L)`` = prompt (left-padded) followed by
    the response (right-padded) of length ``response_len`` -> ``(B, response_len)``.
    Alignment: the logits at position ``p`` predict token ``p+1``, so the response tokens
    ``input_ids[:, L-R:]`` are scored by ``logits[:, L-R-1 : L-1]``.
    """
    L = input_ids.shape[1]
    R = response_len
    if not 0 < R < L:
        raise ValueError(f"response_len must be in [1, {L - 1}], got {R}")
    return logprobs_from_logits(
        logits[:, L - R - 1 : L - 1],
        input_ids[:, L - R :],
        temperature=temperature,
        chunk_size=chunk_size,
    )


def entropy_from_logits(
    logits: Tensor, *, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK
) -> Tensor:
    """Entropy of the categorical distribution of each row.

    Shapes: ``logits (..., V) -> (...)`` fp32.
    Formula: ``H = logsumexp(l) - Σ_v softmax(l)_v l_v`` (with ``l`` divided by ``τ``),
    chunked over rows. Differentiable.
    """
    _check_temperature(temperature)
    flat = _rows(logits)
    out = []
    for i in range(0, flat.shape[0], chunk_size):
        c = _scaled(flat[i : i + chunk_size], temperature)
        p = torch.softmax(c, dim=-1)
        out.append(torch.logsumexp(c, dim=-1) - (p * c).sum(dim=-1))
    res = torch.cat(out) if out else _empty(flat)
    return res.reshape(logits.shape[:-1])


@torch.no_grad()
def sum_pi_squared_from_logits(
    logits: Tensor, *, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK
) -> Tensor:
    """Collision probability ``Σ_v π_v²`` of the categorical distribution of each row,
    the input of the optimal-token-baseline estimators (their path weight
    ``w = 1 − 2π(y) + Σ_v π_v²``).

    Shapes: ``logits (..., V) -> (...)`` fp32 (fp64 stays fp64).
    Formula: with ``l`` the logits divided by ``τ`` (the same temperature as the
    log-probs) and ``e_v = exp(l_v − max l)``, ``Σ_v π_v² = Σ_v e_v² / (Σ_v e_v)²`` —
    verl's ``exp(logsumexp(2l) − 2·logsumexp(l))`` with one exponential instead of two
    (``e ≤ 1`` and ``Σ e ≥ 1``: no overflow). Chunked over rows: one fp32
    ``(chunk, V)`` temporary at a time, nothing ``(N, V)``. No gradient: the estimators
    read it as data.
    """
    _check_temperature(temperature)
    flat = _rows(logits)
    out = []
    for i in range(0, flat.shape[0], chunk_size):
        c = _scaled(flat[i : i + chunk_size], temperature)
        e = (c - c.max(dim=-1, keepdim=True).values).exp_()
        total = e.sum(dim=-1)
        out.append(torch.linalg.vecdot(e, e) / (total * total))
    res = torch.cat(out) if out else flat.new_zeros(0, dtype=_work_dtype(flat))
    return res.reshape(logits.shape[:-1])


# Elements of one fp32 chunk of the fused pass, and the fewest rows a chunk takes. On a
# CPU, chunks of a few MB ran faster than chunks of tens of MB (every temporary of a chunk
# is memory the allocator hands out afresh), while the row reductions (logsumexp, the
# entropy's dot product) slow down below a few dozen rows (benchmarks/logprob_entropy.py
# --chunk). On a GPU chunks are large enough that kernel launches do not dominate.
FUSED_CHUNK_ELEMENTS = {"cpu": 3 * 2**20, "cuda": 64 * 2**20}
FUSED_CHUNK_MIN_ROWS = {"cpu": 32, "cuda": 1}


def fused_chunk_rows(vocab: int, device: torch.device) -> int:
    """Rows per chunk of :func:`logprobs_and_entropy` when the config leaves it open."""
    budget = FUSED_CHUNK_ELEMENTS.get(device.type, FUSED_CHUNK_ELEMENTS["cuda"])
    least = FUSED_CHUNK_MIN_ROWS.get(device.type, FUSED_CHUNK_MIN_ROWS["cuda"])
    return max(least, budget // max(1, vocab))


def logprobs_and_entropy(
    logits: Tensor,
    labels: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
) -> tuple[Tensor, Tensor]:
    """Log-probability of each chosen token and the entropy of each row, from one pass.

    Shapes: ``logits (..., V)``, ``labels (...)`` int64 -> two ``(...)`` fp32 tensors,
    both differentiable (``.detach()`` the entropy when it is only a metric: its gradient
    pass is then skipped).
    Formulas, with ``c = l/τ``, ``lse = logsumexp(c)``, ``p = softmax(c)``:
    ``log p(y) = c_y − lse``; ``H = −Σ_v p_v (c_v − lse)``;
    ``∂log p(y)/∂c = onehot(y) − p``; ``∂H/∂c = −p (c − lse + H)``.

    The same numbers as :func:`logprobs_from_logits` (bit-identical log-probs) and
    :func:`entropy_from_logits`, but the autograd graph keeps only the logits (which the
    LM head's backward holds anyway) and two floats per row: no fp32 copy of bf16 logits,
    no log-softmax or softmax of the whole ``(N, V)`` block survives the forward. The
    backward recomputes ``p`` ``chunk_size`` rows at a time and writes the logits' gradient
    in place, so the only ``(N, V)`` buffer it makes is the gradient itself.
    """
    _check_temperature(temperature)
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match labels {tuple(labels.shape)}")
    flat, lab = _rows(logits), labels.reshape(-1).long()
    if flat.shape[0] == 0:
        empty = _empty(flat)
        return empty.reshape(labels.shape), empty.reshape(labels.shape)
    log_p, entropy = _LogProbEntropy.apply(flat, lab, temperature, chunk_size)
    return log_p.reshape(labels.shape), entropy.reshape(labels.shape)


class _LogProbEntropy(torch.autograd.Function):
    """Rows ``(N, V)`` and labels ``(N,)`` -> (log-probs, entropy), chunked over rows."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        logits: Tensor,
        labels: Tensor,
        temperature: float,
        step: int,
    ) -> tuple[Tensor, Tensor]:
        n = logits.shape[0]
        work = _work_dtype(logits)
        lse = torch.empty(n, dtype=work, device=logits.device)
        log_p = torch.empty(n, dtype=work, device=logits.device)
        entropy = torch.empty(n, dtype=work, device=logits.device)
        for i in range(0, n, step):
            rows = slice(i, i + step)
            c = _scaled(logits[rows], temperature)
            lse[rows] = torch.logsumexp(c, dim=-1)
            # the same two ops as logprobs_from_logits, so the log-probs are bit-identical
            log_p[rows] = c.gather(-1, labels[rows, None]).squeeze(-1) - lse[rows]
            log_softmax = c - lse[rows, None]
            # H = −Σ_v p_v log p_v as a batched dot product (no (rows, V) product
            # temporary); on the log-softmax, not lse − Σ p c, which cancels in fp32
            entropy[rows] = -torch.einsum("nv,nv->n", log_softmax.exp(), log_softmax)
        ctx.save_for_backward(logits, labels, lse, entropy)
        ctx.temperature, ctx.step = temperature, step  # type: ignore[attr-defined]
        ctx.set_materialize_grads(False)
        return log_p, entropy

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, g_logp: Tensor | None, g_ent: Tensor | None
    ) -> tuple[Tensor | None, None, None, None]:
        logits, labels, lse, entropy = ctx.saved_tensors  # type: ignore[attr-defined]
        tau, step = ctx.temperature, ctx.step  # type: ignore[attr-defined]
        if g_logp is None and g_ent is None:
            return None, None, None, None
        grad = torch.empty_like(logits)
        in_place = grad.dtype == lse.dtype  # fp32 logits: build each chunk inside ``grad``
        for i in range(0, logits.shape[0], step):
            rows = slice(i, i + step)
            c = _scaled(logits[rows], tau)
            # g = −p · (g_ent (c − lse + H) + g_logp), then + g_logp at the label
            g = grad[rows] if in_place else torch.empty_like(c)
            torch.sub(c, lse[rows, None], out=g)
            p = g.exp()
            if g_ent is not None:
                g.add_(entropy[rows, None]).mul_(g_ent[rows, None].to(g.dtype))
                if g_logp is not None:
                    g.add_(g_logp[rows, None].to(g.dtype))
            else:
                g.copy_(g_logp[rows, None].to(g.dtype).expand_as(g))  # type: ignore[index]
            g.mul_(p).neg_()
            if g_logp is not None:
                g.scatter_add_(-1, labels[rows, None], g_logp[rows, None].to(g.dtype))
            if tau != 1.0:
                g.div_(tau)
            if not in_place:
                grad[rows] = g
        return grad, None, None, None


DEFAULT_VOCAB_CHUNK = 8192


def full_kl_from_logits(
    logits: Tensor,
    ref_logits: Tensor,
    mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    vocab_chunk_size: int = DEFAULT_VOCAB_CHUNK,
) -> Tensor:
    """Exact KL(π_θ ‖ π_ref) over the vocabulary at each position (``kl_penalty: full``).

    Shapes: ``logits, ref_logits (..., V)``, ``mask (...)`` optional -> ``(...)`` fp32,
    0 where ``mask`` is 0.
    Formula: ``KL = Σ_v p_v (log p_v - log q_v)`` with ``p = softmax(l/τ)``,
    ``q = softmax(l_ref/τ)``; terms with ``p_v = 0`` are 0. Same direction as the ``k1``/
    ``k3`` sample estimators (which estimate it from the sampled token only). verl raises
    ``NotImplementedError`` for ``full``; ROLL computes it unchunked.

    Memory stays bounded: rows go ``chunk_size`` at a time and the vocabulary
    ``vocab_chunk_size`` columns at a time (two passes: the log-normalizers, then the sum),
    forward *and* backward — a custom autograd function recomputes the softmax chunk by
    chunk for the gradient ``∂KL/∂(l_j/τ) = p_j (log p_j − log q_j − KL)`` (and
    ``q_j − p_j`` for the reference's logits) instead of keeping ``(N, V)`` intermediates.
    """
    _check_temperature(temperature)
    if logits.shape != ref_logits.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and ref_logits {tuple(ref_logits.shape)} differ"
        )
    flat, ref = _rows(logits), _rows(ref_logits)
    out = [
        _FullKL.apply(
            flat[i : i + chunk_size], ref[i : i + chunk_size], temperature, vocab_chunk_size
        )
        for i in range(0, flat.shape[0], chunk_size)
    ]
    res = torch.cat(out) if out else _empty(flat)
    res = res.reshape(logits.shape[:-1])
    if mask is not None:
        res = torch.where(mask > 0, res, torch.zeros_like(res))
    return res


def _work_dtype(x: Tensor) -> torch.dtype:
    """fp64 stays fp64; everything else is computed in fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _log_normalizer(x: Tensor, temperature: float, step: int) -> Tensor:
    """``logsumexp(x/τ)`` over the last dim ``(N, V) -> (N,)``, ``step`` columns at a time."""
    lse = torch.full(x.shape[:1], float("-inf"), dtype=_work_dtype(x), device=x.device)
    for v in range(0, x.shape[-1], step):
        lse = torch.logaddexp(lse, torch.logsumexp(_scaled(x[:, v : v + step], temperature), -1))
    return lse


class _FullKL(torch.autograd.Function):
    """Row-wise exact KL of two logit matrices ``(N, V)``, chunked over the vocabulary."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        logits: Tensor,
        ref_logits: Tensor,
        temperature: float,
        step: int,
    ) -> Tensor:
        lse_p = _log_normalizer(logits, temperature, step)
        lse_q = _log_normalizer(ref_logits, temperature, step)
        kl = torch.zeros(logits.shape[:1], dtype=_work_dtype(logits), device=logits.device)
        for v in range(0, logits.shape[-1], step):
            lp = _scaled(logits[:, v : v + step], temperature) - lse_p[:, None]
            lq = _scaled(ref_logits[:, v : v + step], temperature) - lse_q[:, None]
            p = lp.exp()
            kl += torch.where(p > 0, p * (lp - lq), torch.zeros_like(p)).sum(-1)
        ctx.save_for_backward(logits, ref_logits, lse_p, lse_q, kl)
        ctx.temperature, ctx.step = temperature, step  # type: ignore[attr-defined]
        return kl

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: Tensor
    ) -> tuple[Tensor | None, Tensor | None, None, None]:
        logits, ref_logits, lse_p, lse_q, kl = ctx.saved_tensors  # type: ignore[attr-defined]
        tau, step = ctx.temperature, ctx.step  # type: ignore[attr-defined]
        need_p, need_q = ctx.needs_input_grad[:2]  # type: ignore[attr-defined]
        grad_p = torch.zeros_like(logits) if need_p else None
        grad_q = torch.zeros_like(ref_logits) if need_q else None
        g = grad.to(kl.dtype)[:, None] / tau
        for v in range(0, logits.shape[-1], step):
            cols = slice(v, v + step)
            lp = _scaled(logits[:, cols], tau) - lse_p[:, None]
            lq = _scaled(ref_logits[:, cols], tau) - lse_q[:, None]
            p = lp.exp()
            if grad_p is not None:
                term = torch.where(p > 0, p * (lp - lq - kl[:, None]), torch.zeros_like(p))
                grad_p[:, cols] = (g * term).to(grad_p.dtype)
            if grad_q is not None:
                grad_q[:, cols] = (g * (lq.exp() - p)).to(grad_q.dtype)
        return grad_p, grad_q, None, None
