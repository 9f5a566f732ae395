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

    def temper_begin_weight_update(self) -> None:
        """Open one in-place update: layers go back to checkpoint format (on meta)."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            initialize_layerwise_reload,
        )

        self._temper_loaded: set[str] = set()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self._temper_model())

    def temper_load_bucket(self, bucket: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Feed one bucket of (Hugging Face name, tensor) to the model's loader."""
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(self.vllm_config), torch.no_grad():
            loaded = self._temper_model().load_weights(list(bucket))
        if loaded:
            self._temper_loaded |= set(loaded)
        return len(loaded or ())

    def temper_finish_weight_update(self) -> list[str]:
        """Close the update; returns the engine's parameters that got no new value."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            finalize_layerwise_reload,
        )

        model = self._temper_model()
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
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            fn = getattr(self.model_runner, reset, None)
            if callable(fn):
                fn()
        expected = {name for name, _ in model.named_parameters()}
        return sorted(expected - self._temper_loaded)
