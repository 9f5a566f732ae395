"""Loading the models an engine trains: a causal LM (optionally with LoRA) or a value model.

Everything a ``ModelConfig`` says about *how* to build the network lives here (dtype,
attention kernel, config overrides, remote code, extra model registrations, gradient
checkpointing, LoRA), so engines only decide *where* it runs and *how* it is batched.

The value model is the policy's backbone (``AutoModel``, no LM head) plus a scalar
``nn.Linear(hidden, 1)`` head, the usual PPO critic. It saves as a directory: the
backbone as a Hugging Face model plus ``value_head.safetensors``, so it reloads with
:func:`load_value_model` and its backbone loads anywhere ``transformers`` does.
"""

from __future__ import annotations

import importlib
import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig, ModelConfig
from temper.utils.model_path import resolve_model_path

log = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"
VALUE_MODEL_STAMP = "temper_value_model.json"

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` → cuda when available, else cpu."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Compute dtype: ``auto`` is fp32 on CPU (always works there) and bf16 on GPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ConfigError(
            "model.dtype", f"unknown dtype '{dtype}'", "use auto, fp32, bf16 or fp16"
        ) from None


def resolve_attn_implementation(name: str) -> str:
    """``auto`` → ``sdpa``: fused, exact, and available on CPU and GPU alike."""
    return "sdpa" if name in ("auto", "", None) else name


def import_external_lib(name: str | None) -> None:
    """Import a module whose side effect registers custom architectures with ``Auto*``."""
    if not name:
        return
    try:
        importlib.import_module(name)
    except ImportError as err:
        raise ConfigError(
            "model.external_lib", f"cannot import '{name}': {err}", "install it or fix the name"
        ) from err


def load_hf_config(cfg: ModelConfig, path: str | None = None) -> Any:
    """The model's ``PretrainedConfig`` with ``override_config`` applied."""
    from transformers import AutoConfig

    import_external_lib(cfg.external_lib)
    config = AutoConfig.from_pretrained(
        resolve_model_path(path or cfg.path), trust_remote_code=cfg.trust_remote_code
    )
    for key, value in cfg.override_config.items():
        if not hasattr(config, key):
            log.warning("model.override_config.%s is not a field of %s", key, type(config).__name__)
        setattr(config, key, value)
    return config


def _from_pretrained(auto_cls: Any, cfg: ModelConfig, path: str, dtype: torch.dtype) -> nn.Module:
    if not path:
        raise ConfigError("model.path", "no model given", "set model.path to a HF directory or id")
    path = resolve_model_path(path)
    return auto_cls.from_pretrained(
        path,
        config=load_hf_config(cfg, path),
        dtype=dtype,
        attn_implementation=resolve_attn_implementation(cfg.attn_implementation),
        trust_remote_code=cfg.trust_remote_code,
    )


def enable_gradient_checkpointing(model: nn.Module, *, offload: bool = False) -> None:
    """Non-reentrant checkpointing: works with frozen inputs (LoRA) and no input grads.

    ``offload`` keeps the saved activations in pinned host memory (GPU only; needs the
    ``activation_checkpointing_enable`` API of transformers >= 5).
    """
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs = {"use_reentrant": False}
    if hasattr(target, "activation_checkpointing_enable"):
        target.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs, offload=offload
        )
        return
    if offload:
        log.warning("model.enable_activation_offload needs transformers >= 5; ignored")
    target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _checkpointing(model: nn.Module, cfg: ModelConfig, device: torch.device) -> None:
    if cfg.enable_activation_offload and not cfg.enable_gradient_checkpointing:
        log.warning("model.enable_activation_offload works with enable_gradient_checkpointing")
    if cfg.enable_gradient_checkpointing:
        offload = cfg.enable_activation_offload and device.type == "cuda"
        enable_gradient_checkpointing(model, offload=offload)


def lora_config(lora: LoraConfig, *, task_type: str | None = "CAUSAL_LM") -> Any:
    """The ``peft.LoraConfig`` for our ``LoraConfig`` section."""
    import peft

    return peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        target_modules=lora.target_modules,
        lora_dropout=lora.dropout,
        bias="none",
        task_type=task_type,
    )


def apply_lora(model: nn.Module, lora: LoraConfig, *, task_type: str | None = "CAUSAL_LM"):
    """Wrap ``model`` with peft LoRA adapters; only the adapters stay trainable."""
    import peft

    return peft.get_peft_model(model, lora_config(lora, task_type=task_type))


def load_causal_lm(
    cfg: ModelConfig,
    *,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    path: str | None = None,
    trainable: bool = True,
) -> nn.Module:
    """A causal LM from ``cfg.path`` (or ``path``), with LoRA and checkpointing if asked.

    ``dtype`` is the *storage* dtype: trained models keep fp32 master weights (AdamW
    updates of ~1e-6 vanish in bf16) and run bf16 under autocast; frozen ones can be
    stored directly in the compute dtype.
    """
    from transformers import AutoModelForCausalLM

    model = _from_pretrained(AutoModelForCausalLM, cfg, path or cfg.path, dtype)
    if cfg.lora.rank > 0:
        model = apply_lora(model, cfg.lora)
    if trainable:
        _checkpointing(model, cfg, device)
    if not trainable:
        model.requires_grad_(False)
    return model.to(device)


class ValueModel(nn.Module):
    """Causal-LM backbone + scalar head: ``values = head(hidden_states).squeeze(-1)``."""

    def __init__(self, backbone: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = head

    @property
    def config(self) -> Any:
        return self.backbone.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        keep_last: int | None = None,
    ) -> torch.Tensor:
        """Values ``(B, L)``, or of the last ``keep_last`` positions only (cheaper head)."""
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        hidden = out.last_hidden_state
        if keep_last is not None:
            hidden = hidden[:, -keep_last:]
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()

    def save_pretrained(
        self, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Backbone as a HF directory (adapters only, with LoRA) + the head weights.

        ``state_dict`` (this module's keys) replaces the live weights: a sharded (FSDP2)
        model passes its gathered full state.
        """
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        if state_dict is None:
            self.backbone.save_pretrained(str(out))
            head_sd = self.value_head.state_dict()
        else:
            sub = {
                k[len("backbone.") :]: v for k, v in state_dict.items() if k.startswith("backbone.")
            }
            self.backbone.save_pretrained(str(out), state_dict=sub)
            head_sd = {
                k[len("value_head.") :]: v
                for k, v in state_dict.items()
                if k.startswith("value_head.")
            }
        head = {k: v.detach().cpu().contiguous() for k, v in head_sd.items()}
        save_file(head, str(out / VALUE_HEAD_FILE))
        (out / VALUE_MODEL_STAMP).write_text(json.dumps({"hidden_size": self.head_in_features}))

    @property
    def head_in_features(self) -> int:
        return int(self.value_head.in_features)


def is_value_model_dir(path: str | Path) -> bool:
    """True for a directory written by :meth:`ValueModel.save_pretrained`."""
    return (Path(path) / VALUE_HEAD_FILE).is_file()


def load_value_model(
    cfg: ModelConfig,
    *,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    path: str | None = None,
    trainable: bool = True,
    seed: int = 0,
) -> ValueModel:
    """A value model from a saved value-model directory, or a fresh head on a causal LM.

    A fresh head is initialised N(0, 0.02²)-ish from ``seed`` (small, so initial values
    are ≈ 0 but the backbone still receives gradients from the first step), bias 0.
    """
    from safetensors.torch import load_file
    from transformers import AutoModel

    src = resolve_model_path(path or cfg.path)
    backbone = _from_pretrained(AutoModel, cfg, src, dtype)
    hidden = int(backbone.config.hidden_size)
    head = nn.Linear(hidden, 1, dtype=dtype)
    if is_value_model_dir(src):
        head.load_state_dict(load_file(str(Path(src) / VALUE_HEAD_FILE)))
    else:
        std = float(getattr(backbone.config, "initializer_range", 0.02))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * std)
            head.bias.zero_()
    if cfg.lora.rank > 0:
        backbone = apply_lora(backbone, cfg.lora, task_type=None)
    if trainable:
        _checkpointing(backbone, cfg, device)
    model = ValueModel(backbone, head)
    if not trainable:
        model.requires_grad_(False)
    return model.to(device)


def load_tokenizer(cfg: ModelConfig, path: str | None = None) -> Any:
    """The tokenizer saved next to checkpoints (``tokenizer_path`` or the model path)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        resolve_model_path(cfg.tokenizer_path or path or cfg.path),
        trust_remote_code=cfg.trust_remote_code,
    )
