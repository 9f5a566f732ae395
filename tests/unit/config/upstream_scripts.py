"""The command lines of verl's example scripts, read without running them.

A verl run is a shell script that ends in ``python3 -m verl.trainer.main_ppo
[--config-path D --config-name N] key=value …``. :func:`script_commands` turns a script
into the trainer commands it would run: a small POSIX-shell lexer (quotes, ``\\``
continuations, comments, ``;``/``&&``/``|`` separators) with the expansions those
scripts use — ``$VAR``, ``${VAR}``, ``${VAR:-default}`` (and ``:=``, ``-``), ``$((…))``
arithmetic, ``$(pwd)`` — evaluated over the script's own assignments, in order. Other
command substitutions (``$(date …)``, ``$(nvidia-smi …)``) are not run: they expand to a
placeholder, which is fine for the names and paths they feed. Bash arrays
(``ARGS=( … )``, ``ARGS+=( … )``) expand where ``"${ARGS[@]}"`` (or ``${ARGS[i]}``)
names them, one word per element, as bash does. Control flow is not
followed: assignments are applied in the order they appear, which is what these
scripts' top-level parameter blocks need. Nothing is ever executed.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

#: Entry points of a verl trainer run, and what they are.
ENTRY_POINTS = {
    "verl.trainer.main_ppo": "ppo",
    "recipe.dapo.main_dapo": "dapo",
    "recipe.prime.main_prime": "prime",
    "recipe.spin.main_spin": "spin",
    "recipe.sppo.main_sppo": "sppo",
    "verl.trainer.main_generation": "generation",
    "verl.trainer.main_generation_server": "generation",  # verl 0.9: on ppo_trainer.yaml
    "verl.trainer.main_ppo_v0": "ppo",  # verl 0.9: the legacy trainer
    "verl.trainer.main_eval": "eval",
    "recipe.r1.main_eval": "eval",
    "verl.trainer.fsdp_sft_trainer": "sft",
    "verl.trainer.sft_trainer": "sft",
    "main_ppo_split.py": "ppo",  # examples/split_placement: main_ppo with split placement
    # verl 0.9's one-step-off recipe: its own trainer, with the rollout on a pool of its own
    "verl.experimental.one_step_off_policy.main_ppo": "ppo",
    # verl 0.9's fully-async trainer: a rollouter streaming to the trainer, its own pool
    "verl.experimental.fully_async_policy.fully_async_main": "ppo",
}
#: The temper command of an entry point's kind (the others: ``train``).
COMMANDS = {"generation": "generate", "eval": "eval"}
#: Each entry point's default config (``--config-name``), relative to the snapshot root.
DEFAULT_CONFIG = {
    "verl.trainer.main_ppo": "verl/trainer/config/ppo_trainer.yaml",
    "recipe.dapo.main_dapo": "recipe/dapo/config/dapo_trainer.yaml",
    "recipe.prime.main_prime": "recipe/prime/config/prime_trainer.yaml",
    "recipe.spin.main_spin": "recipe/spin/config/spin_trainer.yaml",
    "recipe.sppo.main_sppo": "recipe/sppo/config/sppo_trainer.yaml",
    "verl.trainer.main_generation": "verl/trainer/config/generation.yaml",
    "verl.trainer.main_generation_server": "verl/trainer/config/ppo_trainer.yaml",
    "verl.trainer.main_ppo_v0": "verl/trainer/config/ppo_trainer.yaml",
    "verl.trainer.main_eval": "verl/trainer/config/evaluation.yaml",
    "recipe.r1.main_eval": "recipe/r1/config/evaluation.yaml",
    "verl.trainer.fsdp_sft_trainer": "verl/trainer/config/sft_trainer.yaml",
    "verl.trainer.sft_trainer": "verl/trainer/config/sft_trainer_engine.yaml",
    "main_ppo_split.py": "examples/split_placement/config/ppo_trainer_split.yaml",
    "verl.experimental.one_step_off_policy.main_ppo": (
        "verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml"
    ),
    "verl.experimental.fully_async_policy.fully_async_main": (
        "verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml"
    ),
}
#: Where an entry point's ``@hydra.main(config_path=...)`` points, for relative
#: ``--config-path`` values (Hydra resolves them against the module's directory).
MODULE_DIR = {
    "verl.trainer.main_ppo": "verl/trainer",
    "recipe.dapo.main_dapo": "recipe/dapo",
    "recipe.prime.main_prime": "recipe/prime",
    "recipe.spin.main_spin": "recipe/spin",
    "recipe.sppo.main_sppo": "recipe/sppo",
    "verl.trainer.main_generation": "verl/trainer",
    "verl.trainer.main_generation_server": "verl/trainer",
    "verl.trainer.main_ppo_v0": "verl/trainer",
    "verl.trainer.main_eval": "verl/trainer",
    "recipe.r1.main_eval": "recipe/r1",
    "verl.trainer.fsdp_sft_trainer": "verl/trainer",
    "verl.trainer.sft_trainer": "verl/trainer",
    "main_ppo_split.py": "examples/split_placement",
    "verl.experimental.one_step_off_policy.main_ppo": "verl/experimental/one_step_off_policy",
    "verl.experimental.fully_async_policy.fully_async_main": (
        "verl/experimental/fully_async_policy"
    ),
}
#: The environment the scripts see (``$HOME``); the working directory is the snapshot
#: root, as verl's scripts ask ("run from the root of the project").
HOME = "/home/user"
#: Variables a few scripts take from their launcher (SLURM) without a default.
LAUNCHER_ENV = {
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_NNODES": "2",
    "SLURM_GPUS_PER_NODE": "8",
    "ARNOLD_WORKER_NUM": "2",  # ByteDance's launcher
    "ARNOLD_WORKER_GPU": "8",
}
UNKNOWN = "cmdsubst"  # what a command substitution we do not run expands to


@dataclasses.dataclass(frozen=True)
class Command:
    """One trainer command of a script: its entry point, config file and overrides."""

    script: str  # path relative to the snapshot directory
    index: int  # 0 for the first trainer command of the script, 1 for the next, …
    entry: str  # key of ENTRY_POINTS
    config: Path  # the composed config file (--config-path/--config-name, or the default)
    overrides: tuple[str, ...]

    @property
    def kind(self) -> str:
        return ENTRY_POINTS[self.entry]

    @property
    def command(self) -> str:
        """The temper command that runs it (a generation server's ``ppo_trainer.yaml`` is
        read by ``temper generate``)."""
        return COMMANDS.get(self.kind, "train")

    @property
    def name(self) -> str:
        return self.script if self.index == 0 else f"{self.script}#{self.index + 1}"


# --------------------------------------------------------------------------- lexer


class _Lexer:
    """Splits shell text into commands (lists of words), expanding as it goes."""

    def __init__(self, text: str, env: dict[str, str], arrays: dict | None = None) -> None:
        self.s = text
        self.i = 0
        self.env = env
        self.arrays: dict[str, list[str]] = {} if arrays is None else arrays

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def commands(self) -> list[list[str]]:
        out: list[list[str]] = []
        words: list[str] = []
        while self.i < len(self.s):
            c = self.peek()
            if c == "\\" and self.peek(1) == "\n":
                self.i += 2
            elif c in " \t":
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            elif c == "(" and words and _ARRAY.match(words[-1]) and self.s[self.i - 1] == "=":
                self.i += 1
                name, plus = _ARRAY.match(words.pop()).groups()  # type: ignore[union-attr]
                elements = self._array()
                self.arrays[name] = (self.arrays.get(name, []) if plus else []) + elements
            elif c in "\n;&|()":
                self.i += 1
                if words:
                    out.append(self._finish(words))
                    words = []
            else:
                words.extend(self.word())
        if words:
            out.append(self._finish(words))
        return out

    def _array(self) -> list[str]:
        """The elements of ``NAME=( … )`` up to its ``)`` (the ``(`` is consumed)."""
        elements: list[str] = []
        while self.i < len(self.s):
            c = self.peek()
            if c == ")":
                self.i += 1
                break
            if c == "\\" and self.peek(1) == "\n":
                self.i += 2
            elif c in " \t\n":
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.peek() != "\n":
                    self.i += 1
            else:
                elements.extend(w for w in self.word() if w != _EMPTY)
        return elements

    def _finish(self, words: list[str]) -> list[str]:
        # An assignment-only command (``A=1 B=2``) takes effect now, for later commands.
        if words and words[0] == "export":
            words = words[1:]
        if words and all(_ASSIGN.match(w) for w in words):
            for w in words:
                name, _, value = w.partition("=")
                self.env[name] = value
        return words

    def word(self) -> list[str]:
        """The next word; an unquoted expansion is split on whitespace (more words)."""
        buf: list[str] = []
        quoted = False
        assignment = False  # NAME= written literally: no field splitting (bash)
        while self.i < len(self.s):
            c = self.peek()
            if c in " \t\n;&|()" or (c == "<" or c == ">"):
                if c in "<>":  # a redirection (``2>&1``, ``> log``): skip it and its target
                    if "".join(buf).isdigit():
                        buf = []
                    self.i += 1
                    while self.peek() in "<>&":
                        self.i += 1
                    while self.peek() in " \t":
                        self.i += 1
                    self.word()
                    continue
                break
            if c == "\\":
                if self.peek(1) == "\n":
                    self.i += 2
                    continue
                buf.append(self.peek(1))
                self.i += 2
            elif c == "'":
                quoted = True
                end = self.s.index("'", self.i + 1)
                buf.append(self.s[self.i + 1 : end])
                self.i = end + 1
            elif c == '"':
                quoted = True
                self.i += 1
                buf.append(self._double_quoted())
            elif c == "$":
                assignment = assignment or bool(_ASSIGN.match("".join(buf)))
                buf.append(_SPLIT.join(self._dollar().split()))
            else:
                buf.append(c)
                self.i += 1
        text = "".join(buf)
        if _ELEMENT in text:  # "${ARR[@]}": one word per element, quoted or not
            words = [w for w in text.split(_ELEMENT) if w]
            return [w for w in words if w != _EMPTY]
        if not quoted and not text.strip(_SPLIT):
            return []
        if quoted or assignment:  # no field splitting in quotes or assignments
            return [text.replace(_SPLIT, " ")]
        return [w for w in text.split(_SPLIT) if w]

    def _double_quoted(self) -> str:
        buf: list[str] = []
        while self.i < len(self.s) and self.peek() != '"':
            c = self.peek()
            if c == "\\" and self.peek(1) in '"\\$`\n':
                if self.peek(1) != "\n":
                    buf.append(self.peek(1))
                self.i += 2
            elif c == "$":
                buf.append(self._dollar())
            else:
                buf.append(c)
                self.i += 1
        self.i += 1  # closing quote
        return "".join(buf)

    def _balanced(self, open_: str, close: str) -> str:
        """Text up to the matching ``close`` (the opener is already consumed)."""
        depth, start = 1, self.i
        while self.i < len(self.s):
            c = self.peek()
            if c == open_:
                depth += 1
            elif c == close:
                depth -= 1
                if depth == 0:
                    text = self.s[start : self.i]
                    self.i += 1
                    return text
            self.i += 1
        return self.s[start:]

    def _dollar(self) -> str:
        self.i += 1
        c = self.peek()
        if c == "(" and self.peek(1) == "(":
            self.i += 2
            expr = self._balanced("(", ")")
            if self.peek() == ")":
                self.i += 1
            return _arith(expr, self)
        if c == "(":
            self.i += 1
            inner = self._balanced("(", ")").strip()
            if inner == "pwd":
                return self.env.get("PWD", "")
            return UNKNOWN
        if c == "{":
            self.i += 1
            return self._braced(self._balanced("{", "}"))
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!]", self.s[self.i :])
        if not m:
            return "$"
        self.i += m.end()
        name = m.group()
        if name == "@":
            return _EMPTY_ARRAY  # "$@": the script's own arguments, none here: no word
        if name == "*":
            return ""
        return self.env.get(name, "")

    def _braced(self, body: str) -> str:
        a = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[(@|\*|[0-9]+)\]", body)
        if a:
            elements = self.arrays.get(a.group(1))
            if elements is None:  # a plain variable indexed: bash gives its value at [0]
                plain = self.env.get(a.group(1), "")
                return plain if a.group(2) in "@*0" else ""
            if a.group(2) in "@*":
                return _ELEMENT + _ELEMENT.join(elements) + _ELEMENT if elements else _EMPTY_ARRAY
            k = int(a.group(2))
            return elements[k] if k < len(elements) else ""
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(:?[-=+?])?(.*)$", body, re.S)
        if not m:
            return ""
        name, op, rest = m.group(1), m.group(2), m.group(3)
        value = self.env.get(name)
        if op is None:
            return value or ""
        default = _Lexer(rest, self.env, self.arrays).expand_word()
        empty = value is None or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return default if empty else value  # type: ignore[return-value]
        if op.endswith("="):
            if empty:
                self.env[name] = default
                return default
            return value  # type: ignore[return-value]
        if op.endswith("+"):
            return "" if empty else default
        return value or ""

    def expand_word(self) -> str:
        """The whole text as one word (for ``${X:-word}`` defaults)."""
        buf: list[str] = []
        while self.i < len(self.s):
            c = self.peek()
            if c == '"':
                self.i += 1
                buf.append(self._double_quoted())
            elif c == "'":
                end = self.s.index("'", self.i + 1)
                buf.append(self.s[self.i + 1 : end])
                self.i = end + 1
            elif c == "$":
                buf.append(self._dollar())
            else:
                buf.append(c)
                self.i += 1
        return "".join(buf)


_SPLIT = "\x00"  # marks where an unquoted expansion splits into words
_ELEMENT = "\x01"  # marks the bounds of an array's elements in an expansion
_EMPTY = "\x02"  # an empty array's expansion: no word at all
_EMPTY_ARRAY = _ELEMENT + _EMPTY + _ELEMENT
_ARRAY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\+?)=$")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _arith(expr: str, lexer: _Lexer) -> str:
    """``$((…))``: integer arithmetic over the script's variables (C semantics)."""

    def var(m: re.Match[str]) -> str:
        value = lexer.env.get(m.group(1), "0") or "0"
        return value if re.fullmatch(r"-?[0-9]+", value) else "0"

    text = re.sub(r"\$?\{?([A-Za-z_][A-Za-z0-9_]*)\}?", var, expr)
    if not re.fullmatch(r"[0-9+\-*/%() \t]*", text):
        return UNKNOWN
    try:
        return str(int(eval(text.replace("/", "//"), {"__builtins__": {}}, {})))
    except (SyntaxError, ZeroDivisionError):
        return UNKNOWN


# --------------------------------------------------------------------------- commands


def script_commands(
    script: Path, root: Path, text: str | None = None, env: dict[str, str] | None = None
) -> list[Command]:
    """The trainer commands of ``script`` (a file under snapshot ``root``), in order;
    ``text`` replaces the file's text (a SkyPilot task's ``run:`` block), ``env`` adds
    variables its launcher sets."""
    scope = {"HOME": HOME, "PWD": str(root), **LAUNCHER_ENV, **(env or {})}
    rel = str(script.relative_to(root))
    out: list[Command] = []
    body = script.read_text(encoding="utf-8") if text is None else text
    for words in _Lexer(body, scope).commands():
        entry, rest = _entry(words)
        if entry is None:
            continue
        config_path: str | None = None
        config_name: str | None = None
        overrides: list[str] = []
        it = iter(rest)
        for word in it:
            flag, eq, value = word.partition("=")
            if flag in ("--config-path", "--config_path", "-cp"):
                config_path = value if eq else next(it, "")
            elif flag in ("--config-name", "--config_name", "-cn"):
                config_name = value if eq else next(it, "")
            elif word.startswith("-"):
                continue  # other launcher flags (python -u, …)
            elif word:
                overrides.append(word)
        out.append(
            Command(
                rel,
                len(out),
                entry,
                _config_file(root, entry, config_path, config_name),
                tuple(overrides),
            )
        )
    return out


def _entry(words: list[str]) -> tuple[str | None, list[str]]:
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words) and words[i + 1] in ENTRY_POINTS:
            return words[i + 1], words[i + 2 :]
        if Path(word).name in ENTRY_POINTS and i > 0 and "python" in words[i - 1]:
            return Path(word).name, words[i + 1 :]
    return None, []


def _config_file(root: Path, entry: str, path: str | None, name: str | None) -> Path:
    default = root / DEFAULT_CONFIG[entry]
    folder = default.parent
    if path:
        folder = Path(path) if Path(path).is_absolute() else root / MODULE_DIR[entry] / path
    stem = (name or default.stem).removesuffix(".yaml")
    return folder / f"{stem}.yaml"


def snapshot_scripts(root: Path) -> list[Path]:
    """Every shell script of a verl snapshot (examples and recipes)."""
    return sorted(root.rglob("*.sh"))
