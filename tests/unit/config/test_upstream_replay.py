"""Every upstream verl and ROLL config, and every verl example command line, through
``temper check`` (config and engines): each row passes, or is refused in one line naming
a feature (``upstream_expected.EXPECTED``). When a branch lands a feature, its rows flip
to ``passes`` and the table is updated with them; a row whose outcome changes otherwise
fails here.

The rows are checked in one test (about 400 of them; composing, overriding and
translating each is ~0.1-0.2 s), which reports every row that differs at once.
"""

from __future__ import annotations

import pytest
from reference_paths import SHARED_UPSTREAM, UPSTREAM  # next to this file
from upstream_expected import EXPECTED
from upstream_replay import classify, fragments, replayed, rows
from upstream_scripts import _Lexer, script_commands


def test_every_upstream_file_is_a_row_or_a_fragment():
    names = {r.name.split("#")[0] for r in rows()}
    files = {
        str(p.relative_to(UPSTREAM)) for p in UPSTREAM.rglob("*") if p.suffix in (".yaml", ".sh")
    }
    frags = fragments()
    assert files == names | set(frags)
    assert "?" not in frags.values(), {k: v for k, v in frags.items() if v == "?"}


def test_expected_covers_every_row():
    assert {r.name for r in rows()} == set(EXPECTED)


def test_replay_every_row():
    """The outcome of every row is the expected one, and every refusal is one line."""
    wrong = []
    for name, message in replayed()[0].items():
        assert "\n" not in message, (name, message)
        got = "passes" if message == "passes" else classify(message)
        if got != EXPECTED[name]:
            wrong.append(f"{name}: expected {EXPECTED[name]!r}, got {got!r}: {message}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.skipif(not SHARED_UPSTREAM.exists(), reason="no ../shared reference tree here")
def test_copy_equals_the_shared_reference_tree():
    """tests/data/upstream is an unmodified copy of the files the tests read."""
    for path in UPSTREAM.rglob("*"):
        rel = path.relative_to(UPSTREAM)
        if path.is_file() and path.suffix in (".yaml", ".sh"):
            assert path.read_bytes() == (SHARED_UPSTREAM / rel).read_bytes(), rel
    wanted = {
        p.relative_to(SHARED_UPSTREAM)
        for p in SHARED_UPSTREAM.rglob("*")
        if p.suffix in (".yaml", ".yml") or (p.suffix == ".sh" and str(p).find("/verl") >= 0)
    }
    have = {p.relative_to(UPSTREAM) for p in UPSTREAM.rglob("*") if p.is_file()}
    assert wanted <= have


# ------------------------------------------------------------------ the shell reader


def words(text: str, env: dict[str, str] | None = None) -> list[list[str]]:
    return _Lexer(text, dict(env or {})).commands()


def test_shell_words_quotes_continuations_comments():
    text = (
        "A=1\n"
        "python3 -m x \\\n"
        "  a.b='x y' \\\n"
        '  c="${A}-$A" \\\n'
        "  d=[1,2] $@ # a comment\n"
        "echo done\n"
    )
    assert words(text)[1] == ["python3", "-m", "x", "a.b=x y", "c=1-1", "d=[1,2]"]


def test_shell_defaults_arithmetic_and_field_splitting():
    env = {"HOME": "/h"}
    text = (
        "L=$((1024 * 2))\n"
        'P=${P:-"${HOME}/p"}\n'
        'ARGS="x=1 y=2"\n'
        "run $ARGS z=$(((L + 2) * 2)) p=$P q=${UNSET:-dflt} r=$(date +%s)\n"
    )
    assert words(text, env)[-1] == ["run", "x=1", "y=2", "z=4100", "p=/h/p", "q=dflt", "r=cmdsubst"]


def test_shell_empty_expansion_assigns_the_empty_string():
    """``X=${UNSET:-}`` makes X empty (not a space), so a later ``${X:-2}`` takes its
    default — verl 0.9's scripts derive their defaults this way."""
    env: dict[str, str] = {}
    cmds = _Lexer("tp=${TP:-}\ntp=${tp:-2}\nrun a=${tp} $UNSET b\n", env).commands()
    assert cmds[-1] == ["run", "a=2", "b"]
    assert env["tp"] == "2"


def test_shell_comment_after_escaped_space_ends_the_command():
    """bash: ``a \\  # note`` is the word ' ', then a comment that ends the command —
    verl's run_deepseek7b_llm_pfppo.sh is broken this way upstream."""
    cmds = words("run a=1 \\  # note\n  b=2\n")
    assert cmds[0] == ["run", "a=1", " "]
    assert cmds[1] == ["b=2"]


def test_shell_arrays_expand_one_word_per_element():
    """verl 0.9's scripts gather overrides in arrays: ``"${A[@]}"`` is one word per
    element (quoted ones keep their spaces), an empty array no word, ``+=`` appends."""
    text = (
        "N=4\n"
        "DATA=(\n"
        "    data.a=$N  # the size\n"
        "    data.b='x y'\n"
        ")\n"
        "DATA+=(data.c=1)\n"
        "EMPTY=(\n)\n"
        "LAUNCH=(uv run python3)\n"
        '"${LAUNCH[@]}" -m x "${DATA[@]}" "${EMPTY[@]}" k=${DATA[1]} "$@"\n'
    )
    assert words(text)[-1] == [
        "uv", "run", "python3", "-m", "x", "data.a=4", "data.b=x y", "data.c=1", "k=data.b=x y",
    ]  # fmt: skip


def test_script_commands_find_the_config(tmp_path):
    root = tmp_path / "verl"
    (root / "verl/trainer/config").mkdir(parents=True)
    script = root / "examples/run.sh"
    script.parent.mkdir(parents=True)
    script.write_text(
        "set -x\n"
        "python3 -m verl.trainer.main_ppo --config-path=config "
        "--config-name='ppo_megatron_trainer.yaml' a=1 2>&1 | tee log\n"
    )
    (cmd,) = script_commands(script, root)
    assert cmd.config == root / "verl/trainer/config/ppo_megatron_trainer.yaml"
    assert cmd.overrides == ("a=1",)
