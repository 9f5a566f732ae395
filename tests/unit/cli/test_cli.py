"""``temper check`` / ``temper convert`` on every example, and one-line config errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from temper.cli.main import main
from temper.pipelines.catalog import load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
CONFIGS = sorted(p for p in EXAMPLES.glob("*.yaml"))


def test_examples_exist():
    names = {p.name for p in CONFIGS}
    assert {
        "grpo_native.yaml",
        "verl_gsm8k_ppo.yaml",
        "roll_rlvr.yaml",
        "roll_agentic_sokoban.yaml",
        "agentic_sokoban.yaml",
        "quickstart.yaml",
        "arithmetic_hard.yaml",
    } <= names


#: Examples whose model ships with temper (the smollm2 alias): the full pre-flight passes
#: here. The others name a model directory or hub id of their author's machine.
LOCAL_MODEL = {
    "quickstart.yaml",
    "arithmetic_hard.yaml",
    "agentic_sokoban.yaml",
    "roll_agentic_sokoban.yaml",
    "generate.yaml",
}
#: What ``check`` explains first: a step's samples, or a generate call's or an eval's size.
SHAPE_ROWS = (
    "actor mini-batch (samples)",
    "episodes per step",
    "prompts per generate call",
    "rows scored",
)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_check_passes_and_explains(path, capsys):
    args = ["check", str(path)] + ([] if path.name in LOCAL_MODEL else ["--config-only"])
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "# derived values" in out
    assert any(row in out for row in SHAPE_ROWS)
    assert ("pre-flight passed" in out) == (path.name in LOCAL_MODEL)


#: Recipes of chained stages (examples/<recipe>/*.yaml): each stage's config is valid; a
#: later stage's model is an earlier stage's output, so the pre-flight waits for that run.
#: (examples/config/ holds ROLL's config fragments, composed by the ROLL examples.)
STAGES = sorted(p for p in EXAMPLES.glob("*/*.yaml") if p.parent.name != "config")


@pytest.mark.parametrize("path", STAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recipe_stages_are_valid_configs(path, capsys):
    assert main(["check", "--config-only", str(path)]) == 0
    assert "valid" in capsys.readouterr().out


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_convert_round_trips(path, tmp_path, capsys):
    """Converting a dialect file gives a native config that passes check; converting
    that output again changes nothing."""
    assert main(["convert", str(path)]) == 0
    first = capsys.readouterr().out
    native = tmp_path / "native.yaml"
    native.write_text(first)
    loaded = load_config(native)
    assert loaded.dialect == "native"
    assert main(["convert", str(native)]) == 0
    second = capsys.readouterr().out
    strip = lambda text: [ln for ln in text.splitlines() if not ln.startswith("# note")]  # noqa: E731
    assert strip(second) == strip(first)
    original = load_config(path).config
    assert loaded.config == original


def test_typo_wrong_type_and_indivisible_batch_are_one_line_errors(capsys):
    path = str(EXAMPLES / "grpo_native.yaml")
    cases = {
        "actor.mini_bach_size=4": "actor.mini_bach_size: unknown key (did you mean 'mini_batch_size'?)",
        "rollout.n=eight": "rollout.n: expected int, got 'eight' (str)",
        "actor.mini_batch_size=100": "actor.mini_batch_size: 256 samples per step",
        "algorithm.adv_estimator=grpoo": "algorithm.adv_estimator: unknown value 'grpoo' (did you mean 'grpo'?)",
    }
    for override, expected in cases.items():
        assert main(["check", path, override, "--config-only"]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err, err
        assert expected in err, err
        assert "Fix:" in err


@pytest.mark.parametrize("command", ["train", "check", "convert"])
def test_a_command_without_its_config_file_says_so(command, capsys):
    """Not argparse's "the following arguments are required: config, overrides": the
    overrides are optional, the file is what is missing (issue 29)."""
    assert main([command]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"config error: CONFIG: temper {command} needs a config file (native, verl or ROLL "
        f"YAML). Fix: temper {command} FILE [key=value …], e.g. temper {command} "
        "examples/quickstart.yaml"
    )


def test_a_reader_that_stops_early_gets_no_traceback():
    """``temper check FILE | head`` (the reader closes the pipe): exit 141, as a shell
    reports SIGPIPE, with no BrokenPipeError traceback."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "temper", "check", str(EXAMPLES / "grpo_native.yaml")]
    proc = subprocess.Popen(
        [*cmd, "--config-only"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before temper writes a line: its first print finds no reader
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_dialect_detection():
    assert load_config(EXAMPLES / "verl_gsm8k_ppo.yaml").dialect == "verl"
    assert load_config(EXAMPLES / "roll_rlvr.yaml").dialect == "roll"
    assert load_config(EXAMPLES / "grpo_native.yaml").dialect == "native"


def test_check_full_lists_every_key(capsys):
    assert main(["check", str(EXAMPLES / "grpo_native.yaml"), "--full", "--config-only"]) == 0
    out = capsys.readouterr().out
    body = yaml.safe_load(
        "\n".join(
            ln for ln in out.split("# derived values")[0].splitlines() if not ln.startswith("#")
        )
    )
    assert "policy_loss_kwargs" in body["actor"] and "multi_turn" in body["rollout"]
