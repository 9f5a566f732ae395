"""Time of one trainer → vLLM weight sync on the local backend, per 100M parameters.

    python benchmarks/weight_sync.py [--model smollm2:135m-instruct] [--repeats 5]
                                     [--bucket-mb 256]

The "trainer" is the model a ``torch`` training engine holds (fp32 on CPU); one sync is
what ``Run.sync_weights`` does: ``VLLMRolloutEngine.load_weights(hf_named_weights(model))``
(begin → buckets → finish, prefix cache dropped). The baseline, in the same run and on the
same tensors, is vLLM's own in-place reload, ``collective_rpc("reload_weights",
weights_iterator=...)`` with every tensor in one call (vLLM on CPU repacks each linear
weight for oneDNN after loading, so a bare ``model.load_weights`` into the live model is
not a valid update there; ``reload_weights`` is vLLM's cheapest correct one). Each is
warmed up once, then timed ``--repeats`` times; medians are printed, with seconds per
100M parameters (the unique parameters of the model: a tied embedding counts once) and
the ratio temper/vLLM. Also checks the synced engine's greedy log-probs equal those after
vLLM's reload (a sync that loses a tensor shows there).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch

from temper.config.schema import ModelConfig, RolloutConfig
from temper.data.batch import Batch
from temper.rollout.base import SamplingParams


def timed(fn, repeats: int) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn`` after one warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m-instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=None, help="default: the engine's")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from temper.rollout.vllm_engine import VLLMRolloutEngine
    from temper.training.weights import hf_named_weights
    from temper.utils.model_path import resolve_model_path

    path = resolve_model_path(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    params = sum(p.numel() for p in model.parameters())  # unique: tied weights once
    engine = VLLMRolloutEngine.from_config(
        RolloutConfig(
            engine="vllm",
            max_model_len=256,
            engine_kwargs={"vllm": {"kv_cache_memory_bytes": 256 << 20}},
        ),
        ModelConfig(path=path, dtype="fp32"),
        seed=0,
    )
    if args.bucket_mb is not None:
        engine.bucket_bytes = args.bucket_mb << 20
    tok = engine.tokenizer
    enc = tok(
        ["The capital of France is", "7 + 2 ="],
        padding=True,
        padding_side="left",
        return_tensors="pt",
    )
    batch = Batch.from_dict({"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]})
    greedy = SamplingParams(n=1, max_new_tokens=8, do_sample=False)

    def temper_sync() -> None:
        engine.load_weights(hf_named_weights(model))

    def vllm_reload() -> None:
        weights = list(hf_named_weights(model))
        engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        engine.llm.reset_prefix_cache()

    print(
        f"model={args.model} params={params / 1e6:.1f}M dtype=fp32 "
        f"threads={torch.get_num_threads()} bucket={engine.bucket_bytes >> 20}MiB "
        f"repeats={args.repeats}"
    )
    base = timed(vllm_reload, args.repeats)
    ref = engine.generate(batch, greedy)["rollout_log_probs"]
    ours = timed(temper_sync, args.repeats)
    got = engine.generate(batch, greedy)["rollout_log_probs"]
    stats = engine.last_sync
    per = 1e8 / params
    t, b = statistics.median(ours), statistics.median(base)
    print(
        f"temper sync   median {t:.3f}s  ({t * per:.3f}s per 100M params)  "
        f"runs {' '.join(f'{s:.3f}' for s in ours)}  "
        f"[{stats.tensors} tensors, {stats.bytes / 2**20:.0f} MiB, {stats.buckets} buckets]"
    )
    print(
        f"vllm reload   median {b:.3f}s  ({b * per:.3f}s per 100M params)  "
        f"runs {' '.join(f'{s:.3f}' for s in base)}"
    )
    print(f"ratio temper/vllm: {t / b:.2f}   log-probs equal after sync: {torch.equal(got, ref)}")
    engine.close()


if __name__ == "__main__":
    main()
