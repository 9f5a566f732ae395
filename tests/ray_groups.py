"""A reward model's Ray ``reward`` worker group, started on its own (no run around it),
for the tests that compare its scores with one process's (CPU and GPU). Importable from
any test as ``ray_groups`` (this folder is on the test path; see tests/conftest.py)."""

from __future__ import annotations

import torch

from temper.config.schema import MegatronConfig, RewardModelConfig, TemperConfig


def score_on_a_ray_group(
    path: str,
    strategy: str,
    megatron: MegatronConfig,
    seqs: list[list[int]],
    device: str = "cpu",
    ranks: int = 2,
) -> tuple[torch.Tensor, int]:
    """``seqs`` scored by a ``reward`` group of ``ranks`` Ray ranks (one bundle each: a
    CPU process slot, or a GPU) of ``strategy`` over the reward model at ``path``, in
    fp32; and the group's data-parallel size. Ray is started if it is not running."""
    from temper.cluster.ray import RayWorkerGroup, init_ray, require_ray
    from temper.cluster.reward import RemoteRewardModel
    from temper.cluster.roles import placement_group

    cfg = TemperConfig()
    cfg.model.path, cfg.model.dtype = path, "fp32"
    cfg.experiment.device = device
    cfg.resources.backend, cfg.resources.devices_per_node = "ray", ranks
    cfg.resources.ray.num_cpus = 2 * ranks
    cfg.reward.model = RewardModelConfig(
        enable=True, path=path, strategy=strategy, micro_batch_size_per_device=2, megatron=megatron
    )
    init_ray(cfg)
    ray = require_ray()
    pg = placement_group(ray, cfg, tuple(range(ranks)), None, device == "cuda", ["reward"])
    slots = [(pg, r, 1.0) for r in range(ranks)]
    group = RayWorkerGroup("reward", cfg, slots=slots, device=device)
    try:
        scorer = RemoteRewardModel.over(group, cfg.reward.model)
        return scorer.score_sequences(seqs), group.data_size
    finally:
        group.shutdown()
        ray.util.remove_placement_group(pg)
