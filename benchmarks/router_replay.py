"""Log-prob mismatch on a tiny MoE model with and without router replay.

Two mismatches that routing flips cause (``temper.training.router_replay``):

* **R2 (policy drift)**: the actor records old log-probs and routing, takes one
  optimizer step, then scores the same tokens again, as the update's second mini-batch
  does. ``|Δ|`` = ``|log π_update − log π_old|``, with the update forward routing by its own
  top-k (off) or by the recorded experts (R2);
* **rollout numerics (R3)**: the ``hf`` rollout engine generates in bf16 and returns the
  routing of its tokens; the fp32 trainer's old-log-prob forward scores them routing by
  its own top-k (off) or by the rollout's experts (``actor.router_replay: R3``), against
  the rollout's own log-probs.

Printed per case: max and mean ``|Δ|`` over response tokens, and the share of tokens
(any MoE layer) whose expert set differs between the two forwards without replay.

    python benchmarks/router_replay.py                  # Qwen3-MoE, 8 experts top-2, 4 layers
    python benchmarks/router_replay.py --lr 1e-6 --batch 32
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.router_replay import ROUTED_EXPERTS
from temper.training.spec import EngineSpec


def tiny_moe(out: str, experts: int, layers: int) -> str:
    """A random Qwen3-MoE (top-2 of ``experts``, ``layers`` MoE layers), router weights
    scaled like ``temper.utils.tiny.make_tiny_moe_model``'s and expert weights scaled up
    (std 0.3), so that which experts a token takes moves its output as in a trained MoE
    model (at the default init the experts' outputs are small beside the residual)."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from temper.utils.tiny import build_tokenizer

    tok = build_tokenizer(out)
    config = Qwen3MoeConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=experts,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.normal_(0.0, 0.5)
            elif ".experts." in name:
                p.normal_(0.0, 0.3)
    model.save_pretrained(out)
    return out


def batch_of(n: int, prompt: int, response: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    return Batch.from_dict(
        {
            "prompt_ids": torch.randint(0, 256, (n, prompt), generator=g),
            "prompt_mask": torch.ones(n, prompt, dtype=torch.long),
            "response_ids": torch.randint(0, 256, (n, response), generator=g),
            "response_mask": torch.ones(n, response, dtype=torch.long),
            "advantages": torch.randn(n, 1, generator=g).expand(n, response).contiguous(),
        }
    )


def actor(path: str, lr: float, replay: str = "R2") -> Actor:
    cfg = ActorConfig(
        strategy="torch",
        micro_batch_size_per_device=8,
        optim=OptimConfig(lr=lr, weight_decay=0.0),
        router_replay=replay,
    )
    spec = EngineSpec(
        model=ModelConfig(path=path, dtype="fp32"),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=8),
        router_replay=replay != "none",
    )
    return Actor(cfg, build_engine("torch", spec))


def stats(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> str:
    d = (a - b).abs()[mask > 0]
    if d.numel() == 0:
        return "-"
    return f"max |Δ| {d.max():.3e}  mean |Δ| {d.mean():.3e}"


def flipped(a: torch.Tensor, b: torch.Tensor, batch: Batch) -> torch.Tensor:
    """``(B, R)``: response tokens whose scoring position's expert set differs in any
    layer (a flip at an earlier position moves later tokens too, through attention)."""
    P = batch["prompt_ids"].shape[1]
    sets = a.long().sort(dim=-1).values != b.long().sort(dim=-1).values
    return sets.flatten(2).any(dim=-1)[:, P - 1 : -1]


def report(
    title: str,
    free: torch.Tensor,
    replay: torch.Tensor,
    ref: torch.Tensor,
    flips: torch.Tensor,
    mask: torch.Tensor,
    name: str,
) -> None:
    print(f"{title}: {flips.float().mean():.2%} of response tokens route differently")
    print(f"  all tokens      off    {stats(free, ref, mask)}")
    print(f"  all tokens      {name:6} {stats(replay, ref, mask)}")
    print(f"  flipped tokens  off    {stats(free, ref, mask * flips)}")
    print(f"  flipped tokens  {name:6} {stats(replay, ref, mask * flips)}")


def drift(path: str, batch: Batch, lr: float) -> None:
    act = actor(path, lr)
    eng: Any = act.engine
    old = act.compute_log_probs(batch)  # R2: records the routing
    act.update(old)  # one optimizer step (one mini-batch)
    free = eng.forward(batch, routing="record")
    replay = eng.forward(old, routing="replay")["log_probs"]
    flips = flipped(free[ROUTED_EXPERTS], old[ROUTED_EXPERTS], batch)
    title = f"R2: update forward vs old log-probs after one step (lr {lr:g})"
    ref = old["old_log_probs"]
    report(title, free["log_probs"], replay, ref, flips, batch["response_mask"], "R2")


def numerics(path: str, batch: Batch) -> None:
    rollout = HFRolloutEngine.from_pretrained(path, dtype="bf16")
    prompts = Batch.from_dict({k: batch[k] for k in ("prompt_ids", "prompt_mask")})
    length = batch["response_ids"].shape[1]
    params = SamplingParams(max_new_tokens=length, ignore_eos=True, routed_experts=True)
    torch.manual_seed(0)
    out = rollout.generate(prompts, params)
    free = actor(path, 0.0, "none").compute_log_probs(out)["old_log_probs"]
    replay = actor(path, 0.0, "R3").compute_log_probs(out)["old_log_probs"]
    own = actor(path, 0.0).engine.forward(out, routing="record")[ROUTED_EXPERTS]
    flips = flipped(own, out[ROUTED_EXPERTS], out)
    title = "R3: fp32 trainer vs the bf16 hf rollout's log-probs"
    ref = out["rollout_log_probs"]
    report(title, free, replay, ref, flips, out["response_mask"], "R3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--response", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_moe(tmp, args.experts, args.layers)
        batch = batch_of(args.batch, args.prompt, args.response, args.seed)
        drift(path, batch, args.lr)
        numerics(path, batch)


if __name__ == "__main__":
    main()
