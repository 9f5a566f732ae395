"""LoRA on the megatron engine against the torch engine's (peft) LoRA, fp32 on CPU: with
the same adapters (random A and B, loaded from the peft model) both give the same
log-probs with adapters on and off (the reference policy), one actor update gives the
same metrics, adapters and merged weights at TP = 1, TP = 2 and PP = 2; only adapter
parameters move; the merged export is base + scale·B·A; a checkpoint resumes exactly
(and a TP = 2 one at TP = 1);
the HF directory holds the merged model and peft's adapter directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
from test_megatron import actor_config, make_batch, weights  # same folder: on sys.path

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import LoraConfig, MegatronConfig, ModelConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow

LORA = LoraConfig(rank=4, alpha=8)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    """qwen2: untied, q/k/v biases; llama: tied embeddings (split over PP = 2)."""
    from test_megatron import _tiny

    root = tmp_path_factory.mktemp("megatron-lora")
    return {t: _tiny(root / t, t) for t in ("qwen2", "llama")}


def lora_actor(path: str, strategy: str, tp: int = 1, pp: int = 1, cp: int = 1) -> Actor:
    cfg = actor_config(strategy)
    cfg.megatron = MegatronConfig(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp
    )
    spec = EngineSpec(
        model=ModelConfig(path=path, lora=LORA),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
        total_steps=4,
    )
    return Actor(cfg, build_engine(strategy, spec))


def random_adapters(actor: Actor) -> dict[str, torch.Tensor]:
    """Random A and B on the torch actor (B ≠ 0: the adapters change the model); their
    peft-named tensors."""

    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in actor.engine.model.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return peft_state(actor)


def peft_state(actor: Actor) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(actor.engine.model)
    return {k: v.detach().clone() for k, v in state.items()}


def _step_rank(
    rank: int,
    world: int,
    path: str,
    batch: Batch,
    adapters: dict,
    tp: int,
    pp: int,
    cp: int,
    out: str,
) -> dict[str, Any] | None:
    actor = lora_actor(path, "megatron", tp=tp, pp=pp, cp=cp)
    engine: Any = actor.engine
    engine.lora.load_peft(adapters)
    with engine.adapters_disabled():
        base_log_probs = actor.compute_log_probs(batch)["old_log_probs"]
    log_probs = actor.compute_log_probs(batch)["old_log_probs"]
    frozen = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    trainable = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    metrics = actor.update(batch)
    moved = {n for n, p in engine.model.named_parameters() if not torch.equal(p, frozen[n])}
    merged = weights(engine)
    peft = dict(engine.checkpointer.peft_named_weights())
    engine.save_checkpoint(f"{out}/ckpt")
    engine.save_hf(f"{out}/hf")
    actor.update(batch)
    peft2 = dict(engine.checkpointer.peft_named_weights())
    result = {
        "base": base_log_probs,
        "lora": log_probs,
        "metrics": metrics,
        "trainable": trainable,
        "moved": moved,
        "merged": merged,
        "peft": peft,
        "peft2": peft2,
    }
    return result if rank == 0 else None


def _resume_rank(rank: int, world: int, path: str, batch: Batch, tp: int, pp: int, out: str) -> Any:
    actor = lora_actor(path, "megatron", tp=tp, pp=pp)
    engine: Any = actor.engine
    engine.load_checkpoint(f"{out}/ckpt")
    actor.update(batch)
    peft = dict(engine.checkpointer.peft_named_weights())
    return peft if rank == 0 else None


@pytest.mark.parametrize(
    ("model", "tp", "pp", "cp"),
    [("qwen2", 1, 1, 1), ("qwen2", 2, 1, 1), ("llama", 1, 2, 1), ("qwen2", 1, 1, 2)],
    ids=["tp1", "tp2", "pp2-tied", "cp2"],
)
def test_lora_matches_the_torch_engines(
    models: dict[str, str], tmp_path: Path, model: str, tp: int, pp: int, cp: int
) -> None:
    from safetensors.torch import load_file

    path = models[model]
    single = lora_actor(path, "torch")
    adapters = random_adapters(single)
    batch = make_batch()
    with single.engine.adapters_disabled():
        base = single.compute_log_probs(batch)["old_log_probs"]
    batch = single.compute_log_probs(batch)
    noise = torch.randn(batch["old_log_probs"].shape, generator=torch.Generator().manual_seed(3))
    batch["ref_log_probs"] = (base + 0.1 * noise) * batch["response_mask"]
    ref_metrics = single.update(batch)
    ref_merged = weights(single.engine)
    ref_peft = peft_state(single)

    out = str(tmp_path)
    got = spawn_ranks(_step_rank, tp * pp * cp, path, batch, adapters, tp, pp, cp, out)[0]

    torch.testing.assert_close(got["lora"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got["base"], base, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got["lora"], got["base"], atol=1e-3)  # the adapters count
    for k, v in ref_metrics.items():
        if k == "actor/packed_fraction":  # a layout choice (megatron never packs)
            continue
        assert got["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    # only adapters train, and every one of this rank's moved
    assert got["trainable"] and all(".lora." in n for n in got["trainable"])
    assert got["moved"] == got["trainable"]
    assert got["peft"].keys() == ref_peft.keys()
    for k, v in ref_peft.items():
        torch.testing.assert_close(got["peft"][k], v, atol=1e-5, rtol=1e-4, msg=k)
    assert got["merged"].keys() == ref_merged.keys()
    for k, v in ref_merged.items():
        torch.testing.assert_close(got["merged"][k], v, atol=1e-5, rtol=1e-4, msg=k)
    # the merged export is base + (alpha / rank)·B·A
    hf = load_file(str(Path(path) / "model.safetensors"))
    name = "model.layers.1.self_attn.k_proj.weight"
    peft_key = "base_model.model.model.layers.1.self_attn.k_proj.lora_{}.weight"
    a, b = got["peft"][peft_key.format("A")], got["peft"][peft_key.format("B")]
    scale = LORA.alpha / LORA.rank
    torch.testing.assert_close(got["merged"][name], hf[name] + scale * b @ a, atol=1e-6, rtol=0)
    # the HF directory: merged model + peft's adapter directory, as the torch engine writes
    saved = load_file(str(tmp_path / "hf" / "lora_adapter" / "adapter_model.safetensors"))
    assert saved.keys() == ref_peft.keys()
    assert (tmp_path / "hf" / "lora_adapter" / "adapter_config.json").is_file()
    assert (tmp_path / "hf" / "config.json").is_file()
    if tp == pp == cp == 1:  # peft loads the adapter directory onto the base model
        from peft import PeftModel, get_peft_model_state_dict
        from transformers import AutoModelForCausalLM

        base_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        peft_model = PeftModel.from_pretrained(base_model, str(tmp_path / "hf" / "lora_adapter"))
        loaded = get_peft_model_state_dict(peft_model)
        for k, v in got["peft"].items():
            torch.testing.assert_close(loaded[k], v, atol=0, rtol=0, msg=k)
    # a checkpoint resumes exactly at the layout that wrote it, and a TP = 2 (CP = 2) one
    # at TP = 1 (CP = 1: the adapters' shards gathered; equal to rounding)
    again = 1 if tp == 2 else tp
    resumed = spawn_ranks(_resume_rank, again * pp, path, batch, again, pp, out)[0]
    exact = 0.0 if again == tp and cp == 1 else 1e-6
    for k, v in got["peft2"].items():
        torch.testing.assert_close(resumed[k], v, atol=exact, rtol=exact, msg=k)
