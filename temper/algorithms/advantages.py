"""Advantage estimators, registered under the ``adv_estimator`` config name.

One signature for all::

    fn(inp: AdvantageInputs, params: AdvantageParams) -> (advantages, returns)

Shapes: ``token_level_rewards``, ``response_mask``, ``values`` are ``(B, T)``; the group
index is ``(B,)``; outputs are ``(B, T)`` float and **0 on masked tokens**. Outcome
estimators use the sequence score ``s_i = Σ_t r_it`` (rewards on masked tokens are
ignored) and broadcast a scalar advantage over the valid tokens of the response.

Singleton groups (a prompt with one response): mean 0, std 1, i.e. no baseline — the
score passes through (verl's convention); ``grpo_passk`` needs ≥2 and raises.
Zero-length responses (all-masked rows) get all-zero advantages and returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from temper.algorithms.groups import GroupIndex, as_group_ids, group_stats
from temper.algorithms.masked import masked_whiten
from temper.registry import Registry


@dataclasses.dataclass
class AdvantageInputs:
    """Tensors an estimator may read.

    Attributes:
        token_level_rewards: ``(B, T)`` rewards (outcome reward on the last valid token,
            or dense/per-turn rewards), KL penalty already applied if any.
        response_mask: ``(B, T)`` 1 for tokens the policy generated (observation/tool
            tokens of a multi-turn response and padding are 0).
        group_index: ``(B,)`` LongTensor or sequence of hashable prompt ids (``uid``).
        values: ``(B, T)`` critic values, needed by ``gae``.
        baseline_rewards: ``(B,)`` reward of the greedy response, needed by ``remax``.
        reward_components: ``(B, K)`` the ``K`` named reward components of each sample
            (one column per ``algorithm.gdpo_reward_keys`` entry), needed by ``gdpo``.
        old_log_probs: ``(B, T)`` log-probs of the sampled tokens under the policy that
            generated them, needed by the optimal-token-baseline estimators.
        sum_pi_squared: ``(B, T)`` ``Σ_v π(v)²`` over the vocabulary at each response
            position, needed by the optimal-token-baseline estimators.
        rollout_is_weights: ``(B, T)`` truncated rollout importance weights ``ρ̄``; the
            optimal-token-baseline estimators scale their path weights by ``ρ̄²``.
        step_rewards: ``(B,)`` the environment's reward for the one env step a sample
            holds (a step-wise agentic sample), needed by ``gigpo``.
        episode_index: ``(B,)`` the episode each step sample belongs to, needed by ``gigpo``.
        step_index: ``(B,)`` the step's position in its episode (0 first), needed by ``gigpo``.
        anchor_index: ``(B,)`` the key of the environment state the step started from (its
            anchor state; equal keys = identical states), needed by ``gigpo``.
    """

    token_level_rewards: Tensor
    response_mask: Tensor
    group_index: GroupIndex | None = None
    values: Tensor | None = None
    baseline_rewards: Tensor | None = None
    reward_components: Tensor | None = None
    old_log_probs: Tensor | None = None
    sum_pi_squared: Tensor | None = None
    rollout_is_weights: Tensor | None = None
    step_rewards: Tensor | None = None
    episode_index: GroupIndex | None = None
    step_index: Tensor | None = None
    anchor_index: GroupIndex | None = None


@dataclasses.dataclass(frozen=True)
class AdvantageParams:
    """Scalars of the estimators (verl ``algorithm.*`` / ROLL top-level keys).

    Attributes:
        gamma: discount γ (``gae``, ``reinforce``, ``reinforce_plus_plus``).
        lam: GAE λ (verl ``lam``, ROLL ``lambd``).
        norm_adv_by_std_in_grpo: divide by the group std (GRPO); ``False`` is Dr. GRPO.
        epsilon: added to the std before dividing.
        gae_whiten: whiten GAE advantages over the batch inside the estimator (verl always
            does; ROLL does not and has a separate ``whiten_advantages`` key).
        gpg_f_norm: the ``F_norm`` divisor of GPG.
        reward_weights: GDPO's weight of each reward component (``None``: all 1).
        step_gamma: GiGPO's discount of step rewards into step returns (ROLL
            ``step_reward_gamma``).
        episode_weight: GiGPO's weight of the episode-level advantage (ROLL
            ``episode_reward_weight``).
        step_weight: GiGPO's weight ω of the step-level advantage (ROLL
            ``step_reward_weight``).
        sppo_beta: SPPO's soft-mean temperature ``β`` of the baseline (verl
            ``algorithm.sppo_eta``; 0 is the plain mean).
    """

    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    epsilon: float = 1e-6
    gae_whiten: bool = True
    gpg_f_norm: float = 1.0
    reward_weights: tuple[float, ...] | None = None
    step_gamma: float = 0.95
    episode_weight: float = 1.0
    step_weight: float = 1.0
    sppo_beta: float = 1.0


AdvantageFn = Callable[[AdvantageInputs, AdvantageParams], tuple[Tensor, Tensor]]


@dataclasses.dataclass(frozen=True)
class Estimator:
    """An advantage estimator and the optional inputs it needs, named as the fields of
    :class:`AdvantageInputs`: ``values`` (a critic's, so the run builds one),
    ``baseline_rewards`` (a greedy response's reward, which the RLVR producer generates),
    ``reward_components``, ``old_log_probs``, ``sum_pi_squared``, and the step-sample
    inputs ``step_rewards`` / ``episode_index`` / ``step_index`` / ``anchor_index`` (the
    agentic step-wise env manager gives them). The pipeline provides
    them on demand, never by name; a run whose pipeline cannot provide one is refused.
    ``reads`` names the :class:`AdvantageParams` fields that this estimator alone reads
    (``algorithm.<field>`` in the config), so a run that sets one for another estimator
    is refused rather than ignored."""

    fn: AdvantageFn
    needs: frozenset[str] = frozenset()
    reads: frozenset[str] = frozenset()


ADV_ESTIMATORS: Registry[Estimator] = Registry("adv_estimator")


def estimator(
    name: str,
    *aliases: str,
    needs: frozenset[str] = frozenset(),
    reads: frozenset[str] = frozenset(),
) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator registering an advantage function as estimator ``name`` (with its needs
    and the parameters only it reads)."""

    def register(fn: AdvantageFn) -> AdvantageFn:
        ADV_ESTIMATORS.add(name, Estimator(fn, needs, reads), *aliases)
        return fn

    return register


def _float(x: Tensor) -> Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _mask(inp: AdvantageInputs, like: Tensor) -> Tensor:
    return (inp.response_mask > 0).to(like.dtype)


def _scores(inp: AdvantageInputs) -> tuple[Tensor, Tensor]:
    r = _float(inp.token_level_rewards)
    m = _mask(inp, r)
    return (r * m).sum(dim=-1), m


def _need_index(inp: AdvantageInputs, name: str) -> GroupIndex:
    if inp.group_index is None:
        raise ValueError(f"adv_estimator {name!r} needs group_index (one prompt id per sample)")
    return inp.group_index


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """``G_t = r_t + γ·G_{t'}`` over valid tokens, ``t'`` the next *valid* token.

    Shapes ``(B, T) -> (B, T)``. Masked tokens carry the running return through unchanged
    (no discount, their reward ignored) and get 0. For a prefix mask (single-turn) this is
    ROLL's ``compute_reinforce_return`` exactly.
    """
    r = _float(rewards)
    m = (mask > 0).to(r.dtype)
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0]) if r.shape[1] else r.new_zeros(r.shape[0])
    for t in reversed(range(r.shape[1])):
        g = r[:, t] + gamma * running
        running = m[:, t] * g + (1 - m[:, t]) * running
        out[:, t] = g * m[:, t]
    return out


