"""`temper check`'s placement table (ranks, nodes, bundles and colocation per role,
the rollout engines of ``actor_infer`` included) and the placement checks."""

from __future__ import annotations

import pytest

from temper.cluster.placement import device_pools, format_table, placement_rows, rank_slots
from temper.cluster.rollout import prompt_slices
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.config.validate import validate
from temper.pipelines.catalog import CATALOG, build_config


def ray_cfg() -> TemperConfig:
    cfg = TemperConfig()
    cfg.model.path = "unused"
    cfg.experiment.device = "cuda"
    cfg.resources.backend = "ray"
    cfg.resources.nnodes, cfg.resources.devices_per_node = 2, 4
    cfg.actor.strategy = "fsdp2"
    cfg.actor.use_kl_loss = True
    cfg.reference.strategy = "fsdp2"
    cfg.rollout.engine = "vllm"
    return cfg


def test_separate_roles_get_their_own_devices_and_nodes() -> None:
    cfg = ray_cfg()
    cfg.resources.actor_train = [0, 1, 2, 3]
    cfg.resources.actor_infer = [4, 5]
    cfg.resources.reference = [6, 7]
    rows = {r[0]: r for r in placement_rows(cfg, validate(cfg, CATALOG))[1:]}
    # role: devices, nodes, ranks, dp, engine, bundle/rank, colocated with
    assert rows["actor"][1:] == ("0..3", "0", "4", "4", "fsdp2", "GPU 1, CPU 1", "-")
    assert rows["rollout"][1:] == ("4,5", "1", "2", "2", "vllm", "GPU 1, CPU 1", "-")
    assert rows["reference"][1:] == ("6,7", "1", "2", "2", "fsdp2", "GPU 1, CPU 1", "-")
    lines = format_table(placement_rows(cfg, validate(cfg, CATALOG)))
    assert lines[0].split()[:3] == ["role", "devices", "nodes"]


def test_hybrid_engine_colocates_actor_rollout_and_reference() -> None:
    cfg = ray_cfg()  # nothing placed: every role on all 8 devices (verl's hybrid engine)
    rows = {r[0]: r for r in placement_rows(cfg, validate(cfg, CATALOG))[1:]}
    assert rows["actor"][1:5] == ("0..7", "0,1", "8", "8")
    assert rows["actor"][6] == "GPU 0.333333, CPU 0.333333"
    assert rows["actor"][7] == "rollout,reference"
    assert rows["rollout"][7] == "actor,reference"


def test_local_placement_is_one_process() -> None:
    cfg = TemperConfig()
    cfg.model.path = "unused"
    rows = placement_rows(cfg, validate(cfg, CATALOG))
    assert rows[1][0] == "actor" and rows[1][3] == "1" and "in process" in rows[1][5]
    assert rows[2][0] == "rollout" and "in process" in rows[2][5]


def base(**resources) -> dict:
    return {
        "model": {"path": "unused"},
        "data": {"train_files": ["task:arithmetic?n=8"], "train_batch_size": 4},
        "rollout": {"n": 2},
        "actor": {"strategy": "fsdp2", "mini_batch_size": 8},
        "resources": {"backend": "ray", "devices_per_node": 4, **resources},
    }


def test_partly_overlapping_roles_share_one_pool_of_bundles() -> None:
    """ROLL's upstream RLVR layout: actor_infer on 0..11 of actor_train's 0..15, the
    reference with the actor, and a critic alone on 16..17."""
    ids = {
        "actor": list(range(16)),
        "rollout": list(range(12)),
        "reference": list(range(16)),
        "critic": [16, 17],
    }
    assert device_pools(ids) == [tuple(range(16)), (16, 17)]
    slots = rank_slots(ids)
    assert slots["actor"][0] == (0, 0, 1 / 3)  # device 0: actor, rollout, reference
    assert slots["actor"][15] == (0, 15, 1 / 2)  # device 15: actor, reference
    assert slots["rollout"][11] == (0, 11, 1 / 3)
    assert slots["critic"] == [(1, 0, 1.0), (1, 1, 1.0)]
    # no bundle is over-subscribed
    used: dict[tuple[int, int], float] = {}
    for ranks in slots.values():
        for p, b, share in ranks:
            used[(p, b)] = used.get((p, b), 0.0) + share
    assert all(abs(v - 1.0) < 1e-9 for v in used.values())
    build_config(base(actor_train=[0, 1], actor_infer=[1, 2, 3]))  # partial overlap: fine


