"""``temper`` command line: check, convert, train, generate, eval, report."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback

import yaml

from temper.config import ConfigError, LoadedConfig
from temper.config.typed import diff_from_default, to_dict

#: Errors a user acts on from their message alone, as (module, class name), with a hint
#: added after the message. Looked up only among modules already imported — an
#: exception cannot come from a module that never loaded — so the CLI never imports
#: torch, vLLM or Ray just to handle errors.
USER_ERRORS: dict[tuple[str, str], str] = {
    ("temper.rollout.vllm_engine", "VLLMEngineError"): "",
    ("temper.training.base", "NonFiniteError"): (
        " (no optimizer step was taken: lower that role's optim.lr or set its grad_clip, "
        "and check rewards and advantages for huge values)"
    ),
    ("temper.cluster.base", "WorkerGroupError"): (
        " (see that worker's log above; the same command resumes from the last checkpoint)"
    ),
    ("temper.rewards.failures", "RewardFailureError"): "",
    ("temper.rewards.executor", "RewardWorkerError"): "",
    ("temper.pipelines.checkpointing", "CheckpointWriteError"): "",
    ("temper.pipelines.ahead", "RolloutAheadError"): (
        " (the same command resumes from the last checkpoint)"
    ),
}
DEBUG_ENV = "TEMPER_DEBUG"
#: The commands that run a config: what a file is read as (``--for`` of check, convert).
COMMANDS = ("train", "generate", "eval")


def _user_error_hint(err: BaseException) -> str | None:
    """The hint for a known user-facing error, or None for anything else (a bug)."""
    for (module, name), hint in USER_ERRORS.items():
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(err, cls):
            return hint
    return None


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def _load(args: argparse.Namespace) -> LoadedConfig:
    """The config of the command line, validated with every check that needs no machine;
    later errors about it are told in its dialect (``main``)."""
    from temper.pipelines.catalog import load_config

    if args.config is None:  # argparse would say "required: config, overrides"
        raise ConfigError(
            "CONFIG",
            f"temper {args.command} needs a config file (native, verl or ROLL YAML)",
            f"temper {args.command} FILE [key=value …], e.g. temper {args.command} "
            "examples/quickstart.yaml",
        )
    # the command that reads the file (check and convert: --for): verl's ppo_trainer.yaml
    # trains under temper train and generates under temper generate, as verl's main_ppo
    # and main_generation_server read it
    args.loaded = load_config(
        args.config, args.overrides, dialect=args.dialect, command=args.reads_as
    )
    loaded: LoadedConfig = args.loaded
    if getattr(args, "overwrite", False):  # a flag, so a verl or ROLL file can say it too
        loaded.config.experiment.overwrite = True
    return loaded


def _dump(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=None)


def _preflight(loaded: LoadedConfig) -> list[str]:
    """The pre-flight of ``check`` and ``train`` (paths, data, engines, rewards, tools)."""
    from temper.pipelines.preflight import preflight

    return preflight(loaded.config, loaded.plan)


def cmd_check(args: argparse.Namespace) -> int:
    if args.explain:
        return _explain(args.explain)
    from temper.config.derive import explain

    loaded = _load(args)
    cfg = loaded.config
    flight = [] if args.config_only else _preflight(loaded)
    what = "config only, pre-flight skipped" if args.config_only else "pre-flight passed"
    print(f"# {loaded.source}: {loaded.dialect} dialect, valid ({what})")
    if loaded.notes:
        print("# notes (accepted keys that have no effect here):")
        for note in loaded.notes:
            print(f"#   - {note}")
    if flight:
        print("# pre-flight (settled for this machine):")
        for note in flight:
            print(f"#   - {note}")
    shown = to_dict(cfg) if args.full else diff_from_default(cfg)
    label = "full" if args.full else "non-default keys; --full shows all"
    print(f"# resolved native config ({label}):")
    print(_dump(shown))
    rows = explain(cfg, loaded.plan)
    width = max(len(r[0]) for r in rows)
    vwidth = max(len(r[1]) for r in rows)
    print("# derived values")
    for name, value, how in rows:
        print(f"  {name:<{width}}  {value:>{vwidth}}  {how}")
    from temper.cluster.placement import format_table, placement_rows
    from temper.config.plan import NO_TRAINING

    if NO_TRAINING in loaded.plan.uses:  # generate, eval: one process, no roles placed
        return 0
    print(f"# placement (resources.backend: {cfg.resources.backend})")
    print("\n".join(format_table(placement_rows(cfg, loaded.plan))))
    return 0


def _explain(keys: list[str]) -> int:
    """``temper check --explain KEY``: each key's doc, type and default (any dialect)."""
    from temper.config.explain import explain_key
    from temper.pipelines.catalog import CATALOG

    for key in keys:
        print("\n".join(explain_key(key, CATALOG)))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    loaded = _load(args)
    shown = to_dict(loaded.config) if args.full else diff_from_default(loaded.config)
    for note in loaded.notes:
        print(f"# note: {note}")
    print(_dump(shown), end="")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from temper.pipelines import command_pipeline, run_pipeline

    loaded = _load(args)
    command_pipeline(loaded.config, "train")  # generate and eval configs have their own
    for note in _preflight(loaded):  # before Ray starts or a model loads
        print(f"pre-flight: {note}", flush=True)
    summary = run_pipeline(loaded.config, loaded.plan)
    stopped = summary.get("stopped_by") if isinstance(summary, dict) else None
    if args.report and isinstance(summary, dict) and summary.get("output_dir"):
        from temper.report import write_report

        report = write_report(summary["output_dir"])
        if report.warning:
            print(f"warning: {report.warning}", file=sys.stderr)
        print(f"report: {report.png} (dashboard), {report.markdown} (summary)")
    if stopped:  # interrupted after a checkpoint: 128 + signal, as a shell reports it
        return 128 + int(signal.Signals[stopped])
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    return _run_command(args, "generate")


