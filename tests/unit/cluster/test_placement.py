"""`temper check`'s placement table: ranks, nodes, bundles and colocation per role."""

from __future__ import annotations

from temper.cluster.placement import format_table, placement_rows
from temper.config.schema import TemperConfig


def test_ray_placement_rows_show_nodes_ranks_and_colocation() -> None:
    cfg = TemperConfig()
    cfg.model.path = "unused"
    cfg.experiment.device = "cuda"
    cfg.resources.backend = "ray"
    cfg.resources.nnodes, cfg.resources.devices_per_node = 2, 4
    cfg.actor.strategy = "fsdp2"
    cfg.actor.use_kl_loss = True
    cfg.reference.strategy = "fsdp2"
    cfg.resources.reference = [6, 7]
    rows = {r[0]: r for r in placement_rows(cfg)[1:]}
    assert rows["actor"][1:5] == ("0..7", "0,1", "8", "8")
    assert rows["actor"][6] == "GPU 1, CPU 1" and rows["actor"][7] == "-"
    assert rows["reference"][1:4] == ("6,7", "1", "2")
    lines = format_table(placement_rows(cfg))
    assert lines[0].split()[:3] == ["role", "devices", "nodes"]


def test_local_placement_is_one_process() -> None:
    cfg = TemperConfig()
    cfg.model.path = "unused"
    rows = placement_rows(cfg)
    assert rows[1][0] == "actor" and rows[1][3] == "1" and "in process" in rows[1][5]
