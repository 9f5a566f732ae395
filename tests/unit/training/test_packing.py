"""Sequence packing (``model.use_remove_padding``): the packed row, its block-diagonal
mask, the measured cost model, and packed forwards equal to padded ones."""

from __future__ import annotations

import pytest
import torch

from temper.config.schema import ModelConfig
from temper.data.batch import Batch
from temper.training.micro_batching import model_inputs
from temper.training.packing import (
    CPU_ATTENTION_WEIGHT,
    LayoutCost,
    block_causal_mask,
    choose_layout,
    fit_layout_cost,
    layout_costs,
    model_cost,
    pack,
    plan_packing,
    prefix_tree_mask,
    scored_positions,
)
from temper.training.torch_engine import TorchEngine

from .conftest import make_batch, make_engine

# very different lengths, left-padded prompts, right-padded responses (one of length 1)
PROMPTS = [1, 12, 3, 7, 2]
RESPONSES = [1, 10, 2, 6, 9]
ALWAYS_PACK = LayoutCost(per_token=1.0, per_pair=0.0)


def _engine(path: str, *, packed: bool, **kw) -> TorchEngine:
    """An engine that always packs (a cost model with free attention) or never does."""
    model = ModelConfig(path=path, use_remove_padding=packed, **kw.pop("model_kw", {}))
    engine = make_engine(path, model=model, **kw)
    if packed:
        engine._layout_cost = lambda: ALWAYS_PACK  # type: ignore[method-assign]
    return engine


def _batch(seed: int = 0) -> Batch:
    return make_batch(PROMPTS, RESPONSES, P=12, R=10, seed=seed)


# groups as a GRPO batch has them: rows 0-2 answer one prompt, rows 3-4 another, row 5 alone
GROUPS = [[0, 1, 2], [3, 4], [5]]
GROUP_PROMPTS = [5, 5, 5, 9, 9, 3]
GROUP_RESPONSES = [4, 1, 6, 6, 2, 5]


def _grouped_batch(seed: int = 0) -> Batch:
    batch = make_batch(GROUP_PROMPTS, GROUP_RESPONSES, P=9, R=6, seed=seed)
    for rows in GROUPS:
        batch["prompt_ids"][rows] = batch["prompt_ids"][rows[0]].clone()
    return batch


# ------------------------------------------------------------------ the packed row


def test_pack_concatenates_real_tokens_with_restarting_positions() -> None:
    batch = _batch()
    inp = model_inputs(batch, torch.device("cpu"))
    p = pack(inp, "sdpa", torch.float32)
    lengths = [a + b for a, b in zip(PROMPTS, RESPONSES)]
    assert p.input_ids.shape == (1, sum(lengths)) and p.lengths.tolist() == lengths
    assert p.position_ids[0].tolist() == [i for n in lengths for i in range(n)]
    for i, (pl, rl) in enumerate(zip(PROMPTS, RESPONSES)):
        start = sum(lengths[:i])
        row = p.input_ids[0, start : start + lengths[i]]
        assert torch.equal(row[:pl], batch["prompt_ids"][i, -pl:])
        assert torch.equal(row[pl:], batch["response_ids"][i, :rl])
    # ``keep`` holds the position before each response token: its logits score it
    valid = p.valid.mask
    assert valid.sum(dim=1).tolist() == RESPONSES
    assert torch.equal(torch.stack([p.valid.rows, p.valid.cols], 1), valid.nonzero())
    before = p.input_ids[0, p.keep + 1]
    assert torch.equal(before, inp.response_ids[valid])
    assert torch.equal(p.valid.take(inp.response_ids), inp.response_ids[valid])
    back = p.valid.put(torch.arange(p.keep.numel()))
    assert back.shape == valid.shape and (back[~valid] == 0).all()
    assert back[valid].tolist() == list(range(p.keep.numel()))


def test_scored_positions_and_the_plan_come_from_the_host_copy() -> None:
    """Inputs on another device keep their host copy, and what is planned from them (the
    scored coordinates, the packing plan) is read from it, never from the device: on the
    meta device, which holds no values, reading would raise."""
    batch = _grouped_batch()
    host = model_inputs(batch, torch.device("cpu"))
    assert host.on_host is None and host.host is host
    inp = model_inputs(batch, torch.device("meta"))
    assert inp.input_ids.is_meta and inp.on_host is not None
    assert torch.equal(inp.host.input_ids, host.input_ids)
    scored, expected = scored_positions(inp), scored_positions(host)
    assert scored.rows.is_meta and scored.rows.shape == expected.rows.shape
    plan, expected_plan = (
        plan_packing(inp, share_prompts=True),
        plan_packing(host, share_prompts=True),
    )
    assert plan.where.is_meta and plan.tokens == expected_plan.tokens


