"""Megatron context parallelism (``megatron.context_parallel_size``) against the torch
engine (which the megatron engine equals at CP = 1, see test_megatron): each CP rank
runs its two chunks of every sequence, attention gathers keys and values over the CP
group, outputs are gathered back before the loss. The test batch's rows are 13 tokens
long (odd), so the engine pads them to 16 (a multiple of 2·CP = 4; 8 with TP = 2 under
sequence parallelism).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
from test_megatron import (  # same folder: pytest puts it on sys.path
    assert_close_weights,
    make_batch,
    megatron_actor,
    megatron_critic,
    weights,
    with_log_probs,
)

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import MegatronConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


def _megatron(cp: int, tp: int = 1, sp: bool = False) -> MegatronConfig:
    return MegatronConfig(
        context_parallel_size=cp, tensor_model_parallel_size=tp, sequence_parallel=sp
    )


def make_actor(path: str, strategy: str, cp: int = 1, tp: int = 1, sp: bool = False) -> Actor:
    return megatron_actor(path, strategy, _megatron(cp, tp, sp) if strategy == "megatron" else None)


def _step_rank(rank: int, world: int, path: str, batch: Batch, tp: int, sp: bool) -> dict:
    actor = make_actor(path, "megatron", cp=2, tp=tp, sp=sp)
    engine = actor.engine
    assert (engine.parallel.cp, engine.dp_size) == (2, world // (2 * tp))
    mine = batch.slice(0, len(batch))
    out = engine.forward(mine, with_entropy=True, temperature=0.7, with_sum_pi_squared=True)
    result: dict[str, Any] = {"forward": out, "old": actor.compute_log_probs(mine)}
    result["metrics"] = actor.update(mine)
    result["weights"] = weights(engine)  # a collective: every rank gathers
    result["cp_rank"] = engine.parallel.cp_rank
    return result


def _check_ranks(ranks: list[dict], single: Actor, batch: Batch) -> None:
    ref_forward = single.engine.forward(
        batch, with_entropy=True, temperature=0.7, with_sum_pi_squared=True
    )
    ref_metrics = single.update(batch)
    ref_weights = weights(single.engine)
    assert {r["cp_rank"] for r in ranks} == {0, 1}
    for r in ranks:  # every CP rank returns whole sequences
        for k in ("log_probs", "entropy", "sum_pi_squared"):
            torch.testing.assert_close(r["forward"][k], ref_forward[k], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            r["old"]["old_log_probs"], batch["old_log_probs"], atol=1e-5, rtol=1e-5
        )
        for k, v in ref_metrics.items():
            if k == "actor/packed_fraction":  # a layout choice (megatron never packs)
                continue
            assert r["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active
    assert_close_weights(ranks[0]["weights"], ref_weights)


def test_cp2_log_probs_and_update_match_torch_engine(tiny_path: str) -> None:
    """CP = 2 on two ranks (Llama: GQA, tied embeddings, llama3 RoPE): log-probs,
    entropy, Σπ², one update's metrics and weights equal the one-process engine's."""
    batch = make_batch()
    width = int((batch["prompt_mask"].sum(1) + batch["response_mask"].sum(1)).max())
    assert width % 4  # the engine pads it
    single = make_actor(tiny_path, "torch")
    batch = with_log_probs(single, batch)
    ranks = spawn_ranks(_step_rank, 2, tiny_path, batch, 1, False)
    _check_ranks(ranks, single, batch)
