"""Actor, reference and critic over the torch engine, built from a TemperConfig."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig, ModelConfig
from temper.config.validate import validate
from temper.data.batch import Batch
from temper.pipelines.catalog import CATALOG
from temper.roles import build_roles

from .conftest import PROMPTS, RESPONSES, make_batch, make_config

ACTOR_METRICS = {
    "actor/pg_loss",
    "actor/kl",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/kl_loss",
    "actor/loss",
}


def base_log_probs(path: str, batch: Batch) -> torch.Tensor:
    """Log-probs of a freshly loaded (untrained) base model."""
    from temper.training import EngineSpec, TorchEngine

    spec = EngineSpec(model=ModelConfig(path=path), device=torch.device("cpu"))
    return TorchEngine(spec).forward(batch)["log_probs"]


def test_role_selection_from_config(tiny_path: str) -> None:
    cfg = make_config(tiny_path)
    roles = build_roles(cfg, validate(cfg, CATALOG), "cpu")
    assert roles.reference is None and roles.critic is None
    # one process (local backend): fsdp2 over one rank is the torch engine's update
    cfg.actor.strategy = "fsdp2"
    assert (
        type(build_roles(cfg, validate(cfg, CATALOG), "cpu").actor.engine).__name__ == "TorchEngine"
    )
    # on ray, an engine this build does not ship is a config error naming the key
    cfg.resources.backend = "ray"
    with pytest.raises(ConfigError, match=r"actor\.strategy"):
        build_roles(cfg, validate(cfg, CATALOG), "cpu")


def test_actor_update_moves_every_parameter(tiny_path: str) -> None:
    cfg = make_config(tiny_path)
    cfg.actor.use_kl_loss = True
    cfg.actor.entropy_coeff = 0.01
    cfg.actor.mini_batch_size = 2
    cfg.actor.ppo_epochs = 2
    cfg.actor.shuffle = True
    cfg.data.train_batch_size = len(PROMPTS)  # the plan's step: this batch
    plan = validate(cfg, CATALOG)
    roles = build_roles(cfg, plan, "cpu")
    assert roles.reference is not None and roles.reference.engine is not roles.actor.engine
    batch = make_batch(PROMPTS, RESPONSES)
    batch = roles.actor.compute_log_probs(batch, with_entropy=True)
    batch = roles.reference.compute_ref_log_probs(batch)
    torch.testing.assert_close(batch["old_log_probs"], batch["ref_log_probs"])
    assert "entropy" in batch and "old_log_probs" not in make_batch(PROMPTS, RESPONSES)

    model = roles.actor.engine.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = roles.actor.update(batch)
    assert set(metrics) >= ACTOR_METRICS
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    # the plan's optimizer steps per RL step (the LR schedule's unit) are what it took
    assert plan.actor.optimizer_steps_per_rl_step == roles.actor.engine.schedule.step_count == 4
    for n, p in model.named_parameters():
        assert not torch.equal(p, before[n]), f"{n} did not move"
    new = roles.actor.compute_log_probs(batch)["old_log_probs"]
    assert not torch.allclose(new, batch["old_log_probs"])


def test_actor_loss_is_micro_batch_invariant(tiny_path: str) -> None:
    """Every loss term uses mini-batch normalizers: 1×4, 4×1 and token budgets agree, and
    a micro-batch size above the rank's 4 samples is one micro-batch of 4."""
    batch = make_batch(PROMPTS, RESPONSES, seed=1)
    g = torch.Generator().manual_seed(0)
    results = []
    for micro, budget in ((4, None), (1, None), (1, 11), (8, None)):
        cfg = make_config(tiny_path)
        cfg.actor.loss_agg_mode = "seq-mean-token-mean"
        cfg.actor.use_kl_loss = True
        cfg.actor.entropy_coeff = 0.01
        cfg.actor.sft_loss_coef = 0.1
        cfg.actor.l2_coef = 1e-4
        cfg.actor.micro_batch_size_per_device = micro
        cfg.actor.optim.eps = 1.0  # update linear in the gradient (see engine test)
        # no reference role: the test hands the actor its reference log-probs
        plan = dataclasses.replace(validate(cfg, CATALOG), use_reference=False)
        # a budget below one whole sample (validation refuses it for a run) splits rows
        cfg.actor.use_dynamic_bsz = budget is not None
        cfg.actor.max_token_len_per_device = budget or 16384
        actor = build_roles(cfg, plan, "cpu").actor
        b = actor.compute_log_probs(batch)
        if not results:
            noise = 0.1 * torch.randn(b["old_log_probs"].shape, generator=g)
            ref = (b["old_log_probs"] + noise) * b["response_mask"]
        b["ref_log_probs"] = ref
        metrics = actor.update(b)
        results.append((metrics, dict(actor.engine.model.named_parameters())))
    m0, w0 = results[0]
    for m, w in results[1:]:
        for key in (
            "actor/loss",
            "actor/pg_loss",
            "actor/kl",
            "actor/entropy",
            "actor/ppo_kl",
            "actor/sft_loss",
            "actor/grad_norm",
        ):
            assert m[key] == pytest.approx(m0[key], rel=1e-5, abs=1e-7), key
        for name, p in w.items():
            torch.testing.assert_close(p, w0[name], atol=1e-8, rtol=0, msg=name)


