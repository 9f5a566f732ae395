"""What every sandbox of the code rewards shares: the limits of one execution, how it
ended, the runner's interface and the error of a sandbox that cannot run here.

The local runners (:mod:`temper.rewards.sandbox`) and the SandboxFusion client
(:mod:`temper.rewards.sandbox_fusion`) both implement :class:`Sandbox`.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Mapping
from typing import Protocol


class SandboxUnavailable(RuntimeError):
    """The sandbox tool cannot run here (missing, or namespaces are not permitted)."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one execution may use (``reward.sandbox_limits``)."""

    wall_time_s: float = 5.0
    cpu_time_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_open_files: int = 64
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20


@dataclasses.dataclass(frozen=True)
class SandboxChoice:
    """Which sandbox runs a program, where, and within what limits: ``reward.sandbox``,
    ``reward.sandbox_url`` and ``reward.sandbox_limits`` (the code reward's, and the
    sandboxed envs' of the agentic pipeline)."""

    name: str = "bwrap"
    url: str | None = None
    limits: Limits = Limits()


@dataclasses.dataclass
class ExecResult:
    """How a program ended: ``exit_code`` (negative: killed by that signal)."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    seconds: float
    timed_out: bool = False
    output_exceeded: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_exceeded

    def describe(self) -> str:
        """One phrase for failure records: why the program did not pass."""
        if self.timed_out:
            return "time limit exceeded"
        if self.output_exceeded:
            return "output limit exceeded"
        if self.exit_code < 0:
            return f"killed by {signal.Signals(-self.exit_code).name}"
        tail = self.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"exit code {self.exit_code}" + (f": {tail[-1][:200]}" if tail else "")


class Sandbox(Protocol):
    """Runs a program with its files in a fresh working directory (its cwd)."""

    name: str

    def run_program(
        self, language: str, files: Mapping[str, str], main: str, stdin: bytes, limits: Limits
    ) -> ExecResult:
        """Run ``files[main]`` as a ``language`` program (the other files beside it)."""
        ...
