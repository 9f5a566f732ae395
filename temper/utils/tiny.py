"""A tiny random causal LM with a real byte-level tokenizer, built offline.

Tests, benchmarks and CI use it in place of a hub model: it loads with
``AutoModelForCausalLM`` / ``AutoTokenizer`` like any Hugging Face checkpoint (and in
vLLM), has a ChatML chat template, and trains in milliseconds on CPU. It stays in the
package (not under ``tests/``) because the benchmarks and the command below use it to
try a config on a machine without a model hub; the test-only helpers (a scripted
policy, teaching a tiny model a conversation) live in ``tests/doubles.py``.

    python -m temper.utils.tiny DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(out_dir: str | Path):
    """Byte-level tokenizer (256 byte tokens, no merges) + ChatML special tokens."""
    return byte_tokenizer(out_dir, SPECIAL_TOKENS, CHATML_TEMPLATE)


def byte_tokenizer(
    out_dir: str | Path, specials: list[str], chat_template: str, words: tuple[str, ...] = ()
):
    """A byte-level tokenizer (256 byte tokens, no merges), ``specials`` after them, then
    ``words`` as whole-word tokens, saved to ``out_dir`` with ``chat_template``; its
    ``eos`` is ``<|im_end|>`` and its pad ``<|pad|>`` (both among ``specials``)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    for tok in specials:
        vocab[tok] = len(vocab)
    model = models.BPE(vocab=vocab, merges=[], unk_token=None)
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(specials)
    if words:
        backend.add_tokens([AddedToken(w, single_word=True, normalized=False) for w in words])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = chat_template
    fast.save_pretrained(str(out_dir))
    return fast


def make_tiny_model(
    out_dir: str | Path,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 1024,
    seed: int = 0,
) -> Path:
    """Write a tiny Llama-architecture model + tokenizer to ``out_dir`` (idempotent)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    out = Path(out_dir)
    stamp = out / "temper_tiny.json"
    spec = dict(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
    )
    if stamp.is_file() and json.loads(stamp.read_text()) == spec:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out))
    stamp.write_text(json.dumps(spec))
    return out


def tiny_fields(tok: Any, **over: Any) -> dict[str, Any]:
    """The config fields the tiny test models share — 64 wide, 2 layers, 4 heads over 2
    KV heads (GQA), 256 positions — with the byte tokenizer's size and ids; ``over``
    replaces or adds fields."""
    return {
        "vocab_size": len(tok),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        **over,
    }


def save_seeded(
    config: Any,
    out: Path,
    seed: int,
    drawn: tuple[str, ...] = (),
    head: Any = None,
) -> str:
    """Build a model of ``config`` under ``seed`` (torch's RNG restored afterwards) and
    save it to ``out``. Parameters whose names end in ``drawn`` are drawn from N(0, 0.5²)
    (norm scales from N(1, 0.5²)) instead of their init — q/k/v biases and qk-norms that
    HF initialises to 0 and 1, or routers, so that they matter in a test. ``head``: the
    Auto class (a causal LM by default)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = (head or AutoModelForCausalLM).from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if drawn and name.endswith(drawn):
                    p.copy_(torch.randn_like(p) * 0.5 + (1.0 if "norm" in name else 0.0))
    model.save_pretrained(str(out))
    return str(out)


def make_tiny_classifier(out_dir: str | Path, model_type: str = "qwen2", seed: int = 4) -> str:
    """Write a tiny random ``*ForSequenceClassification`` reward model (``num_labels`` 1)
    with the byte tokenizer to ``out_dir``: ``llama`` (GQA, tied embeddings in its
    config) or ``qwen2`` (q/k/v biases, drawn large so that they matter)."""
    from transformers import AutoModelForSequenceClassification, LlamaConfig, Qwen2Config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    kind = LlamaConfig if model_type == "llama" else Qwen2Config
    config = kind(**tiny_fields(tok, num_labels=1, tie_word_embeddings=model_type == "llama"))
    head = AutoModelForSequenceClassification
    return save_seeded(config, out, seed, drawn=("_proj.bias",), head=head)


def make_tiny_moe_model(
    out_dir: str | Path, model_type: str, num_layers: int = 2, *, dense_first: bool = True
) -> str:
    """A tiny random MoE model with the shared byte tokenizer: ``num_layers`` layers, 4
    experts, top-2, router weights scaled up so that tokens spread unevenly over the
    experts. A Qwen3-MoE's first layer has a dense MLP unless ``dense_first`` is off."""
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    out = Path(out_dir)
    if (out / "config.json").is_file():
        return str(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    common = tiny_fields(
        tok,
        intermediate_size=96,
        num_hidden_layers=num_layers,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    )
    if model_type == "qwen2_moe":
        config: Any = Qwen2MoeConfig(
            **common, num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=48
        )
    elif model_type == "qwen3_moe":
        # head_dim is a config field the class's typed signature leaves out
        qwen3: dict[str, Any] = dict(
            head_dim=32, mlp_only_layers=[0] if dense_first else [], norm_topk_prob=True
        )
        config = Qwen3MoeConfig(**common, num_experts=4, moe_intermediate_size=32, **qwen3)
    else:
        config = MixtralConfig(**common, num_local_experts=4)
    # the router and the shared expert's gate
    return save_seeded(config, out, seed=3, drawn=("gate.weight",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    args = parser.parse_args()
    print(make_tiny_model(args.out_dir))


if __name__ == "__main__":
    main()