def test_reinforce_is_batch_normalize_uses_the_mini_batch_mean_however_split(
    tiny_path: str,
) -> None:
    """reinforce_is with batch normalization: -sg[w/w̄]·A·log π with w̄ the mean weight of
    the whole mini-batch at the current policy. With no truncation w/w̄ = exp(log π -
    (log π_old + log w̄)), so the update equals the unnormalized one from shifted old
    log-probs; and 1×4 and 4×1 micro-batches agree (verl's per-micro-batch mean would not)."""
    batch = make_batch(PROMPTS, RESPONSES, seed=2)
    g = torch.Generator().manual_seed(3)

    def run(micro: int, normalize: bool, shift: float = 0.0) -> tuple[dict, dict]:
        cfg = make_config(tiny_path)
        cfg.actor.policy_loss = "reinforce_is"
        cfg.actor.policy_loss_kwargs = {
            "reinforce_is_level": "token",
            "reinforce_is_threshold": 100.0,
            "reinforce_is_batch_normalize": normalize,
        }
        cfg.actor.micro_batch_size_per_device = micro
        cfg.actor.optim.eps = 1.0  # update linear in the gradient (see engine test)
        actor = build_roles(cfg, validate(cfg, CATALOG), "cpu").actor
        b = actor.compute_log_probs(batch)
        b["old_log_probs"] = (old + shift) * b["response_mask"]
        metrics = actor.update(b)
        return metrics, {n: p.detach().clone() for n, p in actor.engine.model.named_parameters()}

    cfg = make_config(tiny_path)
    current = build_roles(cfg, validate(cfg, CATALOG), "cpu").actor.compute_log_probs(batch)
    mask = current["response_mask"]
    old = current["old_log_probs"] + 0.3 * torch.randn(mask.shape, generator=g)
    mean = float((torch.exp(current["old_log_probs"] - old) * mask).sum() / mask.sum())
    assert abs(mean - 1.0) > 0.01  # the normalization changes something
    m4, w4 = run(4, True)
    m1, w1 = run(1, True)
    _, shifted = run(4, False, shift=math.log(mean))
    assert m4["actor/reinforce_is_batch_mean"] == pytest.approx(mean, rel=1e-5)
    assert m1["actor/pg_loss"] == pytest.approx(m4["actor/pg_loss"], rel=1e-5)
    for name, p in w4.items():
        torch.testing.assert_close(p, w1[name], atol=1e-8, rtol=0, msg=name)
        torch.testing.assert_close(p, shifted[name], atol=1e-7, rtol=0, msg=name)


