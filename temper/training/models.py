"""Loading the models an engine trains: a causal LM (optionally with LoRA) or a value model,
and finding their parts (decoder layers, vision tower). The Hugging Face directories
of trained models are written by :mod:`temper.training.hf_export`.

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
from typing import Any, cast

import torch
from torch import nn

from temper.config.errors import ConfigError
from temper.config.schema import DTYPES, LoraConfig, ModelConfig, Precision, TrainEngineConfig
from temper.training import segment_attention
from temper.training.attention_kind import attention_limit, declares
from temper.training.freezing import freeze_prefixes, frozen
from temper.utils.hf_auto import causal_lm_class, text_hidden_size
from temper.utils.model_path import resolve_model_path

log = logging.getLogger(__name__)

VALUE_HEAD_FILE = "value_head.safetensors"
VALUE_MODEL_STAMP = "temper_value_model.json"


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` → cuda when available, else cpu."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Compute dtype: ``auto`` is fp32 on CPU (always works there) and bf16 on GPU."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ConfigError(
            "model.dtype", f"unknown dtype '{dtype}'", f"use auto or one of {', '.join(DTYPES)}"
        )
    return getattr(torch, DTYPES[dtype])


def master_dtype(name: Precision) -> torch.dtype:
    """The storage dtype of trained weights (``<role>.master_dtype``)."""
    return cast(torch.dtype, getattr(torch, DTYPES[name]))


def trained_compute_dtype(master: torch.dtype, compute: torch.dtype) -> torch.dtype:
    """The dtype a trained model computes in: ``compute`` (``model.dtype``), except that
    fp32 compute over half-precision master weights is ``master``. Such a weight only
    holds ``master``'s values, and each engine runs a forward in one dtype (autocast
    only ever lowers precision), so the whole forward then runs in ``master``."""
    if compute == torch.float32 and master != torch.float32:
        return master
    return compute


def role_compute_dtype(
    model_dtype: str, master: Precision | None, device: torch.device
) -> torch.dtype:
    """The dtype a role computes in: ``model.dtype`` resolved for ``device``, and for a
    trained role (``master``: its ``master_dtype``) :func:`trained_compute_dtype`."""
    compute = resolve_dtype(model_dtype, device)
    return compute if master is None else trained_compute_dtype(master_dtype(master), compute)


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


def _from_pretrained(
    auto_cls: Any | None, cfg: ModelConfig, path: str, dtype: torch.dtype, device: torch.device
) -> nn.Module:
    """Load ``path`` with ``auto_cls`` (None: the causal-LM class its config needs) for an
    engine computing on ``device``."""
    if not path:
        raise ConfigError("model.path", "no model given", "set model.path to a HF directory or id")
    path = resolve_model_path(path)
    config = load_hf_config(cfg, path)
    if auto_cls is None:
        auto_cls = causal_lm_class(config)
    attn = resolve_attn_implementation(cfg.attn_implementation)
    if attn == "sdpa" and not declares(config.to_dict(), "_supports_sdpa", (auto_cls,)):
        if cfg.attn_implementation != "auto":
            raise ConfigError(
                "model.attn_implementation",
                f"{config.model_type} does not run transformers' SDPA attention",
                "set model.attn_implementation: eager (or auto, which picks it here)",
            )
        attn = "eager"  # e.g. gpt-oss, whose sinks SDPA cannot add
    text_only = getattr(config, "vision_config", None) is None  # VL rows are never packed
    # the segment kernel needs plain attention, a sliding window aside (else packed rows
    # stay padded), reached through transformers' attention interface with the keywords
    plain = attention_limit(config.to_dict(), windows=True) is None
    plain = plain and declares(config.to_dict(), "_supports_attention_backend", (auto_cls,))
    if attn == "sdpa" and cfg.use_remove_padding and text_only and plain and device.type == "cpu":
        # packed rows run segment by segment; every unpacked forward is sdpa's own
        # (training.segment_attention). On CUDA a packed row keeps the dense mask: there
        # the segment kernel has not beaten padding yet (benchmarks/packing.py --device
        # cuda), and flash-attn's varlen kernel is the GPU's packed path.
        segment_attention.register()
        attn = segment_attention.SEGMENT_KERNEL
    model = auto_cls.from_pretrained(
        path,
        config=config,
        dtype=dtype,
        attn_implementation=attn,
        trust_remote_code=cfg.trust_remote_code,
    )
    if attn == segment_attention.SEGMENT_KERNEL:
        reaches = segment_attention.hands_keywords_to_attention(model)
        if reaches is False:
            log.warning(
                "%s's layers do not hand their forward keywords to attention: its packed "
                "rows use the dense mask (sdpa) instead of the segment kernel",
                config.model_type,
            )
        if not reaches:
            # no probe (ZeRO-3 partitions the parameters at load): the dense mask is right
            # for every model
            model.set_attn_implementation("sdpa")
    return model


def enable_gradient_checkpointing(model: nn.Module, *, offload: bool = False) -> None:
    """Non-reentrant checkpointing: works with frozen inputs (LoRA) and no input grads.

    ``offload`` keeps the saved activations in pinned host memory (GPU only; needs the
    ``activation_checkpointing_enable`` API of transformers >= 5).
    """
    hf: Any = model  # a transformers (or peft) model, duck-typed
    target = hf.get_base_model() if hasattr(hf, "get_base_model") else hf
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
        exclude_modules=lora.exclude_modules,
        lora_dropout=lora.dropout,
        bias="none",
        task_type=task_type,
    )


def apply_lora(model: nn.Module, lora: LoraConfig, *, task_type: str | None = "CAUSAL_LM"):
    """Wrap ``model`` with peft LoRA adapters; only the adapters stay trainable.

    A causal LM with ``lora.adapter_path`` gets the saved adapter (trainable), whose
    settings the config loader already made ``lora``'s (:mod:`temper.config.lora_adapter`);
    a value model's backbone (no LM head, other module names) gets fresh adapters."""
    import peft

    if lora.adapter_path and task_type == "CAUSAL_LM":
        return peft.PeftModel.from_pretrained(
            model, str(Path(lora.adapter_path).expanduser()), is_trainable=True
        )
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

    ``dtype`` is the *storage* dtype: trained models keep their role's ``master_dtype``
    (fp32 by default: AdamW updates of ~1e-6 vanish in bf16) and run bf16 under
    autocast; frozen ones are stored directly in the compute dtype.
    """
    model = _from_pretrained(None, cfg, path or cfg.path, dtype, device)
    if cfg.lora.rank > 0:
        model = apply_lora(model, cfg.lora)
    if trainable:
        _checkpointing(model, cfg, device)
    if not trainable:
        model.requires_grad_(False)
    return model.to(device)


class ValueModel(nn.Module):
    """Causal-LM backbone + scalar head: ``values = head(hidden_states).squeeze(-1)``.

    ``score_head``: the model is a reward model in training (a bias-free head, as the
    ``score`` layer of ``transformers``' ``*ForSequenceClassification``), saved in that
    class's layout (:meth:`save_pretrained`)."""

    def __init__(self, backbone: nn.Module, head: nn.Linear, *, score_head: bool = False) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = head
        self.score_head = score_head

    @property
    def config(self) -> Any:
        return self.backbone.config

    def get_input_embeddings(self) -> nn.Module:
        backbone: Any = self.backbone  # a transformers model
        return backbone.get_input_embeddings()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None,
        keep_last: int | None = None,
        keep_index: torch.Tensor | None = None,
        **inputs: Any,
    ) -> torch.Tensor:
        """Values ``(B, L)``, or of the last ``keep_last`` positions only (cheaper head), or
        of the positions ``keep_index`` (a packed row's response positions).

        ``inputs`` go to the backbone as they are (a vision-language model's pixel
        inputs and token types)."""
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **inputs,
        )
        hidden = out.last_hidden_state
        if keep_last is not None:
            hidden = hidden[:, -keep_last:]
        if keep_index is not None:
            hidden = hidden[:, keep_index]
        values = self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)
        # a copy, not a view: FSDP2 hooks its backward on the output, and warns that an
        # in-place edit of a view output would skip that hook
        return values.to(torch.float32, copy=True)

    def save_pretrained(
        self, path: str | Path, state_dict: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Backbone as a HF directory (adapters only, with LoRA) + the head weights; with
        ``score_head``, one ``AutoModelForSequenceClassification`` directory
        (:func:`save_sequence_classification`).

        ``state_dict`` (this module's keys) replaces the live weights: a sharded (FSDP2)
        model passes its gathered full state.
        """
        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        backbone: Any = self.backbone  # a transformers AutoModel
        if self.score_head:
            full = state_dict if state_dict is not None else self.state_dict()
            save_sequence_classification(backbone.config, full, out)
            return
        if state_dict is None:
            backbone.save_pretrained(str(out))
            head_sd = self.value_head.state_dict()
        else:
            sub = {
                k[len("backbone.") :]: v for k, v in state_dict.items() if k.startswith("backbone.")
            }
            backbone.save_pretrained(str(out), state_dict=sub)
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


def save_sequence_classification(config: Any, state: dict[str, torch.Tensor], out: Path) -> None:
    """A :class:`ValueModel`'s weights (``state``: its ``backbone.*`` and ``value_head.*``)
    as the ``transformers`` directory of ``AutoModelForSequenceClassification`` with
    ``num_labels=1``: the backbone under the class's ``base_model_prefix``, the head as
    its ``score.weight``, ``config.json`` naming the class. Its logit at a sequence's last
    token is this model's value there. The names are checked against the class itself
    (built on the meta device): an architecture whose classifier is laid out otherwise
    fails here rather than loading with a fresh head."""
    import copy

    from safetensors.torch import save_file
    from transformers import AutoModelForSequenceClassification

    mapping: Any = AutoModelForSequenceClassification._model_mapping
    if type(config) not in mapping:
        raise ValueError(
            f"{type(config).__name__} has no sequence-classification class in transformers: "
            "a reward model of this architecture cannot be saved as one"
        )
    cls = mapping[type(config)]
    cfg = copy.deepcopy(config)
    cfg.architectures = [cls.__name__]
    cfg.num_labels = 1
    prefix = cls.base_model_prefix
    weights = {
        f"{prefix}.{k[len('backbone.') :]}": v
        for k, v in state.items()
        if k.startswith("backbone.")
    }
    weights["score.weight"] = state["value_head.weight"]
    with torch.device("meta"):
        expected = set(cls(cfg).state_dict())
    if set(weights) != expected:
        missing, extra = sorted(expected - set(weights)), sorted(set(weights) - expected)
        raise ValueError(
            f"the reward model's weights do not match {cls.__name__}: missing {missing[:5]}, "
            f"unexpected {extra[:5]}"
        )
    cfg.save_pretrained(str(out))
    tensors = {k: v.detach().cpu().contiguous() for k, v in weights.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def saved_score_head(path: str | Path) -> torch.Tensor | None:
    """The ``score.weight`` (1, hidden) of a sequence-classification directory with one
    label (a reward model :func:`save_sequence_classification` wrote), or None."""
    from safetensors import safe_open

    src = Path(path)
    config = src / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    archs = data.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        return None
    for file in sorted(src.glob("*.safetensors")):
        with safe_open(str(file), "pt") as weights:
            if "score.weight" in weights.keys():  # noqa: SIM118 (a safetensors handle)
                tensor: torch.Tensor = weights.get_tensor("score.weight")
                return tensor if tensor.shape[0] == 1 else None
    return None


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
    score_head: bool = False,
) -> ValueModel:
    """A value model from a saved value-model directory, or a fresh head on a causal LM.

    A fresh head is initialised N(0, 0.02²)-ish from ``seed`` (small, so initial values
    are ≈ 0 but the backbone still receives gradients from the first step), bias 0.
    ``score_head``: a reward model's head, without bias (the sequence-classification
    layout; a pair loss sees only score differences, which a bias would not change),
    the saved one when ``path`` is a reward model (:func:`saved_score_head`).
    """
    from safetensors.torch import load_file
    from transformers import AutoModel

    src = resolve_model_path(path or cfg.path)
    backbone: Any = _from_pretrained(AutoModel, cfg, src, dtype, device)  # transformers AutoModel
    hidden = text_hidden_size(backbone.config)
    head = nn.Linear(hidden, 1, bias=not score_head, dtype=dtype)
    saved_score = saved_score_head(src) if score_head else None
    if is_value_model_dir(src) and not score_head:
        head.load_state_dict(load_file(str(Path(src) / VALUE_HEAD_FILE)))
    elif saved_score is not None:  # a reward model trained on: its head goes on too
        with torch.no_grad():
            head.weight.copy_(saved_score.reshape(head.weight.shape))
    else:
        std = float(getattr(backbone.config, "initializer_range", 0.02))
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * std)
            if head.bias is not None:
                head.bias.zero_()
    if cfg.lora.rank > 0:
        backbone = apply_lora(backbone, cfg.lora, task_type=None)
    if trainable:
        _checkpointing(backbone, cfg, device)
    model = ValueModel(backbone, head, score_head=score_head)
    if not trainable:
        model.requires_grad_(False)
    return model.to(device)


_PEFT_PREFIX = "base_model.model."


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: HF ``_no_split_modules`` classes, else the longest ModuleList.

    The units a sharded engine handles one at a time: FSDP2 shards each, DeepSpeed
    ZeRO-3 gathers each for export."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    lists: list[nn.ModuleList] = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        return []
    longest: nn.ModuleList = max(lists, key=len)
    return list(longest)


def vision_tower_prefixes(model: nn.Module) -> list[str]:
    """Parameter-name prefixes of a vision-language model's vision tower (with merger).

    The tower is the outermost submodule built from the model's ``vision_config``
    (Qwen2-VL: ``model.visual``); a text model has none.
    """
    from temper.training.weights import is_peft_model

    base: nn.Module = cast(Any, model).get_base_model() if is_peft_model(model) else model
    vision_cfg = getattr(getattr(base, "config", None), "vision_config", None)
    if vision_cfg is None:
        return []
    found: list[str] = []
    for name, module in base.named_modules():
        cfg = getattr(module, "config", None)
        if (
            name
            and type(cfg) is type(vision_cfg)
            and not any(name.startswith(f + ".") for f in found)
        ):
            found.append(name)
    return found


def freeze_modules(model: nn.Module, train: TrainEngineConfig, role: str) -> nn.Module:
    """Freeze the vision tower (``freeze_vision_tower``) and every parameter whose name
    starts with one of ``freeze_module_prefix`` (:mod:`temper.training.freezing`). Names
    are the Hugging Face model's own (under LoRA, without peft's ``base_model.model.``),
    e.g. ``model.visual``; a critic's are its backbone's, under ``backbone.``."""
    towers = vision_tower_prefixes(model)
    prefixes = freeze_prefixes(train, role, towers)
    if not prefixes:
        return model
    params = list(model.named_parameters())
    names = [n.removeprefix(_PEFT_PREFIX) for n, _ in params]
    for i in frozen(prefixes, names, towers, role):
        params[i][1].requires_grad_(False)
    return model
