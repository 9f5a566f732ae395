"""The ``megatron`` engine: a Megatron-Core ``GPTModel`` with tensor, pipeline and data
parallelism (verl ``strategy: megatron``, ROLL ``megatron_train`` / ``megatron_infer``).

It runs inside the role's ``torch.distributed`` world (the Ray worker group; a one-rank
world is made on the local backend). :mod:`megatron_parallel` cuts the world into
tensor-parallel (TP), pipeline-parallel (PP) and data-parallel (DP) groups;
:mod:`megatron_model` builds the model from the HF checkpoint, each rank holding its TP
shard of its pipeline stage. The training loop, micro-batching, loss bookkeeping and LR
schedule are the :class:`TorchEngine`'s; this class supplies the model, its forward,
and the collectives:

* **Samples.** The TP groups of one pipeline compute on the same samples (the worker
  group hands every rank of it the same shard, see :attr:`dp_rank`); DP groups on
  different ones. Loss normalizers and metrics are summed over the DP group only.
* **Forward.** Each micro-batch (left-padded prompt ‖ right-padded response) is shifted
  row by row so that its real tokens start at position 0: RoPE positions are then the
  sequence positions, exactly Hugging Face's ``cumsum(mask) - 1``, and causal attention
  alone masks the trailing padding. Log-probs and entropy come from the vocabulary-
  parallel logits without gathering them (:mod:`megatron_vocab`). A vision-language
  model's micro-batch enters as a decoder input (word embeddings with the vision
  tower's features at the image placeholders) with 3-D M-RoPE positions
  (:mod:`megatron_vision`).
* **Pipeline.** With PP > 1 the micro-batches go through the stages on temper's own
  schedule (:mod:`megatron_pipeline`: all forwards, then all backwards); the last stage
  computes outputs and losses, and its log-probs, values and metric sums are broadcast
  so that every rank returns what a one-stage engine would. With virtual pipeline
  stages each rank holds several model chunks (:mod:`megatron_chunks`), each a
  ``GPTModel`` of its own; the optimizer, gradient reductions, checkpoints and export
  run over all of them.
* **Sequence parallelism** (``megatron.sequence_parallel``; always for an MoE model
  at TP > 1): the TP ranks hold shares of each sequence between the TP layers, the ids
  padded at their end to a multiple of TP (:mod:`megatron_sp`).
* **Context parallelism** (``megatron.context_parallel_size``): the CP ranks of a DP
  rank get the same samples; each runs its share of every sequence (padded at its end to
  a multiple of ``2·CP``) in Megatron's load-balanced layout (:mod:`megatron_cp`), the
  attention gathering keys and values over the CP group. Per-position outputs are
  gathered back to whole sequences before the loss, which each CP rank computes whole;
  their gradients are summed with the DP ranks'.
* **Gradients.** TP-sharded weights get their gradient from Megatron's TP layers;
  after the micro-batches, the partial gradients of TP-replicated weights (norms under
  sequence parallelism, q/k norms, an MoE router) are summed over the TP group as
  Megatron's ``finalize_model_grads`` sums them, then gradients over the DP group (each rank's loss is
  a partial sum of the mini-batch loss) — and a tied embedding's over its first- and
  last-stage copies — then clipped by the global norm over TP × PP, counting each
  TP-replicated weight (norms) and the tied copy once. AdamW on the fp32 local shards,
  as the torch engine does — so one update equals the torch engine's at any TP × PP × DP.
* **Router replay** (MoE, :mod:`megatron_router_replay`): every stage records and
  replays its own MoE layers, every CP and TP rank its own tokens; a recording forward's
  routing is gathered over TP and CP within each stage's forward and over the pipeline
  after all of them, so every rank returns the whole ``routed_experts``.
* **Collectives in step.** Every rank runs the same number of micro-batches (padding
  micro-batches with zero loss, as FSDP2 does) and a non-finite loss anywhere stops
  every rank before its backward.

Checkpoints (sharded, reshardable over TP, PP and DP) and the export to Hugging Face
names are :class:`~temper.training.megatron_io.MegatronCheckpointer`'s, which the engine
builds from its model, parallel groups, optimizer, schedule and spec.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from temper.data.batch import Batch
from temper.training.base import LossFn
from temper.training.megatron_check import (
    check_engine_spec,
    half_precision_note,
    unapplied_options,
)
from temper.training.megatron_cp import cp_multiple, cp_positions
from temper.training.megatron_grads import clip_grad_norm, reduce_grads
from temper.training.megatron_head import ResponseHead, right_align
from temper.training.megatron_io import MegatronCheckpointer
from temper.training.megatron_lora import LoraAdapters, TPSplit, attach_lora
from temper.training.megatron_lora_targets import check_lora
from temper.training.megatron_model import MegatronModel, build_model, read_model_source
from temper.training.megatron_moe import (
    RouterStats,
    load_imbalance,
    router_loss_scales,
    set_router_loss_scale,
)
from temper.training.megatron_parallel import init_parallel
from temper.training.megatron_pipeline import (
    StageLink,
    forward_only,
    set_stage_input,
    train_forward_backward,
)
from temper.training.megatron_router_replay import (
    MegatronRouterReplay,
    held_order,
    model_tokens,
    token_columns,
)
from temper.training.megatron_sp import pad_sequence, stage_padding_mask
from temper.training.micro_batching import (
    MicroBatching,
    ModelInputs,
    model_inputs,
    split_micro_batches,
)
from temper.training.packing import PackedInputs
from temper.training.router_replay import (
    ROUTED_EXPERTS,
    Recording,
    RoutingHooks,
    batch_routing,
    routing_dtype,
)
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

log = logging.getLogger(__name__)


class MegatronEngine(TorchEngine):
    """Causal LM or value model on Megatron-Core, tensor × data parallel."""

    built: MegatronModel  # the GPTModel and its conversion maps (set by _load_model)
    _aux_scales: list[float]  # router-loss weight of the micro-batches still to backward
    lora: LoraAdapters | None  # the adapters under model.lora (set by _load_model)
    supports_full_kl = False  # its own _run: no exact KL (refused at check)

    def __init__(self, spec: EngineSpec) -> None:
        check_engine_spec(spec)
        self._aux_scales = []
        # a recording pipeline forward's routing, by micro-batch, chunk by chunk
        self._recorded: dict[int, list[torch.Tensor]] = {}
        device = spec.device
        if device.type == "cuda":
            import os

            index = int(os.environ.get("LOCAL_RANK", device.index or 0))
            torch.cuda.set_device(index)
            device = torch.device("cuda", index)
            spec = replace(spec, device=device)
        self.source = read_model_source(spec)  # before any process group or Megatron state
        self.parallel = init_parallel(
            spec.megatron_config, role=spec.role, device=device, seed=spec.seed
        )
        self._comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        self.link = StageLink(self.parallel, device, self._comm_device)
        ckpt = spec.model.enable_gradient_checkpointing and spec.train is not None
        for note in unapplied_options(
            spec.megatron_config,
            device.type,
            gradient_checkpointing=ckpt,
            lora=spec.model.lora.rank > 0,
            trainable=spec.train is not None,
        ):
            log.warning("%s.megatron.%s", spec.role, note)
        for flag in ("use_liger", "use_fused_kernels"):
            if getattr(spec.model, flag):
                log.warning("model.%s is a GPU kernel option the megatron engine ignores", flag)
        super().__init__(spec)  # builds the model: _load_model sets self.built
        p = self.parallel
        self.head = ResponseHead(
            self.built.vocab, spec.value_head, spec.entropy_chunk_size, p.cp, p.cp_group
        )
        moe = self.built.layout.moe
        self._router_stats = RouterStats(self.built.chunks, moe) if moe is not None else None
        self._groups: list[list[int]] = []
        half = half_precision_note(spec.model.dtype, device.type)
        if half:
            log.warning("%s", half)
            self.compute_dtype = torch.float32
        self.checkpointer = MegatronCheckpointer(
            model=self.model,
            built=self.built,
            parallel=self.parallel,
            optimizer=self.optimizer,
            schedule=self.schedule,
            spec=self.spec,
            device=self.device,
            trainable=self.trainable,
            adapters=self.lora,
        )

    # ------------------------------------------------------------------ model

    def _load_model(self) -> nn.Module:
        self.built = build_model(self.spec, self.source, self.parallel, self.device)
        module: nn.Module = self.built.module
        self.lora = None
        lora = self.spec.model.lora
        if lora.rank > 0 and self.trainable:  # base frozen, adapters train (an actor)
            check_lora(lora, self.spec.role)
            p = self.parallel
            self.lora = attach_lora(
                module,
                self.built.maps,
                self.built.layout,
                lora,
                tp=TPSplit(p.tp, p.tp_rank),
                etp=TPSplit(p.etp, p.etp_rank, p.etp_group),
                seed=self.spec.seed,
            )
        if not self.trainable:
            module.requires_grad_(False)
        elif self.spec.train is not None:  # freeze_vision_tower / freeze_module_prefix
            from temper.training.megatron_vision import freeze

            vision = self.built.layout.vision
            freeze(module, self.built.maps, vision, self.spec.train, self.spec.role)
        return module

    @property
    def _tied_param(self) -> nn.Parameter | None:
        """This stage's copy of a tied embedding that spans the pipeline's first and last
        stage (the embedding there, the output layer's copy here); else None."""
        p = self.parallel
        if p.pp == 1 or not self.built.layout.tied_embeddings or self.spec.value_head:
            return None
        if self.lora is not None:  # frozen under LoRA: its copies stay equal untouched
            return None
        params = dict(self.model.named_parameters())
        if p.first_stage:
            name = self.built.name_of("embed_tokens.weight")
        else:
            name = self.built.name_of("lm_head.weight", tied_copy=True)
        return params[name] if name is not None else None

    @property
    def shareable_module(self) -> nn.Module | None:
        return None  # not a Hugging Face module: rollout engines get synced copies

    @property
    def has_adapters(self) -> bool:
        return self.lora is not None

    @contextlib.contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """The base model without its LoRA adapters (the reference policy)."""
        if self.lora is None:
            raise RuntimeError("adapters_disabled() needs a LoRA model (model.lora.rank > 0)")
        with self.lora.disabled():
            yield

    # ------------------------------------------------------------------ forward

    def _stage_output(
        self, mb: Batch, received: torch.Tensor | None, *, chunk: int = 0, index: int | None = None
    ) -> torch.Tensor:
        """Model ``chunk``'s output for ``mb`` (micro-batch ``index`` of the step): logits
        ``(b, L, V/TP)`` (or values ``(b, L, 1)``) on the pipeline's last chunk, else the
        hidden states ``(L, b, H)`` to send on; ``received``: the previous virtual stage's,
        None on the first."""
        inp = model_inputs(mb, self.device)
        ids, positions = self._local_ids(self._model_ids(inp))
        module = self.built.chunks[chunk]
        if self.parallel.pp > 1:
            set_stage_input(module, received)
        if self._router_stats is None:
            with self._autocast():
                rope, extra = self._vision_args(module, mb, inp, ids, positions)
                out: torch.Tensor = module(ids, rope, None, **extra)
            return out
        self._router_stats.begin(index)  # router losses, counts: trailing padding out
        real = inp.attention_mask.sum(dim=1, keepdim=True)  # positions: global under CP
        padding = stage_padding_mask(positions >= real, module, self.parallel.tp_group)
        with self._autocast():
            out = module(ids, positions, None, padding_mask=padding)
        return out

    def _vision_args(
        self,
        module: nn.Module,
        mb: Batch,
        inp: ModelInputs,
        ids: torch.Tensor,
        positions: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(positions, extra forward kwargs)`` for this rank's ``ids`` at
        ``positions`` (:meth:`_local_ids`): a vision-language model's M-RoPE positions
        and decoder input (:func:`megatron_vision.forward_args`); a text model's own
        positions and none."""
        rope = self.built.rope_index
        if rope is None:
            return positions, {}
        from temper.training.megatron_vision import forward_args

        # the whole sequence's ids, and the columns this rank runs (its CP share)
        whole, cols = self._model_ids(inp), positions[0]
        group = self.parallel.tp_group if self.built.sequence_parallel else None
        return forward_args(rope, self.built.hf_config, module, mb, inp, whole, cols, group)

    def _model_ids(self, inp: ModelInputs) -> torch.Tensor:
        """The right-aligned ids of the whole sequence; under sequence parallelism padded
        at the end to a multiple of TP (:mod:`megatron_sp`: outputs are read at real
        positions only, and an MoE router's padding mask covers the added ones), under
        context parallelism to a multiple of ``2·CP`` (``2·CP·TP`` with both)."""
        ids, _ = right_align(inp)
        p = self.parallel
        multiple = cp_multiple(p.cp, p.tp, sequence_parallel=self.built.sequence_parallel)
        if multiple > 1:
            ids = pad_sequence(ids, multiple)
        return ids

    def _local_ids(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids, positions)`` of this rank's share of the sequence: all of it, or under
        context parallelism the two chunks :func:`megatron_cp.cp_positions` gives."""
        p = self.parallel
        if p.cp == 1:
            return ids, torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        at = cp_positions(ids.shape[1], p.cp, p.cp_rank).to(ids.device)
        return ids.index_select(1, at), at.expand(ids.shape[0], -1)

    def _chunk_output(
        self, chunk: int, index: int, mb: Batch, received: torch.Tensor | None
    ) -> torch.Tensor:
        """:func:`megatron_pipeline.Stage` over :meth:`_stage_output`, routed by
        :meth:`_route` (a recording forward keeps each chunk's routing for
        :meth:`_pipeline_routing`)."""
        hooks = self.router_replay
        if not isinstance(hooks, MegatronRouterReplay):
            return self._stage_output(mb, received, chunk=chunk, index=index)
        if self._routing_use != "record":
            self._route(mb, model_inputs(mb, self.device), None)
            return self._stage_output(mb, received, chunk=chunk, index=index)
        with hooks.recording_chunk(chunk) as got:
            out = self._stage_output(mb, received, chunk=chunk, index=index)
        self._recorded.setdefault(index, []).append(got[0])
        return out

    def _pipeline_routing(self, micro: list[Batch]) -> list[torch.Tensor]:
        """The ``routed_experts`` rows of each micro-batch of a recording pipeline
        forward: every stage's layers gathered over the pipeline (on every rank)."""
        hooks = self.router_replay
        assert isinstance(hooks, MegatronRouterReplay)
        out = []
        for i, mb in enumerate(micro):
            inp = model_inputs(mb, self.device)
            tokens = hooks.whole(self._recorded.pop(i, []))
            columns = self._token_columns(tokens.to(routing_dtype(hooks.num_experts)), inp, None)
            out.append(batch_routing(columns, inp, mb["prompt_ids"].shape[1]))
        return out

    def _replay_for(self, micro: list[Batch], i: int) -> None:
        """Set micro-batch ``i``'s replay again before its backward (a recomputed layer
        routes as its forward did; the forwards of later micro-batches moved it on)."""
        if self.router_replay is not None:
            self._route(micro[i], model_inputs(micro[i], self.device), None)

    def _head(
        self,
        mb: Batch,
        hidden: torch.Tensor,
        *,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = True,
        with_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Log-probs (+ entropy, + Σπ²) or values of the response tokens from the last
        stage's output (:class:`~temper.training.megatron_head.ResponseHead`)."""
        inp = model_inputs(mb, self.device)
        return self.head.outputs(
            mb,
            inp,
            hidden,
            self._model_ids(inp),
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            with_sum_pi_squared=with_sum_pi_squared,
        )

    @torch.no_grad()
    def _top_logit_micro_batches(
        self, micro: list[Batch], k: int, scale: float, vocab: int | None, log_probs: bool
    ) -> Iterator[dict[str, torch.Tensor]]:
        """Over pipeline stages: every micro-batch through the forward schedule, the last
        stage's top-``k`` (ids as exact fp32 integers) broadcast to every stage."""
        if self.parallel.pp == 1:
            yield from super()._top_logit_micro_batches(micro, k, scale, vocab, log_probs)
            return
        shard = self.head.vocab
        tp = 1 if shard.group is None else dist.get_world_size(cast(Any, shard.group))
        padded = shard.width * tp
        width = k if 0 < k < padded else padded

        def head(mb: Batch, hidden: torch.Tensor) -> dict[str, torch.Tensor]:
            inp = model_inputs(mb, self.device)
            out = self.head.top_logits(mb, inp, hidden, k, scale, vocab, log_probs)
            return {"values": out["values"], "ids": out["ids"].float()}

        outs = forward_only(
            self.link, micro, self._chunk_output, head, ["values", "ids"], width=width
        )
        for out in outs:
            yield {"values": out["values"], "ids": out["ids"].long()}

    @torch.no_grad()
    def _micro_top_logits(
        self, mb: Batch, k: int, scale: float, vocab: int | None, log_probs: bool = False
    ) -> dict[str, torch.Tensor]:
        """A teacher's top-``k`` logits / ``scale`` over the vocabulary-parallel logits."""
        inp = model_inputs(mb, self.device)
        ids, positions = self._local_ids(self._model_ids(inp))
        with self._autocast():
            rope, extra = self._vision_args(self.model, mb, inp, ids, positions)
            hidden = self.model(ids, rope, None, **extra)
        return self.head.top_logits(mb, inp, hidden, k, scale, vocab, log_probs)

    def _run(
        self,
        mb: Batch,
        *,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = True,
        with_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        record = self._route(mb, model_inputs(mb, self.device), None)
        with record:
            hidden = self._stage_output(mb, None)
        out = self._head(
            mb,
            hidden,
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            with_sum_pi_squared=with_sum_pi_squared,
        )
        if isinstance(record, Recording):
            out[ROUTED_EXPERTS] = record.columns()
        return out

    # router replay: Megatron-Core's RouterReplay (megatron_router_replay)

    def _router_replay(self) -> RoutingHooks:
        return MegatronRouterReplay(
            self.built.chunks, self.parallel, self.built.sequence_parallel, self._comm_device
        )

    def _model_tokens(
        self, routed: torch.Tensor, inp: ModelInputs, packed: PackedInputs | None
    ) -> torch.Tensor:
        width = self._model_ids(inp).shape[1]
        return held_order(model_tokens(routed, inp, width), width, self.parallel.cp)

    def _token_columns(
        self, tokens: torch.Tensor, inp: ModelInputs, packed: PackedInputs | None
    ) -> torch.Tensor:
        width = self._model_ids(inp).shape[1]
        return token_columns(held_order(tokens, width, self.parallel.cp, inverse=True), inp)

    def _forward_micro_batches(
        self,
        micro: list[Batch],
        *,
        temperature: float,
        with_entropy: bool,
        with_sum_pi_squared: bool = False,
    ) -> Iterator[dict[str, torch.Tensor]]:
        if self.parallel.pp == 1:
            yield from super()._forward_micro_batches(
                micro,
                temperature=temperature,
                with_entropy=with_entropy,
                with_sum_pi_squared=with_sum_pi_squared,
            )
            return
        keys = ["log_probs", *["entropy"] * with_entropy, *["sum_pi_squared"] * with_sum_pi_squared]
        self._recorded.clear()  # nothing left of a forward that failed
        outs = forward_only(
            self.link,
            micro,
            self._chunk_output,
            lambda mb, hidden: self._head(
                mb,
                hidden,
                temperature=temperature,
                with_entropy=with_entropy,
                with_sum_pi_squared=with_sum_pi_squared,
            ),
            ["values"] if self.spec.value_head else keys,
        )
        if self._routing_use == "record":
            for out, routed in zip(outs, self._pipeline_routing(micro)):
                out[ROUTED_EXPERTS] = routed
        yield from outs

    def _accumulate(
        self,
        micro: list[Batch],
        groups: list[list[int]],
        loss_fn: LossFn,
        *,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[float, dict[str, float]]:
        if self.parallel.pp == 1:
            return super()._accumulate(
                micro, groups, loss_fn, temperature=temperature, with_entropy=with_entropy
            )
        return train_forward_backward(
            self.link,
            micro,
            groups,
            self._chunk_output,
            lambda mb, hidden: self._head(
                mb, hidden, temperature=temperature, with_entropy=True, entropy_grad=with_entropy
            ),
            lambda mb, out: loss_fn(mb.to(self.device), out),
            all_min=lambda flags: self._all_reduce(flags, dist.ReduceOp.MIN),
            role=self.spec.role,
            before_backward=lambda i: self._before_backward(micro, i),
        )

    def _before_backward(self, micro: list[Batch], i: int) -> None:
        self._set_aux_loss_scale_of(i)
        self._replay_for(micro, i)

    # ------------------------------------------------------------------ collectives

    @property
    def dp_size(self) -> int:
        return self.parallel.dp

    @property
    def dp_rank(self) -> int:
        return self.parallel.dp_rank

    def _all_reduce(self, values: list[float], op: Any, group: Any = None) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(t, op=op, group=group)
        return t.tolist()

    def global_sum(self, values: list[float]) -> list[float]:
        """Sum over the DP group (the ranks of a TP group hold the same samples)."""
        if self.parallel.dp == 1:
            return [float(v) for v in values]
        return self._all_reduce(
            [float(v) for v in values], dist.ReduceOp.SUM, self.parallel.dp_group
        )

    def _reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        keys = sorted(sums)
        return dict(zip(keys, self.global_sum([sums[k] for k in keys])))

    def _split(self, batch: Batch, spec: MicroBatching) -> tuple[list[Batch], list[list[int]]]:
        """The rank's micro-batches, padded with row-less copies to the world's maximum
        count (the finiteness check below is a collective per micro-batch)."""
        if len(batch) == 0:
            raise ValueError(
                f"{self.spec.role} rank {self.parallel.rank} got no samples; the worker "
                "group pads batches so that every rank gets at least one"
            )
        micro, groups = split_micro_batches(batch, spec)
        if self.parallel.world > 1:
            (most,) = self._all_reduce([float(len(micro))], dist.ReduceOp.MAX)
            pad = int(most) - len(micro)
            micro, groups = [*micro, *[micro[-1]] * pad], [*groups, *[[] for _ in range(pad)]]
        if self._router_stats is not None:
            self._aux_scales = self._moe_aux_loss_scales(groups)
            self._router_stats.take([])  # counts of earlier forwards dropped
            self._groups = groups
        return micro, groups

    def train_mini_batch(
        self,
        batch: Batch,
        loss_fn: LossFn,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        """The torch engine's step; for an MoE model with the routers' load imbalance
        (:func:`megatron_moe.load_imbalance` of the step's tokens over all ranks)."""
        out = super().train_mini_batch(
            batch, loss_fn, temperature=temperature, with_entropy=with_entropy
        )
        stats, moe = self._router_stats, self.built.layout.moe
        if stats is not None and moe is not None:
            counts = stats.take(self._groups).to(self._comm_device)
            if self.parallel.world > 1:
                # stages hold other layers; DP ranks other samples; TP ranks (sequence
                # parallel) other positions: every count is summed once
                dist.all_reduce(counts)
            out["moe_load_imbalance"] = load_imbalance(counts.cpu(), moe)
        return out

    def _moe_aux_loss_scales(self, groups: list[list[int]]) -> list[float]:
        (total,) = self.global_sum([float(sum(1 for g in groups if g))])
        return router_loss_scales(groups, total)

    def _set_aux_loss_scale(self) -> None:
        if self._aux_scales:
            set_router_loss_scale(self._aux_scales.pop(0))

    def _set_aux_loss_scale_of(self, index: int) -> None:
        """Micro-batch ``index``'s router-loss weight, for each of its backwards (one per
        model chunk under pipeline parallelism)."""
        if self._aux_scales:
            set_router_loss_scale(self._aux_scales[index])

    def _backward(self, loss: torch.Tensor, *, last: bool) -> None:
        self._set_aux_loss_scale()
        super()._backward(loss, last=last)

    def _all_finite(self, loss: torch.Tensor) -> bool:
        if self.parallel.world == 1:
            return bool(torch.isfinite(loss))
        (ok,) = self._all_reduce([float(torch.isfinite(loss.detach()).item())], dist.ReduceOp.MIN)
        return ok > 0

    def _reduce_grads(self) -> None:
        """Gradients summed over the groups holding partial ones (:mod:`megatron_grads`)."""
        reduce_grads(
            self.model,
            self.parallel,
            link=self.link,
            tied=self._tied_param,
            sequence_parallel=self.built.sequence_parallel,
            qk_norm=self.built.layout.qk_norm,
            lora=self.lora is not None,
        )

    def _clip_grad_norm(self, params: list[nn.Parameter], clip: float) -> float:
        """Clipped by the global norm over the model-parallel shards (:mod:`megatron_grads`)."""
        return clip_grad_norm(
            self.model,
            params,
            clip,
            self.parallel,
            tied_copy=self._tied_param if self.parallel.last_stage else None,
            device=self.device,
            comm_device=self._comm_device,
        )

    # ------------------------------------------------------------------ weights and state

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights under HF names, each gathered over the TP group as it is yielded
        (a collective: every rank of the role iterates to the end)."""
        return self.checkpointer.hf_named_weights()

    def save_checkpoint(self, path: str) -> None:
        """Sharded checkpoint: model, AdamW moments, schedule, per-rank RNG. A collective;
        loads at any TP/PP/DP layout."""
        self.checkpointer.save(path)

    def load_checkpoint(self, path: str) -> None:
        self.checkpointer.load(path)

    def save_hf(self, path: str, *, merge_lora: bool = True) -> None:
        """HF directory written by rank 0 from the gathered weights (a collective); LoRA:
        the merged model + ``lora_adapter/`` (peft's layout), or without ``merge_lora``
        the adapter directory alone, as the torch engine writes them."""
        self.checkpointer.save_hf(path, merge_lora=merge_lora)
