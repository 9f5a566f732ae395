"""The reward workers' shield: signals to the trainer fail with EPERM, others go."""

from __future__ import annotations

import os
import platform
import subprocess

import pytest

from temper.rewards.shield import ARCHES, install, program

pytestmark = pytest.mark.skipif(platform.machine() not in ARCHES, reason="no program here")


def _in_child(check) -> None:
    """Run ``check`` in a forked child (a filter cannot be removed); its failure fails."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            check()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_trainer_its_group_and_everyone_are_refused_others_are_not():
    trainer, group = os.getpid(), os.getpgid(0)
    bystander = subprocess.Popen(["sleep", "30"])

    def check() -> None:
        assert install(trainer, group) is None
        for target in (trainer, -group, -1):  # signal 0: nothing is delivered anyway
            with pytest.raises(PermissionError):
                os.kill(target, 0)
        os.kill(bystander.pid, 0)  # another process: allowed
        os.kill(os.getpid(), 0)
        os.kill(0, 0)  # its own (new) group
        # inherited by what it starts, which cannot reach the trainer either
        probe = subprocess.run(["kill", "-0", str(trainer)], capture_output=True)
        assert probe.returncode != 0

    try:
        _in_child(check)
    finally:
        bystander.kill()
        bystander.wait()


def test_the_program_jumps_land_inside_it():
    arch, numbers = ARCHES["x86_64"]
    code = program(arch, numbers, (1, 2, 3))
    assert len(code) % 8 == 0 and len(code) // 8 == 7 + len(numbers) + 3
