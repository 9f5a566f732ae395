"""Router replay R3 with the ``hf`` rollout engine (tiny Qwen3-MoE and Mixtral, fp32 CPU):

* the routing the engine records while it generates is the routing a teacher-forced
  forward of the trainer's model picks on the same tokens with the same weights — every
  token but the last generated one, in the batch's columns, whatever the chunking; the
  ``n`` samples of a prompt share their prompt's routing (one prefill);
* the actor under R3 replays it: with a rollout in bf16 (the trainer in fp32: routing
  flips at near-ties), the old-log-prob forward reproduces the rollout's log-probs at
  least as closely as without replay, and the update's first forward gives the old
  log-probs bitwise;
* a GRPO run with the ``hf`` rollout and R3 trains two steps.

Megatron: test_megatron_router_replay_r3.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from test_router_replay import chosen_experts

from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.data.routing import ROUTED_EXPERTS, real_columns
from temper.roles.actor import Actor
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine
from temper.training.micro_batching import MicroBatching, model_inputs
from temper.training.registry import build_engine
from temper.training.router_replay import micro_routing
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_moe_model

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="module")
def models(tmp_path_factory: Any) -> dict[str, str]:
    root = tmp_path_factory.mktemp("r3")
    return {t: make_tiny_moe_model(root / t, t) for t in ("qwen3_moe", "mixtral")}


def prompts(n: int = 3, seed: int = 0) -> Batch:
    """``n`` left-padded prompts of different lengths (at most 7 tokens)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 5, 2, 6, 4, 7, 1][:n])
    mask = (torch.arange(7)[None] >= 7 - lengths[:, None]).long()
    ids = torch.where(mask > 0, torch.randint(3, 250, (n, 7), generator=g), 0)
    return Batch.from_dict({"prompt_ids": ids, "prompt_mask": mask})


def trainer(path: str, replay: str = "R2", **actor: Any) -> Any:
    cfg = ActorConfig(
        strategy="torch",
        micro_batch_size_per_device=4,
        mini_batch_size=actor.pop("mini_batch_size", 4),
        optim=OptimConfig(lr=1e-2, weight_decay=0.0),
        router_replay=replay,
        **actor,
    )
    spec = EngineSpec(
        model=ModelConfig(path=path, use_remove_padding=False),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=4),
        router_replay=replay != "none",
    )
    return Actor(cfg, build_engine("torch", spec))


def rollout(
    path: str, batch: Batch, *, dtype: str = "fp32", chunk: int | None = None, n: int = 2
) -> Batch:
    engine = HFRolloutEngine.from_pretrained(path, dtype=dtype, infer_batch_size=chunk)  # type: ignore[arg-type]
    torch.manual_seed(0)
    params = SamplingParams(n=n, max_new_tokens=8 * n, routed_experts=True)
    return engine.generate(batch, params)