def test_shared_prompts_are_packed_once() -> None:
    """Each group's prompt once, then its rows' responses; positions go on from the
    prompt's end for every response; a first response token is scored at the shared
    prompt's last token."""
    batch = _grouped_batch()
    inp = model_inputs(batch, torch.device("cpu"))
    plan = plan_packing(inp, share_prompts=True)
    assert plan.tokens == 5 + 4 + 1 + 6 + 9 + 6 + 2 + 3 + 5 == 41
    assert plan.lengths.tolist() == [16, 17, 8]
    assert (
        plan.owner.tolist()
        == [-1] * 5 + [0] * 4 + [1] + [2] * 6 + [-1] * 9 + [3] * 6 + [4] * 2 + [-1] * 3 + [5] * 5
    )
    p = pack(inp, "sdpa", torch.float32, plan)
    assert p.position_ids[0, :16].tolist() == [*range(9), 5, *range(5, 11)]
    assert torch.equal(p.input_ids[0, :5], batch["prompt_ids"][0, -5:])
    assert torch.equal(p.input_ids[0, 9:10], batch["response_ids"][1, :1])
    before = p.input_ids[0, p.keep + 1]  # the token after each scoring position ...
    valid = p.valid.mask
    first = torch.zeros_like(valid)
    first[:, 0] = True
    # ... is the response token it scores, except at a shared prompt's last token
    assert torch.equal(before[~first[valid]], inp.response_ids[valid & ~first])
    assert p.keep[first[valid]].tolist() == [4, 4, 4, 24, 24, 35]
    # nothing shared: one segment per row, as long as the real tokens
    alone = plan_packing(inp, share_prompts=False)
    assert alone.tokens == sum(GROUP_PROMPTS) + sum(GROUP_RESPONSES)


def test_prefix_tree_mask() -> None:
    # one segment: a 2-token prompt, a 2-token response of row 0, a 1-token one of row 1
    m = prefix_tree_mask(torch.zeros(5, dtype=torch.long), torch.tensor([-1, -1, 0, 0, 1]))
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 0, 0, 1],  # row 1 sees the prompt, not row 0's response
        ],
        dtype=torch.bool,
    )
    assert torch.equal(m[0, 0], expected)


