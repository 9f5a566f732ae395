"""Prompt data: files → templated, tokenized prompts → seeded, resumable prompt batches.

The pipeline's calls::

    train, val = build_datasets(cfg, tokenizer)          # PromptDataset | None each
    sampler = build_sampler(cfg, len(train), train.tags)  # PromptSampler
    batch = next_prompt_batch(train, sampler)             # Batch (prompt_ids left-padded)
    metrics = train.metrics()                             # {"data/skipped_rows": ..., ...}
    ckpt["sampler"] = sampler.state_dict(); sampler.load_state_dict(ckpt["sampler"])

Synthetic tasks: ``temper.data.tasks.write_task(name, path, n, seed, **knobs)`` (not
imported here so that ``python -m temper.data.tasks`` runs cleanly).
"""

from temper.data.batch import Batch
from temper.data.collate import PromptExample, collate_prompts, left_pad
from temper.data.dataset import PromptDataset, build_dataset, build_datasets
from temper.data.errors import DataError, RowIssue
from temper.data.row_files import write_rows
from temper.data.sampler import Draw, PromptSampler, build_sampler, next_prompt_batch
from temper.data.sources import read_rows

__all__ = [
    "Batch",
    "DataError",
    "Draw",
    "PromptDataset",
    "PromptExample",
    "PromptSampler",
    "RowIssue",
    "build_dataset",
    "build_datasets",
    "build_sampler",
    "collate_prompts",
    "left_pad",
    "next_prompt_batch",
    "read_rows",
    "write_rows",
]