def cmd_eval(args: argparse.Namespace) -> int:
    return _run_command(args, "eval")


def _run_command(args: argparse.Namespace, command: str) -> int:
    """``temper generate`` / ``temper eval``: a pipeline that is no training loop, run
    whole by its record's ``main`` after the same pre-flight as ``train``."""
    from temper.pipelines import command_pipeline, run_command

    loaded = _load(args)
    command_pipeline(loaded.config, command)  # a config of another command: said first
    for note in _preflight(loaded):
        print(f"pre-flight: {note}", flush=True)
    run_command(loaded.config, command)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from temper.report import write_report

    try:
        report = write_report(list(args.run_dir), args.out)
    except (OSError, ValueError) as err:
        print(f"report: {err}", file=sys.stderr)
        return 1
    if report.warning:
        print(f"warning: {report.warning}", file=sys.stderr)
    print(f"dashboard: {report.png}\nsummary:   {report.markdown}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="temper", description="RL post-training for LLMs.")
    debug_help = f"show the Python traceback of errors too (or set {DEBUG_ENV}=1)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    # also after the command (`temper train x.yaml --debug`); SUPPRESS keeps a
    # `temper --debug train` from being reset by the subcommand's default
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, parents=[common])
        # optional for argparse, so that a missing file is told as such (_load), not as
        # "the following arguments are required: config, overrides"
        p.add_argument("config", nargs="?", help="YAML config (native, verl or ROLL)")
        p.add_argument("overrides", nargs="*", help="key=value overrides (Hydra syntax)")
        p.add_argument("--dialect", default="auto", help="auto, native, verl or roll")
        p.set_defaults(reads_as=name if name in COMMANDS else "train")
        return p

    def add_for(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--for",
            dest="reads_as",
            default="train",
            choices=COMMANDS,
            help="read the config as this command does (a verl ppo_trainer.yaml is a "
            "generation for generate, as verl's main_generation_server reads it)",
        )

    def add_overwrite(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--overwrite",
            action="store_true",
            help="experiment.overwrite=true for a config of any dialect: a start that would "
            "not continue the run in the output directory moves that run to "
            "<output_dir>.old-<time> instead of refusing",
        )

    p = add("check", "validate a config, pre-flight it, and explain its derived values")
    p.add_argument("--full", action="store_true", help="show every key, defaults included")
    p.add_argument(
        "--explain",
        metavar="KEY",
        action="append",
        help="print what a key means (its doc, type and default; a verl or ROLL key: what it "
        "sets here) and exit; repeatable",
    )
    p.add_argument(
        "--config-only",
        action="store_true",
        help="check the config alone: skip the pre-flight of models, data, directories, "
        "engines and rewards on this machine",
    )
    add_for(p)
    add_overwrite(p)
    p.set_defaults(func=cmd_check)
    p = add("convert", "print a config translated into the native schema")
    p.add_argument("--to", default="native", choices=["native"], help="target dialect")
    p.add_argument("--full", action="store_true", help="write every key, defaults included")
    add_for(p)
    p.set_defaults(func=cmd_convert)
    p = add("train", "train with a config")
    p.add_argument("--report", action="store_true", help="write the run's report at the end")
    add_overwrite(p)
    p.set_defaults(func=cmd_train)
    p = add(
        "generate",
        "generate responses to a file of prompts and write them with their log-probs "
        "(verl main_generation, and main_generation_server on a ppo_trainer.yaml)",
    )
    p.set_defaults(func=cmd_generate)
    p = add(
        "eval",
        "score a file of responses with temper's rewards: mean@n and pass@k per data "
        "source (verl main_eval); on a ROLL RLVR file, generate over its validation set and "
        "score it: val_correct per tag (ROLL's RLVR rollout pipeline)",
    )
    p.set_defaults(func=cmd_eval)
    p = sub.add_parser(
        "report",
        help="draw a run's (or chained runs') dashboard (PNG) and summary (markdown)",
        parents=[common],
    )
    p.add_argument(
        "run_dir",
        nargs="+",
        help="run directory (with metrics.jsonl) or the metrics file; several: runs chained "
        "in that order (e.g. sft then rl) on one step axis",
    )
    p.add_argument("--out", default=None, help="where to write them (default: the last run dir)")
    p.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command. Errors a user fixes from the message (a bad config, vLLM, a
    non-finite loss, a failed Ray worker) print one ``error: ...`` line on stderr — exit
    2 for config errors, 1 otherwise; ``--debug`` / ``TEMPER_DEBUG=1`` add the traceback.
    Any other exception is a bug and keeps its traceback. An interruption the run did not
    finish (a second Ctrl-C, or one before the run started) is one ``interrupted: ...``
    line, exit 130. A config error found after the
    config loaded (the pre-flight's, the run's) is told in the keys of the file the user
    wrote, like those found while loading it."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    parser.set_defaults(loaded=None)  # the command's config, once loaded
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes")
    try:
        return args.func(args)
    except ConfigError as err:
        if debug:
            traceback.print_exc()
        if args.loaded is not None:  # the one path: told in the dialect the user wrote
            err = args.loaded.in_dialect(err)
        print(f"config error: {_one_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C outside a run's guard, or twice within it
        if debug:
            traceback.print_exc()
        print(f"interrupted: {_one_line(str(err)) or 'SIGINT'}", file=sys.stderr)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        # the reader went away (`temper check … | head`): nothing is left to tell it, and
        # Python would print a traceback flushing stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + int(signal.SIGPIPE)
    except Exception as err:
        hint = _user_error_hint(err)
        if hint is None:
            raise
        if debug:
            traceback.print_exc()
        print(f"error: {_one_line(str(err))}{hint}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
