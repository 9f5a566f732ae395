"""TorchEngine: forward correctness, batching invariances, optimizer step, state, export."""

from __future__ import annotations

import copy

import pytest
import torch

from temper.algorithms.aggregation import LossAggregator
from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig, ModelConfig
from temper.data.batch import Batch
from temper.training.base import NonFiniteError
from temper.training.micro_batching import (
    MicroBatching,
    first_fit_decreasing,
    micro_batch_indices,
    real_lengths,
    shared_prompt_runs,
)
from temper.training.packing import LayoutCost
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

from .conftest import make_batch, make_engine

PROMPTS = [7, 3, 5, 1]
RESPONSES = [6, 2, 4, 1]
ALWAYS_PACK = LayoutCost(per_token=1.0, per_pair=0.0)  # free attention: packing wins


def manual_log_probs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Ground truth: each sample alone, unpadded, full forward, log-softmax, shift by one."""
    out = torch.zeros(batch["response_ids"].shape)
    for i in range(len(batch)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i] > 0]
        n = int(batch["response_mask"][i].sum())
        resp = batch["response_ids"][i, :n]
        ids = torch.cat([prompt, resp])[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        p = prompt.numel()
        out[i, :n] = logp[p - 1 : p - 1 + n].gather(-1, resp[:, None]).squeeze(-1)
    return out


def test_forward_matches_manual_full_forward(tiny_path: str) -> None:
    engine = make_engine(tiny_path, micro=4, train=False)
    batch = make_batch(PROMPTS, RESPONSES)
    got = engine.forward(batch)["log_probs"]
    torch.testing.assert_close(got, manual_log_probs(engine.model, batch), atol=1e-5, rtol=1e-5)
    assert (got[batch["response_mask"] == 0] == 0).all()


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_padded_forward_runs_the_lm_head_on_scored_positions_only(
    tiny_path: str, tmp_path, family: str
) -> None:
    """A padded micro-batch maps only its scored positions through the LM head (no logits
    of padding are computed or kept for backward); log-probs and the gradient of a loss
    equal the one-sample-at-a-time forward's, also where the model transforms its logits
    after the head (Gemma 2's final soft-cap)."""
    from transformers import AutoConfig

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    path = tiny_path
    if family == "gemma2":
        fields = tiny_fields(build_tokenizer(tmp_path), head_dim=16)
        fields |= {"final_logit_softcapping": 2.0, "attn_logit_softcapping": None}
        path = save_seeded(AutoConfig.for_model("gemma2", **fields), tmp_path, 0)
    model = ModelConfig(path=path, use_remove_padding=False)
    engine = make_engine(path, micro=4, train=False, model=model)
    batch = make_batch(PROMPTS, RESPONSES, seed=2)
    rows: list[int] = []
    head = engine.model.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[:-1]))
    got = engine.forward(batch)["log_probs"]
    handle.remove()
    assert rows == [torch.Size([1, sum(RESPONSES)])]  # K scored rows, not 4 × (r + 1)
    torch.testing.assert_close(got, manual_log_probs(engine.model, batch), atol=1e-5, rtol=1e-5)
    # the gradient through the gathered hidden states: the full logits' gradient
    engine = make_engine(path, micro=4, model=model)
    out = engine._run(batch, temperature=1.0, with_entropy=True)
    loss = (out["log_probs"] * batch["advantages"]).sum() + out["entropy"].sum()
    got_grads = torch.autograd.grad(loss, list(engine.model.parameters()))
    dense, mask = torch.zeros_like(out["log_probs"]), batch["response_mask"] > 0
    entropy = torch.zeros_like(dense)
    for i in range(len(batch)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i] > 0]
        resp = batch["response_ids"][i][mask[i]]
        logits = engine.model(input_ids=torch.cat([prompt, resp])[None]).logits[0]
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
        dense[i, mask[i]] = logp.gather(-1, resp[:, None])[:, 0]
        entropy[i, mask[i]] = -(logp.exp() * logp).sum(-1)
    want = (dense * batch["advantages"]).sum() + entropy.sum()
    want_grads = torch.autograd.grad(want, list(engine.model.parameters()))
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_micro_dynamic_and_single_batches_agree(tiny_path: str) -> None:
    """Packed equals padded: every micro-batching, run padded and really packed (one
    row, block-diagonal mask), gives the log-probs and entropy of one sample at a time."""
    engine = make_engine(tiny_path, train=False)
    packed = make_engine(tiny_path, train=False)
    packed._layout_cost = lambda: ALWAYS_PACK  # type: ignore[method-assign]
    padded = make_engine(
        tiny_path, train=False, model=ModelConfig(path=tiny_path, use_remove_padding=False)
    )
    batch = make_batch(PROMPTS, RESPONSES, seed=1)
    ref = engine.forward(batch, micro_batching=MicroBatching(size=1), with_entropy=True)
    for spec in (MicroBatching(size=4), MicroBatching(size=3), MicroBatching(max_tokens=12)):
        for e in (engine, packed, padded):
            out = e.forward(batch, micro_batching=spec, with_entropy=True)
            for key in ("log_probs", "entropy"):
                torch.testing.assert_close(out[key], ref[key], atol=1e-5, rtol=1e-5)
    # multi-row micro-batches: 1 (size 4) + 1 (size 3) + 1 (budget 12: [0], [1], [2, 3])
    assert packed.layouts["packed"] == 3 and padded.layouts["packed"] == 0
    hot = engine.forward(batch, temperature=0.5)["log_probs"]
    assert not torch.allclose(hot, ref["log_probs"])