@pytest.mark.parametrize("model", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("chunk", [None, 1])
def test_recorded_routing_is_the_trainers_teacher_forced_routing(
    models: dict[str, str], model: str, chunk: int | None
) -> None:
    path = models[model]
    out = rollout(path, prompts(), chunk=chunk)
    routed = out[ROUTED_EXPERTS]
    actor = trainer(path)
    L = actor.engine.router_replay.num_layers
    assert routed.shape == (6, 7 + out["response_ids"].shape[1], L, 2)
    own = actor.engine.forward(out, routing="record")[ROUTED_EXPERTS]
    have = routed[..., 0] >= 0  # (B, C, L): a layer routes every token or none
    assert torch.equal(have, have[..., :1].expand_as(have))
    assert torch.equal(routed[have], own[have])  # exactly the trainer's experts
    real = real_columns(out["prompt_mask"], out["response_mask"])
    assert not (have[..., 0] & ~real).any()  # nothing at padding
    # only each row's last token is unrouted: no forward of the rollout ran it
    missed = (real & ~have[..., 0]).nonzero()
    last = real.cumsum(dim=1).argmax(dim=1)
    assert missed[:, 0].tolist() == list(range(6)) and torch.equal(missed[:, 1], last)
    # n = 2 samples of a prompt: one prefill, the same prompt routing
    assert torch.equal(routed[0::2, :7], routed[1::2, :7])


def _mismatch(batch: Batch) -> tuple[float, float]:
    """Mean and max |old − rollout| log-prob over response tokens."""
    mask = batch["response_mask"] > 0
    diff = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs()[mask]
    return float(diff.mean()), float(diff.max())


def test_r3_old_log_probs_follow_a_bf16_rollout_at_least_as_closely(
    models: dict[str, str],
) -> None:
    """A bf16 rollout routes some tokens differently from the fp32 trainer (near-ties);
    replaying its routing in the old-log-prob forward brings the trainer's log-probs at
    least as close to the rollout's as routing by its own top-k."""
    path = models["mixtral"]
    out = rollout(path, prompts(8, seed=1), dtype="bf16", n=4)
    with_r3 = trainer(path, "R3").compute_log_probs(out)
    without = trainer(path, "none").compute_log_probs(out)
    m3, m0 = _mismatch(with_r3), _mismatch(without)
    print(
        f"\n|old - rollout| log-prob, bf16 rollout: R3 mean {m3[0]:.3e} max {m3[1]:.3e}; "
        f"none mean {m0[0]:.3e} max {m0[1]:.3e}"
    )
    own = trainer(path).engine.forward(out, routing="record")[ROUTED_EXPERTS]
    have = out[ROUTED_EXPERTS] >= 0
    flips = int((out[ROUTED_EXPERTS][have] != own[have]).sum())
    print(f"experts the bf16 rollout chose unlike the fp32 trainer: {flips} of {int(have.sum())}")
    assert flips > 0  # the bf16 rollout routed some tokens otherwise
    assert m3[0] < m0[0] and m3[1] <= m0[1]


def test_r3_replays_the_rollout_routing_in_the_old_log_prob_and_update_forwards(
    models: dict[str, str],
) -> None:
    """Under R3 no forward records: the old-log-prob forward and every update forward
    (also after an optimizer step) route by the rollout's experts, and the update's
    first forward (old weights) gives the old log-probs bitwise."""
    path = models["qwen3_moe"]
    out = rollout(path, prompts(2, seed=2), dtype="bf16")
    out["advantages"] = torch.randn(out["response_mask"].shape) * out["response_mask"]
    actor = trainer(path, "R3", ppo_epochs=2, shuffle=False)
    seen = chosen_experts(actor.engine)
    batch = actor.compute_log_probs(out)
    assert torch.equal(batch[ROUTED_EXPERTS], out[ROUTED_EXPERTS])  # replayed, not re-recorded
    got: list[torch.Tensor] = []

    def capture(mb: Batch, o: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        got.append(o["log_probs"].detach())
        return o["log_probs"].sum() * 0.0, {}

    actor.engine.train_mini_batch(batch, capture)
    assert torch.equal(got[0], batch["old_log_probs"])
    actor.update(batch)
    inp = model_inputs(batch, torch.device("cpu"))
    want = micro_routing(batch[ROUTED_EXPERTS], inp).long()[..., 0, :]
    routed = want[..., 0] >= 0  # the last generated token routes by the router's own
    assert len(seen) == 4  # old log-probs, capture, 2 update epochs
    for experts in seen:
        assert torch.equal(experts.reshape(*inp.input_ids.shape, -1)[routed], want[routed])


@pytest.mark.slow
def test_rlvr_run_with_r3_and_the_hf_rollout(
    tmp_path: Any, models: dict[str, str], monkeypatch: Any
) -> None:
    """Two GRPO steps of the tiny Qwen3-MoE with ``actor.router_replay: R3``: the hf
    rollout (the actor's own module) records the routing, the actor replays it."""
    from test_rlvr_tiny import read_metrics, tiny_config

    from temper.pipelines import run_pipeline

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config(
        tmp_path,
        models["qwen3_moe"],
        experiment={"output_dir": str(tmp_path / "run"), "max_steps": 2, "seed": 1},
        rollout={"engine": "hf", "n": 4, "response_length": 12, "temperature": 1.0},
        actor={"mini_batch_size": 8, "router_replay": "R3", "use_dynamic_bsz": True},
    )
    run_pipeline(cfg)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    diffs = {k: v for k, v in rows[0].items() if k.startswith("rollout/logprob_diff")}
    print("\nR3 run, step 1:", diffs)
    assert rows[0]["rollout/logprob_diff_max"] < 1e-4  # same weights, same routing


@pytest.mark.slow
@pytest.mark.ray
def test_r3_on_ray_routing_travels_back_from_two_rollout_engines(
    tmp_path: Any, models: dict[str, str], monkeypatch: Any
) -> None:
    """Two FSDP2 actor ranks and two ``hf`` rollout engines on their ranks (Ray): each
    engine returns its slice's routing with its samples; stop tokens end responses at
    different lengths, so the slices are padded together (routing with -1) before the
    actor replays them."""
    pytest.importorskip("ray")
    import ray
    from test_ray_backend import ray_config
    from test_rlvr_tiny import read_metrics

    from temper.pipelines import run_pipeline

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    cfg = ray_config(
        tmp_path,
        models["qwen3_moe"],
        data={"train_batch_size": 4},
        rollout={"engine": "hf", "n": 2, "response_length": 8, "stop_token_ids": [*range(3, 90)]},
        actor={"mini_batch_size": 8, "router_replay": "R3"},
    )
    try:
        run_pipeline(cfg)
    finally:
        ray.shutdown()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/logprob_diff_max"] < 1e-4 for r in rows)  # the same weights
