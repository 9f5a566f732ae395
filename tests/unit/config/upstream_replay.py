"""The upstream verl and ROLL configs and command lines as rows of ``temper check``.

Every file under ``tests/data/upstream`` is one of:

- a **config row**: a verl trainer config, a recipe's or an example's ``--config-name``
  file, or a ROLL pipeline YAML — checked as it is;
- a **script row**: a trainer command line of a verl example script (or of a SkyPilot
  task's ``run:`` block), parsed by :mod:`upstream_scripts` into the config file it
  composes and its ``key=value`` overrides — checked with them, as the temper command
  of its entry point reads them (``temper generate`` for ``main_generation_server``,
  which composes ``ppo_trainer.yaml``);
- a **fragment**: a file that other files pull in (Hydra ``defaults:`` groups, ROLL's
  ``config/`` definitions), a tool or interaction config, a Ray runtime env, or a
  script without a trainer command (data preparation).

A row's outcome is what ``temper check`` says about the config itself, the engines it
names and the rewards it scores with (the ``engines`` and ``rewards`` pre-flights): ``passes``, or the one-line refusal, classified by
:data:`FEATURES` into the feature it names. The rest of the pre-flight (model and data
paths, output directories) is about the author's machine, not the file, and is tested
elsewhere.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from functools import cache
from pathlib import Path

import yaml
from reference_paths import UPSTREAM  # next to this file
from upstream_scripts import Command, script_commands

from temper.config import ConfigError
from temper.config.dialects.core.derivation import Record, recording
from temper.pipelines.catalog import load_config
from temper.pipelines.preflight import preflight

VERL = ("verl-2025-06-38d9a88", "verl-2026-01-b178a3c", "verl-2026-08-1dda039")
ROLL = ("roll-v0", "roll-2025-06-70e9c6c", "roll-2026-08-8eb27cc")
#: Environment the rows see: a secret some ROLL files interpolate (${oc.env:...}).
ENV = {"WANDB_API_KEY": "dummy-key"}
#: ROLL files its rollout scripts run (``run_rlvr_rollout_pipeline.sh`` ->
#: ``start_rlvr_rollout_pipeline.py``, from 2025-08), and the temper command that does.
ROLL_ROLLOUTS = {
    "roll-2026-08-8eb27cc/examples/qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus.yaml": "eval",
}


@dataclasses.dataclass(frozen=True)
class Row:
    # snapshot-relative path, "#n" for a script's n-th trainer command, "#rollout" for a
    # ROLL file as its rollout script reads it (ROLL_ROLLOUTS)
    name: str
    config: Path
    overrides: tuple[str, ...] = ()
    command: str = "train"  # the temper command that reads it (upstream_scripts.Command)


# --------------------------------------------------------------------------- the rows


def _rel(path: Path) -> str:
    return str(path.relative_to(UPSTREAM))


def _is_verl_config(rel: str) -> bool:
    """verl files checked as configs: the trainer configs, recipe and example configs."""
    parts = rel.split("/")
    if "trainer/config/" in rel:  # the top-level configs, not their group files
        return len(parts) == 5 and parts[-1] != "reward_manager.yaml"
    return "/config/" in rel and parts[-2] == "config"


def _skypilot_commands(path: Path, root: Path) -> list[Command]:
    """The ``run:`` block of a SkyPilot task, as its head node runs it: the task's
    ``setup`` clones verl into ``./verl`` (this snapshot), SkyPilot sets the node count and
    the GPUs per node (from ``resources.accelerators``, e.g. ``H100:1``)."""
    task = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    run = str(task.get("run") or "").replace("$(pwd)/verl", "$(pwd)")
    gpus = str((task.get("resources") or {}).get("accelerators") or "x:1").split(":")[-1]
    sky_env = {
        "SKYPILOT_NUM_NODES": str(task.get("num_nodes") or 1),
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NUM_GPUS_PER_NODE": gpus.strip(),
    }
    return script_commands(path, root, text=run, env=sky_env)


@cache
def rows() -> tuple[Row, ...]:
    out: list[Row] = [
        Row("verl-0.8/ppo_trainer_flat.yaml", UPSTREAM / "verl-0.8/ppo_trainer_flat.yaml")
    ]
    for snap in VERL:
        root = UPSTREAM / snap
        for path in sorted(root.rglob("*.yaml")):
            rel = _rel(path)
            if _is_verl_config(rel):
                out.append(Row(rel, path))
        for path in sorted([*root.rglob("*.sh"), *root.glob("examples/skypilot/*.yaml")]):
            cmds = (
                _skypilot_commands(path, root)
                if path.suffix == ".yaml"
                else script_commands(path, root)
            )
            out += [Row(f"{snap}/{c.name}", c.config, c.overrides, c.command) for c in cmds]
    for snap in ROLL:
        for path in sorted((UPSTREAM / snap).rglob("*.yaml")):
            if path.parent.name != "config":
                out.append(Row(_rel(path), path))
            if _rel(path) in ROLL_ROLLOUTS:
                out.append(Row(f"{_rel(path)}#rollout", path, (), ROLL_ROLLOUTS[_rel(path)]))
    return tuple(out)


@cache
def fragments() -> dict[str, str]:
    """Files that are no row, and what they are."""
    out: dict[str, str] = {}
    names = {r.name.split("#")[0] for r in rows()}
    for path in sorted(UPSTREAM.rglob("*")):
        rel = _rel(path)
        if path.suffix not in (".yaml", ".sh") or rel in names:
            continue
        if "/tool_config/" in rel or "/interaction_config/" in rel:
            out[rel] = "tool or interaction config"
        elif path.suffix == ".sh":
            out[rel] = "script without a trainer command"
        elif path.name == "runtime_env.yaml":
            out[rel] = "Ray runtime environment"
        elif path.parent.name == "config" or "trainer/config/" in rel:
            out[rel] = "defaults fragment"
        elif "skypilot" in rel:
            out[rel] = "SkyPilot task (its run: block is a script row)"
        else:
            out[rel] = "?"
    return out


# --------------------------------------------------------------------------- outcomes

#: What a refusal names, by the first pattern its message matches.
FEATURES: tuple[tuple[str, str], ...] = (
    ("megatron engine", r"'megatron' training engine \(Megatron-Core\)"),
    ("deepspeed engine", r"'deepspeed' training engine \(DeepSpeed\)"),
    ("rewards: ifeval/code/llm_judge", r"(GeneralRule|CodeSandbox|LLMJudge)RewardWorker"),
    ("rewards: sandbox_fusion", r"sandbox_fusion"),
    ("rewards: served reward model", r"served reward model|generative reward model"),
    ("audio input", r"audio inputs are not supported"),
    ("custom data function", r"custom ROLL data function"),
    ("vision-language", r"vision-language|multimodal|vision tower"),
    (
        "megatron: virtual pipeline",
        r"interleaved \(virtual\) pipeline stages split each|pipeline stages × \d+ virtual",
    ),
    ("megatron: expert parallel on a dense model", r"is dense: expert parallelism splits"),
    ("megatron: expert FFN over TP", r"does not divide the model's \d+ (shared-)?expert FFN"),
    ("megatron: MoE option needs CUDA", r"Megatron keeps its (buffers|token counts) on CUDA"),
    ("megatron: dist-checkpoint unset", r"distributed checkpoint to start from is not given"),
    ("megatron: MoE router lora", r"LoRA on a mixture-of-experts router"),
    ("megatron: fsdp", r"Megatron-FSDP"),
    ("engine: fsdp_turbo", r"fsdp_turbo engine"),
    ("device: npu", r"is not supported \(got 'npu'\)"),
    ("model_engine vs strategy", r"but model_engine sets it|role files \(strategy"),
    ("expert parallel on FSDP", r"expert parallelism (over FSDP ranks|in the AutoModel)"),
    ("reward manager", r"reward_manager(\.name)?: this value is not supported"),
    ("megatron: reward model split", r"the reward model scores in the\s+driver process"),
    ("dynamic sampling", r"dynamic-sampling|is_use_additional_prompts"),
    ("pipeline: sft", r"SFT (trainer|pipeline)"),
    ("pipeline: dpo", r"DPO pipeline"),
    ("pipeline: distillation", r"distillation pipeline|distillation trainer"),
    ("pipeline: rollout only", r"ROLL rollout pipeline"),
    ("pipeline: generation/eval", r"verl (generation|evaluation) entry point"),
    ("pipeline: prime", r"verl PRIME recipe"),
    ("engine: sglang", r"'sglang'"),
    ("engine: trtllm", r"TensorRT-LLM"),
    ("torchtitan: mesh", r"torchtitan's mesh must cover"),
    ("env manager", r"custom ROLL env manager class"),
    ("agent runner", r"custom ROLL agent runner"),
    (
        "engine: reward cluster",
        r"reward\.strategy_args\.strategy_name: this value is not supported",
    ),
    ("env type", r"\.env_type\b.*: unknown value '\w+'"),
    ("env tool wrapper", r"GEM tool wrappers"),
    ("async generation", r"asynchronous \(off-policy\) generation"),
    (
        "length: engine context",
        r"max_model_len.*is shorter than max_prompt_length \+ response_length",
    ),
    ("one-step-off: hybrid engine", r"one-step-off trainer asserts hybrid_engine is false"),
    ("fully-async: hybrid engine", r"fully-async trainer asserts hybrid_engine is false"),
    ("fully-async: dynamic resource scheduling", r"dynamic resource scheduling"),
    ("fully-async: no step", r"prompts are fewer than one step's"),
    ("script: missing config", r"config file not found"),
    ("tp rollout on cpu", r"is not supported with vLLM's CPU build"),
    ("custom code", r"custom (dataset classes|samplers|ROLL worker class)"),
    ("verl interaction", r"interaction agents"),
    ("chat template", r"custom Jinja chat template"),
    (
        "rollout correction",
        r"rejection sampling|bypass mode|probability ratio|no token would ever be rejected",
    ),
    ("router replay", r"router replay"),
    ("pg variant", r"pg_variant|TOPR's negative"),
    ("lora adapters", r"LoRA adapter|excluding LoRA modules|excluding modules from LoRA"),
    ("file: no adapter", r"no adapter directory given"),  # the script's unset variable
    ("precision", r"master weights|reduced in fp32"),
    (
        "logger",
        r"this logger is not supported|track_with: (this value is not supported|ml_tracker)",
    ),
    ("tool-call format", r"tool-call format '\w+' is not supported"),
    ("checkpoint contents", r"checkpoints without (model|optimizer|extra)"),
    ("file: no model", r"no policy model given"),
    ("multi-token prediction", r"multi-token prediction is not supported"),
    ("engine: automodel", r"(automodel|NeMo AutoModel) training engine"),
    (
        "batch arithmetic",
        r"mini-batch|contiguous|outside the \d+ devices|cannot be split evenly"
        r"|devices are not divisible by the sequence-parallel size",
    ),
    ("file: empty", r"the config is empty"),
    ("file: missing default", r"Could not load|Could not find '[\w/]+'"),
    (
        "script: broken",
        r"not an override|adds a key, but|expected (bool|int|float)|unknown verl key.*Hydra would refuse"
        r"|its config conversion stops on it|quotes around the brackets make it one"
        r"|verl's Hydra refuses this override",
    ),
    ("verl 0.9 vocabulary", r": unknown verl key"),  # keys of verl >= 2026-04: issue 27
)


def classify(message: str) -> str:
    """The feature a refusal names, from its key and reason (not its fix, which may list
    other keys)."""
    reason = message.split(". Fix: ")[0]
    for label, pattern in FEATURES:
        if re.search(pattern, reason):
            return label
    return f"unclassified: {message}"


def check(row: Row) -> str:
    """``passes`` or the one-line refusal of ``temper check`` (config + engines)."""
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        loaded = load_config(row.config, list(row.overrides), command=row.command)
        try:
            preflight(loaded.config, loaded.plan, checks=("engines", "rewards"))
        except ConfigError as err:
            raise loaded.in_dialect(err) from err
        return "passes"
    except ConfigError as err:
        return str(err)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@cache
def replayed() -> tuple[dict[str, str], Record]:
    """Every row's :func:`check` message, and the keys each dialect derivation read over
    them (``core.derivation.recording``): one replay, shared by the tests that hold the
    outcomes and the derivations' declarations to it (a replay is the config tests'
    longest run)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with recording() as record:
            messages = {row.name: check(row) for row in rows()}
    return messages, record


