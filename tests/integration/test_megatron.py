"""The megatron engine (Megatron-Core ``GPTModel``, gloo on CPU) against Hugging Face and
the torch engine: converted tiny Llama / Qwen2 / Qwen3 models give HF's logits at TP=1
and TP=2; one actor update at TP=2 and at TP=1 × DP=2 gives the torch engine's weights;
the critic's values and update match too; checkpoints reshard between TP=2 and TP=1;
exported weights and HF directories load in transformers.

Ranks are forked by ``spawn_ranks`` after this module has imported Megatron-Core, so a
spawn costs a fork (~1 s), not Megatron's import (~5-10 s per process).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
import torch.distributed.checkpoint

import temper.training.megatron_engine
import temper.training.megatron_layers  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import (
    ActorConfig,
    CriticConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
)
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.roles.critic import Critic
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow

PAD = 259
PROMPTS = [7, 3, 5, 1]
RESPONSES = [6, 2, 4, 1]


# ----------------------------------------------------------------------- fixtures


def _tiny(out: Path, model_type: str) -> str:
    """A tiny random model of ``model_type`` with the shared byte tokenizer.

    llama: GQA 4/2, tied embeddings, llama3 RoPE scaling. qwen2: q/k/v biases (random,
    not HF's zero init), untied. qwen3: qk-norm (random scales), head_dim 32 ≠ 64/4,
    untied, rope_theta 1e6.
    """
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    if (out / "config.json").is_file():
        return str(out)
    out.mkdir(parents=True, exist_ok=True)
    common = tiny_fields(build_tokenizer(out))
    if model_type == "llama":
        rope = {
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }
        config: Any = LlamaConfig(**common, tie_word_embeddings=True, rope_parameters=rope)
    elif model_type == "qwen2":
        config = Qwen2Config(**common, tie_word_embeddings=False)
    else:
        config = Qwen3Config(
            **common,
            head_dim=32,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        )
    return save_seeded(config, out, seed=3, drawn=("_proj.bias", "q_norm.weight", "k_norm.weight"))


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("megatron-models")
    return {t: _tiny(root / t, t) for t in ("llama", "qwen2", "qwen3")}


def make_batch(seed: int = 0) -> Batch:
    """4 left/right-padded samples of different lengths, advantages ±1."""
    g = torch.Generator().manual_seed(seed)
    B, P, R = len(PROMPTS), 7, 6
    pl, rl = torch.tensor(PROMPTS), torch.tensor(RESPONSES)
    pm = (torch.arange(P)[None] >= P - pl[:, None]).long()
    rm = (torch.arange(R)[None] < rl[:, None]).long()
    return Batch.from_dict(
        {
            "prompt_ids": torch.where(pm > 0, torch.randint(0, 256, (B, P), generator=g), PAD),
            "prompt_mask": pm,
            "response_ids": torch.where(rm > 0, torch.randint(0, 256, (B, R), generator=g), PAD),
            "response_mask": rm,
            "advantages": (torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * rm).float(),
            "returns": (torch.tensor([0.3, -0.2, 0.8, 0.1])[:, None] * rm).float(),
        }
    )


def actor_config(strategy: str, tp: int = 1) -> ActorConfig:
    """Token-budget micro-batches (12 tokens) so ranks run different micro-batch counts;
    a small grad_clip so clipping bites; a decaying LR for the resume test."""
    return ActorConfig(
        strategy=strategy,
        use_dynamic_bsz=True,
        max_token_len_per_device=12,
        grad_clip=0.05,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        entropy_coeff=0.01,
        megatron=MegatronConfig(tensor_model_parallel_size=tp),
        optim=OptimConfig(
            lr=1e-3, weight_decay=0.01, lr_scheduler="linear", total_training_steps=4
        ),
    )


def megatron_actor(path: str, strategy: str, megatron: MegatronConfig | None = None) -> Actor:
    """An actor of :func:`actor_config` on ``strategy``, laid out by ``megatron`` (the
    Megatron test files' shared builder)."""
    cfg = actor_config(strategy)
    if megatron is not None:
        cfg.megatron = megatron
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
        total_steps=4,
    )
    return Actor(cfg, build_engine(strategy, spec))


def megatron_critic(path: str, strategy: str, megatron: MegatronConfig | None = None) -> Critic:
    """A critic (clipping at 0.5, seed 5) on ``strategy``, laid out by ``megatron``."""
    cfg = CriticConfig(
        strategy=strategy,
        micro_batch_size_per_device=1,
        grad_clip=0.5,
        megatron=megatron or MegatronConfig(),
        optim=OptimConfig(lr=1e-3, weight_decay=0.01),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        kind="value",
        train=cfg,
        infer_micro=MicroBatching(size=2),
        seed=5,
        role="critic",
    )
    return Critic(cfg, build_engine(strategy, spec))


def make_actor(path: str, strategy: str, tp: int = 1) -> Actor:
    return megatron_actor(path, strategy, MegatronConfig(tensor_model_parallel_size=tp))


def make_critic(path: str, strategy: str, tp: int = 1) -> Critic:
    return megatron_critic(path, strategy, MegatronConfig(tensor_model_parallel_size=tp))


def with_log_probs(actor: Actor, batch: Batch) -> Batch:
    batch = actor.compute_log_probs(batch)
    noise = torch.randn(batch["old_log_probs"].shape, generator=torch.Generator().manual_seed(3))
    batch["ref_log_probs"] = (batch["old_log_probs"] + 0.1 * noise) * batch["response_mask"]
    return batch


def shard(batch: Batch, index: int, count: int) -> Batch:
    n = len(batch) // count
    return batch.slice(index * n, (index + 1) * n)


def weights(engine: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.named_weights()}


def assert_close_weights(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(ref)
    for k in got:
        torch.testing.assert_close(got[k], ref[k], atol=1e-5, rtol=1e-4, msg=k)


# ----------------------------------------------------------------------- conversion


def _logits_rank(rank: int, world: int, paths: dict[str, str], ids: torch.Tensor) -> dict:
    """Full logits (TP shards gathered) of every model at TP=2, then at TP=1 × DP=2."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from temper.training.megatron_model import build_model, read_model_source
    from temper.training.megatron_parallel import init_parallel

    out: dict[str, torch.Tensor] = {}
    for tp in (2, 1):
        m = MegatronConfig(tensor_model_parallel_size=tp)
        parallel = init_parallel(m, role="actor", device=torch.device("cpu"), seed=0)
        for name, path in paths.items():
            spec = EngineSpec(model=ModelConfig(path=path), device=torch.device("cpu"), megatron=m)
            source = read_model_source(spec)
            built = build_model(spec, source, parallel, torch.device("cpu"))
            with torch.no_grad():
                local = built.module(ids, torch.arange(ids.shape[1]).expand_as(ids), None)
            parts = [torch.empty_like(local) for _ in range(tp)]
            if tp > 1:
                dist.all_gather(parts, local.contiguous(), group=parallel.tp_group)
            else:
                parts = [local]
            out[f"{name}/tp{tp}"] = torch.cat(parts, dim=-1)[..., : built.layout.vocab_size]
        parallel_state.destroy_model_parallel()
    return out if rank == 0 else {}


def test_converted_models_give_hf_logits_at_tp1_and_tp2(tiny_models) -> None:
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(1))
    (got, _) = spawn_ranks(_logits_rank, 2, tiny_models, ids)
    for name, path in tiny_models.items():
        ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)(ids).logits
        for tp in (1, 2):
            torch.testing.assert_close(
                got[f"{name}/tp{tp}"], ref, atol=2e-5, rtol=1e-5, msg=f"{name}/tp{tp}"
            )


def _forward_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    actor = make_actor(path, "megatron", tp=2)
    out = actor.engine.forward(batch, with_entropy=True, temperature=0.7, with_sum_pi_squared=True)
    named = weights(actor.engine)
    return {"out": out, "weights": named} if rank == 0 else {}


def test_padded_log_probs_entropy_and_export_match_hf(tiny_models, tiny_path) -> None:
    """Left/right-padded rows: log-probs, entropy and Σπ² (vocabulary-parallel) equal
    the torch engine's (HF); the TP=2 export gives back exactly the HF tensors."""
    from safetensors.torch import load_file

    batch = make_batch()
    for path in (tiny_path, tiny_models["qwen3"]):
        ref = make_actor(path, "torch").engine.forward(
            batch, with_entropy=True, temperature=0.7, with_sum_pi_squared=True
        )
        (got, _) = spawn_ranks(_forward_rank, 2, path, batch)
        for k in ("log_probs", "entropy", "sum_pi_squared"):
            torch.testing.assert_close(got["out"][k], ref[k], atol=1e-5, rtol=1e-5, msg=k)
        saved = load_file(str(Path(path) / "model.safetensors"))
        if "lm_head.weight" not in saved:  # tied: the export names it too, as HF's state_dict
            saved["lm_head.weight"] = saved["model.embed_tokens.weight"]
        assert set(got["weights"]) == set(saved)
        for k, v in got["weights"].items():
            assert torch.equal(v, saved[k]), k


# ----------------------------------------------------------------------- updates


def _step_rank(rank: int, world: int, path: str, batch: Batch, tp: int) -> dict:
    actor = make_actor(path, "megatron", tp=tp)
    engine = actor.engine
    mine = shard(batch, engine.dp_rank, engine.dp_size)
    old = actor.compute_log_probs(mine)["old_log_probs"]
    metrics = actor.update(mine)
    full = weights(engine)  # a collective: every rank gathers
    return {
        "old": old,
        "dp": engine.dp_rank,
        "metrics": metrics,
        "weights": full if rank == 0 else None,
    }


@pytest.mark.parametrize("tp", [2, 1], ids=["tp2", "tp1xdp2"])
def test_actor_update_matches_torch_engine(tiny_path: str, tp: int) -> None:
    single = make_actor(tiny_path, "torch")
    batch = with_log_probs(single, make_batch())
    before = weights(single.engine)
    ref_metrics = single.update(batch)
    ref_weights = weights(single.engine)

    ranks = spawn_ranks(_step_rank, 2, tiny_path, batch, tp)

    dp = 2 // tp
    olds = [next(r["old"] for r in ranks if r["dp"] == d) for d in range(dp)]
    torch.testing.assert_close(torch.cat(olds), batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    got = ranks[0]["metrics"]
    assert got.keys() == ref_metrics.keys()
    for k, v in ref_metrics.items():
        if k == "actor/packed_fraction":  # a layout choice (megatron never packs)
            continue
        assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
        assert ranks[1]["metrics"][k] == got[k], k  # every rank reports the global value
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active
    assert_close_weights(ranks[0]["weights"], ref_weights)
    moved = [k for k in ranks[0]["weights"] if not torch.equal(before[k], ranks[0]["weights"][k])]
    assert len(moved) == len(ranks[0]["weights"])


def _critic_rank(rank: int, world: int, path: str, batch: Batch, out: str) -> dict:
    critic = make_critic(path, "megatron", tp=2)
    values = critic.compute_values(batch)["values"]
    batch = batch.union(Batch.from_dict({"values": values}))
    metrics = critic.update(batch)
    named = weights(critic.engine)
    critic.engine.save_hf(out)
    # a megatron critic starts from the exported value-model directory (backbone + head)
    again = make_critic(out, "megatron", tp=2).compute_values(batch)["values"]
    result = {"values": values, "metrics": metrics, "weights": named, "reloaded": again}
    return result if rank == 0 else {}


def test_critic_values_update_and_export_match_torch_engine(tiny_path: str, tmp_path: Path) -> None:
    from temper.training.torch_engine import TorchEngine

    single = make_critic(tiny_path, "torch")
    batch = make_batch()
    values = single.compute_values(batch)["values"]
    ref_metrics = single.update(batch.union(Batch.from_dict({"values": values})))
    ref = {k: v.detach().clone() for k, v in single.engine.model.state_dict().items()}

    (got, _) = spawn_ranks(_critic_rank, 2, tiny_path, batch, str(tmp_path / "critic"))

    torch.testing.assert_close(got["values"], values, atol=1e-5, rtol=1e-5)
    after = single.compute_values(batch)["values"]
    torch.testing.assert_close(got["reloaded"], after, atol=1e-5, rtol=1e-4)
    for k, v in ref_metrics.items():
        assert got["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    for name, tensor in got["weights"].items():
        key = (
            name.replace("value_head.", "value_head.")
            if name.startswith("value_head.")
            else f"backbone.{name}"
        )
        torch.testing.assert_close(tensor, ref[key], atol=1e-5, rtol=1e-4, msg=name)
    # the exported critic reloads as the torch engine's value model, with the same values
    spec = EngineSpec(
        model=ModelConfig(path=str(tmp_path / "critic")), device=torch.device("cpu"), kind="value"
    )
    again = TorchEngine(spec).forward(batch, with_values=True)["values"]
    torch.testing.assert_close(again, after, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------- checkpoints


def _checkpoint_rank(
    rank: int, world: int, path: str, b1: Batch, b2: Batch, ckpt: str, tp: int, mode: str
):
    actor = make_actor(path, "megatron", tp=tp)
    engine = actor.engine
    out: dict[str, Any] = {}
    if mode == "train":
        actor.update(shard(b1, engine.dp_rank, engine.dp_size))
        engine.save_checkpoint(f"{ckpt}/a")
    else:
        engine.load_checkpoint(f"{ckpt}/a")
    out["w1"] = weights(engine)
    actor.update(shard(b2, engine.dp_rank, engine.dp_size))
    out["w2"] = weights(engine)
    out["lr"] = engine.schedule.state_dict() if engine.schedule else None
    return out if rank == 0 else None


def test_checkpoint_resumes_at_another_tensor_parallel_size(tiny_path: str, tmp_path: Path) -> None:
    """TP=2: step, save A, step → W2. TP=1 (one rank): load A, step → W2 again: model,
    AdamW moments and the LR schedule come back, resharded."""
    single = make_actor(tiny_path, "torch")
    b1 = with_log_probs(single, make_batch(seed=1))
    b2 = with_log_probs(single, make_batch(seed=2))
    ckpt = str(tmp_path)
    (trained, _) = spawn_ranks(_checkpoint_rank, 2, tiny_path, b1, b2, ckpt, 2, "train")
    (resumed,) = spawn_ranks(_checkpoint_rank, 1, tiny_path, b1, b2, ckpt, 1, "load")
    for k in trained["w1"]:
        torch.testing.assert_close(resumed["w1"][k], trained["w1"][k], atol=0, rtol=0, msg=k)
        torch.testing.assert_close(resumed["w2"][k], trained["w2"][k], atol=1e-6, rtol=1e-5, msg=k)
    assert resumed["lr"] == trained["lr"]
    assert not torch.equal(
        trained["w1"]["model.embed_tokens.weight"], trained["w2"]["model.embed_tokens.weight"]
    )


# ----------------------------------------------------------------------- distillation


def _kd_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    from temper.algorithms.kd import KDParams
    from temper.roles.kd_loss import TEACHER_LOGITS
    from temper.training.micro_batching import KD_INDICES

    actor = make_actor(path, "megatron", tp=2)
    values, ids = actor.engine.top_logits(batch, 5, 0.5)
    work = batch.union(Batch.from_dict({KD_INDICES: ids, TEACHER_LOGITS: values}))
    metrics = actor.distill_update(work, "forward_kl", KDParams(teacher_temperature=0.5), 0.5)
    full = weights(actor.engine)
    return {"values": values, "ids": ids, "metrics": metrics, "weights": full} if rank == 0 else {}


def test_offline_distillation_at_tp2_matches_torch_engine(tiny_path: str) -> None:
    """The vocabulary-parallel top-k of a teacher forward and gather of a student's logits
    at the teacher's ids (offline distillation) at TP=2 give the torch engine's top-k, loss
    and weights (the model as its own teacher at half the temperature: a divergence > 0)."""
    from temper.algorithms.kd import KDParams
    from temper.roles.kd_loss import TEACHER_LOGITS
    from temper.training.micro_batching import KD_INDICES

    batch = make_batch(seed=5)
    single = make_actor(tiny_path, "torch")
    values, ids = single.engine.top_logits(batch, 5, 0.5)
    work = batch.union(Batch.from_dict({KD_INDICES: ids, TEACHER_LOGITS: values}))
    ref = single.distill_update(work, "forward_kl", KDParams(teacher_temperature=0.5), 0.5)
    assert ref["actor/distill_loss"] > 0.01
    (got, _) = spawn_ranks(_kd_rank, 2, tiny_path, batch)
    torch.testing.assert_close(got["values"], values, atol=1e-5, rtol=1e-5)
    assert torch.equal(got["ids"], ids)
    for k in ("actor/loss", "actor/distill_loss", "actor/sft_loss", "actor/grad_norm"):
        assert got["metrics"][k] == pytest.approx(ref[k], rel=1e-5, abs=1e-6), k
    assert_close_weights(got["weights"], weights(single.engine))
