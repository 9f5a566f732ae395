"""LoRA from a saved adapter (``model.lora.adapter_path``) and modules left out of LoRA
(``model.lora.exclude_modules``), on the torch engine (fsdp2 and deepspeed load their
model through the same ``load_causal_lm``)."""

from __future__ import annotations

import json

import pytest
import torch

from temper.algorithms.aggregation import LossAggregator
from temper.config.errors import ConfigError
from temper.config.lora_adapter import check_adapter_dir, take_adapter_config
from temper.config.schema import LoraConfig, ModelConfig, TemperConfig
from temper.data.batch import Batch
from temper.training.megatron_lora_targets import check_lora

from .conftest import make_batch, make_engine

PROMPTS = [7, 3, 5, 1]
RESPONSES = [6, 2, 4, 1]


def _pg_loss(mini: Batch):
    agg = LossAggregator.from_mask("token-mean", mini["response_mask"])

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]):
        loss = agg(-mb["advantages"] * out["log_probs"], mb["response_mask"])
        return loss, {"pg_loss": loss.detach()}

    return loss_fn


def _adapted(model: torch.nn.Module) -> set[str]:
    """Names of the modules peft wrapped (``….q_proj`` of ``….q_proj.lora_A.default``)."""
    return {n.split(".lora_A")[0] for n, _ in model.named_parameters() if ".lora_A." in n}


@pytest.fixture(scope="module")
def saved(tiny_path: str, tmp_path_factory):
    """An adapter trained one mini-batch and saved as a run's HF export saves it; the
    trained engine's log-probs on a fixed batch."""
    lora = LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    engine = make_engine(tiny_path, micro=2, lr=1e-2, model=ModelConfig(path=tiny_path, lora=lora))
    batch = make_batch(PROMPTS, RESPONSES, seed=4)
    engine.train_mini_batch(batch, _pg_loss(batch))
    out = tmp_path_factory.mktemp("export")
    engine.save_hf(str(out))
    with torch.no_grad():
        log_probs = engine.forward(batch)["log_probs"]
    return out / "lora_adapter", batch, log_probs


def test_the_adapters_saved_settings_become_the_sections(saved) -> None:
    adapter, _, _ = saved
    cfg = TemperConfig()
    cfg.model.lora = LoraConfig(rank=16, adapter_path=str(adapter))
    notes = take_adapter_config(cfg)
    lora = cfg.model.lora
    assert (lora.rank, lora.alpha, lora.dropout) == (4, 8, 0.0)
    assert lora.target_modules == ["down_proj", "q_proj", "v_proj"]
    # the file's own rank differed from the adapter's: said, not silently replaced
    assert notes == [f"model.lora.rank: 16 -> 4 (the adapter at {adapter} was saved with it)"]


def test_a_missing_adapter_leaves_the_section_and_fails_the_preflight(tmp_path) -> None:
    cfg = TemperConfig()
    cfg.model.lora = LoraConfig(adapter_path=str(tmp_path / "nowhere"))
    assert take_adapter_config(cfg) == [] and cfg.model.lora.rank == 0
    with pytest.raises(ConfigError) as err:
        check_adapter_dir(cfg.model.lora)
    assert err.value.key == "model.lora.adapter_path" and "adapter_config.json" in str(err.value)
    (tmp_path / "nowhere").mkdir()
    (tmp_path / "nowhere" / "adapter_config.json").write_text(json.dumps({"r": 4}))
    with pytest.raises(ConfigError, match="no adapter weights"):
        check_adapter_dir(cfg.model.lora)
    (tmp_path / "nowhere" / "adapter_config.json").write_text(json.dumps({"peft_type": "IA3"}))
    with pytest.raises(ConfigError, match="not a LoRA adapter"):
        take_adapter_config(cfg)


def test_training_resumes_from_the_saved_adapter(saved, tiny_path: str) -> None:
    """The base model under the loaded adapter is the trained policy (its log-probs), and
    only the adapter trains on."""
    adapter, batch, trained = saved
    cfg = TemperConfig()
    cfg.model.lora = LoraConfig(adapter_path=str(adapter))
    take_adapter_config(cfg)
    check_adapter_dir(cfg.model.lora)
    engine = make_engine(tiny_path, micro=2, model=ModelConfig(path=tiny_path, lora=cfg.model.lora))
    with torch.no_grad():
        torch.testing.assert_close(engine.forward(batch)["log_probs"], trained, atol=1e-6, rtol=0)
    trainable = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    engine.train_mini_batch(batch, _pg_loss(batch))
    moved = {n for n, p in engine.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and moved <= trainable


@pytest.mark.parametrize(
    ("exclude", "left_out"),
    [
        (r".*layers\.0\..*", lambda name: ".layers.0." in name),  # a regex, full match
        (["v_proj"], lambda name: name.endswith(".v_proj")),  # a name: itself or a suffix
    ],
)
def test_excluded_modules_get_no_adapter(tiny_path: str, exclude, left_out) -> None:
    lora = LoraConfig(rank=4, target_modules=["q_proj", "v_proj"])
    everything = _adapted(
        make_engine(tiny_path, model=ModelConfig(path=tiny_path, lora=lora)).model
    )
    lora.exclude_modules = exclude
    engine = make_engine(tiny_path, model=ModelConfig(path=tiny_path, lora=lora))
    assert _adapted(engine.model) == {n for n in everything if not left_out(n)}
    assert any(left_out(n) for n in everything)


@pytest.mark.parametrize("field", ["adapter_path", "exclude_modules"])
def test_the_megatron_engine_refuses_them(field: str) -> None:
    lora = LoraConfig(rank=8, target_modules=["linear_qkv"])
    setattr(lora, field, "/some/adapter" if field == "adapter_path" else ".*visual.*")
    with pytest.raises(ConfigError) as err:
        check_lora(lora, "actor")
    assert err.value.key == f"model.lora.{field}" and "fsdp2" in err.value.fix