@estimator("gae", needs=frozenset({"values"}))
def gae(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438).

    ``δ_t = r_t + γ V_{t'} - V_t``, ``A_t = δ_t + γλ A_{t'}``, ``R_t = A_t + V_t``, where
    ``t'`` is the next *valid* token (``V, A`` past the end are 0). Masked tokens inside a
    response (tool/observation tokens) carry ``V`` and ``A`` through unchanged, so the
    result equals GAE on the response with those tokens deleted (verl's multi-turn GAE).
    Rewards on masked tokens are ignored. If ``params.gae_whiten`` (verl), advantages are
    whitened over the valid tokens of the batch. Needs ``inp.values``.
    """
    if inp.values is None:
        raise ValueError("adv_estimator 'gae' needs values (B, T) from the critic")
    r = _float(inp.token_level_rewards)
    v = _float(inp.values).to(r.dtype)
    m = _mask(inp, r)
    B, T = r.shape
    next_v = r.new_zeros(B)
    last = r.new_zeros(B)
    adv = torch.zeros_like(r)
    for t in reversed(range(T)):
        delta = r[:, t] + params.gamma * next_v - v[:, t]
        a = delta + params.gamma * params.lam * last
        next_v = m[:, t] * v[:, t] + (1 - m[:, t]) * next_v
        last = m[:, t] * a + (1 - m[:, t]) * last
        adv[:, t] = last
    returns = (adv + v) * m
    if params.gae_whiten and m.sum() > 0:
        adv = masked_whiten(adv, m)
    return adv * m, returns


@estimator("grpo")
def grpo(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, arXiv:2402.03300), verl's definition.

    ``A_i = (s_i - mean_g) / (std_g + ε)`` with the unbiased group std; with
    ``norm_adv_by_std_in_grpo=False`` ``A_i = s_i - mean_g`` (Dr. GRPO, arXiv:2503.20783).
    All-equal rewards give 0; singleton groups give ``s_i / (1 + ε)`` (mean 0, std 1).
    Broadcast over valid tokens; returns = advantages.
    """
    s, m = _scores(inp)
    st = group_stats(s, _need_index(inp, "grpo"))
    a = s - st.mean
    if params.norm_adv_by_std_in_grpo:
        a = a / (st.std + params.epsilon)
    adv = a.unsqueeze(-1) * m
    return adv, adv.clone()


@estimator("rloo")
def rloo(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, arXiv:2402.14740).

    ``A_i = s_i - (Σ_{j≠i} s_j)/(n-1) = n/(n-1)·(s_i - mean_g)``; singleton groups keep
    ``A_i = s_i`` (verl's ``rloo``). Broadcast over valid tokens; returns = advantages.
    """
    s, m = _scores(inp)
    st = group_stats(s, _need_index(inp, "rloo"))
    n = st.count
    a = torch.where(n > 1, (n * s - st.sum) / (n - 1).clamp(min=1), s)
    adv = a.unsqueeze(-1) * m
    return adv, adv.clone()


@estimator("reinforce")
def reinforce(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """REINFORCE discounted return, ROLL's ``reinforce`` estimator.

    ``A_t = R_t = r_t + γ·R_{t'}`` (``t'`` the next valid token, see
    :func:`discounted_returns`); no baseline and no whitening — ROLL applies its reward
    normalization before and ``whiten_advantages`` after, as separate steps.
    """
    r = _float(inp.token_level_rewards)
    ret = discounted_returns(r, inp.response_mask, params.gamma)
    return ret.clone(), ret


@estimator("reinforce_plus_plus")
def reinforce_plus_plus(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262), verl's definition.

    ``R_t`` = discounted return (:func:`discounted_returns`), ``A = whiten(R)`` over the
    valid tokens of the batch. Returns ``(A·mask, R)``.
    """
    r = _float(inp.token_level_rewards)
    m = _mask(inp, r)
    ret = discounted_returns(r, m, params.gamma)
    adv = masked_whiten(ret, m) * m if m.sum() > 0 else torch.zeros_like(ret)
    return adv, ret


@estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(
    inp: AdvantageInputs, params: AdvantageParams
) -> tuple[Tensor, Tensor]:
    """REINFORCE++-baseline (arXiv:2501.03262), verl's definition.

    ``a_i = s_i - mean_g`` (singleton: mean 0), broadcast over valid tokens, then whitened
    over all valid tokens of the batch. Returns = advantages.
    """
    s, m = _scores(inp)
    st = group_stats(s, _need_index(inp, "reinforce_plus_plus_baseline"))
    a = (s - st.mean).unsqueeze(-1) * m
    adv = masked_whiten(a, m) * m if m.sum() > 0 else a
    return adv, adv.clone()


@estimator("remax", needs=frozenset({"baseline_rewards"}))
def remax(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505): greedy-decoding baseline.

    ``R_t = Σ_{k≥t} r_k m_k`` (undiscounted reward-to-go), ``A_t = R_t - b_i`` on valid
    tokens, ``b_i`` the reward of the greedy response to the same prompt
    (``inp.baseline_rewards``). Returns ``(A, R)``.
    """
    if inp.baseline_rewards is None:
        raise ValueError(
            "adv_estimator 'remax' needs baseline_rewards (B,) of the greedy responses"
        )
    r = _float(inp.token_level_rewards)
    m = _mask(inp, r)
    ret = (r * m).flip(-1).cumsum(-1).flip(-1) * m
    adv = ret - inp.baseline_rewards.to(r.dtype).reshape(-1, 1) * m
    return adv, ret


@estimator("opo")
def opo(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, arXiv:2505.23585).

    ``b_g = Σ_j |y_j| s_j / Σ_j |y_j|`` (length-weighted group mean), ``A_i = s_i - b_g``.
    Singleton groups and groups whose responses are all empty use ``b = 0``.
    """
    s, m = _scores(inp)
    lengths = m.sum(dim=-1)
    ids = as_group_ids(_need_index(inp, "opo"), device=s.device)
    G = int(ids.max().item()) + 1 if ids.numel() else 0
    num = s.new_zeros(G).index_add_(0, ids, lengths * s)
    den = s.new_zeros(G).index_add_(0, ids, lengths)
    cnt = s.new_zeros(G).index_add_(0, ids, torch.ones_like(s))
    b = torch.where((cnt > 1) & (den > 0), num / den.clamp(min=1e-12), torch.zeros_like(num))
    adv = (s - b[ids]).unsqueeze(-1) * m
    return adv, adv.clone()


@estimator("gpg")
def gpg(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546), verl's definition.

    ``α = B / max(1, #{i: s_i ≠ 0})``, ``A_i = α (s_i - mean_g) / F_norm``
    (singleton: mean 0). Broadcast over valid tokens.
    """
    s, m = _scores(inp)
    st = group_stats(s, _need_index(inp, "gpg"))
    alpha = s.numel() / max(int(torch.count_nonzero(s).item()), 1)
    adv = (alpha * (s - st.mean) / params.gpg_f_norm).unsqueeze(-1) * m
    return adv, adv.clone()


@estimator("grpo_passk")
def grpo_passk(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """Pass@k advantage (arXiv:2503.19595), verl's ``grpo_passk``.

    In each group only the best response gets a non-zero advantage,
    ``A = s_max - s_second`` (divided by ``std_g + ε`` if ``norm_adv_by_std_in_grpo``).
    Ties for the best give 0. Groups of one response raise ``ValueError``.
    """
    s, m = _scores(inp)
    ids = as_group_ids(_need_index(inp, "grpo_passk"), device=s.device)
    st = group_stats(s, ids)
    a = torch.zeros_like(s)
    for g in range(int(ids.max().item()) + 1 if ids.numel() else 0):
        members = (ids == g).nonzero(as_tuple=True)[0]
        if members.numel() < 2:
            raise ValueError(f"grpo_passk needs >= 2 responses per group; group {g} has 1")
        top, arg = torch.topk(s[members], 2)
        value = top[0] - top[1]
        if params.norm_adv_by_std_in_grpo:
            value = value / (st.std[members[0]] + params.epsilon)
        a[members[arg[0]]] = value
    adv = a.unsqueeze(-1) * m
    return adv, adv.clone()


def estimator_inputs(name: str) -> frozenset[str]:
    """The optional inputs estimator ``name`` needs (names of :class:`AdvantageInputs`
    fields: ``values``, ``baseline_rewards``, ``reward_components``, …)."""
    return ADV_ESTIMATORS.get(name).needs


def estimator_params(name: str) -> frozenset[str]:
    """The :class:`AdvantageParams` fields estimator ``name`` alone reads."""
    return ADV_ESTIMATORS.get(name).reads


def own_params() -> dict[str, str]:
    """Every estimator-own parameter -> the estimator that reads it."""
    return {f: n for n in ADV_ESTIMATORS.primary_names() for f in estimator_params(n)}


def compute_advantages(
    name: str, inp: AdvantageInputs, params: AdvantageParams | None = None
) -> tuple[Tensor, Tensor]:
    """Look up ``name`` in :data:`ADV_ESTIMATORS` and run it under ``torch.no_grad``."""
    fn = ADV_ESTIMATORS.get(name).fn
    with torch.no_grad():
        return fn(inp, params or AdvantageParams())
