"""Each temper phase against the raw library call it wraps, on the same tokens.

    python benchmarks/phases.py [--model tiny|smollm2] [--length 16|128] [--prompts 8]
                                [--n 4] [--micro 8] [--reps 3] [--no-vllm]
                                [--only train|hf|vllm ...]

=============  ==========================================  ===================================
phase          temper                                      raw call (same inputs)
=============  ==========================================  ===================================
rollout/hf     ``HFRolloutEngine.generate``                transformers ``model.generate``
rollout/vllm   ``VLLMRolloutEngine.generate``              ``vllm.LLM.generate`` (same LLM)
train/padded   ``TorchEngine.train_mini_batch``            forward + backward + clip + AdamW
               (``use_remove_padding: false``)             on the same padded micro-batches
train/packed   the same, every micro-batch packed          the same on one packed row per
                                                           micro-batch, block-diagonal mask
sync/hf        ``HFRolloutEngine.load_weights`` (owned)    ``module.load_state_dict``
sync/vllm      ``VLLMRolloutEngine.load_weights``          ``LLM.collective_rpc("reload_weights",
               (buckets, layerwise reload)                 all tensors in one call)``
=============  ==========================================  ===================================

Rollout: ``--prompts`` chat prompts of different lengths, ``--n`` samples each,
temperature 1, exactly ``--length`` new tokens per sample (temper: ``ignore_eos``; raw
transformers: ``min_new_tokens``; raw vLLM: ``ignore_eos``). temper records each drawn
token's log-prob (the RL loop needs it): the raw vLLM call asks for the same
(``logprobs=0``), the raw transformers call returns none, so that overhead includes the
recording. Training: the rollout's batch shape (``prompts × n`` samples, the same prompts,
random response tokens of ``length/4 .. length`` tokens, random advantages), one optimizer
step over ``--micro``-sample micro-batches with a policy-gradient loss; both sides compute
logits only where they score a response token (transformers' ``logits_to_keep``). temper
also computes the entropy metric (detached) on every micro-batch, and its packed row
carries each group's prompt once (a prefix-tree mask; the raw packed row repeats it per
sample), so ``train/packed`` can run below its raw call: that is work removed, not
overhead. The first call of each
side is a warm-up whose losses are printed: equal losses show both saw the same tokens
and weights.

Each cell is the median of ``--reps`` timed calls, temper and raw alternating (the machine
may be shared). ``overhead`` is temper / raw - 1. The last column is the training's
fraction of this CPU's matmul peak: FLOPs ≈ 6 × (body parameters × real tokens + LM-head
parameters × scored tokens) — attention's own FLOPs left out — over the time, over the
best ``torch.mm`` GFLOP/s at the model's shapes (tokens × hidden × intermediate, hidden,
vocab; fp32, this process's threads).
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch
from chat_prompts import chat_prompt_batch  # benchmarks/chat_prompts.py, beside this script

from temper.config.schema import ActorConfig, ModelConfig, OptimConfig, RolloutConfig
from temper.data.batch import Batch
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine
from temper.training.micro_batching import MicroBatching
from temper.training.packing import LayoutCost
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

QUESTIONS = [
    "What is 27 + 82?",
    "Name a prime number larger than 10.",
    "Write a haiku about autumn leaves falling on a quiet river.",
    "What is the capital of France?",
    "Explain gravity in one sentence.",
    "List three colors.",
    "What is 12 times 7? Put the final answer after ####.",
    "Say hello in Spanish.",
]
LR = 1e-6
CLIP = 1.0
Row = tuple[str, float, float, str]  # phase, temper s, raw s, note


def model_path(name: str) -> str:
    if name == "smollm2":
        from temper.utils.smollm2 import ensure_smollm2

        return str(ensure_smollm2())
    if name == "tiny":  # head size 64: vLLM's CPU attention has a kernel for it
        from temper.utils.tiny import make_tiny_model

        return str(
            make_tiny_model(
                "/tmp/temper-bench-phases-tiny",
                hidden_size=256,
                num_layers=4,
                intermediate_size=688,
            )
        )
    return name


def median_pair(
    temper: Callable[[], Any], raw: Callable[[], Any], reps: int
) -> tuple[float, float]:
    """Median seconds of ``temper()`` and ``raw()`` over ``reps`` alternating calls."""
    times: dict[str, list[float]] = {"temper": [], "raw": []}
    for _ in range(reps):
        for name, fn in (("temper", temper), ("raw", raw)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return statistics.median(times["temper"]), statistics.median(times["raw"])


# --------------------------------------------------------------------------- inputs


def prompt_batch(tokenizer: Any, prompts: int) -> Batch:
    return chat_prompt_batch(tokenizer, prompts, QUESTIONS)


def train_batch(prompts: Batch, n: int, length: int, vocab: int, pad: int) -> Batch:
    """The rollout's batch shape: prompts × n (aabb), responses of length/4 .. length."""
    g = torch.Generator().manual_seed(0)
    rows = prompts.repeat(n, interleave=True)
    B = len(rows)
    lengths = torch.randint(max(1, length // 4), length + 1, (B,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    ids = torch.where(mask > 0, torch.randint(0, vocab, (B, length), generator=g), pad)
    adv = torch.randn(B, 1, generator=g).expand(B, length) * mask
    return Batch.from_dict(
        {
            "prompt_ids": rows["prompt_ids"],
            "prompt_mask": rows["prompt_mask"],
            "response_ids": ids,
            "response_mask": mask,
            "advantages": adv.contiguous(),
        }
    )


def micro_batches(batch: Batch, micro: int) -> list[Batch]:
    return [batch.slice(i, min(i + micro, len(batch))) for i in range(0, len(batch), micro)]


# --------------------------------------------------------------------------- train


def pg_loss(
    log_probs: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, total: float
) -> torch.Tensor:
    return -(adv * log_probs * mask).sum() / total


def temper_engine(path: str, packed: bool, micro: int) -> TorchEngine:
    spec = EngineSpec(
        model=ModelConfig(path=path, dtype="fp32", use_remove_padding=packed),
        device=torch.device("cpu"),
        train=ActorConfig(
            micro_batch_size_per_device=micro,
            grad_clip=CLIP,
            optim=OptimConfig(lr=LR, weight_decay=0.0),
        ),
        infer_micro=MicroBatching(size=micro),
    )
    engine = TorchEngine(spec)
    if packed:  # every micro-batch packed, whatever the cost model would pick
        engine._layout_cost = lambda: LayoutCost(per_token=1.0, per_pair=0.0)  # type: ignore[method-assign]
    return engine


def temper_step(engine: TorchEngine, batch: Batch) -> float:
    total = float(batch["response_mask"].sum())

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        return pg_loss(out["log_probs"], mb["advantages"], mb["response_mask"], total), {}

    return engine.train_mini_batch(batch, loss_fn)["loss"]


def raw_padded_forward(model: Any, mb: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs, advantages, mask of a padded micro-batch, trimmed to its real extent."""
    pm, rm = mb["prompt_mask"], mb["response_mask"]
    p0 = int(pm.any(dim=0).nonzero()[0])
    r = int(rm.any(dim=0).nonzero()[-1]) + 1
    ids = torch.cat([mb["prompt_ids"][:, p0:], mb["response_ids"][:, :r]], dim=1)
    attn = torch.cat([pm[:, p0:], rm[:, :r]], dim=1)
    pos = (attn.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(
        input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=r + 1, use_cache=False
    ).logits[:, :r]
    labels = mb["response_ids"][:, :r]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, labels[..., None])[..., 0]
    return logp, mb["advantages"][:, :r], rm[:, :r]


def raw_packed_forward(model: Any, mb: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The same micro-batch as one row: positions restart per sequence, a block-diagonal
    causal bool mask (sdpa), logits only at the positions that score response tokens."""
    seqs, keep, labels, advs = [], [], [], []
    start = 0
    for i in range(len(mb)):
        prompt = mb["prompt_ids"][i][mb["prompt_mask"][i] > 0]
        r = int(mb["response_mask"][i].sum())
        resp = mb["response_ids"][i, :r]
        seqs.append(torch.cat([prompt, resp]))
        keep.append(start + len(prompt) - 1 + torch.arange(r))
        labels.append(resp)
        advs.append(mb["advantages"][i, :r])
        start += len(prompt) + r
    lengths = torch.tensor([len(s) for s in seqs])
    seq_of = torch.repeat_interleave(torch.arange(len(seqs)), lengths)
    idx = torch.arange(int(lengths.sum()))
    mask = (seq_of[:, None] == seq_of[None, :]) & (idx[:, None] >= idx[None, :])
    pos = torch.cat([torch.arange(n) for n in lengths.tolist()])
    keep_t = torch.cat(keep)
    logits = model(
        input_ids=torch.cat(seqs)[None],
        attention_mask=mask[None, None],
        position_ids=pos[None],
        logits_to_keep=keep_t,
        use_cache=False,
    ).logits[0]
    label_t = torch.cat(labels)
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, label_t[:, None])[:, 0]
    return logp, torch.cat(advs), torch.ones_like(logp)


def raw_step(
    model: Any, opt: torch.optim.Optimizer, batch: Batch, micro: int, packed: bool
) -> float:
    model.train()
    opt.zero_grad(set_to_none=True)
    total_tokens = float(batch["response_mask"].sum())
    total = 0.0
    for mb in micro_batches(batch, micro):
        forward = raw_packed_forward if packed else raw_padded_forward
        logp, adv, mask = forward(model, mb)
        loss = pg_loss(logp, adv, mask, total_tokens)
        loss.backward()
        total += float(loss.detach())
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    return total


def matmul_peak(shapes: list[tuple[int, int, int]], reps: int) -> float:
    """Best GFLOP/s of fp32 ``torch.mm`` over ``shapes`` (M, K, N), median per shape."""
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)
        flops = 2.0 * m * k * n
        inner = max(1, int(2e9 // flops))  # ~2 GFLOP a timing (tens of ms)
        times = []
        for _ in range(max(reps, 3)):
            start = time.perf_counter()
            for _ in range(inner):
                torch.mm(a, b)
            times.append((time.perf_counter() - start) / inner)
        best = max(best, flops / statistics.median(times) / 1e9)
    return best


def train_flops(model: Any, batch: Batch) -> float:
    """≈ 6 × (body parameters × real tokens + head parameters × scored tokens)."""
    cfg = model.config
    head = int(cfg.vocab_size) * int(cfg.hidden_size)
    embed = model.get_input_embeddings().weight.numel()
    params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    body = params - embed - (0 if tied else head)
    tokens = float(batch["prompt_mask"].sum() + batch["response_mask"].sum())
    scored = float(batch["response_mask"].sum())
    return 6.0 * (body * tokens + head * scored)


def bench_train(path: str, batch: Batch, args: argparse.Namespace) -> tuple[list[Row], float]:
    from transformers import AutoModelForCausalLM

    rows: list[Row] = []
    raw = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="sdpa"
    )
    flops = train_flops(raw, batch)
    cfg = raw.config
    tokens = int(batch["prompt_mask"].sum() + batch["response_mask"].sum())
    per_micro = max(1, tokens * args.micro // len(batch))
    h, i, v = int(cfg.hidden_size), int(cfg.intermediate_size), int(cfg.vocab_size)
    peak = matmul_peak([(per_micro, h, i), (per_micro, i, h), (per_micro, h, h), (256, h, v)], 3)
    print(
        f"train batch: {len(batch)} samples, {tokens} real tokens "
        f"({int(batch['response_mask'].sum())} scored), micro-batches of {args.micro}; "
        f"≈{flops / 1e9:.1f} GFLOP per step; matmul peak {peak:.1f} GFLOP/s"
    )
    opt = torch.optim.AdamW(raw.parameters(), lr=LR, weight_decay=0.0)
    for packed in (False, True):
        engine = temper_engine(path, packed, args.micro)
        engine.model.load_state_dict(raw.state_dict())  # same weights (raw has stepped)
        a = temper_step(engine, batch)  # warm-up: the losses of the same weights and tokens
        b = raw_step(raw, opt, batch, args.micro, packed)
        layout = "packed" if packed else "padded"
        assert not packed or engine.layouts["packed"] > 0, engine.layouts
        print(f"train/{layout} warm-up loss: temper {a:.6f}, raw {b:.6f}")
        t, r = median_pair(
            functools.partial(temper_step, engine, batch),
            functools.partial(raw_step, raw, opt, batch, args.micro, packed),
            args.reps,
        )
        frac = f"peak {flops / t / 1e9 / peak:.0%} (raw {flops / r / 1e9 / peak:.0%})"
        rows.append((f"train/{layout}", t, r, frac))
        del engine  # free it before the next one loads
        gc.collect()
    return rows, peak


# --------------------------------------------------------------------------- rollout


def bench_hf(path: str, prompts: Batch, args: argparse.Namespace) -> list[Row]:
    engine = HFRolloutEngine.from_pretrained(path, dtype="fp32", device="cpu")
    module = engine.module
    params = SamplingParams(
        n=args.n, max_new_tokens=args.length, temperature=1.0, ignore_eos=True, logprobs=True
    )
    expected = len(prompts) * args.n * args.length

    def temper() -> None:
        out = engine.generate(prompts, params)
        assert int(out["response_mask"].sum()) == expected

    def raw() -> None:
        with torch.no_grad():
            out = module.generate(
                input_ids=prompts["prompt_ids"],
                attention_mask=prompts["prompt_mask"],
                max_new_tokens=args.length,
                min_new_tokens=args.length,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                num_return_sequences=args.n,
                pad_token_id=engine.pad_token_id,
            )
        assert out.shape[0] * (out.shape[1] - prompts["prompt_ids"].shape[1]) == expected

    temper()
    raw()
    t, r = median_pair(temper, raw, args.reps)
    rows: list[Row] = [("rollout/hf", t, r, f"{expected / t:.0f} tok/s (raw {expected / r:.0f})")]

    source = {k: v.clone() for k, v in module.state_dict().items()}
    engine.load_weights(source.items())
    t, r = median_pair(
        lambda: engine.load_weights(source.items()),
        lambda: module.load_state_dict(source),
        args.reps,
    )
    mib = sum(v.numel() * v.element_size() for v in source.values()) / 2**20
    rows.append(("sync/hf", t, r, f"{len(source)} tensors, {mib:.0f} MiB"))
    return rows


def bench_vllm(path: str, prompts: Batch, args: argparse.Namespace) -> list[Row]:
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.inputs import TokensPrompt

    from temper.rollout.vllm_engine import VLLMRolloutEngine

    longest = int(prompts["prompt_ids"].shape[1])
    engine = VLLMRolloutEngine.from_config(
        RolloutConfig(engine="vllm", max_model_len=longest + args.length),
        ModelConfig(path=path, dtype="fp32"),
        seed=0,
    )
    params = SamplingParams(
        n=args.n, max_new_tokens=args.length, temperature=1.0, ignore_eos=True, logprobs=True
    )
    ids, mask = prompts["prompt_ids"], prompts["prompt_mask"].bool()
    token_prompts = [
        TokensPrompt(prompt_token_ids=ids[i][mask[i]].tolist()) for i in range(len(ids))
    ]
    raw_params = VLLMSamplingParams(
        n=args.n, max_tokens=args.length, temperature=1.0, ignore_eos=True, logprobs=0
    )
    expected = len(prompts) * args.n * args.length

    def temper() -> None:
        out = engine.generate(prompts, params)
        assert int(out["response_mask"].sum()) == expected

    def raw() -> None:
        outs = engine.llm.generate(token_prompts, raw_params, use_tqdm=False)
        assert sum(len(c.token_ids) for o in outs for c in o.outputs) == expected

    try:
        temper()
        raw()
        t, r = median_pair(temper, raw, args.reps)
        rows: list[Row] = [
            ("rollout/vllm", t, r, f"{expected / t:.0f} tok/s (raw {expected / r:.0f})")
        ]
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        source = dict(hf.state_dict())

        def bare() -> None:
            engine.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": list(source.items())}
            )

        engine.load_weights(source.items())
        bare()
        t, r = median_pair(lambda: engine.load_weights(source.items()), bare, args.reps)
        mib = sum(v.numel() * v.element_size() for v in source.values()) / 2**20
        rows.append(
            (
                "sync/vllm",
                t,
                r,
                f"{len(source)} tensors, {mib:.0f} MiB, {engine.last_sync.buckets} buckets",
            )
        )
        return rows
    finally:
        engine.close()


# --------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="tiny (random 4-layer Llama), smollm2, or a dir")
    p.add_argument("--length", type=int, default=16, help="new tokens per sample (16 or 128)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4, help="samples per prompt")
    p.add_argument("--micro", type=int, default=8, help="samples per training micro-batch")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM rows")
    p.add_argument(
        "--only",
        action="append",
        choices=("train", "hf", "vllm"),
        help="run only these rows (repeatable): train/*, rollout/hf + sync/hf, the vLLM rows",
    )
    args = p.parse_args()
    groups = set(args.only or ("train", "hf", "vllm")) - ({"vllm"} if args.no_vllm else set())
    path = model_path(args.model)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    prompts = prompt_batch(tok, args.prompts)
    vocab = len(tok)
    pad = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    print(
        f"model {args.model} fp32, {torch.get_num_threads()} torch threads; {args.prompts} "
        f"prompts ({int(prompts['prompt_mask'].sum(1).min())}-{prompts['prompt_ids'].shape[1]} "
        f"tokens) × n={args.n}, {args.length} new tokens; median of {args.reps}; "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at start"
    )
    rows: list[Row] = []
    if "train" in groups:
        rows += bench_train(path, train_batch(prompts, args.n, args.length, vocab, pad), args)[0]
    if "hf" in groups:
        rows += bench_hf(path, prompts, args)
    if "vllm" in groups:
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("vllm not importable: rollout/vllm and sync/vllm skipped")
        else:
            from temper.config.errors import ConfigError

            try:
                rows += bench_vllm(path, prompts, args)
            except ConfigError as exc:  # e.g. a head size vLLM's CPU build has no kernel for
                print(f"vllm skipped: {exc}")
    order = ["rollout/hf", "rollout/vllm", "train/padded", "train/packed", "sync/hf", "sync/vllm"]
    rows.sort(key=lambda row: order.index(row[0]))
    print(
        f"\nload average {os.getloadavg()[0]:.1f} at the end (a shared machine inflates either side)"
    )
    print(f"\n{'phase':14} {'temper ms':>10} {'raw ms':>10} {'overhead':>9}  note")
    for name, t, r, note in rows:
        print(f"{name:14} {t * 1e3:10.1f} {r * 1e3:10.1f} {t / r - 1:+9.1%}  {note}")


if __name__ == "__main__":
    main()