def test_first_fit_decreasing_respects_budget() -> None:
    lengths = [5, 9, 3, 7, 2, 30]
    groups = first_fit_decreasing(lengths, budget=10)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert [5] in groups  # oversized sample alone
    assert all(sum(lengths[i] for i in g) <= 10 for g in groups if g != [5])
    assert len(groups) == 4


def test_token_budget_keeps_a_prompts_rows_together() -> None:
    """GRPO groups (consecutive rows, one prompt) stay in one micro-batch where they fit,
    so packing can carry the prompt once; a group over the budget is cut in order."""
    batch = make_batch([3, 3, 3, 5, 5, 2], [4, 1, 6, 2, 2, 3], P=5, R=6)
    for rows in ([0, 1, 2], [3, 4]):
        batch["prompt_ids"][rows] = batch["prompt_ids"][rows[0]].clone()
    assert shared_prompt_runs(batch) == [[0, 1, 2], [3, 4], [5]]
    lengths = real_lengths(batch).tolist()  # 7 4 9 | 7 7 | 5
    assert micro_batch_indices(batch, MicroBatching(max_tokens=20)) == [[0, 1, 2], [3, 4, 5]]
    # budget 14: the first group (20 tokens) is cut in order, the second kept whole;
    # row by row, first-fit-decreasing would split both groups
    assert micro_batch_indices(batch, MicroBatching(max_tokens=14)) == [[3, 4], [0, 1], [2, 5]]
    assert first_fit_decreasing(lengths, 14) == [[2, 5], [0, 3], [1, 4]]


def _pg_loss_fn(mini: Batch):
    agg = LossAggregator.from_mask("token-mean", mini["response_mask"])

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]):
        loss = agg(-mb["advantages"] * out["log_probs"], mb["response_mask"])
        return loss, {"pg_loss": loss.detach()}

    return loss_fn


