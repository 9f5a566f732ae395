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
  Each stage holds the activations of all its micro-batches until their backwards
  (GPipe's memory cost; a 1F1B order would hold at most PP of them and is not built):
  it lets every loss be checked for finiteness before any backward, as one stage does.
* **Interleaved (virtual) stages.** With ``v`` model chunks per rank
  (:mod:`megatron_chunks`: rank ``r`` holds virtual stages ``r, r+p, …``) a micro-batch
  goes through the ``p·v`` chunks in order, from rank ``p−1``'s chunk ``c`` back to
  rank 0's chunk ``c+1``. The order is *chunk-major*: every micro-batch through chunk 0
  on every rank, then chunk 1, …; the backwards in reverse chunk order, micro-batches in
  order within a chunk. With ``m`` micro-batches and ``t`` the time of one chunk on one
  micro-batch, rank 0 works without pause once ``m ≥ p`` (the first micro-batch is back
  from rank ``p−1`` before rank 0 ends a chunk), so each phase idles ``(p−1)·t`` per
  rank — GPipe's bubble over the same ranks divided by ``v``; with ``m < p`` each chunk
  boundary adds ``(p−m)·t``. Memory stays GPipe's (all micro-batches' activations of
  every chunk). This is not Megatron's interleaved 1F1B, which also bounds memory.
* **Transfers** are sent without blocking (``isend``) and awaited at the end of each
  phase, so a rank never waits for its receiver: in chunk-major order rank ``p−1``
  sends to rank 0 while rank 0 still sends its own chunk on, and blocking sends both
  ways would wait for each other. The hops from rank ``p−1`` back to rank 0 (and their
  gradients) travel on a group of their own (:attr:`Parallel.wrap_group`): a group's
  transfers between two ranks run in one order (NCCL: one stream per pair of ranks),
  and with two stages both hops of the ring join the same two ranks, so rank 1's
  hand-back to rank 0 would otherwise queue behind rank 0's sends to rank 1 that wait
  for it. (Exercised on gloo; NCCL pipelines need several GPUs, not run here.)
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

from temper.data.batch import Batch
from temper.training.base import NonFiniteError
from temper.training.megatron_parallel import Parallel
from temper.training.step_sums import LOSS_SUM, StepSums

