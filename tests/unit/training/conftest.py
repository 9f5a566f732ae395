"""Fixtures for engine tests: one tiny model per session, random left/right-padded batches."""

from __future__ import annotations

import os

import torch

from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.training.micro_batching import MicroBatching
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
torch.set_num_threads(2)

PAD = 259


def make_batch(
    prompt_lens: list[int], response_lens: list[int], P: int = 7, R: int = 6, seed: int = 0
) -> Batch:
    """Left-padded prompts, right-padded responses, random advantages."""
    g = torch.Generator().manual_seed(seed)
    B = len(prompt_lens)
    pl, rl = torch.tensor(prompt_lens), torch.tensor(response_lens)
    pm = (torch.arange(P)[None] >= P - pl[:, None]).long()
    rm = (torch.arange(R)[None] < rl[:, None]).long()
    pid = torch.where(pm > 0, torch.randint(0, 256, (B, P), generator=g), PAD)
    rid = torch.where(rm > 0, torch.randint(0, 256, (B, R), generator=g), PAD)
    adv = torch.randn(B, 1, generator=g).expand(B, R) * rm
    return Batch.from_dict(
        {
            "prompt_ids": pid,
            "prompt_mask": pm,
            "response_ids": rid,
            "response_mask": rm,
            "advantages": adv.contiguous(),
        }
    )


def make_engine(
    path: str,
    *,
    micro: int = 1,
    max_tokens: int | None = None,
    lr: float = 1e-3,
    train: bool = True,
    model: ModelConfig | None = None,
    kind: str = "causal_lm",
    master_dtype: str = "fp32",
    **optim: object,
) -> TorchEngine:
    actor = ActorConfig(
        master_dtype=master_dtype,  # type: ignore[arg-type]
        micro_batch_size_per_device=micro,
        use_dynamic_bsz=max_tokens is not None,
        max_token_len_per_device=max_tokens or 16384,
        optim=OptimConfig(lr=lr, weight_decay=0.0, **optim),  # type: ignore[arg-type]
    )
    spec = EngineSpec(
        model=model or ModelConfig(path=path),
        device=torch.device("cpu"),
        kind=kind,  # type: ignore[arg-type]
        train=actor if train else None,
        infer_micro=MicroBatching(size=micro, max_tokens=max_tokens),
    )
    return TorchEngine(spec)
