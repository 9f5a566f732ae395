"""A SandboxFusion service as the code reward's sandbox (verl ``reward_model.sandbox_fusion``).

SandboxFusion (ByteDance's code-execution service) runs a program from an HTTP request:
``POST {url}/run_code`` with ``{"code", "language", "stdin", "run_timeout",
"compile_timeout", "files", "memory_limit_MB"}`` answers ``{"status", "run_result": {"status",
"return_code", "stdout", "stderr"}, "compile_result"}``. The request goes through the
``sandbox-fusion`` client package (its retries included); the service does the
isolation, and runs every language it supports (python, cpp, java, go, nodejs, …).

``url`` is the service root (``http://host:8080``) or its ``/run_code`` endpoint, as
verl's configs write it.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping

from temper.rewards.sandbox_api import ExecResult, Limits

LANGUAGES = {"javascript": "nodejs"}  # temper's language name -> SandboxFusion's


class SandboxFusionRunner:
    """Programs run over HTTP (see the module doc)."""

    name = "sandbox_fusion"
    python = "python"

    def __init__(self, url: str, *, max_attempts: int = 3) -> None:
        self.endpoint = url.rstrip("/").removesuffix("/run_code")
        self.max_attempts = max_attempts

    def run_program(
        self, language: str, files: Mapping[str, str], main: str, stdin: bytes, limits: Limits
    ) -> ExecResult:
        from sandbox_fusion import RunCodeRequest, run_code
        from sandbox_fusion.models import CommandRunStatus

        class Request(RunCodeRequest):
            """The client's request plus the memory limit the service reads (as verl sends)."""

            memory_limit_MB: int = 1024  # the service's field name

        others = {
            name: base64.b64encode(data.encode()).decode()
            for name, data in files.items()
            if name != main
        }
        request = Request(
            code=files[main],
            language=LANGUAGES.get(language, language),
            stdin=stdin.decode("utf-8", "replace"),
            run_timeout=limits.wall_time_s,
            compile_timeout=limits.wall_time_s,
            files=others,
            memory_limit_MB=limits.memory_mb,
        )
        start = time.monotonic()
        resp = run_code(
            request,
            endpoint=self.endpoint,
            max_attempts=self.max_attempts,
            client_timeout=limits.wall_time_s + 30.0,
        )
        seconds = time.monotonic() - start
        result = resp.run_result or resp.compile_result
        if result is None:
            raise RuntimeError(f"SandboxFusion answered without a result: {resp.message}")
        stdout = (result.stdout or "").encode()
        exceeded = len(stdout) > limits.max_output_bytes
        return ExecResult(
            exit_code=result.return_code if result.return_code is not None else -9,
            stdout=stdout[: limits.max_output_bytes],
            stderr=(result.stderr or "").encode()[-65536:],
            seconds=seconds,
            timed_out=result.status == CommandRunStatus.TimeLimitExceeded,
            output_exceeded=exceeded,
        )
