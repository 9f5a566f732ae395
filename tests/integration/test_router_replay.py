"""Router replay on the torch engine (HF MoE models): the layout of ``routed_experts``,
the replayed gates, and that a replayed forward routes exactly by the recorded experts
whatever the micro-batching, packing and row order — and keeps them when a weight change
flips the router's own choice. Megatron: test_megatron_router_replay."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching, model_inputs
from temper.training.registry import build_engine
from temper.training.router_replay import (
    ROUTED_EXPERTS,
    batch_routing,
    from_packed,
    micro_routing,
    to_packed,
)
from temper.training.spec import EngineSpec
from temper.utils.router_replay_hf import mixtral_gates, qwen_gates
from temper.utils.tiny import make_tiny_moe_model

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def make_batch() -> Batch:
    """4 left/right-padded samples of different lengths (prompt 7, response 6 columns)."""
    g = torch.Generator().manual_seed(0)
    P, R = 7, 6
    pl, rl = torch.tensor([7, 3, 5, 2]), torch.tensor([6, 2, 4, 5])
    pm = (torch.arange(P)[None] >= P - pl[:, None]).long()
    rm = (torch.arange(R)[None] < rl[:, None]).long()
    return Batch.from_dict(
        {
            "prompt_ids": torch.where(pm > 0, torch.randint(0, 256, (4, P), generator=g), 0),
            "prompt_mask": pm,
            "response_ids": torch.where(rm > 0, torch.randint(0, 256, (4, R), generator=g), 0),
            "response_mask": rm,
            "advantages": (torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * rm).float(),
        }
    )


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: Any) -> str:
    return make_tiny_moe_model(tmp_path_factory.mktemp("rr") / "qwen3_moe", "qwen3_moe")


def engine(
    path: str,
    *,
    packing: bool = False,
    micro: MicroBatching | None = None,
    strategy: str = "torch",
    checkpointing: bool = False,
    ulysses: int = 1,
) -> Any:
    cfg = ActorConfig(
        strategy=strategy,
        ulysses_sequence_parallel_size=ulysses,
        grad_clip=None,
        use_dynamic_bsz=micro is not None and micro.max_tokens is not None,
        max_token_len_per_device=(micro.max_tokens or 1) if micro is not None else 1,
        micro_batch_size_per_device=micro.size if micro is not None else 4,
        optim=OptimConfig(lr=1e-2, weight_decay=0.0),
        router_replay="R2",
    )
    model = ModelConfig(
        path=path, use_remove_padding=packing, enable_gradient_checkpointing=checkpointing
    )
    spec = EngineSpec(
        model=model,
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=micro or MicroBatching(size=4),
        router_replay=True,
    )
    return build_engine(strategy, spec)


def chosen_experts(eng: Any) -> list[torch.Tensor]:
    """Collect the experts each router hands its block (after the replay hook)."""
    seen: list[torch.Tensor] = []
    for module in eng.model.modules():
        if type(module).__name__ == "Qwen3MoeTopKRouter":
            module.register_forward_hook(lambda m, a, out: seen.append(out[2].detach().clone()))
    return seen


# ----------------------------------------------------------------------- layout


def test_micro_routing_cuts_the_trimmed_columns_and_batch_routing_inverts_it() -> None:
    batch = make_batch()
    P, R = batch["prompt_ids"].shape[1], batch["response_ids"].shape[1]
    mb = batch.slice(1, 3)  # rows with shorter prompts/responses: columns get trimmed
    inp = model_inputs(mb, torch.device("cpu"))
    cols = torch.arange(P + R).reshape(1, P + R, 1, 1).expand(2, P + R, 1, 1)
    cut = micro_routing(cols, inp)
    W, r = inp.input_ids.shape[1], inp.response_len
    assert cut[0, :, 0, 0].tolist() == list(range(P - (W - r), P + r))
    back = batch_routing(cut, inp, P)
    kept = back[0, :, 0, 0]
    assert kept[P - (W - r) : P + r].tolist() == list(range(P - (W - r), P + r))
    assert (kept[: P - (W - r)] == -1).all() and (kept[P + r :] == -1).all()


def test_packed_round_trip() -> None:
    index = torch.tensor([[-1, 0, 1], [2, 3, -1]])
    padded = torch.tensor([[[9], [1], [2]], [[3], [4], [9]]])
    packed = to_packed(padded, index, 4)
    assert packed[:, 0].tolist() == [1, 2, 3, 4]
    assert from_packed(packed, index)[..., 0].tolist() == [[-1, 1, 2], [3, 4, -1]]


# ----------------------------------------------------------------------- gates


class _Router:
    def __init__(self, norm: bool) -> None:
        self.norm_topk_prob = norm


def test_replayed_gates_are_the_softmax_at_the_replayed_experts() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    experts = torch.tensor([[0, 2]])  # not the top-2: the replayed choice
    p = torch.softmax(logits, dim=-1)[0]
    raw = qwen_gates(_Router(False), logits, experts)
    torch.testing.assert_close(raw, torch.stack([p[0], p[2]])[None])
    norm = qwen_gates(_Router(True), logits, experts)  # softmax of the chosen logits
    e0, e2 = torch.exp(torch.tensor(0.0)), torch.exp(torch.tensor(2.0))
    torch.testing.assert_close(norm, torch.stack([e0, e2])[None] / (e0 + e2))
    torch.testing.assert_close(mixtral_gates(None, logits, experts), norm)


def test_replaying_the_routers_own_choice_changes_nothing_bitwise(moe_path: str) -> None:
    eng = engine(moe_path)
    batch = make_batch()
    plain = engine(moe_path).forward(batch)["log_probs"]
    out = eng.forward(batch, routing="record")
    assert torch.equal(out["log_probs"], plain)
    batch[ROUTED_EXPERTS] = out[ROUTED_EXPERTS]
    assert torch.equal(eng.forward(batch, routing="replay")["log_probs"], plain)


# ----------------------------------------------------------------------- following samples


def test_routing_follows_samples_through_micro_batches_packing_and_shuffles(moe_path: str) -> None:
    """A routing unlike the model's own (random distinct experts per token) gives the
    same log-probs however the batch is cut, packed and ordered, in no-grad and training
    forwards: each token gets its own row's experts."""
    batch = make_batch()
    B, C = len(batch), batch["prompt_ids"].shape[1] + batch["response_ids"].shape[1]
    g = torch.Generator().manual_seed(0)
    designed = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(B * C)])
    batch[ROUTED_EXPERTS] = designed.reshape(B, C, 1, 2).to(torch.int8)
    batch["row"] = torch.arange(B)
    ref = engine(moe_path).forward(batch, routing="replay")["log_probs"]
    own = engine(moe_path).forward(batch)["log_probs"]
    assert (ref - own).abs().max() > 1e-2  # the designed routing matters

    perm = torch.tensor([2, 0, 3, 1])
    shuffled = batch.select(perm)
    for packing, micro in [
        (False, MicroBatching(size=1)),
        (True, MicroBatching(size=3)),
        (True, MicroBatching(max_tokens=20)),
    ]:
        eng = engine(moe_path, packing=packing, micro=micro)
        got = eng.forward(shuffled, routing="replay")["log_probs"]
        torch.testing.assert_close(got, ref[perm], atol=2e-6, rtol=0)

        seen: dict[int, torch.Tensor] = {}

        def capture(
            mb: Batch, out: dict[str, torch.Tensor], seen: dict = seen
        ) -> tuple[torch.Tensor, dict]:
            for i, row in enumerate(mb["row"].tolist()):
                seen[row] = out["log_probs"][i].detach()
            return out["log_probs"].sum() * 0.0, {}

        eng.train_mini_batch(shuffled, capture)
        train = torch.stack([seen[i] for i in range(B)])
        torch.testing.assert_close(train, ref, atol=2e-6, rtol=0)
        assert packing == (eng.layouts["packed"] > 0)