def test_block_causal_mask() -> None:
    m = block_causal_mask(torch.tensor([2, 3]))[0, 0]
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [0, 0, 1, 0, 0],
            [0, 0, 1, 1, 0],
            [0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(m, expected)
    add = block_causal_mask(torch.tensor([2, 3]), additive_dtype=torch.float32)[0, 0]
    assert (add[expected] == 0).all() and (add[~expected] == torch.finfo(torch.float32).min).all()


def test_mask_keeps_packed_sequences_apart(tiny_path: str) -> None:
    """Each packed sequence's logits equal its forward alone; restarting position ids
    with a 2-D mask (the padded path's arguments) let the sequences attend to each other."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    inp = model_inputs(_batch(1), torch.device("cpu"))
    p = pack(inp, "sdpa", torch.float32)
    with torch.no_grad():
        got = model(
            input_ids=p.input_ids, attention_mask=p.attention_mask, position_ids=p.position_ids
        ).logits[0]
        leaky = model(
            input_ids=p.input_ids,
            attention_mask=torch.ones_like(p.input_ids),
            position_ids=p.position_ids,
        ).logits[0]
        start = 0
        for n in p.lengths.tolist():
            alone = model(input_ids=p.input_ids[:, start : start + n]).logits[0]
            torch.testing.assert_close(got[start : start + n], alone, atol=1e-5, rtol=1e-5)
            start += n
    last = p.lengths[-1]
    assert not torch.allclose(leaky[-last:], got[-last:], atol=1e-3)


# ------------------------------------------------------------------ cost model


def test_cost_model_pads_equal_lengths_and_packs_skewed_ones() -> None:
    cost = LayoutCost(per_token=1e-6, per_pair=1e-8)
    assert choose_layout([16] * 8, 16, cost) == "padded"  # nothing to remove
    assert choose_layout([15, 16, 14, 16], 16, cost) == "padded"  # T² > B·L²: mask costs more
    assert choose_layout([128, 4, 4, 4, 4, 4, 4, 4], 128, cost) == "packed"
    assert choose_layout([40], 64, cost) == "padded"  # one row: nothing to pack
    # equal lengths, but a shared prompt halves the row: packed
    assert choose_layout([16] * 8, 16, cost, packed_tokens=64) == "packed"
    padded, packed = layout_costs([128, 4], 128, cost)
    assert packed < padded
    # a varlen kernel (flash-attn) never loses by packing
    varlen = LayoutCost(per_token=1e-6, per_pair=1.0, varlen=True)
    assert choose_layout([15, 16, 14, 16], 16, varlen) == "packed"


def test_fit_recovers_the_coefficients() -> None:
    truth = LayoutCost(per_token=2e-6, per_pair=3e-9)
    samples = [
        (r, n, 1e-3 + layout_costs([n] * r, n, truth)[0])
        for r, n in ((1, 128), (2, 64), (8, 16), (1, 32), (4, 8))
    ]
    fit = fit_layout_cost(samples)
    assert fit.per_token == pytest.approx(truth.per_token, rel=1e-6)
    assert fit.per_pair == pytest.approx(truth.per_pair, rel=1e-6)


def test_cost_model_from_the_config_by_hand() -> None:
    """per_token = 2·layers·(d·(h+2kv)·hd + h·hd·d + 3·d·ffn), per_pair = w·4·layers·h·hd."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(
        hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=4, intermediate_size=16,
    )  # fmt: skip
    # q,k,v: 8·(2+2)·4 = 128; o: 2·4·8 = 64; mlp: 3·8·16 = 384 -> 2·2·576 = 2304
    varlen = model_cost(cfg, varlen=True)
    assert varlen == LayoutCost(per_token=2304.0, per_pair=64.0, varlen=True)  # 4·2·2·4
    masked = model_cost(cfg, varlen=False)
    assert masked.per_pair == pytest.approx(64.0 * CPU_ATTENTION_WEIGHT)


def test_cost_model_choices_measured_on_smollm2() -> None:
    """The two SmolLM2 measurements behind CPU_ATTENTION_WEIGHT (fwd+bwd, 8 rows): GRPO
    groups of 4 with ~35-token prompts shared and 128-token answers pack (0.89x padded's
    time); 112-128-token rows with nothing shared pad (packing: 1.14x)."""
    from types import SimpleNamespace

    smollm2 = SimpleNamespace(
        hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        head_dim=64, intermediate_size=1536,
    )  # fmt: skip
    cost = model_cost(smollm2, varlen=False)
    groups = [35 + 128] * 8
    assert choose_layout(groups, 35 + 128, cost, packed_tokens=2 * 35 + 8 * 128) == "packed"
    even = [112, 128, 120, 116, 124, 113, 127, 121]
    assert choose_layout(even, 128, cost) == "padded"


def test_engine_cost_model_is_deterministic(tiny_path: str) -> None:
    """No timing: two engines of one model make the same choices (resume and ranks agree).
    The segment kernel (sdpa with packing) is costed like a varlen one: a packed row
    visits only its sequences' pairs."""
    a = make_engine(tiny_path, micro=8, train=False)._layout_cost()
    b = make_engine(tiny_path, micro=8, train=False)._layout_cost()
    assert a == b and a.varlen
    assert choose_layout([16] * 8, 16, a) == "padded"
    assert choose_layout([120, 3, 3, 3, 3, 3, 3, 3], 128, a) == "packed"


def test_use_remove_padding_false_always_pads(tiny_path: str) -> None:
    engine = _engine(tiny_path, packed=False, micro=5, train=False)
    engine._layout_cost = lambda: ALWAYS_PACK  # type: ignore[method-assign]
    engine.forward(_batch())
    assert engine.layouts["packed"] == 0