def test_bypass_rejection_compares_the_current_policy_with_the_rollout(tiny_path: str) -> None:
    """verl's bypass mode with rollout_rs: the old log-probs are the rollout's, so the
    filter compares the current policy with them, before each mini-batch's update — the
    update equals one whose mask had the rejected tokens removed by hand, however the
    mini-batch is split."""
    from temper.algorithms.rollout_correction import RejectionFilter, rollout_rejection_mask
    from temper.config.schema import RolloutFilter

    batch = make_batch(PROMPTS, RESPONSES, seed=4)
    cfg = make_config(tiny_path)
    current = build_roles(cfg, validate(cfg, CATALOG), "cpu").actor.compute_log_probs(batch)
    mask = current["response_mask"]
    g = torch.Generator().manual_seed(6)
    rollout = (current["old_log_probs"] + 0.4 * torch.randn(mask.shape, generator=g)) * mask
    keep, _ = rollout_rejection_mask(
        current["old_log_probs"], rollout, mask, [RejectionFilter("ratio", "token", 0.7, 1.4)]
    )
    assert 0 < int(((1 - keep) * mask).sum()) < int(mask.sum())  # some tokens go, not all

    def run(micro: int, rs: bool, mask_by_hand: bool = False) -> tuple[dict, dict]:
        cfg = make_config(tiny_path)
        cfg.actor.recompute_old_log_prob = False
        cfg.rollout.calculate_log_probs = True
        cfg.actor.rollout_rs = [RolloutFilter("ratio", "token", 0.7, 1.4)] if rs else []
        cfg.actor.micro_batch_size_per_device = micro
        cfg.actor.optim.eps = 1.0  # update linear in the gradient (see engine test)
        actor = build_roles(cfg, validate(cfg, CATALOG), "cpu").actor
        b = Batch(batch.tensors.clone(recurse=False), dict(batch.objects), dict(batch.meta))
        b["rollout_log_probs"] = rollout
        if mask_by_hand:
            b["response_mask"] = mask * keep
        metrics = actor.update(b)
        return metrics, {n: p.detach().clone() for n, p in actor.engine.model.named_parameters()}

    m4, w4 = run(4, rs=True)
    _, w1 = run(1, rs=True)
    _, by_hand = run(4, rs=False, mask_by_hand=True)
    rejected = float(((1 - keep) * mask).sum() / mask.sum())
    assert m4["actor/rollout_rs_masked_fraction"] == pytest.approx(rejected, rel=1e-6)
    for name, p in w4.items():
        torch.testing.assert_close(p, w1[name], atol=1e-8, rtol=0, msg=name)
        torch.testing.assert_close(p, by_hand[name], atol=1e-8, rtol=0, msg=name)


def test_rollout_is_batch_normalize_divides_by_the_mean_over_all_ranks() -> None:
    """Each data-parallel rank normalizes its share by the whole batch's mean (the
    engine's global_sum adds the ranks' parts), as one rank holding the whole batch."""
    from temper.config.schema import ActorConfig
    from temper.roles.actor import rollout_correction_weights

    g = torch.Generator().manual_seed(5)
    mask = (torch.rand(4, 5, generator=g) > 0.2).float()
    batch = Batch.from_dict(
        {
            "old_log_probs": 0.4 * torch.randn(4, 5, generator=g) * mask,
            "rollout_log_probs": torch.zeros(4, 5),
            "response_mask": mask,
        }
    )
    for level in ("token", "sequence"):
        cfg = ActorConfig(rollout_is=level, rollout_is_batch_normalize=True)
        whole, _ = rollout_correction_weights(cfg, batch)
        halves = [batch.slice(0, 2), batch.slice(2, 4)]
        local = [rollout_correction_weights(cfg, h)[0] for h in halves]
        assert not torch.allclose(torch.cat(local), whole)  # local means differ

        total = [sum(p) for p in zip(*[_parts(cfg, h) for h in halves], strict=True)]
        shared = [rollout_correction_weights(cfg, h, lambda _, t=total: t)[0] for h in halves]
        torch.testing.assert_close(torch.cat(shared), whole)
    assert float((whole * mask).sum() / mask.sum()) != pytest.approx(1.0)  # sequence level


