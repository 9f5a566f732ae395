"""The single-process engine: one model on the CPU or one GPU, plain torch.

It is the reference implementation of :class:`TrainEngine` (the distributed engines must
agree with it) and what CI and laptops run. Memory choices:

* trained models keep their master weights in the role's ``master_dtype`` (fp32 by
  default — AdamW updates of ~1e-6 would be lost in bf16 weights; AdamW's state follows
  the weights' dtype) and run under ``torch.autocast`` in the configured compute dtype
  (bf16 on GPU by default); frozen models are stored in the compute dtype directly;
* only the logits of response positions are computed (``logits_to_keep``), and
  log-probs/entropy are chunked over rows by the algorithms package;
* the training forward always returns the per-token ``entropy`` (the ``actor/entropy``
  metric) with the log-probs, from one pass over the logits whose autograd graph keeps no
  ``(tokens, V)`` softmax or fp32 copy for the backward (``logprobs_and_entropy``); unless
  the loss uses the entropy (``with_entropy``) it is detached, and its gradient skipped;
* each micro-batch is trimmed to its longest real prompt/response.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from temper.algorithms.logprobs import DEFAULT_CHUNK, full_kl_from_logits
from temper.config.errors import ConfigError
from temper.data.batch import Batch
from temper.training.base import LossFn, NonFiniteError
from temper.training.hf_export import save_hf_dir
from temper.training.micro_batching import (
    KD_INDICES,
    KD_LOGITS,
    MicroBatching,
    ModelInputs,
    masked_outputs,
    model_inputs,
)
from temper.training.models import role_compute_dtype
from temper.training.packing import LayoutCost, PackedInputs, Scored, scored_positions
from temper.training.router_replay import (
    ROUTED_EXPERTS,
    Recording,
    RoutingUse,
    model_tokens,
    route,
    token_columns,
)
from temper.training.schedule import LRSchedule
from temper.training.spec import EngineSpec
from temper.training.step_sums import LOSS_SUM, StepSums
from temper.training.torch_logits import PackedLogits, token_outputs
from temper.training.torch_model import accepts_logits_to_keep, fused_fn
from temper.training.torch_state import load_trainable_state, trainable_state
from temper.training.vision import vision_forward_inputs
from temper.training.weights import hf_named_weights

log = logging.getLogger(__name__)


def check_one_process(role: str, sequence_parallel: int) -> None:
    """What the one-process engine cannot honour (also run at check, from the config)."""
    if sequence_parallel > 1:
        raise ConfigError(
            f"{role}.ulysses_sequence_parallel_size",
            "sequence parallelism needs several ranks; the torch engine is one process",
            f"set it to 1, or run {role} on several ranks (resources.backend: ray, "
            "strategy: fsdp2)",
        )


def _check_supported(spec: EngineSpec, one_process: bool) -> None:
    """Fail early on settings that would change results and that this engine lacks."""
    t = spec.train
    if t is not None and one_process:
        check_one_process(spec.role, t.ulysses_sequence_parallel_size)
    if spec.model.use_fused_kernels:
        log.warning("model.use_fused_kernels is a GPU speed option the torch engine ignores")


class TorchEngine(PackedLogits):
    """Causal LM or value model, micro-batched forward/backward, AdamW, LR schedule."""

    supports_full_kl = True
    #: trains in this one process (the data-parallel engines subclass it)
    one_process: ClassVar[bool] = True

    def __init__(self, spec: EngineSpec) -> None:
        _check_supported(spec, self.one_process)
        self.spec = spec
        self.device = spec.device
        master = spec.train.master_dtype if spec.train is not None else None
        self.compute_dtype = role_compute_dtype(spec.model.dtype, master, spec.device)
        self.trainable = spec.train is not None
        self.model: nn.Module = self._wrap_model(self._load_model())
        self.router_replay = self._router_replay() if spec.router_replay else None
        #: what the running no-grad forward does with routing (:meth:`forward`)
        self._routing_use: RoutingUse | None = None
        self.infer_micro = spec.infer_micro
        self.train_micro = spec.train_micro
        self.grad_clip = spec.train.grad_clip if spec.train is not None else None
        self._logits_to_keep = accepts_logits_to_keep(self.model, spec.value_head)
        self._adapters_off = False
        self._log_probs_and_entropy = fused_fn(spec, self.device)
        self.layouts: Counter[str] = Counter()  # declared on PackedLogits
        self._cost: LayoutCost | None = None
        self._plain: bool | None = None  # plain causal attention (PackedLogits)
        self.optimizer: torch.optim.Optimizer | None = None
        self.schedule: LRSchedule | None = None
        if spec.optim is not None:
            o = spec.optim
            self.optimizer = torch.optim.AdamW(
                list(self.trainable_parameters()),
                lr=o.lr,
                betas=(o.betas[0], o.betas[1]),
                eps=o.eps,
                weight_decay=o.weight_decay,
                # torch's fused kernel: one pass per tensor, the same update; on CPU 4-7x
                # faster than the per-tensor loop (0.10 vs 0.41-0.70 s for SmolLM2-135M)
                fused=self.device.type in ("cpu", "cuda"),
            )
            self._sparse_tied_embedding_grad()
            self.schedule = LRSchedule(self.optimizer, o, spec.total_steps)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return (p for p in self.model.parameters() if p.requires_grad)

    @property
    def dp_size(self) -> int:
        """1 for a trained engine (it trains in one process); a frozen one that joined a
        process group (a Ray reference, teacher or reward group) is one whole replica per
        rank, so the group's ranks are data-parallel: each scores its share of the rows."""
        if self.trainable or not torch.distributed.is_initialized():
            return 1
        return torch.distributed.get_world_size()

    def set_total_steps(self, total_steps: int) -> None:
        if self.schedule is not None:
            self.schedule.set_total_steps(total_steps)

    # ------------------------------------------------------------------ forward

    def _run(
        self,
        mb: Batch,
        *,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = True,
        with_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Per-response-token outputs ``(b, R)`` of one micro-batch, 0 where masked.

        ``with_sum_pi_squared`` adds ``sum_pi_squared`` (Σ_v π_v² of the tempered
        distribution, no gradient) from the same logits. ``entropy_grad=False`` computes the entropy as a detached metric (no autograd
        graph, chunked even when ``entropy_chunk_size`` is 0). Log-probs, entropy and the
        exact KL are computed on the ``K`` scored response positions only (packed: the
        positions of the packed row, :mod:`temper.training.packing`; padded: the real
        response tokens) and unpacked to ``(b, r)`` at the end."""
        inp = model_inputs(mb, self.device)
        r = inp.response_len
        # vision-language rows: pixel inputs, token types, M-RoPE positions (training.vision)
        extra, vision_context = vision_forward_inputs(self.model, mb, inp)
        packed = self._pack(inp, extra)
        model_in: dict[str, Any]
        if packed is None:
            model_in = {
                "input_ids": inp.input_ids,
                "attention_mask": inp.attention_mask,
                "position_ids": inp.position_ids,
            }
            keep: int | torch.Tensor = r + 1
            valid: Scored = scored_positions(inp)
        else:
            model_in = packed.model_inputs()
            keep = packed.keep
            valid = packed.valid
        labels = valid.take(inp.response_ids)  # (K,): log-probs and entropy only where scored
        out: dict[str, torch.Tensor] = {}
        record = self._route(mb, inp, packed)
        with record, self._autocast(), vision_context:
            if self.spec.value_head:
                if packed is None:
                    out["values"] = self._module()(**{**model_in, **extra}, keep_last=r + 1)[:, :r]
                else:
                    out["values"] = self._module()(**model_in, keep_index=packed.keep)[0]
            else:
                # logits at position p predict token p+1: the r+1 last positions minus the
                # final one score the r response tokens (packed: the positions ``keep``)
                # (K, V): padding costs no LM head and no softmax
                logits = self._logits(
                    model_in, keep, extra, scored=None if packed is not None else valid
                )
                out = token_outputs(
                    logits,
                    labels,
                    self._log_probs_and_entropy if with_entropy else None,
                    temperature=temperature,
                    entropy_grad=entropy_grad,
                    with_sum_pi_squared=with_sum_pi_squared,
                    chunk_size=self.spec.entropy_chunk_size,
                )
                if KD_INDICES in mb:  # offline distillation: the teacher's top-k token ids
                    ids = valid.take(mb[KD_INDICES][:, :r].to(self.device))
                    out[KD_LOGITS] = logits.gather(-1, ids)
                if self.kl_reference is not None and not self._adapters_off:  # the exact KL
                    ref = self.kl_reference.response_logits(mb)
                    out["full_kl"] = full_kl_from_logits(
                        logits,
                        valid.take(ref),
                        temperature=temperature,
                        chunk_size=self.spec.entropy_chunk_size or DEFAULT_CHUNK,
                    )
        if packed is not None or not self.spec.value_head:  # (K, …) -> (b, r, …)
            out = {k: valid.put(v) for k, v in out.items()}
        result = masked_outputs(out, mb, inp)
        if isinstance(record, Recording):
            result[ROUTED_EXPERTS] = record.columns()
        return result

    def _route(
        self,
        mb: Batch,
        inp: ModelInputs,
        packed: PackedInputs | None,
        *,
        to_model: Callable[[torch.Tensor], torch.Tensor] | None = None,
        to_columns: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> contextlib.AbstractContextManager[Any]:
        """Routing of micro-batch ``mb``'s forward (:func:`route`); none without hooks.
        ``to_model`` / ``to_columns``: a layout other than :meth:`_model_tokens`' (a
        Ulysses rank's columns)."""
        if self.router_replay is None:
            return contextlib.nullcontext()
        return route(
            self.router_replay,
            self._routing_use,
            mb,
            inp,
            self.device,
            to_model=to_model or (lambda routed: self._model_tokens(routed, inp, packed)),
            to_columns=to_columns or (lambda tokens: self._token_columns(tokens, inp, packed)),
        )

    def _model_tokens(
        self, routed: torch.Tensor, inp: ModelInputs, packed: PackedInputs | None
    ) -> torch.Tensor:
        """Routing ``(b, W, L, k)`` in the order this model's routers see the tokens (the
        megatron engine's is sequence-first)."""
        return model_tokens(routed, inp, packed)

    def _token_columns(
        self, tokens: torch.Tensor, inp: ModelInputs, packed: PackedInputs | None
    ) -> torch.Tensor:
        """Inverse of :meth:`_model_tokens`, ``-1`` at padding."""
        return token_columns(tokens, inp, packed)

    @torch.no_grad()
    def forward(
        self,
        batch: Batch,
        *,
        with_entropy: bool = False,
        temperature: float = 1.0,
        with_values: bool = False,
        micro_batching: MicroBatching | None = None,
        with_sum_pi_squared: bool = False,
        routing: RoutingUse | None = None,
    ) -> dict[str, torch.Tensor]:
        """No-grad ``log_probs`` (+``entropy``, +``sum_pi_squared``) or ``values``,
        ``(B, R)`` in batch order.

        ``micro_batching`` overrides the engine's inference micro-batching (the reference
        shares the actor's engine under LoRA but has its own batch settings).
        ``routing`` (an engine built with ``router_replay``): ``record`` also returns the
        MoE routing ``routed_experts`` ``(B, P + R, L, k)``; ``replay`` routes by the
        batch's ``routed_experts`` (:mod:`temper.training.router_replay`).
        """
        if routing is not None and self.router_replay is None:
            raise RuntimeError(f"the {self.spec.role} engine was built without router replay")
        if with_values and not self.spec.value_head:
            raise ValueError("values need a value-model engine (kind='value')")
        spec = micro_batching or self.infer_micro
        self.model.eval()
        B = len(batch)
        home = batch["response_ids"].device
        results: dict[str, torch.Tensor] = {}
        self._routing_use = routing
        with self._on_device(), self._routing_done():
            micro, groups = self._split(batch, spec)
            outs = self._forward_micro_batches(
                micro,
                temperature=temperature,
                with_entropy=with_entropy,
                with_sum_pi_squared=with_sum_pi_squared and not self.spec.value_head,
            )
            for out, rows in zip(outs, groups):
                if not rows:  # a padding micro-batch (collectives only)
                    continue
                index = torch.as_tensor(rows, device=home)
                for key, value in out.items():
                    if key not in results:
                        dtype = torch.float32 if value.is_floating_point() else value.dtype
                        shape = (B, *value.shape[1:])
                        results[key] = torch.zeros(shape, dtype=dtype, device=home)
                    results[key][index] = value.to(home)
        return results

    @contextlib.contextmanager
    def _routing_done(self) -> Iterator[None]:
        """Leave the routers routing by their own top-k after a forward or an update."""
        try:
            yield
        finally:
            self._routing_use = None
            if self.router_replay is not None:
                self.router_replay.stop()

    # ------------------------------------------------------------------ training

    def train_mini_batch(
        self,
        batch: Batch,
        loss_fn: LossFn,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> dict[str, float]:
        """Accumulate gradients over micro-batches, check finiteness, clip, step.

        ``loss_fn`` losses and metrics are partial sums (scaled by the mini-batch's global
        normalizers), so both are summed here, never averaged. A causal LM's outputs
        always hold ``entropy``: differentiable if ``with_entropy`` (the loss uses it),
        else detached (the same one pass over the logits, its gradient skipped).
        """
        if self.optimizer is None or self.schedule is None:
            raise RuntimeError(f"the {self.spec.role} engine is frozen (no optimizer)")
        self.model.train()
        self._zero_grad()
        micro, groups = self._split(batch, self.train_micro)
        packed_before = self.layouts["packed"]
        with self._routing_done():
            total, sums = self._accumulate(
                micro, groups, loss_fn, temperature=temperature, with_entropy=with_entropy
            )
        packing = self.spec.model.use_remove_padding
        if packing:  # packed micro-batches over all ranks
            sums["packed_fraction/num"] = float(self.layouts["packed"] - packed_before)
            sums["packed_fraction/den"] = float(len(micro))
        sums = self._reduce_sums({**sums, "loss": total})
        total = sums.pop("loss")
        if packing:
            sums["packed_fraction"] = sums.pop("packed_fraction/num") / max(
                sums.pop("packed_fraction/den"), 1.0
            )
        self._reduce_grads()
        grad_norm, lr = self._apply_gradients()
        return {**sums, "loss": total, "grad_norm": grad_norm, "lr": lr}

    def _forward_micro_batches(
        self,
        micro: list[Batch],
        *,
        temperature: float,
        with_entropy: bool,
        with_sum_pi_squared: bool = False,
    ) -> Iterator[dict[str, torch.Tensor]]:
        """The no-grad outputs of each micro-batch, in order (an engine that pipelines
        its micro-batches over stages runs them its own way)."""
        for mb in micro:
            yield self._run(
                mb,
                temperature=temperature,
                with_entropy=with_entropy,
                with_sum_pi_squared=with_sum_pi_squared,
            )

    def _accumulate(
        self,
        micro: list[Batch],
        groups: list[list[int]],
        loss_fn: LossFn,
        *,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[float, dict[str, float]]:
        """Forward, loss and backward of every micro-batch, gradients accumulated: this
        rank's ``(loss sum, metric sums)`` (padding micro-batches contribute nothing).
        The sums stay on the device until the last micro-batch (:mod:`step_sums`)."""
        sums = StepSums()  # the loss under LOSS_SUM, then the metrics
        for i, (mb, rows) in enumerate(zip(micro, groups)):
            out = self._run(
                mb, temperature=temperature, with_entropy=True, entropy_grad=with_entropy
            )
            loss, metrics = loss_fn(mb.to(self.device), out)
            if not rows:  # padding micro-batch: same collectives, no contribution
                loss = loss * 0.0
            if not self._all_finite(loss):
                self._discard_gradients(mb, out)
                raise NonFiniteError(
                    f"{self.spec.role}: loss is {loss.item()} in micro-batch {i}; "
                    "optimizer step skipped, weights unchanged"
                )
            self._backward(loss, last=i == len(micro) - 1)
            if not rows:
                continue
            sums.add({LOSS_SUM: loss, **metrics})
        result = sums.floats()
        return result.pop(LOSS_SUM, 0.0), result

    def _apply_gradients(self) -> tuple[float, float]:
        """Clip, check, step and clear the accumulated gradients: ``(grad_norm before
        clipping, lr of the step)``; a non-finite norm raises before the step."""
        assert self.optimizer is not None and self.schedule is not None
        params = list(self.trainable_parameters())
        clip = self.grad_clip if self.grad_clip is not None and self.grad_clip > 0 else float("inf")
        grad_norm = self._clip_grad_norm(params, clip)
        if not torch.isfinite(torch.tensor(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteError(
                f"{self.spec.role}: gradient norm is {grad_norm}; optimizer step skipped, "
                "weights unchanged"
            )
        lr = self.schedule.apply()
        self._optimizer_step()
        self.schedule.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm, lr

    # ------------------------------------------------------------------ weights and state

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return hf_named_weights(self.model)

    def state_dict(self) -> dict[str, Any]:
        """Trainable parameters (adapters only, under LoRA), optimizer and schedule
        (:func:`temper.training.torch_state.trainable_state`)."""
        return trainable_state(self.model, self.optimizer, self.schedule)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_trainable_state(self.model, self.optimizer, self.schedule, state, self.spec.role)

    def save_hf(self, path: str, *, merge_lora: bool = True) -> None:
        """HF directory (+ tokenizer); LoRA: merged model + ``lora_adapter/`` (see
        :func:`temper.training.hf_export.save_hf_dir`)."""
        save_hf_dir(self.model, self.spec, path, merge_lora=merge_lora)