def test_gradient_accumulation_invariance(tiny_path: str) -> None:
    """1×4 == 4×1 == token-budget micro-batches after one step.

    Adam's first step is ``lr·g/(|g|+eps)``: with the default eps it maps fp32 round-off
    on ~1e-8 gradients to O(lr) weight changes, so the weights are compared under a large
    eps (the update is then linear in the gradient); the grad norm is compared directly.
    """
    batch = make_batch(PROMPTS, RESPONSES, seed=2)
    padded = ModelConfig(path=tiny_path, use_remove_padding=False)
    whole = make_engine(tiny_path, micro=4, lr=1e-2, eps=1.0, model=padded)
    split = make_engine(tiny_path, micro=1, lr=1e-2, eps=1.0)
    dyn = make_engine(tiny_path, max_tokens=10, lr=1e-2, eps=1.0)
    # packed equals padded: the same micro-batches as ``whole`` and ``dyn``, each one row
    packed = [make_engine(tiny_path, micro=4, lr=1e-2, eps=1.0)]
    packed.append(make_engine(tiny_path, max_tokens=10, lr=1e-2, eps=1.0))
    for e in packed:
        e._layout_cost = lambda: ALWAYS_PACK  # type: ignore[method-assign]
    engines = (whole, split, dyn, *packed)
    results = [e.train_mini_batch(batch, _pg_loss_fn(batch)) for e in engines]
    # budget 10 cuts [0], [2], [1, 3]: one micro-batch of three has rows to pack
    assert [r["packed_fraction"] for r in results[3:]] == [1.0, 1 / 3]
    for r in results[1:]:
        assert r["loss"] == pytest.approx(results[0]["loss"], abs=1e-6)
        assert r["grad_norm"] == pytest.approx(results[0]["grad_norm"], rel=1e-5)
    start = make_engine(tiny_path, train=False).model.state_dict()
    for other in engines[1:]:
        for (name, a), (_, b) in zip(
            whole.model.named_parameters(), other.model.named_parameters()
        ):
            assert not torch.equal(a, start[name]), name
            torch.testing.assert_close(a, b, atol=1e-8, rtol=0, msg=name)


def test_non_finite_loss_raises_before_step(tiny_path: str) -> None:
    engine = make_engine(tiny_path, micro=2)
    before = copy.deepcopy(engine.model.state_dict())
    batch = make_batch(PROMPTS, RESPONSES)

    def nan_loss(mb: Batch, out: dict[str, torch.Tensor]):
        return out["log_probs"].sum() * float("nan"), {}

    with pytest.raises(NonFiniteError):
        engine.train_mini_batch(batch, nan_loss)

    def inf_grad(mb: Batch, out: dict[str, torch.Tensor]):
        return (out["log_probs"] * torch.tensor(float("inf"))).sum() * 0.0 + 1.0, {}

    with pytest.raises(NonFiniteError):
        engine.train_mini_batch(batch, inf_grad)
    assert engine.schedule is not None and engine.schedule.step_count == 0
    for k, v in engine.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in engine.model.parameters())


def test_state_dict_round_trip_resumes_identically(tiny_path: str) -> None:
    batch = make_batch(PROMPTS, RESPONSES, seed=3)
    a = make_engine(tiny_path, lr_scheduler="cosine", warmup_steps=1, total_training_steps=4)
    a.train_mini_batch(batch, _pg_loss_fn(batch))
    saved = copy.deepcopy(a.state_dict())
    m_a = a.train_mini_batch(batch, _pg_loss_fn(batch))

    b = make_engine(tiny_path, lr_scheduler="cosine", warmup_steps=1, total_training_steps=4)
    b.load_state_dict(saved)
    m_b = b.train_mini_batch(batch, _pg_loss_fn(batch))
    assert m_a["lr"] == m_b["lr"] and m_a["loss"] == pytest.approx(m_b["loss"], abs=1e-7)
    for (name, x), (_, y) in zip(a.model.named_parameters(), b.model.named_parameters()):
        torch.testing.assert_close(x, y, atol=1e-7, rtol=0, msg=name)


def test_save_hf_reloads_with_transformers(tiny_path: str, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    engine = make_engine(tiny_path, micro=4)
    batch = make_batch(PROMPTS, RESPONSES)
    engine.train_mini_batch(batch, _pg_loss_fn(batch))
    engine.save_hf(str(tmp_path / "hf"))
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32)
    torch.testing.assert_close(
        manual_log_probs(reloaded, batch), engine.forward(batch)["log_probs"], atol=1e-5, rtol=0
    )
    assert (tmp_path / "hf" / "tokenizer_config.json").is_file()
    names = dict(engine.named_weights())
    assert set(reloaded.state_dict()) <= set(names)