def _parts(cfg, batch: Batch) -> list[float]:
    from temper.algorithms.rollout_correction import rollout_is_weights, weight_mean_parts

    w, _, _ = rollout_is_weights(
        batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"],
        level=cfg.rollout_is, threshold=cfg.rollout_is_threshold,
    )  # fmt: skip
    return [float(x) for x in weight_mean_parts(w, batch["response_mask"], cfg.rollout_is)]


def test_lora_reference_is_the_base_model(tiny_path: str) -> None:
    cfg = make_config(tiny_path)
    cfg.model.lora = LoraConfig(rank=4, alpha=8)
    cfg.actor.use_kl_loss = True
    roles = build_roles(cfg, validate(cfg, CATALOG), "cpu")
    assert roles.reference is not None and roles.reference.engine is roles.actor.engine
    batch = roles.actor.compute_log_probs(make_batch(PROMPTS, RESPONSES, seed=2))
    batch = roles.reference.compute_ref_log_probs(batch)
    model = roles.actor.engine.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    roles.actor.update(batch)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == ("lora_B" not in n), n
    ref = roles.reference.compute_ref_log_probs(batch)["ref_log_probs"]
    torch.testing.assert_close(ref, base_log_probs(tiny_path, batch), atol=1e-6, rtol=0)
    actor_now = roles.actor.compute_log_probs(batch)["old_log_probs"]
    assert not torch.allclose(actor_now, ref)


def test_critic_update_reduces_value_loss(tiny_path: str) -> None:
    cfg = make_config(tiny_path, adv_estimator="gae")
    cfg.critic.optim.lr = 3e-3
    cfg.critic.micro_batch_size_per_device = 2
    cfg.critic.cliprange_value = 0.2
    roles = build_roles(cfg, validate(cfg, CATALOG), "cpu")
    assert roles.critic is not None and roles.reference is None
    batch = make_batch(PROMPTS, RESPONSES, seed=3)
    batch["returns"] = 0.7 * batch["response_mask"].float()
    losses = []
    for _ in range(8):
        batch = roles.critic.compute_values(batch)
        metrics = roles.critic.update(batch)
        losses.append(metrics["critic/value_loss"])
    assert {"critic/value_loss", "critic/vf_clipfrac", "critic/grad_norm"} <= set(metrics)
    assert losses[-1] < 0.5 * losses[0]


def test_actor_reports_entropy_without_recompute_or_entropy_bonus(tiny_path: str) -> None:
    """The quickstart setting (recompute_old_log_prob: false, entropy_coeff: 0) still
    logs ``actor/entropy``: the token mean of the update forward's entropy over each
    mini-batch (summed over its micro-batches), averaged over optimizer steps like the
    other metrics. (The engine test checks that this leaves the gradient unchanged.)"""
    batch = make_batch(PROMPTS, RESPONSES, seed=5)
    cfg = make_config(tiny_path)
    cfg.actor.recompute_old_log_prob = False
    cfg.actor.shuffle = False
    assert cfg.actor.entropy_coeff == 0 and cfg.actor.micro_batch_size_per_device == 2
    actor = build_roles(cfg, validate(cfg, CATALOG), "cpu").actor
    # a low sampling temperature sharpens the tiny model's near-uniform distributions, so
    # the entropy differs between rows
    batch.meta["temperature"] = 0.05
    probe = actor.engine.forward(batch, with_entropy=True, temperature=0.05)
    batch["rollout_log_probs"] = probe["log_probs"]
    assert "old_log_probs" not in batch and "entropy" not in batch

    def token_mean(rows: list[int]) -> float:
        m = batch["response_mask"][rows].float()
        return float((probe["entropy"][rows] * m).sum() / m.sum())

    metrics = actor.update(batch)  # one mini-batch of 4 = two micro-batches of 2
    assert metrics["actor/entropy"] == pytest.approx(token_mean([0, 1, 2, 3]), rel=1e-5)

    # two optimizer steps (lr 0 keeps the weights, so both see the probed entropy): the
    # mean of the steps' own token means, not the token mean of the whole batch
    cfg.actor.mini_batch_size = 2
    cfg.actor.optim.lr = 0.0
    metrics = build_roles(cfg, validate(cfg, CATALOG), "cpu").actor.update(batch)
    per_step = (token_mean([0, 1]) + token_mean([2, 3])) / 2
    assert abs(per_step - token_mean([0, 1, 2, 3])) > 0.01
    assert metrics["actor/entropy"] == pytest.approx(per_step, rel=1e-5)


