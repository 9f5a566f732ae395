"""The one-rank world of an engine on the local backend comes with its launcher
variables (DeepSpeed's ``zero.Init`` reads ``LOCAL_RANK``), whichever library made the
group. Each case runs in a fresh process: a process group outlives the test that made
it, and a user's shell has none of these variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys

VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

FRESH = """
import json, os, torch, torch.distributed as dist
from temper.training.local_world import ensure_local_world
made = ensure_local_world(torch.device("cpu"))
again = ensure_local_world(torch.device("cpu"))
print(json.dumps({"made": made, "again": again, "world": dist.get_world_size(),
                  "env": {k: os.environ.get(k) for k in %r}}))
"""

# another library's one-rank group (vLLM in process makes one) that sets no variable
FOREIGN = """
import json, os, torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
from temper.training.local_world import ensure_local_world
made = ensure_local_world(torch.device("cpu"))
print(json.dumps({"made": made, "env": {k: os.environ.get(k) for k in %r}}))
"""


def run(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    out = subprocess.run(
        [sys.executable, "-c", code % (VARIABLES,)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_world_sets_every_launcher_variable():
    got = run(FRESH)
    assert got["made"] is True and got["again"] is False and got["world"] == 1
    env = got["env"]
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")} == {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
    }
    assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0


def test_a_one_rank_group_another_library_made_gets_its_rank_variables():
    got = run(FOREIGN)
    assert got["made"] is False
    assert got["env"] == {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": None,  # where another library's group met is not ours to say
        "MASTER_PORT": None,
    }