def write_expected(path: Path) -> dict[str, int]:
    """Rewrite ``upstream_expected.py`` from a run of the replay (review the diff: a row
    that changed for a reason other than a feature landing is a regression)."""

    outcomes = {}
    for name, message in replayed()[0].items():
        outcomes[name] = "passes" if message == "passes" else classify(message)
    body = "\n".join(f"    {name!r}: {label!r}," for name, label in sorted(outcomes.items()))
    path.write_text(
        '"""Expected outcome of every row of the upstream replay (see ``upstream_replay``).\n\n'
        "``passes``, or the feature (``upstream_replay.FEATURES``) its one-line refusal names.\n"
        "Generated by ``python tests/unit/config/upstream_replay.py``, then reviewed row by\n"
        "row; when a branch lands a feature its rows flip to ``passes``.\n"
        '"""\n\nfrom __future__ import annotations\n\n'
        f"EXPECTED: dict[str, str] = {{\n{body}\n}}\n"
    )
    counts: dict[str, int] = {}
    for label in outcomes.values():
        counts[label] = counts.get(label, 0) + 1
    return counts


if __name__ == "__main__":  # regenerate the expected outcomes
    import warnings

    warnings.simplefilter("ignore")
    for label, n in sorted(
        write_expected(Path(__file__).with_name("upstream_expected.py")).items()
    ):
        print(f"{n:4d}  {label}")