def _sft_batch() -> Batch:
    """Responses as SFT samples: row 0 holds a context token between learnt ones (a
    user turn inside a conversation), which stays attended to but is not learnt."""
    batch = make_batch(PROMPTS, RESPONSES, seed=3)
    present = batch["response_mask"].clone()
    batch["response_mask"][0, 2] = 0
    batch["attention_mask"] = torch.cat([batch["prompt_mask"], present], dim=1)
    batch.meta["temperature"] = 1.0
    return batch


def test_sft_loss_is_the_token_mean_nll_whatever_the_split_or_packing(tiny_path: str) -> None:
    """The SFT update's loss is the mini-batch's token-mean NLL, and 1×4, 4×1, a token
    budget, packed and padded micro-batches give the same loss, gradient norm and
    weights (the normalizers are the mini-batch's, not a micro-batch's)."""
    batch = _sft_batch()
    results = []
    for micro, budget, packed in (
        (4, None, False),
        (1, None, False),
        (1, 11, True),
        (4, None, True),
    ):
        cfg = make_config(tiny_path)
        cfg.pipeline = "sft"
        cfg.actor.micro_batch_size_per_device = micro
        cfg.actor.use_dynamic_bsz = budget is not None
        cfg.actor.max_token_len_per_device = budget or 16384
        cfg.model.use_remove_padding = packed
        cfg.actor.optim.eps = 1.0  # update linear in the gradient (see engine test)
        cfg.data.train_batch_size = len(PROMPTS)
        actor = build_roles(cfg, validate(cfg, CATALOG), "cpu").actor
        log_probs = actor.compute_log_probs(batch)["old_log_probs"]
        mask = batch["response_mask"].float()
        nll = float(-(log_probs * mask).sum() / mask.sum())
        metrics = actor.sft_update(batch)
        assert metrics["actor/loss"] == pytest.approx(nll, rel=1e-5)
        results.append((metrics, dict(actor.engine.model.named_parameters())))
    m0, w0 = results[0]
    for m, w in results[1:]:
        for key in ("actor/loss", "actor/grad_norm"):
            assert m[key] == pytest.approx(m0[key], rel=1e-5, abs=1e-7), key
        for name, p in w.items():
            torch.testing.assert_close(p, w0[name], atol=1e-8, rtol=0, msg=name)
    assert results[2][0]["actor/packed_fraction"] > 0  # the packed runs did pack


def test_sft_update_moves_every_parameter(tiny_path: str) -> None:
    cfg = make_config(tiny_path)
    cfg.pipeline = "sft"
    cfg.data.train_batch_size = len(PROMPTS)
    plan = validate(cfg, CATALOG)
    assert plan.roles == ("actor",) and not plan.use_rollout
    actor = build_roles(cfg, plan, "cpu").actor
    before = {n: p.detach().clone() for n, p in actor.engine.model.named_parameters()}
    actor.sft_update(_sft_batch())
    for n, p in actor.engine.model.named_parameters():
        assert not torch.equal(p, before[n]), f"{n} did not move"