def test_lora_trains_adapters_only_and_merges(tiny_path: str, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    lora = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    engine = make_engine(tiny_path, micro=2, model=ModelConfig(path=tiny_path, lora=lora))
    trainable = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    batch = make_batch(PROMPTS, RESPONSES, seed=4)
    engine.train_mini_batch(batch, _pg_loss_fn(batch))
    for n, p in engine.model.named_parameters():
        assert torch.equal(p, before[n]) != (n in trainable and "lora_B" in n), n

    merged = dict(engine.named_weights())
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).state_dict()
    assert set(merged) == set(base)
    scale = lora.alpha / lora.rank
    for name, w in merged.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith("weight") and module.split(".")[-1] in lora.target_modules:
            prefix = f"base_model.model.{module}"
            A = engine.model.get_parameter(f"{prefix}.lora_A.default.weight")
            B = engine.model.get_parameter(f"{prefix}.lora_B.default.weight")
            torch.testing.assert_close(w, base[name] + scale * B @ A, atol=1e-6, rtol=0)
        else:
            assert torch.equal(w, base[name]), name

    engine.save_hf(str(tmp_path / "merged"))
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32)
    torch.testing.assert_close(
        manual_log_probs(reloaded, batch), engine.forward(batch)["log_probs"], atol=1e-5, rtol=0
    )
    assert (tmp_path / "merged" / "lora_adapter" / "adapter_config.json").is_file()


def test_value_model_saves_and_reloads(tiny_path: str, tmp_path) -> None:
    engine = make_engine(tiny_path, micro=2, kind="value")
    batch = make_batch(PROMPTS, RESPONSES)
    values = engine.forward(batch, with_values=True)["values"]
    assert values.shape == batch["response_ids"].shape
    assert (values[batch["response_mask"] == 0] == 0).all() and values.abs().sum() > 0
    engine.save_hf(str(tmp_path / "critic"))
    again = make_engine(str(tmp_path / "critic"), micro=4, kind="value", train=False)
    torch.testing.assert_close(again.forward(batch, with_values=True)["values"], values)


def test_gradient_checkpointing_gives_same_step(tiny_path: str) -> None:
    batch = make_batch(PROMPTS, RESPONSES, seed=5)
    plain = make_engine(tiny_path, micro=2)
    ckpt = make_engine(
        tiny_path, micro=2, model=ModelConfig(path=tiny_path, enable_gradient_checkpointing=True)
    )
    m1 = plain.train_mini_batch(batch, _pg_loss_fn(batch))
    m2 = ckpt.train_mini_batch(batch, _pg_loss_fn(batch))
    assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-5)


def test_fsdp2_outside_a_process_group_says_how_to_run_it() -> None:
    spec = EngineSpec(model=ModelConfig(path="unused"), device=torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"actor\.strategy.*fsdp2 needs an initialized"):
        build_engine("fsdp2", spec)


def test_bf16_keeps_fp32_master_weights(tiny_path: str) -> None:
    """Trained engines store fp32 and compute under autocast; frozen ones store bf16."""
    bf16 = ModelConfig(path=tiny_path, dtype="bf16")
    trained = make_engine(tiny_path, micro=2, model=bf16)
    frozen = make_engine(tiny_path, micro=2, model=bf16, train=False)
    assert next(trained.model.parameters()).dtype == torch.float32
    assert next(frozen.model.parameters()).dtype == torch.bfloat16
    batch = make_batch(PROMPTS, RESPONSES)
    exact = make_engine(tiny_path, train=False).forward(batch)["log_probs"]
    for engine in (trained, frozen):
        got = engine.forward(batch)["log_probs"]
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, exact, atol=2e-2, rtol=0)
    assert trained.train_mini_batch(batch, _pg_loss_fn(batch))["grad_norm"] > 0


