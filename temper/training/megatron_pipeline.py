"""Pipeline parallelism for the megatron engine: temper's own schedule over Megatron's
pipeline groups.

Megatron-Core's schedules (``pipeline_parallel.schedules``) and their point-to-point
layer allocate their receive buffers with ``torch.cuda.current_device()``, so they cannot
run on CPU. This module is a small schedule of its own, with ``torch.distributed``
send/recv between neighbouring stages (gloo on CPU, nccl on GPU alike):

* **GPipe order.** Every stage runs the forwards of all micro-batches, then their
  backwards, in the same order. The backwards run in micro-batch order, so gradients
  accumulate in the order a one-stage engine sums them. The last stage turns each
  micro-batch's output into its loss as it is made (the loss function's partial sums,
  unchanged: PP changes where a loss is computed, not what it is).
* **Activations** go forward with a header first (dtype and shape), so a stage never
  guesses the size of what it receives; gradients come back shaped like the activation
  the stage sent.
* **Forward only** (log-probs, values): the last stage's outputs of every micro-batch
  are broadcast over the pipeline group, so each rank returns what one stage would.
* **Tied embeddings**: the last stage's copy of a tied embedding gets the sum of both
  copies' gradients, as does the embedding (:func:`sync_tied_grads`); equal weights and
  equal gradients give equal AdamW updates, so the copies stay equal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from temper.training.megatron_parallel import Parallel

#: Activation dtypes by the code sent in the header
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HEADER = 4  # dtype code and a 3-d shape (sequence, batch, hidden)


class StageLink:
    """Point-to-point transfers between this stage and its neighbours: tensors travel on
    ``comm`` (the backend's device: CPU for gloo) and arrive on ``device``."""

    def __init__(self, parallel: Parallel, device: torch.device, comm: torch.device) -> None:
        self.p = parallel
        self.device = device
        self.comm = comm

    def send_forward(self, activation: torch.Tensor) -> None:
        t = activation.detach().to(self.comm).contiguous()
        header = [DTYPES.index(t.dtype), *t.shape]
        if len(header) != HEADER:
            raise ValueError(f"a stage sends (sequence, batch, hidden) tensors, not {t.shape}")
        dist.send(torch.tensor(header, dtype=torch.int64, device=self.comm), self.p.next_rank)
        dist.send(t, self.p.next_rank)

    def recv_forward(self) -> torch.Tensor:
        header = torch.empty(HEADER, dtype=torch.int64, device=self.comm)
        dist.recv(header, self.p.prev_rank)
        code, *shape = (int(v) for v in header.tolist())
        t = torch.empty(shape, dtype=DTYPES[code], device=self.comm)
        dist.recv(t, self.p.prev_rank)
        return t.to(self.device)

    def send_backward(self, grad: torch.Tensor) -> None:
        dist.send(grad.to(self.comm).contiguous(), self.p.prev_rank)

    def recv_backward(self, sent: torch.Tensor) -> torch.Tensor:
        grad = torch.empty(sent.shape, dtype=sent.dtype, device=self.comm)
        dist.recv(grad, self.p.next_rank)
        return grad.to(self.device)


#: ``(micro-batch index, activation received or None on the first stage) -> output``:
#: the activation to send on, or the last stage's result (a loss when training)
StageStep = Callable[[int, "torch.Tensor | None"], torch.Tensor]


def run_forwards(
    link: StageLink, count: int, step: StageStep, *, grad: bool
) -> list[tuple[torch.Tensor | None, torch.Tensor]]:
    """The forwards of ``count`` micro-batches: ``(received, output)`` of each, for the
    backwards (``grad``) or, forward only, the last stage's outputs (others keep
    nothing)."""
    p = link.p
    saved: list[tuple[torch.Tensor | None, torch.Tensor]] = []
    for i in range(count):
        received = None if p.first_stage else link.recv_forward()
        if received is not None and grad:
            received.requires_grad_()
        out = step(i, received)
        if not p.last_stage:
            link.send_forward(out)
        if grad or p.last_stage:
            saved.append((received, out))
    return saved


def run_backwards(link: StageLink, saved: list[tuple[torch.Tensor | None, torch.Tensor]]) -> None:
    """The backwards of :func:`run_forwards`' micro-batches, in their order: the last
    stage from its losses, the others from the gradient the next stage sends back."""
    p = link.p
    for received, out in saved:
        if p.last_stage:
            out.backward()
        else:
            torch.autograd.backward(out, link.recv_backward(out))
        if received is not None:
            g = received.grad
            link.send_backward(g if g is not None else torch.zeros_like(received))


def broadcast_outputs(
    link: StageLink, outputs: list[torch.Tensor], shapes: Sequence[tuple[int, ...]]
) -> list[torch.Tensor]:
    """The last stage's per-micro-batch ``outputs`` on every stage (``shapes``: theirs,
    known to every rank from its micro-batches); fp32, on the link's device."""
    p = link.p
    out: list[torch.Tensor] = []
    for i, shape in enumerate(shapes):
        if p.last_stage:
            t = outputs[i].float().to(link.comm).contiguous()
        else:
            t = torch.empty(shape, dtype=torch.float32, device=link.comm)
        dist.broadcast(t, group=p.pp_group, group_src=p.pp - 1)
        out.append(t.to(link.device))
    return out


def broadcast_sums(parallel: Parallel, sums: dict[str, float]) -> dict[str, float]:
    """The last stage's loss/metric sums on every stage of the pipeline."""
    box: list[object] = [sums if parallel.last_stage else None]
    dist.broadcast_object_list(box, group=parallel.pp_group, group_src=parallel.pp - 1)
    got = box[0]
    assert isinstance(got, dict)
    return {str(k): float(v) for k, v in got.items()}


def sync_tied_grads(link: StageLink, tied: torch.nn.Parameter | None) -> None:
    """Sum the gradients of a tied embedding's two copies (first and last stage) over
    the embedding group; ``tied``: this rank's copy (None on a middle stage)."""
    group = link.p.embedding_group
    if tied is None or group is None:
        return
    grad = tied.grad if tied.grad is not None else torch.zeros_like(tied)
    summed = grad.to(link.comm)
    dist.all_reduce(summed, group=group)
    tied.grad = summed.to(grad.device)


def sync_tied_state(link: StageLink, tensors: list[torch.Tensor] | None) -> None:
    """Copy the first stage's tied embedding (and its AdamW moments, ``tensors`` in the
    same order on both stages) onto the last stage's copy (the embedding group lists
    the first stage first)."""
    group = link.p.embedding_group
    if tensors is None or group is None:
        return
    for t in tensors:
        moved = t.detach().to(link.comm)
        dist.broadcast(moved, group=group, group_src=0)
        with torch.no_grad():
            t.copy_(moved)
