"""Batch generation: the ``generate`` pipeline (``temper generate``; verl's ``main_generation``
and ``main_generation_server``).

The prompts of ``generate.files`` are read, templated, tokenized and length-checked as
RL prompts are (:func:`temper.data.build_dataset`: ``data.prompt_key`` or
``messages_key``, the chat template, ``max_prompt_length`` and ``truncation``; a bad row
is reported by file and row and skipped, or stops the load with ``data.bad_rows=error``).
``generate.batch_size`` prompts at a time go to the rollout engine ``rollout.engine``
names — built as an RL run builds it (:func:`temper.rollout.build_rollout_engine`, here
with its own copy of ``model.path``), ``rollout.n`` responses each, sampled with
``rollout.*``. The output file holds every generated row's own columns plus
``responses`` (its ``rollout.n`` texts, special tokens skipped, as verl decodes them)
and, with ``rollout.calculate_log_probs``, ``response_log_probs`` (each response's
sampled tokens' log-probs under the sampling distribution). There is no run directory,
checkpoint or tracker: the file is the output.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temper.cluster.generation import RESOURCE_KEYS
from temper.config.errors import ConfigError
from temper.config.plan import NO_TRAINING, ROLLOUT, StepShape
from temper.config.schema import TemperConfig
from temper.data import build_dataset
from temper.data.batch import Batch
from temper.data.collate import PromptExample
from temper.data.row_files import write_rows
from temper.data.sources import read_rows
from temper.pipelines.preflight import writable
from temper.pipelines.preflight_data import check_columns
from temper.pipelines.record import Pipeline, no_producer
from temper.pipelines.unread import refuse_run_keys, refuse_unread

#: The file formats the output may take (``write_rows`` by suffix).
OUTPUT_SUFFIXES = (".parquet", ".jsonl", ".json")
RESPONSES = "responses"
LOG_PROBS = "response_log_probs"


def generate(cfg: TemperConfig) -> dict[str, Any]:
    """Generate ``rollout.n`` responses to every prompt of ``generate.files`` and write
    them to ``generate.output_path`` (module docstring); returns the summary."""
    from temper.cluster.generation import build_generation_engine
    from temper.pipelines.demand import demand_of
    from temper.pipelines.run import load_tokenizer, seed_everything
    from temper.rollout import sampling_params_from_config
    from temper.training.models import import_external_lib

    start = time.perf_counter()
    seed_everything(cfg.experiment.seed)
    import_external_lib(cfg.model.external_lib)  # it may register the architecture
    gen = cfg.generate
    tokenizer = load_tokenizer(cfg)
    prompts = build_dataset(gen.files, cfg.data, tokenizer, "generate", "generate.files")
    rows = {f"{r.file}:{r.where}": r.row for r in read_rows(gen.files, "generate.files") if r.row}
    params = sampling_params_from_config(cfg.rollout, validation=False)
    engine = build_generation_engine(cfg, tokenizer, demand_of(cfg))
    out: list[dict[str, Any]] = []
    tokens = truncated = 0
    generating = 0.0  # seconds inside the engine (the rest: loading data and the model)
    try:
        batches = list(prompts.eval_batches(gen.batch_size))
        for number, batch in enumerate(batches, start=1):
            batch.meta["temperature"] = params.temperature
            begin = time.perf_counter()
            done = engine.generate(batch, params)
            generating += time.perf_counter() - begin
            out.extend(
                response_rows(done, params.n, tokenizer, rows, prompts.examples, params.logprobs)
            )
            tokens += int(done["response_mask"].sum())
            truncated += sum(bool(t) for t in done["truncated"])
            print(f"[{number}/{len(batches)}] {len(out)} prompts generated", flush=True)
    finally:
        engine.close()
    path = write_rows(out, gen.output_path)
    seconds = time.perf_counter() - start
    responses = len(out) * params.n
    summary = {
        "output_path": str(path),
        "prompts": len(out),
        "responses": responses,
        "skipped_rows": prompts.skipped_rows,
        "truncated_prompts": prompts.truncated,
        "filtered_overlong_prompts": prompts.filtered_overlong,
        "response_length_mean": tokens / max(responses, 1),
        "responses_cut_at_length": truncated,
        "seconds": seconds,
        "generation_seconds": generating,
        "tokens_per_second": tokens / max(generating, 1e-9),
    }
    skipped = f", {prompts.skipped_rows} malformed rows skipped" if prompts.skipped_rows else ""
    print(
        f"generated {responses} responses to {len(out)} prompts ({params.n} each{skipped}) "
        f"in {seconds:.1f}s ({generating:.1f}s generating, {tokens} tokens, "
        f"{tokens / max(generating, 1e-9):.1f} tokens/s): {path}",
        flush=True,
    )
    return summary


def response_rows(
    batch: Batch,
    n: int,
    tokenizer: Any,
    rows: dict[str, dict[str, Any]],
    examples: Sequence[PromptExample],
    log_probs: bool = True,
) -> list[dict[str, Any]]:
    """One output row per prompt of a generated ``batch`` (its ``n`` responses in a row,
    the engine's aabb order): the input row's columns (``rows`` by the example's
    ``file:row``), ``responses`` (texts, special tokens skipped) and, with ``log_probs``,
    ``response_log_probs`` (the sampling log-probs of each response's tokens)."""
    ids, mask = batch["response_ids"].cpu(), batch["response_mask"].cpu().bool()
    lp = batch["rollout_log_probs"].cpu().float() if log_probs else None
    texts = tokenizer.batch_decode(
        [row[m].tolist() for row, m in zip(ids, mask)], skip_special_tokens=True
    )
    out = []
    for first in range(0, len(batch), n):
        example = examples[batch["index"][first]]
        row = dict(rows[example.source])
        row[RESPONSES] = texts[first : first + n]
        if lp is not None:
            row[LOG_PROBS] = [lp[i][mask[i]].tolist() for i in range(first, first + n)]
        out.append(row)
    return out


# ------------------------------------------------------------------------ the config

TRAINS_NOTHING = "temper generate trains nothing"
#: Sections a generation reads nothing of, and why.
UNREAD_SECTIONS = {
    "actor": f"{TRAINS_NOTHING}: the engine generates with model.path's weights",
    "critic": TRAINS_NOTHING,
    "reference": TRAINS_NOTHING,
    "reward": "temper generate scores nothing (temper eval scores its output)",
    "algorithm": TRAINS_NOTHING,
}
SCORES_NOTHING = "the output copies each input row whole; generation scores nothing"
#: Keys of read sections a generation reads nothing of, and why.
UNREAD_KEYS = {
    **{
        f"data.{key}": "the prompts are generate.files"
        for key in ("train_files", "val_files", "train_max_samples", "val_max_samples")
    },
    **{
        f"data.{key}": "every prompt is generated for once, in file order"
        for key in (
            "train_batch_size",
            "gen_batch_size",
            "val_batch_size",
            "shuffle",
            "validation_shuffle",
            "dataloader_drop_last",
            "source_weights",
            "source_domains",
            "source_default_domain",
        )
    },
    **{
        f"data.{key}": SCORES_NOTHING
        for key in (
            "ground_truth_key",
            "data_source_key",
            "tag_key",
            "extra_info_key",
            "extra_info_columns",
        )
    },
    "rollout.val": "generation samples with rollout.* (there is no validation)",
    "rollout.multi_turn": "tool calls inside a generation are not supported here",
    "rollout.model_update_frequency": f"{TRAINS_NOTHING}: no weights are synced",
    "rollout.update_weights_bucket_megabytes": f"{TRAINS_NOTHING}: no weights are synced",
    "rollout.load_format": "the engine loads model.path's weights (nothing syncs dummy ones)",
    "rollout.log_prob_micro_batch_size_per_device": "the log-probs written are the "
    "sampling ones; nothing is recomputed",
    "rollout.log_prob_use_dynamic_bsz": "nothing is recomputed",
    "rollout.log_prob_max_token_len_per_device": "nothing is recomputed",
    **{
        f"model.{key}": f"{TRAINS_NOTHING}: a training setting"
        for key in (
            "enable_gradient_checkpointing",
            "enable_activation_offload",
            "use_remove_padding",
            "use_liger",
            "use_fused_kernels",
            "lora",
        )
    },
    "model.override_config": "the rollout engines load the model's own config",
}
#: The experiment and resources keys a generation reads (the rest: refused).
READS = {"experiment": ("seed", "device"), "resources": RESOURCE_KEYS}


def check(cfg: TemperConfig) -> None:
    """Keys a generation reads nothing of are refused with why; then its own limits."""
    refuse_unread(cfg, "generate", UNREAD_SECTIONS, UNREAD_KEYS)
    refuse_run_keys(
        cfg,
        "generate",
        "temper generate writes generate.output_path only, from the rollout's engines (no "
        "run directory, checkpoints or trackers, and no roles to place but the rollout's)",
        READS,
    )
    gen, rollout = cfg.generate, cfg.rollout
    if not gen.files:
        raise ConfigError("generate.files", "no prompt files given", "set generate.files")
    if not gen.output_path:
        raise ConfigError(
            "generate.output_path", "no output file given", "set it, e.g. out/responses.parquet"
        )
    if Path(gen.output_path).suffix not in OUTPUT_SUFFIXES:
        raise ConfigError(
            "generate.output_path",
            f"'{gen.output_path}' is not a {', '.join(OUTPUT_SUFFIXES)} file",
            "end it in .parquet (verl's format), .jsonl or .json",
        )
    if gen.batch_size < 1:
        raise ConfigError("generate.batch_size", f"must be >= 1, got {gen.batch_size}", "set it")
    if rollout.n < 1:
        raise ConfigError("rollout.n", f"must be >= 1, got {rollout.n}", "set it")
    greedy = not rollout.do_sample or rollout.temperature <= 0
    if greedy and rollout.n > 1:
        raise ConfigError(
            "rollout.n",
            f"greedy decoding (temperature 0 or do_sample false) gives {rollout.n} identical "
            "responses (verl refuses it too)",
            "set rollout.n=1, or sample (temperature > 0, do_sample true)",
        )


def check_files(cfg: TemperConfig, notes: list[str]) -> None:
    """The prompt files exist and hold the prompt column; the output can be written
    (the generation's pre-flight)."""
    data = cfg.data
    column = ("data.messages_key", data.messages_key) if data.messages_key else None
    wanted = [column or ("data.prompt_key", data.prompt_key)]
    check_columns(cfg, wanted, [("generate.files", cfg.generate.files)])
    writable(Path(cfg.generate.output_path).expanduser().parent, "generate.output_path")


def prompts_per_call(cfg: TemperConfig) -> StepShape:
    """A generate call takes ``generate.batch_size`` prompts, ``rollout.n`` responses each."""
    size, n = cfg.generate.batch_size, cfg.rollout.n
    return StepShape(
        samples=size * n,
        rows=(
            ("prompts per generate call", str(size), "generate.batch_size"),
            ("responses per prompt", str(n), "rollout.n"),
        ),
    )


PIPELINE = Pipeline(
    build=no_producer,
    uses=frozenset({ROLLOUT, NO_TRAINING}),
    check=check,
    preflight=check_files,
    step_shape=prompts_per_call,
    sections=frozenset({"generate"}),
    command="generate",
    main=generate,
    checks=frozenset({"engines", "models", "model_files", "pipeline"}),
)