# ------------------------------------------------------------------ packed == padded


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_forward_equals_padded(tiny_path: str, attn: str) -> None:
    kw = {"micro": 5, "train": False, "model_kw": {"attn_implementation": attn}}
    padded, packed = _engine(tiny_path, packed=False, **kw), _engine(tiny_path, packed=True, **kw)
    batch = _batch(2)
    a = padded.forward(batch, with_entropy=True, temperature=0.7)
    b = packed.forward(batch, with_entropy=True, temperature=0.7)
    assert packed.layouts["packed"] == 1 and padded.layouts["packed"] == 0
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=1e-5)
    assert (b["log_probs"][batch["response_mask"] == 0] == 0).all()
    # the reference's side of the exact KL unpacks to the padded layout too
    mb = batch.select([0, 1, 3])
    ref_a, ref_b = padded.response_logits(mb), packed.response_logits(mb)
    mask = mb["response_mask"][:, : ref_a.shape[1]] > 0
    torch.testing.assert_close(ref_b[mask], ref_a[mask], atol=1e-5, rtol=1e-5)


def test_packed_full_kl_and_lora_equal_padded(tiny_path: str) -> None:
    """The exact KL against a reference (packed or padded on either side) and a LoRA
    model's log-probs are the padded ones."""
    from temper.config.schema import LoraConfig

    lora = {"lora": LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])}
    kw = {"micro": 5, "train": False, "model_kw": lora}
    padded, packed = _engine(tiny_path, packed=False, **kw), _engine(tiny_path, packed=True, **kw)
    for engine in (padded, packed):  # non-zero adapters: the model differs from the base
        with torch.no_grad():
            for n, p in engine.model.named_parameters():
                if "lora_" in n:
                    p.copy_(torch.linspace(-0.1, 0.1, p.numel()).reshape(p.shape))
    ref_padded = _engine(tiny_path, packed=False, micro=5, train=False)
    ref_packed = _engine(tiny_path, packed=True, micro=5, train=False)
    batch = _batch(6)
    outs = []
    for engine, ref in ((padded, ref_padded), (packed, ref_packed), (packed, ref_padded)):
        engine.kl_reference = ref
        outs.append(engine.forward(batch))
    assert packed.layouts["packed"] == 2
    for out in outs[1:]:
        for key in ("log_probs", "full_kl"):
            torch.testing.assert_close(out[key], outs[0][key], atol=1e-5, rtol=1e-5)
    assert float(outs[0]["full_kl"].abs().sum()) > 0


def test_packed_values_equal_padded(tiny_path: str) -> None:
    kw = {"micro": 5, "train": False, "kind": "value"}
    padded, packed = _engine(tiny_path, packed=False, **kw), _engine(tiny_path, packed=True, **kw)
    batch = _batch(3)
    a = padded.forward(batch, with_values=True)["values"]
    b = packed.forward(batch, with_values=True)["values"]
    assert packed.layouts["packed"] == 1
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_packed_loss_and_gradients_equal_padded(tiny_path: str) -> None:
    """One micro-batch's token-mean policy-gradient + entropy loss: same value, same
    gradient for every parameter."""
    batch = _batch(4)
    grads = []
    for packed in (False, True):
        engine = _engine(tiny_path, packed=packed, micro=5)
        engine.model.train()
        out = engine._run(batch, temperature=1.0, with_entropy=True)
        mask = batch["response_mask"]
        loss = ((-batch["advantages"] * out["log_probs"] - 0.01 * out["entropy"]) * mask).sum()
        (loss / mask.sum()).backward()
        grads.append((loss.item(), {n: p.grad for n, p in engine.model.named_parameters()}))
        assert engine.layouts["packed"] == int(packed)
    (loss_a, ga), (loss_b, gb) = grads
    assert loss_b == pytest.approx(loss_a, abs=1e-5)
    assert set(ga) == set(gb)
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prompt_forward_loss_and_gradients_equal_padded(tiny_path: str, attn: str) -> None:
    """Shared prompts (the engine's default for masked kernels): log-probs, entropy, the
    loss and every parameter's gradient are the padded layout's."""
    batch = _grouped_batch(7)
    runs = []
    for packed in (False, True):
        engine = _engine(tiny_path, packed=packed, micro=6, model_kw={"attn_implementation": attn})
        engine.model.train()
        out = engine._run(batch, temperature=0.8, with_entropy=True)
        mask = batch["response_mask"]
        loss = ((-batch["advantages"] * out["log_probs"] - 0.01 * out["entropy"]) * mask).sum()
        (loss / mask.sum()).backward()
        grads = {n: p.grad for n, p in engine.model.named_parameters()}
        runs.append((out, loss.item(), grads))
        assert engine.layouts["packed"] == int(packed)
    (out_a, loss_a, ga), (out_b, loss_b, gb) = runs
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(out_b[key], out_a[key], atol=1e-5, rtol=1e-5)
    assert loss_b == pytest.approx(loss_a, abs=1e-5)
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-5, rtol=1e-4, msg=name)


