"""Ulysses sequence parallelism computes what one process computes.

Two gloo ranks form one sequence-parallel group (``ulysses_sequence_parallel_size`` 2):
both take the whole batch, each runs half of every sequence's columns, and the
log-probs, entropy, values, metrics and updated weights equal the single-process torch
engine's. Four ranks (two groups of two) split the batch as well.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from temper.cluster.process_group import spawn_ranks
from temper.config.schema import LoraConfig, ModelConfig
from temper.data.batch import Batch
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.training.ulysses import ULYSSES_KERNEL
from tests.integration.test_fsdp2 import (
    actor_config,
    make_actor,
    make_batch,
    shard,
    weights,
    with_log_probs,
)

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


def _sp_rank(
    rank: int, world: int, path: str, batch: Batch, sp: int, strategy: str, model: ModelConfig
) -> dict:
    torch.manual_seed(0)  # LoRA A matrices are drawn from the global RNG
    actor = make_actor(path, strategy, model=model, ulysses=sp)
    mine = shard(batch, rank // sp, world // sp)
    old = actor.compute_log_probs(mine, with_sum_pi_squared=True)
    metrics = actor.update(mine)
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        kind="value",
        train=actor_config(ulysses=sp),
        seed=5,
    )
    values = build_engine(strategy, spec).forward(mine, with_values=True)["values"]
    config: Any = actor.engine.model.config  # type: ignore[attr-defined]
    return {
        "kernel": config._attn_implementation,
        "data_rank": actor.engine.dp_rank,
        "dp": actor.engine.dp_size,
        "old": old["old_log_probs"],
        "spq": old["sum_pi_squared"],
        "values": values,
        "metrics": metrics,
        "weights": weights(actor),
    }


@pytest.mark.parametrize(
    ("strategy", "world", "model"),
    [
        ("fsdp2", 2, {}),
        ("fsdp2", 4, {}),
        ("deepspeed", 2, {}),
        ("fsdp2", 2, {"lora": LoraConfig(rank=4, alpha=8)}),
        ("fsdp2", 2, {"enable_gradient_checkpointing": True}),
        ("fsdp2", 2, {"use_remove_padding": False}),
    ],
    ids=[
        "fsdp2-one-group",
        "fsdp2-two-groups",
        "deepspeed-one-group",
        "fsdp2-lora",
        "fsdp2-grad-ckpt",
        "fsdp2-padded",
    ],
)
def test_sequence_parallel_ranks_match_single_process(
    tiny_path: str, strategy: str, world: int, model: dict[str, Any]
) -> None:
    """Gradient checkpointing recomputes the forward, all-to-alls included, in the
    backward; under LoRA only the adapters train. Packed (the default), the group splits
    one row that holds a micro-batch's sequences (a prompt two rows share, once);
    padded, each sequence's columns."""
    config = ModelConfig(path=tiny_path, **model)
    torch.manual_seed(0)
    single = make_actor(tiny_path, "torch", model=config)
    batch = make_batch()
    for key in ("prompt_ids", "prompt_mask"):  # rows 1 and 3, one micro-batch: one prompt
        batch[key][3] = batch[key][1]
    batch = with_log_probs(single, batch)
    spq = single.compute_log_probs(batch, with_sum_pi_squared=True)["sum_pi_squared"]
    before = weights(single)
    ref_metrics = single.update(batch)
    ref_weights = weights(single)
    spec = EngineSpec(
        model=ModelConfig(path=tiny_path),
        device=torch.device("cpu"),
        kind="value",
        train=actor_config(),
        seed=5,
    )
    ref_values = build_engine("torch", spec).forward(batch, with_values=True)["values"]

    ranks = spawn_ranks(_sp_rank, world, tiny_path, batch, 2, strategy, config)

    groups = world // 2
    assert {r["kernel"] for r in ranks} == {ULYSSES_KERNEL}
    assert [r["data_rank"] for r in ranks] == [i // 2 for i in range(world)]
    assert {r["dp"] for r in ranks} == {groups}
    for name, ref in [("old", batch["old_log_probs"]), ("spq", spq), ("values", ref_values)]:
        for member in range(2):  # each member of a group holds its group's outputs
            got = torch.cat([ranks[g * 2 + member][name] for g in range(groups)])
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5, msg=name)
    got = ranks[0]["metrics"]
    assert got.keys() == ref_metrics.keys()
    for k, v in ref_metrics.items():
        if k == "actor/packed_fraction":  # the cost models differ (a dense masked kernel)
            assert got[k] > 0 or world > 2  # two groups: one row per micro-batch
            continue
        assert got[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active
    # Adam's first step moves an element by about ±lr (1e-3) whatever its gradient's
    # size, so summation-order noise in a near-zero gradient shows: 1e-5 is 1% of a step
    for r in ranks:
        for k, w in r["weights"].items():
            torch.testing.assert_close(w, ref_weights[k], atol=1e-5, rtol=1e-5, msg=k)
    moved = [k for k in before if not torch.equal(before[k], ref_weights[k])]
    assert moved and (len(moved) == len(before) or "lora" in model)


def _window_rank(rank: int, world: int, path: str, batch: Batch, model: ModelConfig) -> dict:
    actor = make_actor(path, "fsdp2", model=model, ulysses=2)
    old = actor.compute_log_probs(batch)["old_log_probs"]
    actor.update(batch)
    return {"old": old, "weights": weights(actor), "layouts": dict(actor.engine.layouts)}


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
def test_sliding_window_layers_split_like_one_process(tmp_path, packed: bool) -> None:
    """Gemma 3's alternating sliding window of 4 tokens over rows of up to 13: Ulysses'
    kernel applies each layer's window (a packed row's segments, or the padded rows'
    positions), and log-probs and the updated weights equal one process's."""
    from transformers import Gemma3TextConfig

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    layers = ["sliding_attention", "full_attention"]
    fields = tiny_fields(build_tokenizer(tmp_path), sliding_window=4, head_dim=16)
    path = save_seeded(Gemma3TextConfig(**fields, layer_types=layers), tmp_path, 0)
    model = ModelConfig(path=path, use_remove_padding=packed)
    single = make_actor(path, "torch", model=model)
    batch = with_log_probs(single, make_batch())
    single.update(batch)
    ref = weights(single)

    for r in spawn_ranks(_window_rank, 2, path, batch, model):
        assert r["layouts"]["packed" if packed else "padded"] > 0
        torch.testing.assert_close(r["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
        for k, w in r["weights"].items():
            torch.testing.assert_close(w, ref[k], atol=1e-5, rtol=1e-5, msg=k)