def _pair_batch() -> Batch:
    """The SFT samples as 2 preference pairs (rows 0/1, 2/3: chosen, rejected), with
    reference log-probs that differ from the policy's, so the pairs' gradient
    coefficients differ."""
    batch = _sft_batch()
    batch["chosen"] = torch.tensor([1, 0, 1, 0])
    gen = torch.Generator().manual_seed(11)
    noise = 0.3 * torch.randn(batch["response_ids"].shape, generator=gen)
    batch["ref_log_probs"] = noise * batch["response_mask"]
    return batch


def test_dpo_update_is_the_pair_loss_whatever_the_split_or_packing(tiny_path: str) -> None:
    """The DPO update's loss is the mean pair loss of the sequence log-probs (computed
    here from the actor's own forward), and micro-batches of 4 rows, of 1 (a pair's rows
    apart), a token budget, packed or padded give the same loss, gradient norm and
    weights: the pair's coefficient comes from the mini-batch, not the micro-batch."""
    from temper.algorithms.preference import PreferenceParams, preference_loss

    batch = _pair_batch()
    params = PreferenceParams(beta=0.5, label_smoothing=0.1)
    results = []
    for micro, budget, packed in (
        (4, None, False),
        (1, None, False),
        (1, 11, True),
        (4, None, True),
    ):
        cfg = make_config(tiny_path)
        cfg.pipeline = "dpo"
        cfg.actor.micro_batch_size_per_device = micro
        cfg.actor.use_dynamic_bsz = budget is not None
        cfg.actor.max_token_len_per_device = budget or 16384
        cfg.model.use_remove_padding = packed
        cfg.actor.optim.eps = 1.0  # update linear in the gradient (see engine test)
        cfg.data.train_batch_size = 2
        actor = build_roles(cfg, validate(cfg, CATALOG), "cpu").actor
        mask = batch["response_mask"].float()
        seq = (actor.compute_log_probs(batch)["old_log_probs"] * mask).sum(-1).double()
        ref = (batch["ref_log_probs"] * mask).sum(-1).double()
        expected, m = preference_loss("sigmoid", seq[0::2], seq[1::2], ref[0::2], ref[1::2], params)
        metrics = actor.dpo_update(batch, "sigmoid", params)
        assert metrics["actor/loss"] == pytest.approx(float(expected), rel=1e-5)
        for key in ("rewards/margin", "rewards/accuracy", "logps/chosen"):
            assert metrics[f"actor/{key}"] == pytest.approx(float(m[key]), rel=1e-5, abs=1e-7)
        results.append((metrics, dict(actor.engine.model.named_parameters())))
    m0, w0 = results[0]
    for m, w in results[1:]:
        for key in ("actor/loss", "actor/grad_norm"):
            assert m[key] == pytest.approx(m0[key], rel=1e-5, abs=1e-7), key
        for name, p in w.items():
            torch.testing.assert_close(p, w0[name], atol=1e-8, rtol=0, msg=name)
    assert results[2][0]["actor/packed_fraction"] > 0  # the packed runs did pack


def test_dpo_mini_batches_keep_pairs_and_refuse_a_split_layout(tiny_path: str) -> None:
    """Mini-batches of one pair (2 rows) each take an optimizer step on whole pairs;
    a batch whose rows do not alternate chosen/rejected is refused."""
    from temper.algorithms.preference import PreferenceParams

    cfg = make_config(tiny_path)
    cfg.pipeline = "dpo"
    cfg.actor.mini_batch_size = 2
    cfg.data.train_batch_size = 2
    actor = build_roles(cfg, validate(cfg, CATALOG), "cpu").actor
    batch = _pair_batch()
    first = actor.dpo_update(batch, "ipo", PreferenceParams(beta=0.5))
    assert first["actor/loss"] > 0 and actor.engine.schedule is not None
    bad = batch.select([0, 2, 1, 3])
    with pytest.raises(ValueError, match="alternates chosen and rejected"):
        actor.dpo_update(bad, "sigmoid", PreferenceParams())


