"""A tiny random causal LM with a real byte-level tokenizer, built offline.

Tests, examples and CI use it in place of a hub model: it loads with
``AutoModelForCausalLM`` / ``AutoTokenizer`` like any Hugging Face checkpoint (and in
vLLM), has a ChatML chat template, and trains in milliseconds on CPU.

    temper-tiny-model DIR  (or ``python -m temper.utils.tiny DIR``)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(out_dir: str | Path):
    """Byte-level tokenizer (256 byte tokens, no merges) + ChatML special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_chars))}
    for tok in SPECIAL_TOKENS:
        vocab[tok] = len(vocab)
    model = models.BPE(vocab=vocab, merges=[], unk_token=None)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
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


def teach_tiny_model(
    model_dir: str | Path,
    out_dir: str | Path,
    conversations: list[list[dict[str, str]]],
    *,
    steps: int = 120,
    lr: float = 3e-3,
    seed: int = 0,
) -> dict[str, float]:
    """Supervised-train a (tiny) model to write the assistant turns of ``conversations``.

    Each conversation is rendered once with the chat template; the loss (mean token
    cross-entropy) covers exactly the tokens of every assistant message's content and
    the end-of-turn text that follows it (``eos_token``), found by character offsets, so
    the model learns to write those turns — and to stop — after the same context.
    Full-batch Adam for ``steps`` steps; model and tokenizer are written to ``out_dir``.
    Lets an end-to-end test make a random model *do* something specific (e.g. write a
    well-formed tool call, then an answer) under greedy or low-temperature sampling.
    Needs a fast tokenizer (offsets). Returns ``{"loss_first", "loss_last"}``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    eos_text = tok.eos_token or ""
    rows, targets = [], []
    for messages in conversations:
        text = tok.apply_chat_template(messages, tokenize=False)
        spans = []  # character spans the loss covers
        for k, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            start = len(
                tok.apply_chat_template(messages[:k], tokenize=False, add_generation_prompt=True)
            )
            if not text.startswith(m["content"] + eos_text, start):
                raise ValueError("the chat template does not render assistant turns verbatim")
            spans.append((start, start + len(m["content"]) + len(eos_text)))
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        labels = [
            i if any(a <= lo and hi <= b for a, b in spans) and hi > lo else -100
            for i, (lo, hi) in zip(ids, enc["offset_mapping"])
        ]
        rows.append(ids)
        targets.append(labels)
    width = max(len(r) for r in rows)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids_t = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    labels_t = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            loss = model(input_ids=ids_t, attention_mask=mask, labels=labels_t).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return {"loss_first": losses[0], "loss_last": losses[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    args = parser.parse_args()
    print(make_tiny_model(args.out_dir))


if __name__ == "__main__":
    main()
