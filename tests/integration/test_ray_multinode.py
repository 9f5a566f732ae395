"""Two Ray nodes (Ray's own local multi-node cluster utility: two raylets on this
machine): ``resources.nnodes=2`` puts each device id's bundle on its node, the actor's
FSDP2 ranks span both nodes, and a GRPO run trains across them."""

from __future__ import annotations

import json

import pytest
from test_ray_backend import ray_config  # same folder: pytest puts it on sys.path

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.ray]


@pytest.fixture
def two_nodes():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # another module's local Ray: this test needs its own
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_roles_are_placed_on_the_nodes_of_their_device_ids(
    tmp_path, tiny_model_dir, monkeypatch, two_nodes
) -> None:
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from temper.cluster.roles import build_ray_roles
    from temper.pipelines import run_pipeline as train
    from temper.pipelines.catalog import plan

    # devices 0,1 on node 0 (the driver's), 2,3 on node 1: actor ranks on 1 and 2 span both
    resources = {
        "nnodes": 2,
        "devices_per_node": 2,
        "actor_train": [1, 2],
        "actor_infer": [0],
        "ray": {"address": two_nodes.address, "rpc_timeout": 120},
    }
    cfg = ray_config(tmp_path, tiny_model_dir, resources=resources)
    head = ray.get_runtime_context().get_node_id()
    roles = build_ray_roles(cfg, plan(cfg))
    try:
        actor, rollout = roles.groups[0], roles.groups[1]
        assert (actor.role, rollout.role) == ("actor", "rollout")
        assert actor.nodes[0] == head and actor.nodes[1] != head
        assert rollout.nodes == [head]
    finally:
        roles.shutdown()
    train(cfg)  # the gloo group of the actor spans the two nodes
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["actor/grad_norm"] > 0 for r in rows)
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in rows)
