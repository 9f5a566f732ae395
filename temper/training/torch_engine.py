"""The single-process engine: one model on the CPU or one GPU, plain torch.

It is the reference implementation of :class:`TrainEngine` (the distributed engines must
agree with it) and what CI and laptops run. Memory choices:

* trained models keep fp32 master weights and run under ``torch.autocast`` in the
  configured compute dtype (bf16 on GPU by default) — AdamW updates of ~1e-6 would be
  lost in bf16 weights; frozen models are stored in the compute dtype directly;
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
import inspect
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from temper.algorithms.kd import teacher_top_logits
from temper.algorithms.logprobs import (
    DEFAULT_CHUNK,
    full_kl_from_logits,
    fused_chunk_rows,
    logprobs_and_entropy,
    logprobs_from_logits,
    sum_pi_squared_from_logits,
)
from temper.config.errors import ConfigError
from temper.data.batch import Batch
from temper.training.base import LossFn, NonFiniteError, TrainEngine
from temper.training.hf_export import save_hf_dir
from temper.training.micro_batching import (
    KD_INDICES,
    KD_LOGITS,
    MicroBatching,
    ModelInputs,
    masked_outputs,
    model_inputs,
    split_micro_batches,
)
from temper.training.models import (
    freeze_modules,
    load_causal_lm,
    load_value_model,
    resolve_dtype,
)
from temper.training.packing import (
    PREFIX_TREE_KERNELS,
    SEGMENT_KERNELS,
    VARLEN_KERNELS,
    LayoutCost,
    PackedInputs,
    choose_layout,
    model_cost,
    pack,
    plan_packing,
    scored_positions,
    unpack,
)
from temper.training.router_replay import (
    ROUTED_EXPERTS,
    Recording,
    RoutingHooks,
    RoutingUse,
    route,
)
from temper.training.router_replay_hf import HFRouterReplay
from temper.training.schedule import LRSchedule
from temper.training.spec import EngineSpec
from temper.training.vision import vision_forward_inputs
from temper.training.weights import hf_named_weights, is_peft_model

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


def _check_supported(spec: EngineSpec) -> None:
    """Fail early on settings that would change results and that this engine lacks."""
    t = spec.train
    if t is not None:
        check_one_process(spec.role, t.ulysses_sequence_parallel_size)
    m = spec.model
    for flag in ("use_liger", "use_fused_kernels"):
        if getattr(m, flag):
            log.warning("model.%s is a GPU speed option the torch engine ignores", flag)


class TorchEngine(TrainEngine):
    """Causal LM or value model, micro-batched forward/backward, AdamW, LR schedule."""

    supports_full_kl = True

    def __init__(self, spec: EngineSpec) -> None:
        _check_supported(spec)
        self.spec = spec
        self.device = spec.device
        self.compute_dtype = resolve_dtype(spec.model.dtype, spec.device)
        self.trainable = spec.train is not None
        self.model: nn.Module = self._wrap_model(self._load_model())
        self.router_replay = self._router_replay() if spec.router_replay else None
        #: what the running no-grad forward does with routing (:meth:`forward`)
        self._routing_use: RoutingUse | None = None
        self.infer_micro = spec.infer_micro
        self.train_micro = spec.train_micro
        self.grad_clip = spec.train.grad_clip if spec.train is not None else None
        self._logits_to_keep = self._accepts_logits_to_keep()
        self._adapters_off = False
        self._log_probs_and_entropy = self._fused_fn(spec)
        #: micro-batches run per layout (packing: ``model.use_remove_padding``)
        self.layouts: Counter[str] = Counter()
        self._cost: LayoutCost | None = None  # packing's cost model (_layout_cost)
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

    # ------------------------------------------------------------------ plumbing

    def _fused_fn(self, spec: EngineSpec) -> Any:
        """``logprobs_and_entropy``, compiled with ``torch.compile`` under the role's
        ``use_torch_compile`` on GPU, as verl compiles its entropy kernel. On CPU it stays
        eager: inductor's CPU backend compiles C++ for every new shape, which costs far more
        than it saves on the small batches CPU runs have."""
        if spec.train is None or not spec.train.use_torch_compile:
            return logprobs_and_entropy
        if self.device.type != "cuda":
            log.warning("%s.use_torch_compile: the entropy kernel stays eager on CPU", spec.role)
            return logprobs_and_entropy
        return torch.compile(logprobs_and_entropy, dynamic=True)

    # Hooks a data-parallel engine overrides (fsdp2_engine); here one process is the world.

    def _load_device(self) -> torch.device:
        """Where weights are loaded (an offloaded frozen model stays on the CPU)."""
        return torch.device("cpu") if self.spec.param_offload else self.device

    def _load_model(self) -> nn.Module:
        """The HF model (or value model) this engine trains, in its storage dtype."""
        spec = self.spec
        storage = torch.float32 if self.trainable else self.compute_dtype
        loader = load_value_model if spec.value_head else load_causal_lm
        kwargs: dict[str, Any] = (
            {"seed": spec.seed, "score_head": spec.kind == "score"} if spec.value_head else {}
        )
        model = loader(
            spec.model,
            device=self._load_device(),
            dtype=storage,
            path=spec.model_path,
            trainable=self.trainable,
            **kwargs,
        )
        if spec.train is not None:  # freeze_vision_tower / freeze_module_prefix
            model = freeze_modules(model, spec.train, spec.role)
        return model

    def _sparse_tied_embedding_grad(self) -> None:
        """With tied input/output embeddings, let the input embedding's backward return
        its few touched rows (``nn.Embedding.sparse``): autograd adds them into the LM
        head's dense gradient of the same weight, instead of materialising a second
        vocab × hidden dense gradient per micro-batch (~50 ms each for SmolLM2's 49k×576).
        The summed gradient is dense, so AdamW and clipping see what they always did:
        every causal-LM forward runs the LM head, whose backward is dense even with no
        scored token (zeros). Single-process engines only: sharded engines keep their
        dense gradients."""
        hf: Any = self.model
        if not isinstance(hf, PreTrainedModel) or is_peft_model(self.model):
            return
        emb, head = hf.get_input_embeddings(), hf.get_output_embeddings()
        if (
            isinstance(emb, nn.Embedding)
            and head is not None
            and emb.weight is head.weight
            and emb.weight.requires_grad
        ):
            emb.sparse = True

    def _router_replay(self) -> RoutingHooks:
        """The record/replay hooks of this engine's MoE routers (engines on another
        model implementation override it)."""
        return HFRouterReplay(self.model)

    def _wrap_model(self, model: nn.Module) -> nn.Module:
        """Hook for distributed engines (sharding) before the optimizer sees the params."""
        return model

    def _module(self) -> nn.Module:
        """What forwards are called on: the model, or a wrapper that runs it (DeepSpeed)."""
        return self.model

    def _split(self, batch: Batch, spec: MicroBatching) -> tuple[list[Batch], list[list[int]]]:
        """Micro-batches and their rows; an empty row list marks a padding micro-batch."""
        return split_micro_batches(batch, spec)

    def _all_finite(self, loss: torch.Tensor) -> bool:
        return bool(torch.isfinite(loss))

    def _backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Backward of one micro-batch's loss; ``last``: the mini-batch's final one."""
        loss.backward()

    def _reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Partial sums of this rank → sums over all data-parallel ranks."""
        return sums

    def _reduce_grads(self) -> None:
        """Hook: combine gradients over data-parallel ranks before clipping (FSDP does it
        inside backward; the megatron engine here)."""

    def _clip_grad_norm(self, params: list[nn.Parameter], clip: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, clip))

    def _optimizer_step(self) -> None:
        assert self.optimizer is not None
        self.optimizer.step()

    def _accepts_logits_to_keep(self) -> bool:
        if self.spec.value_head:
            return False
        hf: Any = self.model  # a transformers (or peft) model, duck-typed
        base = hf.get_base_model() if is_peft_model(self.model) else hf
        return "logits_to_keep" in inspect.signature(base.forward).parameters

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        """With ``param_offload`` the weights visit the device only for the forward."""
        if not self.spec.param_offload or self.device.type == "cpu":
            yield
            return
        self.model.to(self.device)
        try:
            yield
        finally:
            self.model.to("cpu")

    @contextlib.contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Run the base model without its LoRA adapters (the reference policy, for free)."""
        if not is_peft_model(self.model):
            raise RuntimeError("adapters_disabled() needs a LoRA model (model.lora.rank > 0)")
        self._adapters_off = True  # the reference itself: no KL to compare with
        try:
            peft: Any = self.model  # a peft model (is_peft_model)
            with peft.disable_adapter():
                yield
        finally:
            self._adapters_off = False

    @property
    def shareable_module(self) -> nn.Module | None:
        """The live Hugging Face model, which an in-process HF rollout may share."""
        return self.model

    @property
    def has_adapters(self) -> bool:
        return is_peft_model(self.model)

    def trainable_parameters(self) -> Iterator[nn.Parameter]:
        return (p for p in self.model.parameters() if p.requires_grad)

    def set_total_steps(self, total_steps: int) -> None:
        if self.schedule is not None:
            self.schedule.set_total_steps(total_steps)

    # ------------------------------------------------------------------ forward

    def _logits(
        self,
        inputs: dict[str, Any],
        keep: int | torch.Tensor,
        extra: dict[str, Any] | None = None,
    ) -> torch.Tensor:
        """Logits of the last ``keep`` positions ``(b, keep, V)``, or of the positions
        ``keep`` (a tensor: a packed row's response positions) ``(K, V)``."""
        kwargs: dict[str, Any] = {**inputs, "use_cache": False}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = keep
        logits = self._module()(**{**kwargs, **(extra or {})}).logits
        if isinstance(keep, int):
            return logits[:, -keep:]
        return logits[0] if self._logits_to_keep else logits[0, keep]

    # ------------------------------------------------------------------ packing

    def _attn_impl(self) -> str:
        """The attention kernel the loaded model runs (``sdpa``, ``eager``, ``flash_…``)."""
        return str(getattr(self.model.config, "_attn_implementation", None) or "sdpa")

    def _layout_cost(self) -> LayoutCost:
        """The packing cost model of this model (from its config: deterministic, so every
        rank and a resumed run choose the same layouts)."""
        if self._cost is None:
            # a segment kernel, like a varlen one, visits only the pairs of each sequence
            segments = self._attn_impl() in VARLEN_KERNELS + SEGMENT_KERNELS
            self._cost = model_cost(self.model.config, varlen=segments)
        return self._cost

    def _pack(self, inp: ModelInputs, extra: dict[str, Any]) -> PackedInputs | None:
        """This micro-batch packed (``model.use_remove_padding`` and cheaper), or None."""
        if not self.spec.model.use_remove_padding:
            return None
        if extra or getattr(self.model.config, "vision_config", None) is not None:
            # vision-language models stay padded: the model computes its 3-D M-RoPE
            # positions from the padded 2-D mask and image grids (training.vision)
            self.layouts["padded"] += 1
            return None
        cost = self._layout_cost()
        lengths = inp.attention_mask.sum(dim=1).tolist()
        # a prompt shared by a group is packed once (prefix-tree mask: masked kernels only)
        plan = plan_packing(inp, share_prompts=self._attn_impl() in PREFIX_TREE_KERNELS)
        layout = choose_layout(lengths, inp.input_ids.shape[1], cost, plan.tokens)
        self.layouts[layout] += 1
        if layout == "padded":
            return None
        return pack(inp, self._attn_impl(), self.compute_dtype, plan)

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
            valid = scored_positions(inp)
        else:
            model_in = packed.model_inputs()
            keep = packed.keep
            valid = packed.valid
        labels = inp.response_ids[valid]  # (K,): log-probs and entropy only where scored
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
                logits = self._logits(model_in, keep, extra)
                if packed is None:  # (b, r, V) -> (K, V): padding costs no softmax
                    logits = logits[:, :r][valid]
                if with_entropy:  # one pass for both: _log_probs_and_entropy
                    out["log_probs"], entropy = self._log_probs_and_entropy(
                        logits,
                        labels,
                        temperature=temperature,
                        chunk_size=self.spec.entropy_chunk_size
                        or fused_chunk_rows(logits.shape[-1], logits.device),
                    )
                    # a metric-only entropy is detached: its gradient pass is skipped
                    out["entropy"] = entropy if entropy_grad else entropy.detach()
                else:
                    out["log_probs"] = logprobs_from_logits(logits, labels, temperature=temperature)
                if with_sum_pi_squared:  # the optimal-token-baseline estimators' input
                    out["sum_pi_squared"] = sum_pi_squared_from_logits(
                        logits,
                        temperature=temperature,
                        chunk_size=self.spec.entropy_chunk_size
                        or fused_chunk_rows(logits.shape[-1], logits.device),
                    )
                if KD_INDICES in mb:  # offline distillation: the teacher's top-k token ids
                    ids = mb[KD_INDICES][:, :r].to(self.device)[valid]
                    out[KD_LOGITS] = logits.gather(-1, ids)
                if self.kl_reference is not None and not self._adapters_off:  # the exact KL
                    ref = self.kl_reference.response_logits(mb)
                    out["full_kl"] = full_kl_from_logits(
                        logits,
                        ref[valid],
                        temperature=temperature,
                        chunk_size=self.spec.entropy_chunk_size or DEFAULT_CHUNK,
                    )
        if packed is not None or not self.spec.value_head:  # (K, …) -> (b, r, …)
            out = {k: unpack(v, valid) for k, v in out.items()}
        result = masked_outputs(out, mb, inp)
        if isinstance(record, Recording):
            result[ROUTED_EXPERTS] = record.columns()
        return result

    def _route(
        self, mb: Batch, inp: ModelInputs, packed: PackedInputs | None
    ) -> contextlib.AbstractContextManager[Any]:
        """Routing of micro-batch ``mb``'s forward (:func:`route`); none without hooks."""
        if self.router_replay is None:
            return contextlib.nullcontext()
        return route(self.router_replay, self._routing_use, mb, inp, packed, self.device)

    @torch.no_grad()
    def response_logits(self, batch: Batch) -> torch.Tensor:
        """No-grad logits ``(b, r, V)`` of the response tokens of a micro-batch (the
        reference's side of the exact KL; the model's train/eval mode is left as it is —
        under LoRA it is the actor's own module). Zero where a packed forward had no
        response token to score."""
        inp = model_inputs(batch, self.device)
        r = inp.response_len
        extra, vision_context = vision_forward_inputs(self.model, batch, inp)
        with self._on_device(), self._autocast(), vision_context:
            packed = self._pack(inp, extra)
            model_in: dict[str, Any]
            if packed is None:
                model_in = {
                    "input_ids": inp.input_ids,
                    "attention_mask": inp.attention_mask,
                    "position_ids": inp.position_ids,
                }
                return self._logits(model_in, r + 1, extra)[:, :r]
            model_in = packed.model_inputs()
            return unpack(self._logits(model_in, packed.keep), packed.valid)

    @torch.no_grad()
    def top_logits(
        self,
        batch: Batch,
        k: int,
        scale: float,
        micro_batching: MicroBatching | None = None,
        *,
        vocab: int | None = None,
        log_probs: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A teacher's side of offline distillation (``log_probs``: of on-policy
        distillation's top-k loss, the values normalized over the ids ``< vocab``): at every response token the ``k``
        largest logits divided by ``scale`` among ids ``< vocab`` (None: every column; the
        output layer may have padding rows past the tokenizer's tokens, which a student
        of another size lacks) and their token ids (``k = 0``: every token),
        ``(B, R, k)`` each in batch order, zero on masked tokens
        (:func:`temper.algorithms.kd.teacher_top_logits`)."""
        self.model.eval()
        b, r = batch["response_ids"].shape
        home = batch["response_ids"].device
        values = ids = torch.empty(0)
        micro, groups = self._split(batch, micro_batching or self.infer_micro)
        for mb, rows in zip(micro, groups):
            out = self._micro_top_logits(mb, k, scale, vocab, log_probs)
            if not rows:  # a padding micro-batch (collectives only)
                continue
            if values.numel() == 0:
                width = out["values"].shape[-1]
                values = torch.zeros(b, r, width, dtype=torch.float32, device=home)
                ids = torch.zeros(b, r, width, dtype=torch.long, device=home)
            index = torch.as_tensor(rows, device=home)
            values[index] = out["values"].to(home)
            ids[index] = out["ids"].to(home).long()
        return values, ids

    def _micro_top_logits(
        self, mb: Batch, k: int, scale: float, vocab: int | None, log_probs: bool = False
    ) -> dict[str, torch.Tensor]:
        """``values`` and ``ids`` ``(b, R, k)`` of one micro-batch (:meth:`top_logits`)."""
        inp = model_inputs(mb, self.device)
        logits = self.response_logits(mb)[..., :vocab]
        if log_probs:  # log-softmax is monotone: the same top-k ids, normalized values
            logits, scale = torch.log_softmax(logits.float() / scale, dim=-1), 1.0
        values, ids = teacher_top_logits(logits, k, scale)
        return masked_outputs({"values": values, "ids": ids}, mb, inp)

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
        rank's ``(loss sum, metric sums)`` (padding micro-batches contribute nothing)."""
        total = 0.0
        sums: dict[str, float] = {}
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
            total += float(loss.detach())
            for k, v in metrics.items():
                sums[k] = sums.get(k, 0.0) + float(v)
        return total, sums

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

    def _zero_grad(self) -> None:
        """Start a mini-batch with no gradients."""
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)

    def _discard_gradients(self, mb: Batch, out: dict[str, torch.Tensor]) -> None:
        """Drop the gradients accumulated so far (a micro-batch's loss was not finite);
        ``mb``/``out`` are that micro-batch and its outputs, for engines that must run a
        collective to clear their buffers."""
        self._zero_grad()

    # ------------------------------------------------------------------ weights and state

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return hf_named_weights(self.model)

    def state_dict(self) -> dict[str, Any]:
        """Trainable parameters (adapters only, under LoRA), optimizer and schedule.

        Tensors are the live ones (like ``nn.Module.state_dict``): serialize or copy them
        before training on.
        """
        state: dict[str, Any] = {
            "model": {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad}
        }
        if self.optimizer is not None and self.schedule is not None:
            state["optimizer"] = self.optimizer.state_dict()
            state["scheduler"] = self.schedule.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        params = dict(self.model.named_parameters())
        saved = state["model"]
        missing = [n for n, p in params.items() if p.requires_grad and n not in saved]
        unknown = [n for n in saved if n not in params]
        if missing or unknown:
            raise ValueError(
                f"{self.spec.role} checkpoint does not match the model: missing {missing[:5]}, "
                f"unexpected {unknown[:5]} (was it saved with another LoRA/model setting?)"
            )
        with torch.no_grad():
            for name, tensor in saved.items():
                params[name].copy_(tensor)
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.schedule is not None and "scheduler" in state:
            self.schedule.load_state_dict(state["scheduler"])

    def save_hf(self, path: str, *, merge_lora: bool = True) -> None:
        """HF directory (+ tokenizer); LoRA: merged model + ``lora_adapter/`` (see
        :func:`temper.training.hf_export.save_hf_dir`)."""
        save_hf_dir(self.model, self.spec, path, merge_lora=merge_lora)
