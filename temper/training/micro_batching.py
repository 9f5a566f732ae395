"""Cutting a batch into micro-batches and building the trimmed model inputs of each.

Two ways to cut (``MicroBatching``):

* a fixed number of samples per micro-batch (``size``), in order;
* a token budget (``max_tokens``): samples are packed first-fit-decreasing by their real
  (unpadded) length into as few micro-batches as fit, which also groups similar lengths
  and so wastes less padding. Consecutive rows with one prompt (a GRPO group) stay
  together where the budget allows, so that packing can carry their prompt once. A
  sample longer than the budget gets a micro-batch alone.
  Callers scatter results back with the returned indices, so the original order holds.

Each micro-batch is then trimmed to its own longest real prompt and response instead of
the global padded width: prompts are left-padded, so leading all-pad columns go;
responses are right-padded, so trailing all-pad columns go. Removing the rest of the
padding (``model.use_remove_padding``: the micro-batch as one packed row) is
:mod:`temper.training.packing`, chosen per micro-batch by the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from temper.data.batch import Batch


@dataclass(frozen=True)
class MicroBatching:
    """How a batch is cut: ``max_tokens`` set → token budget, else ``size`` samples."""

    size: int = 1
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"micro-batch size must be >= 1, got {self.size}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"micro-batch token budget must be >= 1, got {self.max_tokens}")


def response_attention(batch: Batch) -> torch.Tensor:
    """``(B, R)`` 1 on response positions that hold a real token.

    Taken from ``attention_mask`` when the batch has it. Otherwise every position up to
    the last trained token counts: in multi-turn responses the tool/observation tokens
    (``response_mask`` 0) sit *between* trained tokens and must stay visible.
    """
    R = batch["response_ids"].shape[1]
    if "attention_mask" in batch:
        return batch["attention_mask"][:, -R:].to(torch.long)
    m = batch["response_mask"] > 0
    pos = torch.arange(R, device=m.device).expand_as(m)
    last = torch.where(m, pos, torch.full_like(pos, -1)).max(dim=1, keepdim=True).values
    return (pos <= last).to(torch.long)


def real_lengths(batch: Batch) -> torch.Tensor:
    """``(B,)`` prompt + response tokens that are not padding."""
    return batch["prompt_mask"].sum(dim=1).long() + response_attention(batch).sum(dim=1)


def first_fit_decreasing(
    lengths: list[int], budget: int, units: list[list[int]] | None = None
) -> list[list[int]]:
    """Indices grouped so each group's total length is <= ``budget`` (oversized alone).

    ``units`` (default: each index alone) are kept together — a unit over the budget is
    cut into consecutive pieces that fit. Longest unit first, each into the first group
    with room; groups keep ascending indices.
    """
    items: list[list[int]] = []
    for unit in units if units is not None else [[i] for i in range(len(lengths))]:
        piece: list[int] = []
        load = 0
        for i in unit:
            if piece and load + lengths[i] > budget:
                items.append(piece)
                piece, load = [], 0
            piece.append(i)
            load += lengths[i]
        items.append(piece)
    size = [sum(lengths[i] for i in item) for item in items]
    order = sorted(range(len(items)), key=lambda k: (-size[k], items[k][0]))
    groups: list[list[int]] = []
    loads: list[int] = []
    for k in order:
        for g, load in enumerate(loads):
            if load + size[k] <= budget:
                groups[g].extend(items[k])
                loads[g] += size[k]
                break
        else:
            groups.append(list(items[k]))
            loads.append(size[k])
    return [sorted(g) for g in groups]


def shared_prompt_runs(batch: Batch) -> list[list[int]]:
    """Runs of consecutive rows with the same prompt — a GRPO group, whose rows come
    together (``aabb``) unless shuffled. A token-budget cut keeps them in one micro-batch
    so that packing carries the prompt once (:mod:`temper.training.packing`)."""
    ids, mask = batch["prompt_ids"], batch["prompt_mask"]
    same = ((ids[1:] == ids[:-1]) & (mask[1:] == mask[:-1])).all(dim=1).tolist()
    runs: list[list[int]] = [[0]] if len(batch) else []
    for i, joined in enumerate(same, start=1):
        if joined:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def micro_batch_indices(batch: Batch, spec: MicroBatching) -> list[list[int]]:
    """Row indices of each micro-batch of ``batch`` under ``spec``."""
    n = len(batch)
    if spec.max_tokens is None:
        return [list(range(i, min(i + spec.size, n))) for i in range(0, n, spec.size)]
    lengths = real_lengths(batch).tolist()
    return first_fit_decreasing(lengths, spec.max_tokens, shared_prompt_runs(batch))


def split_micro_batches(batch: Batch, spec: MicroBatching) -> tuple[list[Batch], list[list[int]]]:
    """The micro-batches and their row indices in ``batch``."""
    groups = micro_batch_indices(batch, spec)
    if spec.max_tokens is None:
        return [batch.slice(g[0], g[-1] + 1) for g in groups], groups
    return [batch.select(g) for g in groups], groups


@dataclass
class ModelInputs:
    """Trimmed model inputs of one micro-batch.

    ``input_ids = prompt[:, -P':] ‖ response[:, :R']``; the logits (or hidden states) at
    the last ``R' + 1`` positions, minus the final one, score the ``R'`` response tokens.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_ids: torch.Tensor
    response_len: int
    full_response_len: int
    #: the same inputs on the host (None when these are): what is planned from them
    #: (scored positions, packing) is then read without waiting for the device
    on_host: ModelInputs | None = None

    @property
    def host(self) -> ModelInputs:
        """These inputs on the host, or themselves where no host copy is kept."""
        return self.on_host if self.on_host is not None else self


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device`` without the host waiting for the device: to a GPU from pinned
    memory, asynchronously (a copy from pageable memory first waits for the stream's
    queued work — the previous micro-batch's backward — to finish)."""
    if device.type != "cuda" or x.device.type != "cpu":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def model_inputs(batch: Batch, device: torch.device) -> ModelInputs:
    """Concatenate, trim to the micro-batch's real extent, and derive position ids.

    Position ids count real tokens only (``cumsum(mask) - 1``), so a left-padded row sees
    the same positions as it would alone: batch-of-1 equals batch-of-N. Built on the
    host; the host copy is kept (``on_host``) when ``device`` is another.
    """
    prompt_mask = batch["prompt_mask"].to(torch.long)
    resp_attn = response_attention(batch)
    R = resp_attn.shape[1]
    has_prompt = prompt_mask.any(dim=0).nonzero()
    if has_prompt.numel() == 0:
        raise ValueError("every prompt in the micro-batch is empty; the first token has no logits")
    p_start = int(has_prompt[0])
    has_resp = resp_attn.any(dim=0).nonzero()
    r_len = max(int(has_resp[-1]) + 1 if has_resp.numel() else 0, 1)
    ids = torch.cat([batch["prompt_ids"][:, p_start:], batch["response_ids"][:, :r_len]], dim=1)
    mask = torch.cat([prompt_mask[:, p_start:], resp_attn[:, :r_len]], dim=1)
    pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
    host = ModelInputs(
        input_ids=ids.to(dtype=torch.long),
        attention_mask=mask,
        position_ids=pos,
        response_ids=batch["response_ids"][:, :r_len].to(dtype=torch.long),
        response_len=r_len,
        full_response_len=R,
    )
    if host.input_ids.device == torch.device(device):
        return host
    return ModelInputs(
        input_ids=to_device(host.input_ids, device),
        attention_mask=to_device(host.attention_mask, device),
        position_ids=to_device(host.position_ids, device),
        response_ids=to_device(host.response_ids, device),
        response_len=r_len,
        full_response_len=R,
        on_host=host,
    )


def pad_response(x: torch.Tensor, full_len: int) -> torch.Tensor:
    """Right-pad a ``(b, R', …)`` per-response-token tensor with zeros back to ``(b, R, …)``."""
    if x.shape[1] == full_len:
        return x
    return torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, full_len - x.shape[1]))


