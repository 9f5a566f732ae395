"""Supervised steps that teach a tiny vision-language model to answer a task at all.

The counterpart of ``temper.utils.tiny.teach_tiny_model`` for prompts with images: rows
in the data format temper reads (``prompt`` with ``<image>``, ``images``,
``reward_model.ground_truth``) go through temper's own data path (the model's
:class:`~temper.data.vision.VisionProcessor`), and the loss covers the answer tokens and
the end-of-turn token after them. Full-batch Adam; model and tokenizer are written to
``out_dir``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def teach_tiny_vlm(
    model_dir: str | Path,
    out_dir: str | Path,
    rows: list[dict[str, Any]],
    answers: list[str],
    *,
    steps: int = 30,
    lr: float = 3e-3,
    seed: int = 0,
) -> dict[str, float]:
    """Train ``model_dir`` to answer row ``i`` with ``answers[i]``; returns first/last loss."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from temper.config.schema import DataConfig
    from temper.data.prompts import parse_row
    from temper.data.vision import (
        load_vision_processor,
        stack_inputs,
        token_type_ids,
        vision_token_ids,
    )

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    cfg = DataConfig()
    vision = load_vision_processor(str(model_dir), tok, cfg)
    assert vision is not None, "not a vision-language model"
    seqs, labels, inputs = [], [], []
    for row, answer in zip(rows, answers):
        images = vision.read_images(row, cfg, str(model_dir))
        prompt = vision.render(parse_row(row, cfg).messages, images, cfg)
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        a_ids = tok(answer + tok.eos_token, add_special_tokens=False)["input_ids"]
        seqs.append(p_ids + a_ids)
        labels.append([-100] * len(p_ids) + a_ids)
        inputs.append(vision.model_inputs(images)[1])
    width = max(len(s) for s in seqs)
    pad = tok.pad_token_id
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    target = torch.tensor([t + [-100] * (width - len(t)) for t in labels])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32)
        image_id, video_id = vision_token_ids(model.config)
        extra = dict(stack_inputs(inputs))
        extra["mm_token_type_ids"] = token_type_ids(ids, width, image_id, video_id)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        losses = []
        for _ in range(steps):
            loss = model(input_ids=ids, attention_mask=mask, labels=target, **extra).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    vision.image_processor.save_pretrained(str(out))
    return {"loss_first": losses[0], "loss_last": losses[-1]}