# ----------------------------------------------------------------------- flips


def _scored_flips(batch: Batch, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(B, R)``: response tokens whose scoring position (the column before them) routes
    differently in ``a`` and ``b`` — the tiny model's only MoE layer is its last, so a
    flip moves the log-prob of that one token."""
    P = batch["prompt_ids"].shape[1]
    R = batch["response_ids"].shape[1]
    sets = a.sort(dim=-1).values != b.sort(dim=-1).values  # the chosen set, not its order
    differs = sets.flatten(2).any(dim=-1)[:, P - 1 : P + R - 1]
    return differs & (batch["response_mask"] > 0)


def _flip_router(eng: Any, batch: Batch, recorded: torch.Tensor) -> torch.Tensor:
    """Nudge the MoE router's weights until the engine's own routing of ``batch`` flips
    at a scored token (a tiny change: a near-tie); the flipped tokens ``(B, R)``."""
    router = next(m for m in eng.model.modules() if type(m).__name__ == "Qwen3MoeTopKRouter")
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(router.weight.shape, generator=g)
    for _ in range(300):
        with torch.no_grad():
            router.weight.add_(5e-4 * noise)
        now = eng.forward(batch, routing="record")[ROUTED_EXPERTS]
        flips = _scored_flips(batch, now, recorded)
        if flips.any():
            return flips
    raise AssertionError("no routing flip found")


def test_replay_keeps_the_recorded_routing_when_the_weights_flip_it(moe_path: str) -> None:
    eng = engine(moe_path)
    batch = make_batch()
    out = eng.forward(batch, routing="record")
    recorded = out[ROUTED_EXPERTS]
    flips = _flip_router(eng, batch, recorded)

    seen = chosen_experts(eng)
    batch[ROUTED_EXPERTS] = recorded
    replayed = eng.forward(batch, routing="replay")["log_probs"]
    inp = model_inputs(batch, torch.device("cpu"))
    cols = micro_routing(recorded, inp).long()  # (B, W, L, k): the recorded, as the model sees
    got = seen[-1].reshape(*inp.input_ids.shape, -1)
    mask = inp.attention_mask > 0
    assert torch.equal(got[mask], cols[..., 0, :][mask])  # exact indices at every real token
    free = eng.forward(make_batch())["log_probs"]
    # at a flipped token the free forward jumps; the replayed one moves with the weights only
    old = out["log_probs"]
    assert ((free - old).abs()[flips] > 2 * (replayed - old).abs()[flips]).all()


def test_r2_actor_update_replays_the_old_log_prob_routing(moe_path: str) -> None:
    """The actor's R2: compute_log_probs records, the update's first mini-batch (old
    weights) gives the old log-probs bitwise, and later mini-batches route by the record."""
    cfg = ActorConfig(
        strategy="torch",
        micro_batch_size_per_device=4,
        mini_batch_size=4,
        ppo_epochs=2,
        shuffle=False,
        optim=OptimConfig(lr=5e-2, weight_decay=0.0),
        router_replay="R2",
    )
    spec = EngineSpec(
        model=ModelConfig(path=moe_path, use_remove_padding=False),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=4),
        router_replay=True,
    )
    actor = Actor(cfg, build_engine("torch", spec))
    batch = actor.compute_log_probs(make_batch())
    assert batch[ROUTED_EXPERTS].shape == (4, 13, 1, 2)
    seen = chosen_experts(actor.engine)
    actor.update(batch)
    inp = model_inputs(batch, torch.device("cpu"))
    mask = inp.attention_mask > 0
    want = micro_routing(batch[ROUTED_EXPERTS], inp).long()[..., 0, :][mask]
    assert len(seen) == 2  # one forward per mini-batch (2 epochs × 1)
    for got in seen:  # also the second epoch's, after an optimizer step
        assert torch.equal(got.reshape(*inp.input_ids.shape, -1)[mask], want)


def test_r2_step_zero_log_probs_equal_the_old_ones_bitwise(moe_path: str) -> None:
    """Before any optimizer step a replayed training forward is the recorded forward:
    its log-probs are the old log-probs bit for bit (the PPO ratio is exactly 1)."""
    eng = engine(moe_path)
    batch = make_batch()
    out = eng.forward(batch, routing="record", with_entropy=True)
    batch[ROUTED_EXPERTS] = out[ROUTED_EXPERTS]
    got: list[torch.Tensor] = []

    def capture(mb: Batch, o: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        got.append(o["log_probs"].detach())
        return o["log_probs"].sum() * 0.0, {}

    eng.train_mini_batch(batch, capture)
    assert torch.equal(got[0], out["log_probs"])


@pytest.mark.slow
def test_rlvr_run_with_r2_on_an_moe_model(tmp_path: Any, moe_path: str, monkeypatch: Any) -> None:
    """Two GRPO steps of the tiny Qwen3-MoE with ``actor.router_replay: R2`` and two
    mini-batches a step (the second after an optimizer step), packed micro-batches."""
    from test_rlvr_tiny import read_metrics, tiny_config

    from temper.pipelines import run_pipeline

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config(
        tmp_path,
        moe_path,
        experiment={"output_dir": str(tmp_path / "run"), "max_steps": 2, "seed": 1},
        actor={"mini_batch_size": 8, "router_replay": "R2", "use_dynamic_bsz": True},
    )
    run_pipeline(cfg)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["actor/packed_fraction"] > 0 for r in rows)


def designed_routing(batch: Batch, seed: int = 0) -> torch.Tensor:
    """Random distinct top-2 experts of 4 for every token ``(B, P + R, 1, 2)``."""
    B, C = len(batch), batch["prompt_ids"].shape[1] + batch["response_ids"].shape[1]
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(4, generator=g)[:2] for _ in range(B * C)]
    return torch.stack(rows).reshape(B, C, 1, 2).to(torch.int8)


def _sum_loss(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    return (out["log_probs"] * mb["response_mask"]).sum(), {}


def test_recomputed_layers_replay_too(moe_path: str) -> None:
    """Activation checkpointing recomputes the MoE layer in the backward: the replay
    stays set, so the gradient is the one without checkpointing (the routers' own
    choice in the recomputation would give another)."""
    batch = make_batch()
    batch[ROUTED_EXPERTS] = designed_routing(batch)
    norms = [
        engine(moe_path, checkpointing=c).train_mini_batch(batch, _sum_loss)["grad_norm"]
        for c in (False, True)
    ]
    assert norms[0] == pytest.approx(norms[1], rel=1e-5)
    own = engine(moe_path).train_mini_batch(make_batch(), _sum_loss)["grad_norm"]
    assert own != pytest.approx(norms[0], rel=1e-3)  # the designed routing changes it


def _fsdp2_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    eng = engine(path, strategy="fsdp2", packing=True, checkpointing=True)
    mine = batch.slice(rank * 2, rank * 2 + 2)
    forced = eng.forward(mine, routing="replay")["log_probs"]
    rec = eng.forward(mine.select([0, 1]), routing="record")
    metrics = eng.train_mini_batch(mine, _sum_loss)
    return {"forced": forced, "record": rec[ROUTED_EXPERTS], "grad_norm": metrics["grad_norm"]}


@pytest.mark.slow
def test_fsdp2_replays_like_the_torch_engine(moe_path: str) -> None:
    """Two FSDP2 ranks (packed, activation checkpointing) replay a designed routing to
    the torch engine's log-probs and gradient, and record the torch engine's routing."""
    from temper.cluster.process_group import spawn_ranks

    batch = make_batch()
    ref = engine(moe_path)
    own = ref.forward(batch, routing="record")[ROUTED_EXPERTS]
    batch[ROUTED_EXPERTS] = designed_routing(batch)
    forced = ref.forward(batch, routing="replay")["log_probs"]
    norm = engine(moe_path).train_mini_batch(batch, _sum_loss)["grad_norm"]
    ranks = spawn_ranks(_fsdp2_rank, 2, moe_path, batch)
    got = torch.cat([r["forced"] for r in ranks])
    torch.testing.assert_close(got, forced, atol=2e-5, rtol=0)
    assert torch.equal(torch.cat([r["record"] for r in ranks]), own)
    for r in ranks:  # the gradient of the whole batch, summed over ranks
        assert r["grad_norm"] == pytest.approx(norm, rel=1e-4)


def _ulysses_rank(rank: int, world: int, path: str, batch: Batch, packing: bool) -> dict:
    eng = engine(path, strategy="fsdp2", packing=packing, checkpointing=True, ulysses=2)
    forced = eng.forward(batch, routing="replay")["log_probs"]  # both ranks: every sample
    rec = eng.forward(batch.select([0, 1, 2, 3]), routing="record")
    metrics = eng.train_mini_batch(batch, _sum_loss)
    return {"forced": forced, "record": rec[ROUTED_EXPERTS], "grad_norm": metrics["grad_norm"]}


@pytest.mark.slow
@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_ulysses_ranks_replay_and_record_like_the_torch_engine(moe_path: str, packing: bool):
    """One Ulysses group of two FSDP2 ranks, each routing its half of every sequence's
    columns (packed: of the one row; padded: of each rotated row): replaying a designed
    routing gives the torch engine's log-probs and gradient (activation checkpointing:
    the recomputed layers replay too), and recording gathers the torch engine's routing
    of the whole sequences, -1 at padding."""
    from temper.cluster.process_group import spawn_ranks

    batch = make_batch()
    ref = engine(moe_path)
    own = ref.forward(batch, routing="record")[ROUTED_EXPERTS]
    batch[ROUTED_EXPERTS] = designed_routing(batch)
    forced = ref.forward(batch, routing="replay")["log_probs"]
    norm = engine(moe_path).train_mini_batch(batch, _sum_loss)["grad_norm"]
    ranks = spawn_ranks(_ulysses_rank, 2, moe_path, batch, packing)
    for r in ranks:
        torch.testing.assert_close(r["forced"], forced, atol=2e-5, rtol=0)
        assert torch.equal(r["record"], own)
        assert r["grad_norm"] == pytest.approx(norm, rel=1e-4)
