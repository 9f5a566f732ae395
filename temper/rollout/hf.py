"""Rollout with Hugging Face ``model.generate`` — the engine that runs anywhere.

Two ways to hold the model:

* **shared** (``HFRolloutEngine(module, tokenizer)``): colocated with the trainer in
  one process, the engine generates with the actor's own ``nn.Module``. There is no
  second copy and no weight sync: ``load_weights`` is a no-op, because the trainer's
  optimizer step already changed the very tensors generation reads.
* **owned** (``HFRolloutEngine.from_pretrained(path)``): the engine loads its own copy
  and ``load_weights`` copies the trainer's tensors in by (Hugging Face) name. On CPU,
  where it would run ``sdpa``, it loads with temper's segment kernel, whose forwards
  outside packed training are ``sdpa``'s without the per-query-head copies of the KV
  cache (:func:`temper.training.segment_attention.suits_generation`), as the trainer's
  model does.

Log-probs. ``rollout_log_probs`` are log-probs under the distribution the token was
actually drawn from: raw logits → repetition penalty → temperature → top-k → top-p,
then log-softmax (filtered tokens are -inf, the drawn one never is). Greedy decoding
(``do_sample=False`` or temperature 0) reports log-softmax of the (penalized) raw
logits, i.e. temperature 1, like vLLM's raw log-probs. To get them without keeping
a (steps × batch × vocab) tensor (``output_scores``), the engine builds the whole
processor chain itself with a recorder after the warpers, and gathers the drawn token's log-prob
in a stopping criterion, which ``generate`` calls right after it appends the token.

Routing (``params.routed_experts``, router replay R3). An MoE model's routers are hooked
(:class:`~temper.utils.router_replay_hf.HFRouterReplay`, the trainer's hook code) while
``generate`` runs: the prefill routes the prompt's columns, each decoding step the token
it feeds, so a row gets the routing of every token but the last one it generated — in
the batch's columns, -1 at padding (:func:`temper.data.routing.mask_columns`). The ``n``
samples of a prompt are ``n`` rows of one prefill.

Sampling. The engine draws each token itself, the last processor of its chain
(:func:`temper.rollout.sampling.inverse_cdf_sample`: one uniform variate per row, where
``torch.multinomial`` draws one per vocabulary entry), and leaves only that token finite;
``generate`` runs greedy and takes it.

Linears. On CPU the model's plain float32 linears run on oneDNN-packed copies of their
weights for the length of each ``generate`` call of at least
:data:`temper.rollout.packed_linear.MIN_NEW_TOKENS` tokens (:mod:`temper.rollout.packed_linear`:
the same products, in less time at decoding's few rows; ``pack_linears = False`` turns
it off).

Determinism. The draw uses torch's *global* RNG of the model's device: call
``torch.manual_seed(s)`` (which also seeds CUDA) before ``generate`` to reproduce a
rollout exactly; the driver's seeded, checkpointed RNG state makes resumed runs continue
the same stream.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from temper.config.schema import DTYPES, Dtype
from temper.data.batch import Batch
from temper.data.routing import ROUTED_EXPERTS, mask_columns, routing_dtype
from temper.data.vision import (
    MULTI_MODAL_INPUTS,
    has_pixels,
    stack_inputs,
    token_type_ids,
    vision_token_ids,
)
from temper.rollout import packed_linear
from temper.rollout.base import RolloutEngine, SamplingParams
from temper.rollout.sampling import inverse_cdf_sample
from temper.rollout.stops import FinishedResponses, finish_responses, right_pad
from temper.training import segment_attention
from temper.utils.router_replay_hf import HFRouterReplay


class _LogProbRecorder(LogitsProcessor):
    """Last logits processor: keeps the log-softmax of this step's processed scores.

    ``record_drawn`` (called by ``_RecordDrawn`` once ``generate`` has appended the
    drawn token) gathers that token's log-prob, so only (B,) per step is kept.
    """

    def __init__(self) -> None:
        self._step: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._step = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def record_drawn(self, input_ids: torch.Tensor) -> None:
        if self._step is None:
            raise RuntimeError("transformers called the stopping criteria before the processors")
        self.steps.append(self._step.gather(1, input_ids[:, -1:]).squeeze(1))
        self._step = None

    def log_probs(self, length: int) -> torch.Tensor:
        """(B, length) log-probs of the generated tokens."""
        return torch.stack(self.steps[:length], dim=1)


class _RecordDrawn(StoppingCriteria):
    """A stopping criterion that never stops: it runs right after each drawn token
    is appended to ``input_ids`` — the one hook that sees the token *and* comes
    after the processors (``generate`` passes criteria the stored scores, not the
    current ones)."""

    def __init__(self, recorder: _LogProbRecorder) -> None:
        self.recorder = recorder

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.recorder.record_drawn(input_ids)
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class _DrawToken(LogitsProcessor):
    """Last processor when sampling: draws each row's token from the processed scores
    (:func:`temper.rollout.sampling.inverse_cdf_sample`) and leaves only that token
    finite, so ``generate``'s greedy step (``argmax``) picks it — ``generate`` then runs
    greedy, with no warpers or ``torch.multinomial`` of its own.

    The scores are overwritten in place: the recorder before this keeps its own
    log-softmax, and ``generate`` keeps no scores (``output_scores`` is off).
    """

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        drawn = inverse_cdf_sample(scores)
        return scores.fill_(float("-inf")).scatter_(1, drawn, 0.0)


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


@contextlib.contextmanager
def _generation_mode(module: Any, config: GenerationConfig) -> Iterator[None]:
    """Eval mode (no dropout, no gradient checkpointing) and our generation config.

    The model's own ``generation_config`` is swapped out for the call because
    ``generate`` fills every unset field from it (a hub ``top_k=50`` or ``min_p``
    would silently change the sampling distribution and our log-probs).
    """
    was_training = module.training
    saved = module.generation_config
    module.eval()
    module.generation_config = config
    try:
        yield
    finally:
        module.generation_config = saved
        module.train(was_training)


class HFRolloutEngine(RolloutEngine):
    """``RolloutEngine`` over ``transformers`` ``generate`` (see the module doc)."""

    pad_token_id: int  # always known here (the tokenizer's, else the first EOS)

    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer: Any,
        *,
        infer_batch_size: int | None = None,
        shared: bool = True,
    ) -> None:
        """Generate with ``module`` (a causal LM with ``generate``).

        ``shared=True`` means the module is the trainer's (``load_weights`` does
        nothing); ``infer_batch_size`` is prompts per ``generate`` call (None: all).
        """
        if not hasattr(module, "generate"):
            raise TypeError(f"{type(module).__name__} has no generate(); pass the causal LM")
        if infer_batch_size is not None and infer_batch_size <= 0:
            raise ValueError(f"infer_batch_size must be positive, got {infer_batch_size}")
        self.module: Any = module  # a transformers causal LM (duck-typed: generate, config)
        self.tokenizer = tokenizer
        self.shared = shared
        self.infer_batch_size = infer_batch_size
        # CPU: linears on oneDNN-packed weights while generating (rollout.packed_linear)
        self.pack_linears = True
        gen = getattr(module, "generation_config", None)
        # EOS = the tokenizer's plus the model's (Llama-3 style models list several)
        self.eos_token_ids = sorted(
            set(_as_list(tokenizer.eos_token_id))
            | set(_as_list(getattr(gen, "eos_token_id", None)))
        )
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = self.eos_token_ids[0] if self.eos_token_ids else 0
        self.pad_token_id = int(pad)
        self.vision_ids = vision_token_ids(module.config)  # (None, None) for text models
        self._routers: HFRouterReplay | None = None  # hooked at the first routed call

    # ----------------------------------------------------------------- construction

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        tokenizer_path: str | None = None,
        dtype: Dtype = "auto",
        device: str | torch.device | None = None,
        infer_batch_size: int | None = None,
        trust_remote_code: bool = False,
        attn_implementation: str | None = None,
    ) -> HFRolloutEngine:
        """Load an owned copy of the model at ``path`` (a dir, hub id or temper alias)."""
        from transformers import AutoConfig, AutoTokenizer

        from temper.utils.hf_auto import causal_lm_class
        from temper.utils.model_path import resolve_model_path

        device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype == "auto":
            torch_dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
        else:
            torch_dtype = getattr(torch, DTYPES[dtype])
        model_path = resolve_model_path(path)
        kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
        if attn_implementation and attn_implementation != "auto":
            kwargs["attn_implementation"] = attn_implementation
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        auto_cls = causal_lm_class(config)  # vision-language models: image-text-to-text
        if (
            device.type == "cpu"
            and attn_implementation in (None, "auto", "sdpa")
            and segment_attention.suits_generation(config, auto_cls)
        ):
            # sdpa's sums without copying grouped key/value heads at every decoding step
            segment_attention.register()
            kwargs["attn_implementation"] = segment_attention.SEGMENT_KERNEL
        module: Any = auto_cls.from_pretrained(model_path, **kwargs).to(device)
        tok_path = resolve_model_path(tokenizer_path) if tokenizer_path else model_path
        tokenizer = AutoTokenizer.from_pretrained(tok_path, trust_remote_code=trust_remote_code)
        return cls(module, tokenizer, infer_batch_size=infer_batch_size, shared=False)

    # ----------------------------------------------------------------- interface

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy weights in by Hugging Face name (an MoE expert also by its checkpoint
        name, see :func:`fused_expert_slice`); a no-op for a shared module.

        A shared module *is* the trainer's model, so its weights are always current.
        """
        if self.shared:
            return
        state = self.module.state_dict()
        with torch.no_grad():
            for name, tensor in named_tensors:
                target = state.get(name)
                if target is None:
                    target = fused_expert_slice(name, state)
                if target is None:
                    raise KeyError(f"load_weights: '{name}' is not a weight of the rollout model")
                if target.shape != tensor.shape:
                    raise ValueError(
                        f"load_weights: '{name}' has shape {tuple(tensor.shape)}, "
                        f"the rollout model expects {tuple(target.shape)}"
                    )
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """``params.n`` responses per prompt, rows grouped per prompt (aabb).

        See ``RolloutEngine.generate`` for the output keys. ``rollout_log_probs`` is
        left out when ``params.logprobs`` is False.
        """
        if len(prompts) == 0:
            raise ValueError("generate() got an empty batch")
        if params.n < 1 or params.max_new_tokens < 1:
            raise ValueError(
                f"need n ≥ 1 and max_new_tokens ≥ 1, got {params.n}, {params.max_new_tokens}"
            )
        rows = prompts.repeat(params.n, interleave=True) if params.n > 1 else prompts
        per_call = (self.infer_batch_size or len(prompts)) * params.n
        out_device = rows["prompt_ids"].device
        ids, masks, logps, truncated, routed = [], [], [], [], []
        packed: contextlib.AbstractContextManager[int] = (
            packed_linear.packed_linears(self.module, min(per_call, len(rows)))
            if self.pack_linears
            and params.max_new_tokens >= packed_linear.MIN_NEW_TOKENS
            and packed_linear.available(self.device)
            else contextlib.nullcontext(0)
        )
        with packed:  # once for every chunk of this call
            for start in range(0, len(rows), per_call):
                chunk = rows.slice(start, min(start + per_call, len(rows)))
                done, routing = self._generate_chunk(
                    chunk["prompt_ids"],
                    chunk["prompt_mask"],
                    params,
                    chunk.objects.get(MULTI_MODAL_INPUTS),
                )
                ids.append(done.response_ids.to(out_device))
                masks.append(done.response_mask.to(out_device))
                if done.log_probs is not None:
                    logps.append(done.log_probs.to(out_device))
                if routing is not None:
                    routed.append(routing)
                truncated.extend(done.truncated)
        rows = Batch(rows.tensors.clone(recurse=False), dict(rows.objects), dict(rows.meta))
        rows["response_ids"] = right_pad(ids, self.pad_token_id)
        rows["response_mask"] = right_pad(masks, 0)
        if logps:
            rows["rollout_log_probs"] = right_pad(logps, 0.0)
        if routed:
            width = max(r.shape[1] for r in routed)
            columns = torch.cat([_widen(r, width) for r in routed])
            rows[ROUTED_EXPERTS] = mask_columns(
                columns, rows["prompt_mask"].cpu(), rows["response_mask"].cpu()
            ).to(out_device)
        rows["truncated"] = truncated
        return rows

    # ----------------------------------------------------------------- internals

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def _stop_token_ids(self, params: SamplingParams) -> list[int]:
        """EOS (unless ``ignore_eos``) plus the extra stop ids, as vLLM does."""
        ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            ids |= set(self.eos_token_ids)
        return sorted(ids)

    def _processors(self, params: SamplingParams, recorder: _LogProbRecorder | None):
        """The full logits-processor chain, in ``generate``'s own order."""
        chain: list[LogitsProcessor] = []
        if params.repetition_penalty != 1.0:
            chain.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
        if not params.greedy:
            if params.temperature != 1.0:
                chain.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                chain.append(TopKLogitsWarper(top_k=params.top_k))
            if params.top_p < 1.0:
                chain.append(TopPLogitsWarper(top_p=params.top_p))
        if recorder is not None:
            chain.append(recorder)
        if not params.greedy:
            chain.append(_DrawToken())
        return LogitsProcessorList(chain)

    def _generation_config(self, params: SamplingParams, stop_ids: list[int]) -> GenerationConfig:
        # The warpers and the draw are ours (see _processors): generate runs greedy, which
        # adds no processor of its own and takes the one token _DrawToken leaves finite.
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=False,
            repetition_penalty=1.0,
            num_beams=1,
            eos_token_id=stop_ids,  # [] (ignore_eos, no stop ids) is "never stop"
            pad_token_id=self.pad_token_id,
            use_cache=True,  # even if training set config.use_cache=False (grad ckpt)
            stop_strings=list(params.stop) or None,
            return_dict_in_generate=False,
        )

    def _hooks(self) -> HFRouterReplay:
        """The module's MoE routers, hooked once (their hooks do nothing unless asked)."""
        if self._routers is None:
            self._routers = HFRouterReplay(self.module)
        return self._routers

    def _generate_chunk(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        params: SamplingParams,
        mm_inputs: list[dict[str, torch.Tensor]] | None = None,
    ) -> tuple[FinishedResponses, torch.Tensor | None]:
        """One ``generate`` call: the finished responses, and with
        ``params.routed_experts`` their routing ``(b, P + G - 1, L, k)`` in the chunk's
        columns (``G`` generated columns; not yet masked)."""
        # drop the left columns that are padding in every row of this chunk
        present = prompt_mask.bool().any(dim=0).nonzero()
        first = int(present[0]) if present.numel() else 0
        device = self.device
        input_ids = prompt_ids[:, first:].to(device)
        attention_mask = prompt_mask[:, first:].to(device)
        vision: dict[str, torch.Tensor] = {}
        if mm_inputs is not None and has_pixels(mm_inputs):
            # every row's own pixel inputs (the n rows of a prompt share one dict), and
            # token types from which the model computes its M-RoPE positions
            vision = {k: v.to(device) for k, v in stack_inputs(mm_inputs).items()}
            vision["mm_token_type_ids"] = token_type_ids(
                input_ids, input_ids.shape[1], *self.vision_ids
            )
        recorder = _LogProbRecorder() if params.logprobs else None
        stop_ids = self._stop_token_ids(params)
        config = self._generation_config(params, stop_ids)
        criteria = StoppingCriteriaList([_RecordDrawn(recorder)] if recorder else [])
        routing: contextlib.AbstractContextManager[list[torch.Tensor]] = (
            self._hooks().recording_forwards(self.module)
            if params.routed_experts
            else contextlib.nullcontext([])
        )
        with _generation_mode(self.module, config), torch.no_grad(), routing as forwards:
            out = self.module.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=config,
                logits_processor=self._processors(params, recorder),
                stopping_criteria=criteria,
                tokenizer=self.tokenizer if params.stop else None,
                **vision,
            )
        response = out[:, input_ids.shape[1] :]
        log_probs = recorder.log_probs(response.shape[1]) if recorder else None
        done = finish_responses(
            response,
            log_probs,
            stop_token_ids=stop_ids,
            stop_strings=params.stop,
            tokenizer=self.tokenizer,
            pad_token_id=self.pad_token_id,
        )
        if not params.routed_experts:
            return done, None
        return done, self._forward_columns(forwards, len(input_ids), first)

    def _forward_columns(self, forwards: list[torch.Tensor], rows: int, first: int) -> torch.Tensor:
        """The routing of ``generate``'s forwards (each ``(rows · s, L, k)``, row-major:
        the prefill's ``s`` trimmed prompt columns, then one column per decoding step) in
        the batch's columns: the ``first`` prompt columns that were all padding come back
        as -1."""
        per_row = [f.reshape(rows, -1, *f.shape[1:]) for f in forwards]
        routed = torch.cat(per_row, dim=1).to("cpu", routing_dtype(self._hooks().num_experts))
        return torch.nn.functional.pad(routed, (0, 0, 0, 0, first, 0), value=-1)


