"""Worker-side half of temper's vLLM weight sync (a vLLM ``worker_extension_cls``).

vLLM mixes this class into its worker, so the methods run where the model lives (in
this process with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, in the engine process
otherwise) and are called by name through ``LLM.collective_rpc``.

Why not ``collective_rpc("reload_weights", weights_iterator=all_weights)`` once per
bucket: vLLM's in-place reload puts *every* layer back to checkpoint format on entry
and processes it on exit, so a call that carries only some layers logs a failure for
all the others and processes a layer whose source tensors were split across calls
(q/k/v → ``qkv_proj``) with half of them missing. Here one update is
``begin`` → ``load_bucket`` × N → ``finish``: the layerwise reload is opened once,
buckets stream through the model's own ``load_weights`` (name mapping, fusing,
sharding), and each layer is re-processed (CPU oneDNN prepacking, quantization) as
soon as all of its tensors have arrived.

Embedding layers (the token embedding and the LM head, one weight when tied) skip the
layerwise machinery: their weight keeps its checkpoint layout in the engine (vLLM's CPU
build packs a *copy* of it for the logits GEMM), so the loader writes straight into it and
the LM head is re-processed at ``finish`` (the token embedding needs nothing: it reads its
live weight; see :func:`_logit_heads`). Through the layerwise reload each of them would
be loaded into a fresh tensor and copied back: two passes over the weight more per layer
(SmolLM2's tied embedding, 113 MB, is both layers).

Nothing here imports vLLM at module level: the module must import where vLLM is not
installed (temper's own import checks).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch


class TemperWorkerExtension:
    """Bucketed in-place weight update; mixed into vLLM's worker class."""

    model_runner: Any  # provided by the vLLM worker this class is mixed into
    vllm_config: Any

    def _temper_model(self) -> Any:
        return self.model_runner.get_model()

    def temper_drop_unread_packing(self) -> int:
        """Free the GEMM copies vLLM's CPU build packs for token embeddings that are no LM
        head (see :func:`_logit_heads`): never read, they cost memory and, re-packed, sync
        time. Their ``cpu_linear`` becomes vLLM's own unpacked fallback, ``F.linear`` on
        the live weight, so a call would still be right. Returns the layers' weight bytes
        (the size of each copy freed)."""
        model = self._temper_model()
        layers = _direct_layers(model, reloading=False)
        heads = {id(layer) for layer in _logit_heads(model, layers)}
        freed = 0
        for layer in layers:
            if id(layer) not in heads and hasattr(layer, "cpu_linear"):
                layer.cpu_linear = torch.nn.functional.linear
                freed += layer.weight.numel() * layer.weight.element_size()
        return freed

    def temper_begin_weight_update(self) -> None:
        """Open one in-place update: layers go back to checkpoint format (on meta), but
        embeddings, which are loaded in place (see the module doc)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            get_layerwise_info,
            initialize_layerwise_reload,
        )

        self._temper_loaded: set[str] = set()
        model = self._temper_model()
        self._temper_direct = _direct_layers(model)
        for layer in self._temper_direct:  # marked as open: the layerwise reload skips them
            get_layerwise_info(layer).load_numel_total = 0
        try:
            with set_current_vllm_config(self.vllm_config):
                initialize_layerwise_reload(model)
        except BaseException:
            for layer in self._temper_direct:  # not left marked for the next update
                get_layerwise_info(layer).reset()
            raise
        self._temper_tied = _tied_aliases(model)

    def temper_load_bucket(self, bucket: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Feed one bucket of (Hugging Face name, tensor) to the model's loader."""
        from vllm.config import set_current_vllm_config

        model = self._temper_model()
        tied: set[str] = getattr(self, "_temper_tied", set())
        if tied:  # a tied weight's second name: its first loads it (finish re-processes both)
            mapper = getattr(model, "hf_to_vllm_mapper", None)
            bucket = [
                (name, t)
                for name, t in bucket
                if ((mapper.map_name(name) if mapper is not None else name) not in tied)
            ]
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            loaded = model.load_weights(list(bucket))
        if loaded:
            self._temper_loaded |= set(loaded)
        return len(loaded or ())

    def temper_finish_weight_update(self) -> list[str]:
        """Close the update; returns the engine's parameters that got no new value."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            finalize_layerwise_reload,
            get_layerwise_info,
        )

        model = self._temper_model()
        direct = getattr(self, "_temper_direct", [])
        for layer in direct:  # back to "not reloading", so finalize leaves them alone
            get_layerwise_info(layer).reset()
        # Layers with buffers but no checkpoint tensors (rotary embeddings) get their
        # old values back, and vLLM logs "Failed to load weights" for each: expected here.
        quiet = logging.getLogger(finalize_layerwise_reload.__module__)
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            with set_current_vllm_config(self.vllm_config):
                finalize_layerwise_reload(model, self.vllm_config.model_config)
        finally:
            quiet.setLevel(level)
        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            for layer in _logit_heads(model, direct):  # loaded in place: redo their GEMM
                layer.quant_method.process_weights_after_loading(layer)
        self._temper_direct, self._temper_tied = [], set()
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            fn = getattr(self.model_runner, reset, None)
            if callable(fn):
                fn()
        expected = {name for name, _ in model.named_parameters()}
        return sorted(expected - self._temper_loaded)


def _tied_aliases(model: Any) -> set[str]:
    """Names under which vLLM's loader skips a weight as tied to an earlier name (an LM
    head that is the embedding), as it sees them: layers the layerwise reload put on meta
    have their own tensors then, so only directly loaded embeddings can be tied."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    first: dict[int, str] = {}
    aliases = set()
    for prefix, layer in model.named_modules(remove_duplicate=False):
        if not isinstance(layer, VocabParallelEmbedding):
            continue
        for name, param in layer.named_parameters(remove_duplicate=False):
            qualname = f"{prefix}.{name}" if prefix else name
            if first.setdefault(id(param), qualname) != qualname:
                aliases.add(qualname)
    return aliases