def test_train_forward_reports_entropy_without_a_graph_or_a_gradient_change(
    tiny_path: str,
) -> None:
    """The update's forward always returns the per-token entropy (``actor/entropy``).

    Unless the loss uses it (``with_entropy``) it is a detached no-grad metric of the
    same logits, equal to the inference forward's entropy, and the step is the plain
    policy-gradient step: loss and grad norm equal an independent per-sample reference
    (unpadded full forwards of a copy of the model, backward of the same token-mean loss).
    """
    batch = make_batch(PROMPTS, RESPONSES, seed=4)
    engine = make_engine(tiny_path, micro=2)
    expected = engine.forward(batch, with_entropy=True)["entropy"]
    reference = copy.deepcopy(engine.model)

    seen: list[tuple[bool, torch.Tensor, torch.Tensor]] = []
    pg = _pg_loss_fn(batch)

    def recording(mb: Batch, out: dict[str, torch.Tensor]):
        seen.append((out["entropy"].requires_grad, out["entropy"].detach(), mb["response_ids"]))
        return pg(mb, out)

    result = engine.train_mini_batch(batch, recording, with_entropy=False)
    assert len(seen) == 2 and not any(grad for grad, _, _ in seen)
    got = torch.cat([e for _, e, _ in seen])
    # fixed-size micro-batches keep the batch order
    assert torch.equal(torch.cat([r for _, _, r in seen]), batch["response_ids"])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert float((expected * batch["response_mask"]).sum()) > 0

    # reference gradient of the same loss, no entropy anywhere
    mask = batch["response_mask"]
    total = torch.zeros(())
    for i in range(len(batch)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i] > 0]
        n = int(mask[i].sum())
        resp = batch["response_ids"][i, :n]
        logits = reference(input_ids=torch.cat([prompt, resp])[None]).logits[0].float()
        p = prompt.numel()
        logp = torch.log_softmax(logits[p - 1 : p - 1 + n], -1).gather(-1, resp[:, None])
        total = total + (-batch["advantages"][i, :n] * logp.squeeze(-1)).sum()
    loss = total / mask.sum()
    loss.backward()
    norm = torch.linalg.vector_norm(
        torch.stack([q.grad.norm() for q in reference.parameters() if q.grad is not None])
    )
    assert result["loss"] == pytest.approx(loss.item(), abs=1e-6)
    assert result["grad_norm"] == pytest.approx(float(norm), rel=1e-4)

    # when the loss uses it, the entropy is part of the graph
    grads: list[bool] = []

    def keep(mb: Batch, out: dict[str, torch.Tensor]):
        grads.append(out["entropy"].requires_grad)
        return pg(mb, out)

    engine.train_mini_batch(batch, keep, with_entropy=True)
    assert grads == [True, True]