#: ``(model chunk, micro-batch index, micro-batch, activation received or None on the
#: pipeline's first chunk) -> the chunk's output`` (hidden states to send on; the last
#: chunk's logits or values)
Stage = Callable[[int, int, Batch, "torch.Tensor | None"], torch.Tensor]
#: The last stage's outputs of a micro-batch (log-probs, entropy or values by key)
Head = Callable[[Batch, torch.Tensor], dict[str, torch.Tensor]]
#: A micro-batch's loss (a partial sum of the mini-batch's) and metric sums
MicroLoss = Callable[[Batch, dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]

#: Activation dtypes by the code sent in the header
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
HEADER = 4  # dtype code and a 3-d shape (sequence, batch, hidden)


def set_stage_input(module: torch.nn.Module, received: torch.Tensor | None) -> None:
    """Give a pipeline stage's ``GPTModel`` the previous stage's hidden states, which its
    decoder starts from in the next forward (the first stage embeds its tokens)."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    assert isinstance(module, GPTModel)
    module.set_input_tensor(received)


class StageLink:
    """Point-to-point transfers between this stage and its neighbours: tensors travel on
    ``comm`` (the backend's device: CPU for gloo) and arrive on ``device``. Sends do not
    block; :meth:`flush` waits for them (see the module doc)."""

    def __init__(self, parallel: Parallel, device: torch.device, comm: torch.device) -> None:
        self.p = parallel
        self.device = device
        self.comm = comm
        self._pending: list[tuple[object, torch.Tensor]] = []

    def _send(self, t: torch.Tensor, dst: int, wrap: bool) -> None:
        group = self.p.wrap_group if wrap else None
        # the tensor is kept until the send completes (it is not copied)
        self._pending.append((dist.isend(t, dst, group=group), t))

    def _recv(self, t: torch.Tensor, src: int, wrap: bool) -> None:
        dist.recv(t, src, group=self.p.wrap_group if wrap else None)

    def flush(self) -> None:
        """Wait for every send made so far."""
        for work, _ in self._pending:
            work.wait()  # type: ignore[attr-defined]
        self._pending = []

    def send_forward(self, activation: torch.Tensor) -> None:
        """To the next virtual stage: the next rank, or rank 0 from the last rank."""
        t = activation.detach().to(self.comm).contiguous()
        header = [DTYPES.index(t.dtype), *t.shape]
        if len(header) != HEADER:
            raise ValueError(f"a stage sends (sequence, batch, hidden) tensors, not {t.shape}")
        wrap = self.p.last_stage
        self._send(
            torch.tensor(header, dtype=torch.int64, device=self.comm), self.p.next_rank, wrap
        )
        self._send(t, self.p.next_rank, wrap)

    def recv_forward(self) -> torch.Tensor:
        """From the previous virtual stage: the previous rank, or on rank 0 the last."""
        wrap = self.p.first_stage
        header = torch.empty(HEADER, dtype=torch.int64, device=self.comm)
        self._recv(header, self.p.prev_rank, wrap)
        code, *shape = (int(v) for v in header.tolist())
        t = torch.empty(shape, dtype=DTYPES[code], device=self.comm)
        self._recv(t, self.p.prev_rank, wrap)
        return t.to(self.device)

    def send_backward(self, grad: torch.Tensor) -> None:
        self._send(grad.to(self.comm).contiguous(), self.p.prev_rank, self.p.first_stage)

    def recv_backward(self, sent: torch.Tensor) -> torch.Tensor:
        grad = torch.empty(sent.shape, dtype=sent.dtype, device=self.comm)
        self._recv(grad, self.p.next_rank, self.p.last_stage)
        return grad.to(self.device)


#: ``(model chunk, micro-batch index, activation received or None on the pipeline's
#: first chunk) -> output``: the activation to send on, or the last chunk's result (a
#: loss when training)
StageStep = Callable[[int, int, "torch.Tensor | None"], torch.Tensor]
#: ``saved[chunk][micro-batch]``: what a chunk received and made in a forward
Saved = list[list[tuple["torch.Tensor | None", torch.Tensor]]]


def run_forwards(link: StageLink, count: int, step: StageStep, *, grad: bool) -> Saved:
    """The forwards of ``count`` micro-batches through this rank's chunks, chunk-major:
    ``(received, output)`` of each, for the backwards (``grad``) or, forward only, the
    pipeline's last chunk's outputs (other chunks keep nothing)."""
    p = link.p
    saved: Saved = [[] for _ in range(p.vp)]
    for c in range(p.vp):
        for i in range(count):
            received = None if p.first_chunk(c) else link.recv_forward()
            if received is not None and grad:
                received.requires_grad_()
            out = step(c, i, received)
            if not p.last_chunk(c):
                link.send_forward(out)
            if grad or p.last_chunk(c):
                saved[c].append((received, out))
    link.flush()
    return saved


def run_backwards(
    link: StageLink, saved: Saved, before: Callable[[int], None] | None = None
) -> None:
    """The backwards of :func:`run_forwards`' micro-batches, chunks in reverse order and
    micro-batches in order within one: the pipeline's last chunk from its losses, the
    others from the gradient the next virtual stage sends back; ``before(i)`` runs
    before each backward of micro-batch ``i`` (once per chunk)."""
    p = link.p
    for c in reversed(range(p.vp)):
        for i, (received, out) in enumerate(saved[c]):
            if before is not None:
                before(i)
            if p.last_chunk(c):
                out.backward()
            else:
                torch.autograd.backward(out, link.recv_backward(out))
            if received is not None:
                g = received.grad
                link.send_backward(g if g is not None else torch.zeros_like(received))
    link.flush()


def forward_only(
    link: StageLink,
    micro: list[Batch],
    stage: Stage,
    head: Head,
    keys: list[str],
    width: int | None = None,
) -> list[dict[str, torch.Tensor]]:
    """No-grad outputs ``keys`` of every micro-batch, ``(b, R)`` each (``(b, R, width)``
    with ``width``), on every stage, in fp32."""

    def step(c: int, i: int, received: torch.Tensor | None) -> torch.Tensor:
        hidden = stage(c, i, micro[i], received)
        if not link.p.last_chunk(c):
            return hidden
        out = head(micro[i], hidden)
        return torch.stack([out[k] for k in keys])

    saved = run_forwards(link, len(micro), step, grad=False)
    trailing = () if width is None else (width,)
    shapes = [(len(keys), len(mb), mb["response_ids"].shape[1], *trailing) for mb in micro]
    stacked = broadcast_outputs(link, [out for _, out in saved[-1]], shapes)
    return [dict(zip(keys, t)) for t in stacked]


def train_forward_backward(
    link: StageLink,
    micro: list[Batch],
    groups: list[list[int]],
    stage: Stage,
    head: Head,
    loss: MicroLoss,
    *,
    all_min: Callable[[list[float]], list[float]],
    role: str,
    before_backward: Callable[[int], None] | None = None,
) -> tuple[float, dict[str, float]]:
    """Forwards, then backwards of every micro-batch, gradients accumulated on each
    stage: the ``(loss sum, metric sums)`` of the pipeline's micro-batches on every stage
    (padding micro-batches, ``groups[i]`` empty, contribute nothing). Every loss is
    checked before any backward (``all_min``: a MIN over the role's ranks), so a
    non-finite one leaves no gradient anywhere. ``before_backward(i)``: a hook before
    micro-batch ``i``'s backward (in every chunk)."""
    last = link.p.last_stage
    sums = StepSums()  # on the last stage: the loss under LOSS_SUM, then the metrics

    def step(c: int, i: int, received: torch.Tensor | None) -> torch.Tensor:
        mb = micro[i]
        hidden = stage(c, i, mb, received)
        if not link.p.last_chunk(c):
            return hidden
        value, metrics = loss(mb, head(mb, hidden))
        if not groups[i]:  # padding micro-batch: same transfers, no contribution
            return value * 0.0
        sums.add({LOSS_SUM: value, **metrics})
        return value

    saved = run_forwards(link, len(micro), step, grad=True)
    finite = [1.0] * len(micro)
    if last:
        finite = [float(torch.isfinite(out.detach()).all()) for _, out in saved[-1]]
    bad = [i for i, ok in enumerate(all_min(finite)) if ok <= 0]
    if bad:
        raise NonFiniteError(
            f"{role}: loss is not finite in micro-batch {bad[0]}; optimizer step skipped, "
            "weights unchanged"
        )
    run_backwards(link, saved, before_backward)
    result = broadcast_sums(link.p, sums.floats())
    return result.pop(LOSS_SUM, 0.0), result


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