def _logit_heads(model: Any, layers: list[Any]) -> list[Any]:
    """Those of ``layers`` that compute logits: a ``ParallelLMHead``, or a layer registered
    as ``lm_head``. Their re-processing is what the engine builds from the weight for the
    logits GEMM (the CPU build's packed copy). A token embedding only looks rows up in its
    live weight, so its packed copy (which vLLM's CPU build makes for every embedding) is
    never read, and re-packing it would only cost time (SmolLM2: as long as the LM head's).
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    named_head = {
        id(layer)
        for name, layer in model.named_modules(remove_duplicate=False)
        if name.rsplit(".", 1)[-1] == "lm_head"
    }
    return [
        layer for layer in layers if isinstance(layer, ParallelLMHead) or id(layer) in named_head
    ]


def _direct_layers(model: Any, reloading: bool = True) -> list[Any]:
    """Layers whose checkpoint weights are loaded in place (see the module doc): vLLM
    embeddings (token embedding, LM head) without quantization, whose only tensor is a
    live ``weight``, of its checkpoint shape and dtype when ``reloading`` (between
    updates vLLM keeps no checkpoint record to compare with)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    out = []
    for layer in model.modules():
        if not isinstance(layer, VocabParallelEmbedding):
            continue
        if not isinstance(getattr(layer, "quant_method", None), UnquantizedEmbeddingMethod):
            continue
        tensors = dict(layer.named_parameters(recurse=False)) | dict(
            layer.named_buffers(recurse=False)
        )
        if set(tensors) != {"weight"} or tensors["weight"].is_meta:
            continue
        if not reloading:
            out.append(layer)
            continue
        info = get_layerwise_info(layer)
        if info.can_load():
            continue
        weight, recorded = tensors["weight"], info.restore_metadata[0].get("weight")
        if (
            recorded is None
            or weight.is_meta
            or weight.shape != recorded.shape
            or weight.dtype != recorded.dtype
        ):
            continue
        out.append(layer)
    return out