def _graph_ops(root: torch.Tensor) -> set[str]:
    """Names of every autograd node ``root`` was computed through."""
    seen, names, todo = set(), set(), [root.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo.extend(next_fn for next_fn, _ in node.next_functions)
    return names


def test_a_packed_training_forward_selects_nothing_whose_gradient_is_copied(
    tiny_path: str,
) -> None:
    """The packed row's batch dimension is squeezed, never indexed (logits, q/k/v): a
    select's backward zero-fills a tensor of the input's size and copies the gradient into
    it — for the logits a (1, K, V) buffer per micro-batch."""
    batch = make_batch(PROMPTS, RESPONSES, seed=5)
    engine = make_engine(tiny_path, micro=4)
    engine._layout_cost = lambda: ALWAYS_PACK  # type: ignore[method-assign]
    seen: list[set[str]] = []
    pg = _pg_loss_fn(batch)

    def recording(mb: Batch, out: dict[str, torch.Tensor]):
        seen.append(_graph_ops(out["log_probs"]))
        return pg(mb, out)

    engine.train_mini_batch(batch, recording)
    assert engine.layouts["packed"] >= 1 and seen
    assert all("SelectBackward0" not in ops for ops in seen)
    assert all("SqueezeBackward1" in ops or "SqueezeBackward0" in ops for ops in seen)


def test_tied_embedding_gradient_is_the_dense_one(tiny_path: str) -> None:
    """Tied input/output embeddings: the input embedding's backward is sparse (its touched
    rows, added into the LM head's dense gradient); the summed gradient — and so the
    update — is the one a dense embedding backward gives, and stays dense."""
    batch = make_batch([3, 7, 5], [6, 2, 4], seed=3)
    grads = []
    for sparse in (True, False):
        engine = make_engine(tiny_path, micro=2)
        emb = engine.model.get_input_embeddings()
        assert emb.sparse and emb.weight is engine.model.get_output_embeddings().weight
        emb.sparse = sparse
        out = engine._run(batch, temperature=1.0, with_entropy=False)
        (-(batch["advantages"] * out["log_probs"]).sum()).backward()
        assert not emb.weight.grad.is_sparse
        grads.append(emb.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-6)
    assert float(grads[0].abs().sum()) > 0
    # a micro-batch with no scored token still gives the tied weight a dense gradient
    engine = make_engine(tiny_path, micro=2)
    empty = make_batch([3, 4], [1, 1])
    empty["response_mask"][:] = 0
    out = engine._run(empty, temperature=1.0, with_entropy=False)
    out["log_probs"].sum().backward()
    assert not engine.model.get_input_embeddings().weight.grad.is_sparse
    # untied (a value model) and frozen (LoRA) embeddings keep the dense backward
    value = make_engine(tiny_path, kind="value")
    assert not any(getattr(m, "sparse", False) for m in value.model.modules())


def test_optimizer_is_torch_fused_adamw(tiny_path: str) -> None:
    """One fused pass per tensor (4-5x the per-tensor loop on CPU:
    benchmarks/optimizer_step.py), the same AdamW update."""
    engine = make_engine(tiny_path)
    assert isinstance(engine.optimizer, torch.optim.AdamW)
    assert engine.optimizer.defaults["fused"] is True


def manual_sum_pi_squared(model: torch.nn.Module, batch: Batch, tau: float) -> torch.Tensor:
    """Ground truth: each sample alone, full forward, ``Σ_v softmax(l/τ)_v²`` per token."""
    out = torch.zeros(batch["response_ids"].shape)
    for i in range(len(batch)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i] > 0]
        n = int(batch["response_mask"][i].sum())
        ids = torch.cat([prompt, batch["response_ids"][i, :n]])[None]
        with torch.no_grad():
            p = torch.softmax(model(input_ids=ids).logits[0].float() / tau, dim=-1)
        out[i, :n] = (p * p).sum(-1)[prompt.numel() - 1 : prompt.numel() - 1 + n]
    return out


def test_sum_pi_squared_matches_a_full_softmax_and_every_layout(tiny_path: str) -> None:
    """The log-prob pass's Σπ² (the optimal-token-baseline input) is Σ_v π_v² of the
    tempered distribution at every response token, 0 on padding, the same whatever the
    micro-batching or layout (packed, padded), and leaves the log-probs as they were."""
    engine = make_engine(tiny_path, micro=4, train=False)
    padded = make_engine(
        tiny_path, train=False, model=ModelConfig(path=tiny_path, use_remove_padding=False)
    )
    batch = make_batch(PROMPTS, RESPONSES, seed=2)
    want = manual_sum_pi_squared(engine.model, batch, 0.7)
    plain = engine.forward(batch, temperature=0.7)
    assert "sum_pi_squared" not in plain
    for e, spec in ((engine, MicroBatching(size=1)), (engine, MicroBatching(max_tokens=12)),
                    (padded, MicroBatching(size=3))):  # fmt: skip
        out = e.forward(batch, temperature=0.7, with_sum_pi_squared=True, micro_batching=spec)
        torch.testing.assert_close(out["sum_pi_squared"], want, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(out["log_probs"], plain["log_probs"], atol=1e-5, rtol=1e-5)
    spq = out["sum_pi_squared"]
    valid = batch["response_mask"] > 0
    assert (spq[~valid] == 0).all() and (spq[valid] > 0).all() and (spq[valid] <= 1).all()