def test_actor_rejection_sampling_is_the_update_without_the_rejected_tokens(
    tiny_path: str,
) -> None:
    """actor.rollout_rs takes the rejected tokens (here a whole sample and one token) out
    of the loss: the update equals one on a batch whose response_mask lacks them."""
    from temper.config.schema import RolloutFilter

    batch = make_batch(PROMPTS, RESPONSES, seed=2)
    runs = []
    for rejection in (True, False):
        cfg = make_config(tiny_path)
        cfg.actor.loss_agg_mode = "seq-mean-token-mean"
        if rejection:
            cfg.actor.rollout_rs = [RolloutFilter("ratio", "token", 0.5, 2.0)]
        plan = dataclasses.replace(validate(cfg, CATALOG), use_reference=False)
        actor = build_roles(cfg, plan, "cpu").actor
        b = actor.compute_log_probs(batch)
        shift = torch.zeros_like(b["old_log_probs"])
        shift[0] = 1.0  # rho = e^-1 < 0.5 on all of sample 0
        shift[2, 1] = -1.0  # rho = e > 2 on sample 2's second token
        b["rollout_log_probs"] = b["old_log_probs"] + shift * b["response_mask"]
        if not rejection:
            mask = b["response_mask"].clone()
            mask[0] = 0
            mask[2, 1] = 0
            b["response_mask"] = mask
        runs.append((actor.update(b), dict(actor.engine.model.named_parameters())))
    (m_rs, w_rs), (m_hand, w_hand) = runs
    # 6 + 1 of the 6 + 2 + 4 + 1 = 13 valid tokens; 2 of the 4 samples touched
    assert m_rs["actor/rollout_rs_masked_fraction"] == pytest.approx(7 / 13)
    assert m_rs["actor/rollout_rs_seq_masked_fraction"] == pytest.approx(1 / 2)
    assert m_rs["actor/pg_loss"] == pytest.approx(m_hand["actor/pg_loss"], rel=1e-6)
    for name, p in w_rs.items():
        torch.testing.assert_close(p, w_hand[name], atol=1e-8, rtol=0, msg=name)


def test_topr_score_takes_its_positive_set_from_the_raw_scores(tiny_path: str) -> None:
    """topr_score's positive set is score > 0 (the task score, before normalization):
    with every score flipped positive, its update is topr's with all advantages' signs
    ignored, i.e. plain -A log pi on every token (r = 1 on the first step)."""
    batch = make_batch(PROMPTS, RESPONSES, seed=3)
    results = []
    for loss, scores in (("topr_score", [1.0, 1.0, 1.0, 1.0]), ("gpg", None)):
        cfg = make_config(tiny_path)
        cfg.actor.policy_loss = loss
        plan = dataclasses.replace(validate(cfg, CATALOG), use_reference=False)
        actor = build_roles(cfg, plan, "cpu").actor
        b = actor.compute_log_probs(batch)
        if scores is not None:
            b["scores"] = torch.tensor(scores)
        results.append((actor.update(b), dict(actor.engine.model.named_parameters())))
    (m_topr, w_topr), (m_gpg, w_gpg) = results
    assert m_topr["actor/pg_loss"] == pytest.approx(m_gpg["actor/pg_loss"], rel=1e-6)
    for name, p in w_topr.items():
        torch.testing.assert_close(p, w_gpg[name], atol=1e-8, rtol=0, msg=name)
    cfg = make_config(tiny_path)
    cfg.actor.policy_loss = "topr_score"
    plan = dataclasses.replace(validate(cfg, CATALOG), use_reference=False)
    actor = build_roles(cfg, plan, "cpu").actor
    with pytest.raises(KeyError, match="scores"):
        actor.update(actor.compute_log_probs(batch))