def test_tensor_parallel_rollout_engines_are_refused_on_ray() -> None:
    with pytest.raises(ConfigError, match="resources.devices_per_infer_worker: 2 devices"):
        build_config(base(actor_train=[0, 1], actor_infer=[2, 3], devices_per_infer_worker=2))


@pytest.mark.parametrize(
    ("prompts", "world", "expected"),
    [(5, 2, [(0, 3), (3, 5)]), (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]), (1, 3, [(0, 1)])],
)
def test_prompt_slices_are_contiguous_and_balanced(prompts, world, expected) -> None:
    assert prompt_slices(prompts, world) == expected


def test_weights_travel_through_the_store_format_unchanged() -> None:
    """to_store/from_store (numpy for Ray's zero-copy path) keep every value and dtype,
    bf16 included (numpy has none: it travels as its int16 bits)."""
    import torch

    from temper.cluster.rollout import from_store, to_store

    weights = {
        "a": torch.randn(3, 4),
        "b": torch.randn(5, dtype=torch.float64).to(torch.bfloat16),
        "c": torch.randn(2, 2).half(),
        "d": torch.randn(4, requires_grad=True),
    }
    back = dict(from_store(to_store(weights.items())))
    assert list(back) == list(weights)
    for name, tensor in weights.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor.detach())


def test_tied_weights_are_stored_once_and_come_back_under_both_names() -> None:
    """A tensor that is the same memory as an earlier one (a tied lm_head) is stored as
    an alias (no second array in the object store) and read back as the same values."""
    import torch

    from temper.cluster.rollout import ALIAS, from_store, to_store

    embed = torch.randn(6, 4)
    weights = [
        ("embed.weight", embed),
        ("norm.weight", torch.ones(4)),
        ("lm_head.weight", embed),  # tied: the same tensor
        ("row.weight", embed[1]),  # a view of other memory (offset): its own entry
    ]
    stored = to_store(weights)
    assert stored["lm_head.weight"] == ("embed.weight", ALIAS)
    assert stored["row.weight"][1] == "float32"
    back = list(from_store(stored))
    assert [n for n, _ in back] == [n for n, _ in weights]
    for (_, got), (_, want) in zip(back, weights, strict=True):
        assert torch.equal(got, want)


def test_a_teachers_devices_are_placed_by_the_references_key() -> None:
    from temper.cluster.placement import placement_key, teacher_role

    assert placement_key(teacher_role("default")) == "reference"
    assert placement_key("actor") == "actor_train" and placement_key("judge") == "reward"


def test_teachers_over_nodes_this_machine_lacks_are_one_config_error() -> None:
    """A teacher's group (``teacher:<name>``) has no key of its own: the refusal names the
    furthest-placed role's key without a KeyError for it."""
    from temper.config.schema import TeacherConfig
    from temper.pipelines.cluster_fit import check_placement

    cfg = ray_cfg()
    cfg.resources.actor_train = [0, 1, 2, 3]
    cfg.resources.actor_infer = [0, 1, 2, 3]
    cfg.resources.reference = [4, 5, 6, 7]
    cfg.distill.teachers = {"big": TeacherConfig(model_path="unused")}
    with pytest.raises(ConfigError) as err:
        check_placement(cfg, validate(cfg, CATALOG), [])
    assert err.value.key == "resources.reference" and "teacher:big 4..7" in err.value.reason