def test_shared_prompt_values_and_reference_logits_equal_padded(tiny_path: str) -> None:
    batch = _grouped_batch(8)
    kw = {"micro": 6, "train": False, "kind": "value"}
    padded, packed = _engine(tiny_path, packed=False, **kw), _engine(tiny_path, packed=True, **kw)
    a = padded.forward(batch, with_values=True)["values"]
    b = packed.forward(batch, with_values=True)["values"]
    assert packed.layouts["packed"] == 1
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    padded = _engine(tiny_path, packed=False, micro=6, train=False)
    packed = _engine(tiny_path, packed=True, micro=6, train=False)
    ref_a, ref_b = padded.response_logits(batch), packed.response_logits(batch)
    # equal everywhere: neither layout runs the LM head off the scored tokens (zeros)
    torch.testing.assert_close(ref_b, ref_a, atol=1e-5, rtol=1e-5)
    mask = batch["response_mask"][:, : ref_a.shape[1]] > 0
    assert (ref_a[~mask] == 0).all() and (ref_a[mask] != 0).any(dim=-1).all()


def test_train_step_reports_the_packed_fraction(tiny_path: str) -> None:
    batch = _batch(5)
    engine = _engine(tiny_path, packed=True, micro=2)

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]):
        return (out["log_probs"] * mb["response_mask"]).sum() / 100, {}

    metrics = engine.train_mini_batch(batch, loss_fn)
    # micro-batches of 2, 2, 1 rows: a one-row micro-batch has nothing to pack
    assert metrics["packed_fraction"] == pytest.approx(2 / 3)
    assert "packed_fraction" not in _engine(tiny_path, packed=False, micro=2).train_mini_batch(
        batch, loss_fn
    )


def test_packed_forward_equals_padded_with_a_value_head_size_of_its_own(tmp_path) -> None:
    """DeepSeek-V3's multi-head latent attention: queries and keys of 24 dims (16 without
    position, 8 rotary), values of 8 — the segment kernel's output takes the values'."""
    from transformers import DeepseekV3Config

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    fields = tiny_fields(
        build_tokenizer(tmp_path),
        num_key_value_heads=4,
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=8,
    )
    path = save_seeded(DeepseekV3Config(**fields), tmp_path, 0)
    kw = {"micro": 5, "train": False}
    padded, packed = _engine(path, packed=False, **kw), _engine(path, packed=True, **kw)
    batch = _batch(2)
    a = padded.forward(batch, temperature=0.7)["log_probs"]
    b = packed.forward(batch, temperature=0.7)["log_probs"]
    assert packed.model.config._attn_implementation == "temper_segments"
    assert packed.layouts["packed"] == 1
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("family", "extra"),
    [
        ("qwen3", {}),  # per-head q/k norms
        ("gemma", {}),  # scaled embeddings, query_pre_attn_scalar
        ("granite", {}),  # embedding, attention and logit multipliers
        ("phi3", {}),  # fused qkv
        ("olmo2", {}),  # q/k norms over all heads
        ("gpt2", {}),  # learned absolute positions
        ("opt", {"ffn_dim": 128, "word_embed_proj_dim": 64}),  # positions from the mask
    ],
)
def test_packed_forward_equals_padded_across_families(tmp_path, family: str, extra) -> None:
    """Each family's own attention quirks (norms, multipliers, position schemes) survive
    the packed row: log-probs equal the padded layout's."""
    from transformers import AutoConfig

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    fields = tiny_fields(build_tokenizer(tmp_path), head_dim=16, **extra)
    if family == "gpt2":
        fields |= {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256}
    path = save_seeded(AutoConfig.for_model(family, **fields), tmp_path, 0)
    kw = {"micro": 5, "train": False}
    padded, packed = _engine(path, packed=False, **kw), _engine(path, packed=True, **kw)
    batch = _batch(2)
    a = padded.forward(batch, temperature=0.7)["log_probs"]
    b = packed.forward(batch, temperature=0.7)["log_probs"]
    assert packed.layouts["packed"] == 1
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
