"""What every data-parallel engine (``fsdp2``, ``deepspeed``) adds to the torch engine.

Each rank of a role holds a different share of every mini-batch and runs the
:class:`TorchEngine` computation on it. For one mini-batch split over N ranks to give the
single-process gradient:

* roles build their losses from the **global** normalizers (:meth:`global_normalizers`:
  one all-reduce of the counts), so each rank's loss is a partial sum of the mini-batch
  loss;
* loss and metrics are partial sums on each rank, so they are summed over ranks;
* FSDP and DeepSpeed *average* gradients over ranks, so each engine multiplies its loss
  by the data-parallel size before the backward (the average of N partial sums × N = the
  sum) — that part is the engine's own ``_backward``;
* sharded parameters are gathered and gradients reduced by collectives, so every rank
  must run the same number of forwards and backwards: ranks agree on the micro-batch
  count (all-reduce max) and a rank with fewer runs padding micro-batches whose loss is
  multiplied by 0;
* a non-finite loss on any rank stops every rank before its backward (all-reduce min).

With ``ulysses_sequence_parallel_size`` = ``sp`` > 1 the ranks form sequence-parallel
groups of ``sp`` (:mod:`temper.training.ulysses`): a group is one data-parallel rank whose
``sp`` members take the same samples, each running ``1/sp`` of every sequence's columns.
Counts and metrics are then summed over the data-parallel ranks only (one member per
group), and the loss scale is the world size, not the data-parallel size: the group's
members each hold their columns' share of the gradient of the same loss, which FSDP and
ZeRO average over every rank.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import replace
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from temper.config.errors import ConfigError
from temper.data.batch import Batch
from temper.training.micro_batching import (
    KD_INDICES,
    MicroBatching,
    ModelInputs,
    masked_outputs,
    model_inputs,
)
from temper.training.packing import (
    PackedInputs,
    choose_layout,
    model_cost,
    pack,
    plan_packing,
    scored_positions,
)
from temper.training.router_replay import ROUTED_EXPERTS, Recording
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine
from temper.training.torch_logits import token_outputs
from temper.training.ulysses import (
    CONTEXT_KWARG,
    PACKED_KERNEL,
    SequenceGroup,
    gather_routing,
    packed_rows,
    padded_rows,
    routing_columns,
    sequence_groups,
    shard_columns,
    shard_routing,
    split_language_model,
    sum_owned,
    use_ulysses,
)
from temper.training.vision import vision_forward_inputs


def require_process_group(role: str, strategy: str = "fsdp2") -> None:
    """Fail with the fix when no ``torch.distributed`` process group exists yet."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            f"{role}.strategy",
            f"{strategy} needs an initialized torch.distributed process group (one process "
            "per rank); this process has none",
            "run with resources.backend: ray (roles then run in per-rank workers) or under "
            "torchrun; on one process use strategy: torch (the local backend does this)",
        )