def _widen(routed: torch.Tensor, width: int) -> torch.Tensor:
    """``(b, C, L, k)`` right-padded with -1 to ``width`` columns."""
    return torch.nn.functional.pad(routed, (0, 0, 0, 0, 0, width - routed.shape[1]), value=-1)


_EXPERT = re.compile(
    r"^(?P<layer>.+)\.(?:mlp|block_sparse_moe)\.experts\.(?P<e>\d+)\."
    r"(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$"
)


def fused_expert_slice(name: str, state: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The view of a fused expert tensor that checkpoint name ``name`` (one tensor per
    expert, as safetensors files, vLLM and the megatron engine's export name them) is
    in memory: transformers keeps an MoE layer's experts as ``experts.gate_up_proj``
    ``(E, 2I, H)`` — gate rows then up rows, its checkpoint conversion — and
    ``experts.down_proj`` ``(E, H, I)``. None when ``name`` is no such expert weight."""
    m = _EXPERT.match(name)
    if m is None:
        return None
    e, proj = int(m["e"]), m["proj"]
    prefix = f"{m['layer']}.mlp.experts."
    if proj in ("down_proj", "w2"):
        down = state.get(prefix + "down_proj")
        return down[e] if down is not None else None
    fused = state.get(prefix + "gate_up_proj")
    if fused is None:
        return None
    half = fused.shape[1] // 2
    return fused[e, :half] if proj in ("gate_proj", "w1") else fused[e, half:]
