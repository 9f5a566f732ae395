"""``sokoban_sandbox``: Sokoban played inside the run's sandbox (ROLL's ``SokobanSandbox``).

ROLL's env sends each reset and step to a game server in a container that a ROCK service
starts, and parses the JSON it prints. Here the game runs in temper's own sandbox, the
one the code reward uses (``reward.sandbox``: bubblewrap by default, SandboxFusion, or
``none`` — no isolation, see the README's warning): each reset and each step is **one
run** of :mod:`temper.envs.sokoban_program`, a standard-library-only program shipped as
the run's only file. It reads the request (the action and the game state) on stdin and
prints the observation, reward, flags, info and the new state as JSON. Why one run per
call rather than a server in a long-lived sandbox: it works with any
:class:`~temper.rewards.sandbox_api.Sandbox` (a SandboxFusion service runs programs, not
servers), no process outlives a call (the sandbox's cleanup guarantee holds as for the
code reward), and the trainer holds the whole game state, so nothing is lost when a run
fails. The sandboxed interpreter sees only its standard library (no numpy), hence the
program's own numpy-exact random generator: a seed gives the same room as ``sokoban``.

A seed's room is the same every time, so a reset that ran is not run again: the envs of
a group (one seed) take the first one's reply (:data:`_RESETS`).

The trainer side holds only what the program returned (the grids, the step count) and
draws its observations from them; the rules and rewards are the program's, which
``sokoban`` (:mod:`temper.envs.sokoban`) plays by too, and the legend and the constructor
with its parameters are ``sokoban``'s. A run that fails — time or output limit, a crash,
a reply that is not the JSON asked for, a sandbox that cannot start — ends the episode:
the step (or the first step after a failed reset) returns an error observation, reward
0, ``terminated``, and ``info["env_error"]`` with the reason, which the env manager
counts and logs. Each run gets ``reward.sandbox_limits``.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from temper.rewards.sandbox import get_sandbox, sandbox_problem
from temper.rewards.sandbox_api import SandboxChoice, SandboxUnavailable

from . import sokoban_program
from .registry import register_env
from .sokoban import SokobanEnv

__all__ = ["PROGRAM", "SokobanSandboxEnv"]

#: the program each run executes (its source, shipped as the run's file)
PROGRAM = Path(sokoban_program.__file__).read_text(encoding="utf-8")
_MAIN = "sokoban_game.py"
#: replies of resets that ran, by request: a seed's room is the same every time, so the
#: envs of a group (one seed) and a seed played again run the sandbox once (the oldest
#: replies go past :data:`RESETS_KEPT`)
_RESETS: OrderedDict[tuple[str, str, str], dict[str, Any]] = OrderedDict()
RESETS_KEPT = 4096


class BadRun(RuntimeError):
    """A sandboxed run that did not return the reply asked for."""


@register_env("sokoban_sandbox")
class SokobanSandboxEnv(SokobanEnv):
    """Sokoban whose every reset and step runs in the sandbox (module docstring)."""

    uses_sandbox: ClassVar[bool] = True

    # The constructor is ``SokobanEnv``'s (its parameters are this env's); what the
    # sandbox adds starts as these class defaults, each replaced per instance when set.
    choice: SandboxChoice = SandboxChoice()  # where each run goes (use_sandbox)
    program: str = PROGRAM  # what each run executes
    game: dict[str, Any] | None = None  # the state the last run returned
    error: str = ""  # why the last run failed ('' when it did not)
    errors: int = 0  # failed runs of this env

    def use_sandbox(self, choice: SandboxChoice) -> None:
        self.choice = choice

    def problem(self) -> str | None:
        return sandbox_problem(self.choice.name)

    def _config(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "cols": self.cols,
            "num_boxes": self.num_boxes,
            "max_steps": self.max_steps,
            "search_depth": self.search_depth,
            "symbols": self.symbols,
        }

    def _run(self, request: dict[str, Any]) -> dict[str, Any]:
        """One sandboxed run of the program: its checked reply (``BadRun`` otherwise)."""
        try:
            box = get_sandbox(self.choice.name, self.choice.url)
            res = box.run_program(
                "python",
                {_MAIN: self.program},
                _MAIN,
                json.dumps({**request, "config": self._config()}).encode(),
                self.choice.limits,
            )
        except (SandboxUnavailable, OSError, ValueError) as err:
            raise BadRun(f"the sandbox could not run the game: {err}") from err
        if not res.ok:
            raise BadRun(res.describe())
        try:
            reply = json.loads(res.stdout)
        except ValueError as err:
            raise BadRun(f"the reply is not JSON ({err})") from err
        self._adopt(reply, request["op"])
        return dict(reply)

    def _adopt(self, reply: Any, op: str) -> None:
        """Take the reply's state as the env's, after checking its shape."""
        keys: dict[str, type | tuple[type, ...]] = {"observation": str, "info": dict, "state": dict}
        if op == "step":
            keys.update(reward=(int, float), terminated=bool, truncated=bool)
        if not isinstance(reply, dict) or any(
            not isinstance(reply.get(k), t) for k, t in keys.items()
        ):
            raise BadRun(f"the reply lacks {', '.join(keys)} of the right types")
        state = reply["state"]
        try:
            fixed = np.array(state["fixed"], dtype=np.int8)
            cells = np.array(state["cells"], dtype=np.int8)
            steps = int(state["steps"])
        except (KeyError, TypeError, ValueError) as err:
            raise BadRun(f"the reply's state is malformed ({err})") from err
        shape = (self.rows, self.cols)
        if fixed.shape != shape or cells.shape != shape or cells.min() < 0 or cells.max() > 6:
            raise BadRun(f"the reply's grids are not {shape[0]}x{shape[1]} grids of cells 0..6")
        self.fixed, self.state, self.steps = fixed, cells, steps
        self.game = {"fixed": fixed.tolist(), "cells": cells.tolist(), "steps": steps}

    def _failed(self, why: str) -> str:
        self.error, self.errors = why, self.errors + 1
        return f"Error: the Sokoban game in the sandbox failed ({why}); the episode ends."

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.game, self.error = None, ""
        self.fixed = np.zeros((self.rows, self.cols), dtype=np.int8)  # nothing to show yet
        self.state = self.fixed.copy()
        request = {"op": "reset", "seed": int(seed)}
        key = (json.dumps([request, self._config()]), self.choice.name, self.program)
        reply = _RESETS.get(key)
        if reply is not None:  # this room was dealt before: the same reply
            self._adopt(reply, "reset")
        else:
            try:
                reply = self._run(request)
            except BadRun as err:
                return self._failed(str(err)), {"seed": int(seed), "env_error": self.error}
            _RESETS[key] = reply
            while len(_RESETS) > RESETS_KEPT:
                _RESETS.popitem(last=False)
        return reply["observation"], {**reply["info"], "seed": int(seed)}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.game is None:  # the reset failed: its failure ends the episode here
            why = self.error or "the game was not reset"
            info = {"action_is_valid": True, "success": False, "env_error": why}
            return f"Error: {why}; the episode ends.", 0.0, True, False, info
        try:
            reply = self._run({"op": "step", "action": str(action_text), "state": self.game})
        except BadRun as err:
            self.game = None
            obs = self._failed(str(err))
            info = {"action_is_valid": True, "success": False, "env_error": self.error}
            return obs, 0.0, True, False, info
        return (
            reply["observation"],
            float(reply["reward"]),
            reply["terminated"],
            reply["truncated"],
            dict(reply["info"]),
        )
