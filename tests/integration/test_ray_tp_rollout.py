"""Tensor-parallel vLLM rollout on the Ray backend: two ``actor_infer`` ranks run one
engine (vLLM's external launcher, gloo on CPU), each holding half of every sharded
weight; the trainer's weights reach both halves after every update."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from test_ray_backend import ray_config_dict  # same folder: pytest puts it on sys.path

from temper.pipelines.catalog import build_config
from temper.rollout.vllm_process import SHM_PREFIX

pytest.importorskip("vllm")
ray = pytest.importorskip("ray")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.vllm]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama with head size 32 (vLLM's CPU attention has no kernel for 16)."""
    from temper.utils.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tp-rollout"), hidden_size=128, seed=3)


@pytest.mark.parametrize("devices", [2, 4], ids=["one-engine", "two-engines"])
def test_grpo_with_two_rank_tensor_parallel_vllm_engines(tmp_path, model_dir, monkeypatch, devices):
    """One engine over 2 ranks; two engines over 4 (side by side on one node: their
    shared-memory segments must not collide), each generating its half of the prompts."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from transformers import AutoModelForCausalLM

    from temper.cluster.placement import placement_rows
    from temper.pipelines import run_pipeline as train
    from temper.pipelines.catalog import plan

    over = {
        "data": {"train_batch_size": 4},
        "rollout": {
            "engine": "vllm",
            "tensor_parallel_size": 2,
            # no kv_cache_memory_bytes: each engine's CPU KV cache is sized for its share
            # of a call (EngineDemand.per_engine) and this context
            "max_model_len": 256,
        },
        "actor": {"mini_batch_size": 8},
        "resources": {
            "devices_per_node": devices,
            "ray": {"num_cpus": 2 * devices, "rpc_timeout": 300},
        },
    }
    cfg = build_config(ray_config_dict(tmp_path, model_dir, **over))
    rollout_row = next(r for r in placement_rows(cfg, plan(cfg)) if r[0] == "rollout")
    assert rollout_row[3:6] == (str(devices), str(devices // 2), "vllm TP=2")  # ranks, engines
    before = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    try:
        train(cfg)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    rows = [r for r in map(json.loads, lines) if "train/reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    # the sharded engine samples from the trainer's distribution, after each update too
    assert all(r["rollout/logprob_diff"] < 1e-3 for r in rows), rows
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "actor").state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)
    # the engine's shared-memory segments leave no names behind (Ray kills its workers)
    assert not list(Path("/dev/shm").glob(f"{SHM_PREFIX}*"))
