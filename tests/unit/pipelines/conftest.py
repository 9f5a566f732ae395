"""Three hand-built agentic trajectories as a training batch (the `episodes` fixture)."""

from __future__ import annotations

import pytest

from temper.data.batch import Batch
from temper.pipelines.trajectories import trajectory_batch
from temper.rollout.multiturn import Trajectory

PAD = 0


def traj(uid, tag, prompt, turns, rewards, success=False, invalid=0):
    """A trajectory whose model turns have the given lengths, 2 observation tokens between."""
    t = Trajectory({"uid": uid, "tag": tag}, [], list(prompt))
    for k, (n, r) in enumerate(zip(turns, rewards)):
        if k:
            t.append([7, 7], 0)
        t.append(list(range(10, 10 + n)), 1, [-0.5] * n)
        t.turn_ends.append(len(t.response_ids) - 1)
        t.turn_rewards.append(r)
        last = k == len(turns) - 1
        t.infos.append({"success": success and last, "format_ok": k >= invalid})
    t.stop_reason = "done"
    return t


@pytest.fixture
def episodes() -> Batch:
    """g0 (tag A): a 2-turn success (return 1) and a 1-turn failure with an invalid first
    answer; g1 (tag B): 3 turns with rewards 0.5, 0.5, -1."""
    return trajectory_batch(
        [
            traj("g0", "A", [1, 2, 3], [2, 3], [0.0, 1.0], success=True),
            traj("g0", "A", [1, 2, 3], [1], [0.0], invalid=1),
            traj("g1", "B", [4, 5], [2, 2, 1], [0.5, 0.5, -1.0]),
        ],
        PAD,
    )