#: Batch key of offline distillation's teacher token ids per response token ``(B, R, k)``:
#: a training forward given it also returns the model's logits at those ids (``KD_LOGITS``).
KD_INDICES = "kd_indices"
#: Output key of the model's logits at ``KD_INDICES``, ``(B, R, k)``, differentiable.
KD_LOGITS = "kd_logits"


def masked_outputs(
    out: dict[str, torch.Tensor], mb: Batch, inp: ModelInputs
) -> dict[str, torch.Tensor]:
    """A micro-batch's per-response-token outputs ``(b, r, …)`` (floats as float32), zero where
    ``response_mask`` is 0, right-padded to the batch's response length ``(b, R, …)``."""
    mask = to_device(mb["response_mask"][:, : inp.response_len] > 0, inp.input_ids.device)
    result = {}
    for k, v in out.items():
        m = mask.reshape(mask.shape + (1,) * (v.dim() - 2))
        value = v.float() if v.is_floating_point() else v  # token ids stay integers
        kept = torch.where(m, value, torch.zeros_like(value))
        result[k] = pad_response(kept, inp.full_response_len)
    return result


__all__ = [
    "KD_INDICES",
    "KD_LOGITS",
    "MicroBatching",
    "ModelInputs",
    "first_fit_decreasing",
    "masked_outputs",
    "micro_batch_indices",
    "model_inputs",
    "pad_response",
    "real_lengths",
    "response_attention",
    "shared_prompt_runs",
    "split_micro_batches",
    "to_device",
]