def rank_device(device: torch.device) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` on GPU (and made current), else the CPU."""
    if device.type != "cuda":
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", device.index or 0))
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


class DataParallelEngine(TorchEngine):
    """:class:`TorchEngine` whose ranks split every mini-batch (the collectives above).

    Subclasses call :meth:`_join_group` first in ``__init__`` and implement ``_backward``
    (scaled by :attr:`world`) and their sharding hooks.
    """

    strategy: ClassVar[str] = "data-parallel"
    one_process: ClassVar[bool] = False
    rank: int = 0
    world: int = 1
    _comm_device: torch.device = torch.device("cpu")
    #: this rank's Ulysses group (None: ``ulysses_sequence_parallel_size`` 1)
    sequence: SequenceGroup | None = None
    #: a vision-language model's text decoder, which Ulysses splits (None: a text model)
    _decoder: torch.nn.Module | None = None

    def _join_group(self, spec: EngineSpec) -> EngineSpec:
        """Rank, world size and device of this process in the default process group;
        returns ``spec`` with the rank's device."""
        require_process_group(spec.role, self.strategy)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        device = rank_device(spec.device)
        # a collective's tensors live where the backend wants them (gloo: CPU)
        self._comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        sp = spec.ulysses_size
        self.sequence = sequence_groups(sp) if sp > 1 else None
        return spec if spec.device == device else replace(spec, device=device)

    @property
    def _sp(self) -> int:
        return self.sequence.size if self.sequence is not None else 1

    @property
    def dp_size(self) -> int:
        return self.world // self._sp

    @property
    def dp_rank(self) -> int:
        """A sequence-parallel group's members share one data-parallel index."""
        return self.rank // self._sp

    def _load_model(self) -> torch.nn.Module:
        model = super()._load_model()
        if self.sequence is not None:
            self._decoder = use_ulysses(model, self.spec, self.sequence.size)
        return model

    def _sparse_tied_embedding_grad(self) -> None:
        """Sharded or reduced gradients stay dense (FSDP2 and ZeRO shard dense tensors)."""

    def _all_reduce(self, values: list[float], op: Any) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        # a sequence-parallel group's members hold the same samples: count one of them
        dist.all_reduce(t, op=op, group=self.sequence.data if self.sequence else None)
        return [float(v) for v in t.tolist()]

    def global_sum(self, values: list[float]) -> list[float]:
        return self._all_reduce([float(v) for v in values], dist.ReduceOp.SUM)

    def _split(self, batch: Batch, spec: MicroBatching) -> tuple[list[Batch], list[list[int]]]:
        """The rank's micro-batches, padded with row-less copies to the ranks' maximum count."""
        if len(batch) == 0:
            raise ValueError(
                f"{self.spec.role} rank {self.rank} got no samples; the worker group pads "
                "batches so that every rank gets at least one"
            )
        micro, groups = super()._split(batch, spec)
        (most,) = self._all_reduce([float(len(micro))], dist.ReduceOp.MAX)
        pad = int(most) - len(micro)
        return [*micro, *[micro[-1]] * pad], [*groups, *[[] for _ in range(pad)]]

    def _all_finite(self, loss: torch.Tensor) -> bool:
        (ok,) = self._all_reduce([float(torch.isfinite(loss.detach()).item())], dist.ReduceOp.MIN)
        return ok > 0

    def _reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        keys = sorted(sums)
        return dict(zip(keys, self.global_sum([sums[k] for k in keys])))

    # ------------------------------------------------------------------ Ulysses

    def _run(
        self,
        mb: Batch,
        *,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = True,
        with_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        if self.sequence is None:
            return super()._run(
                mb,
                temperature=temperature,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
                with_sum_pi_squared=with_sum_pi_squared,
            )
        return self._run_columns(
            mb,
            self.sequence,
            temperature=temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            with_sum_pi_squared=with_sum_pi_squared,
        )

    def _run_columns(
        self,
        mb: Batch,
        group: SequenceGroup,
        *,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool,
        with_sum_pi_squared: bool,
    ) -> dict[str, torch.Tensor]:
        """:meth:`TorchEngine._run` on this rank's columns of the micro-batch's rows
        (padded, or packed by :meth:`_pack_for_columns`): each response token scored by
        the rank that holds the column of its logits, the outputs summed over the group,
        ``(b, r)``.

        Every rank's outputs depend on its whole forward even when none of its columns
        scores a token, so that every rank runs the backward through every layer (the
        all-to-alls there are collectives)."""
        if KD_INDICES in mb or self.kl_reference is not None:
            raise ConfigError(
                f"{self.spec.role}.ulysses_sequence_parallel_size",
                "the exact KL and offline distillation compare whole sequences' logits, "
                "which Ulysses does not split",
                "set it to 1",
            )
        inp = model_inputs(mb, self.device)
        valid = scored_positions(inp)  # (b, r)
        # vision-language rows: the model's top forward runs on the whole padded rows (its
        # vision tower and M-RoPE positions see whole sequences) and its text decoder on
        # the rank's columns (split_language_model)
        extra, vision_context = vision_forward_inputs(self.model, mb, inp)
        packed = self._pack_for_columns(inp) if not extra else None
        if extra:
            self.layouts["padded"] += 1
        rows = padded_rows(inp, valid) if packed is None else packed_rows(inp, packed)
        shard = shard_columns(rows, group)
        split: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        model_in: dict[str, Any] = {**shard.model_inputs, "attention_mask": None}
        if extra:
            assert self._decoder is not None  # use_ulysses checked the model's family
            model_in = {"input_ids": inp.input_ids, "attention_mask": inp.attention_mask}
            model_in |= extra
            split = split_language_model(self._decoder, rows, group)
        model_in[CONTEXT_KWARG] = shard.context
        mine: dict[str, torch.Tensor] = {}
        # MoE routing of the rank's columns; a recording gathers the group's (collective)
        record = self._route(
            mb,
            inp,
            packed,
            to_model=lambda routed: shard_routing(routed, rows, packed, group),
            to_columns=lambda tokens: routing_columns(
                gather_routing(tokens, rows, group), inp, rows, packed
            ),
        )
        with record, self._autocast(), vision_context, split:
            if self.spec.value_head:
                values = self._module()(**model_in)  # (R, width)
                mine["values"] = values[shard.row, shard.keep[shard.at]]
                link = values.sum() * 0.0
            else:
                kwargs: dict[str, Any] = {**model_in, "use_cache": False}
                if self._logits_to_keep:
                    kwargs["logits_to_keep"] = shard.keep
                logits = self._module()(**kwargs).logits
                if not self._logits_to_keep:
                    logits = logits[:, shard.keep]
                mine = token_outputs(
                    logits[shard.row, shard.at],
                    shard.label,
                    self._log_probs_and_entropy if with_entropy else None,
                    temperature=temperature,
                    entropy_grad=entropy_grad,
                    with_sum_pi_squared=with_sum_pi_squared,
                    chunk_size=self.spec.entropy_chunk_size,
                )
                link = logits.sum() * 0.0  # this rank's graph, whatever it scores
        result: dict[str, torch.Tensor] = {}
        for key, value in mine.items():
            owned = value.new_zeros(shard.owned.shape).index_put((shard.owned,), value)
            if value.requires_grad:
                owned = owned + link
            result[key] = valid.put(sum_owned(owned, group))  # (K,) -> (b, r)
        result = masked_outputs(result, mb, inp)
        if isinstance(record, Recording):
            result[ROUTED_EXPERTS] = record.columns()
        return result

    def _pack_for_columns(self, inp: ModelInputs) -> PackedInputs | None:
        """The micro-batch packed into one row for Ulysses (``model.use_remove_padding``
        and fewer tokens; its kernel runs the packed row segment by segment after its
        all-to-all, so packing never costs more), or None (the padded layout)."""
        if not self.spec.model.use_remove_padding:
            self.layouts["padded"] += 1
            return None
        if self._cost is None:  # the segment kernel's cost (the model's is Ulysses')
            self._cost = model_cost(self.model.config, varlen=True)
        plan = plan_packing(inp, share_prompts=True)
        lengths = inp.host.attention_mask.sum(dim=1).tolist()
        layout = choose_layout(lengths, inp.input_ids.shape[1], self._cost, plan.tokens)
        self.layouts[layout] += 1
        if layout == "padded":
            return None
        return pack(inp, PACKED_KERNEL, self.compute_dtype, plan)
