"""``temper check``'s pre-flight of the run's data (:mod:`temper.pipelines.preflight`):
files exist, their columns are there, and every sample's data source and tag is scored
by a reward — read row by row, never trained on."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.pipelines.preflight import writable

# --------------------------------------------------------------------------- data

#: Rows read to collect the data sources and tags of a line-oriented file.
MAX_SCAN_ROWS = 100_000


def check_prompt_data(cfg: TemperConfig, notes: list[str]) -> None:
    """Prompt data files exist; their prompt (or messages) column is there; every sample
    (by data source and ROLL tag) is scored by a reward (the RLVR pipeline's pre-flight)."""
    for key, files in (
        ("data.train_files", cfg.data.train_files),
        ("data.val_files", cfg.data.val_files),
    ):
        if not files:
            continue
        columns, samples = _scan(files, key, cfg)
        column = cfg.data.messages_key or cfg.data.prompt_key
        ckey = "data.messages_key" if cfg.data.messages_key else "data.prompt_key"
        if columns is not None and column.split(".")[0] not in columns and column not in columns:
            raise ConfigError(
                ckey,
                f"the column '{column}' is not in {key} "
                f"(its columns: {', '.join(sorted(columns))})",
                f"set {ckey} to the column holding the prompts",
            )
        _check_rewards(cfg, samples, key)
        _check_video_engine(cfg, columns, key)
        if key == "data.train_files" and cfg.data.source_weights:
            _check_weights(cfg, {tag for _source, tag in samples})


def _check_video_engine(cfg: TemperConfig, columns: set[str] | None, key: str) -> None:
    """Prompts with videos generate on the ``hf`` engine: temper hands vLLM a prompt's
    images only (vLLM's CPU build cannot run the Qwen2-VL family here, so a video path
    into it could not be tested)."""
    from temper.rollout.registry import resolve_engine_name

    column = cfg.data.video_key
    if columns is None or (column.split(".")[0] not in columns and column not in columns):
        return
    if resolve_engine_name(cfg.rollout.engine, cfg.model) != "vllm":
        return
    raise ConfigError(
        "rollout.engine",
        f"{key} has a video column '{column}', and vLLM rollout of video prompts is not "
        "supported (temper passes vLLM images only)",
        "set rollout.engine=hf, which generates from videos",
    )


def check_columns(
    cfg: TemperConfig,
    wanted: list[tuple[str, str]],
    sources: list[tuple[str, list[str]]] | None = None,
) -> None:
    """Every file of ``sources`` (``(config key, files)``; default the train and val
    files) holds each ``(config key, column)`` of ``wanted`` (a dotted column names a
    nested field: its first part must be a column)."""
    data = cfg.data
    if sources is None:
        sources = [("data.train_files", data.train_files), ("data.val_files", data.val_files)]
    for key, files in sources:
        if not files:
            continue
        columns, _samples = _scan(files, key, cfg)
        if columns is None:
            continue
        for ckey, column in wanted:
            if column.split(".")[0] not in columns and column not in columns:
                raise ConfigError(
                    ckey,
                    f"the column '{column}' is not in {key} "
                    f"(its columns: {', '.join(sorted(columns))})",
                    f"set {ckey} to the column holding them",
                )


def check_sft_data(cfg: TemperConfig, notes: list[str]) -> None:
    """Supervised data files exist and hold their columns: the conversation column
    (``data.messages_key``), or the prompt and the response (the SFT pipeline's
    pre-flight)."""
    data = cfg.data
    wanted = (
        [("data.messages_key", data.messages_key)]
        if data.messages_key
        else [("data.prompt_key", data.prompt_key), ("sft.response_key", cfg.sft.response_key)]
    )
    check_columns(cfg, wanted)


def check_dpo_data(cfg: TemperConfig, notes: list[str]) -> None:
    """Preference data files exist and hold the prompt, chosen and rejected columns (the
    DPO pipeline's pre-flight)."""
    check_pair_data(cfg, "dpo", cfg.dpo.chosen_key, cfg.dpo.rejected_key)


def check_rm_data(cfg: TemperConfig, notes: list[str]) -> None:
    """The reward-model pipeline's pre-flight: its pairs' columns, as for DPO."""
    check_pair_data(cfg, "rm", cfg.rm.chosen_key, cfg.rm.rejected_key)


def check_pair_data(cfg: TemperConfig, section: str, chosen: str, rejected: str) -> None:
    """Preference data files exist and hold the prompt, chosen and rejected columns
    (``section``: the config section naming the latter two)."""
    wanted = [
        ("data.prompt_key", cfg.data.prompt_key),
        (f"{section}.chosen_key", chosen),
        (f"{section}.rejected_key", rejected),
    ]
    check_columns(cfg, wanted)


def check_eval_data(cfg: TemperConfig, notes: list[str]) -> None:
    """Files of responses exist and hold the responses column; every row's data source
    finds a reward (as for RL prompts); the metrics file can be written (the eval
    pipeline's pre-flight)."""
    key, files = "evaluate.files", cfg.evaluate.files
    columns, samples = _scan(files, key, cfg)
    column = cfg.evaluate.response_key
    if columns is not None and column.split(".")[0] not in columns and column not in columns:
        raise ConfigError(
            "evaluate.response_key",
            f"the column '{column}' is not in {key} (its columns: {', '.join(sorted(columns))})",
            "set evaluate.response_key to the column holding the responses",
        )
    _check_rewards(cfg, samples, key)
    if cfg.evaluate.output_path:
        writable(Path(cfg.evaluate.output_path).expanduser().parent, "evaluate.output_path")


def _check_weights(cfg: TemperConfig, tags: set[str]) -> None:
    """Every weighted tag (or domain) has prompts, and every prompt a weight — what the
    sampler checks when the run starts."""
    from temper.data.sampler import domains_of

    data = cfg.data
    names = set(tags)
    if data.source_domains:
        names = set(domains_of(sorted(tags), data.source_domains, data.source_default_domain))
    what = "domain(s)" if data.source_domains else "tag(s)"
    empty = sorted(k for k, w in data.source_weights.items() if w > 0 and k not in names)
    if empty:
        raise ConfigError(
            "data.source_weights",
            f"{what} {', '.join(empty)} have a weight but no prompts in data.train_files "
            f"(its {what}: {', '.join(sorted(names))})",
            "give them a weight of 0, or add their data",
        )
    unweighted = sorted(names - set(data.source_weights))
    if unweighted:
        raise ConfigError(
            "data.source_weights",
            f"{what} {', '.join(unweighted)} have prompts but no weight",
            "give every one a weight (0 excludes it)",
        )


def _scan(
    files: list[str], key: str, cfg: TemperConfig
) -> tuple[set[str] | None, set[tuple[str, str]]]:
    """Columns and the (data source, tag) pairs of ``files``, as the data loader reads
    them (a missing source is ``unknown``, a missing tag the source): parquet from its
    schema and those two columns, other files from their rows (up to ``MAX_SCAN_ROWS``)."""
    from temper.data.errors import empty_files_error
    from temper.data.prompts import data_source_of, get_path
    from temper.data.row_formats import ROW_FORMATS
    from temper.data.sources import expand_files, read_file

    row_format = ROW_FORMATS.get(cfg.data.row_format)

    columns: set[str] = set()
    samples: set[tuple[str, str]] = set()
    ds_key, tag_key = cfg.data.data_source_key, cfg.data.tag_key
    paths = expand_files(files, key)
    read = [0]  # rows seen, broken ones included: none at all is an empty file
    for path in paths:
        rows: Iterable[dict[str, Any]]
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                names = set(pq.read_schema(path).names)
                read[0] += pq.read_metadata(path).num_rows
            except (OSError, ValueError) as err:
                raise ConfigError(key, f"cannot read {path}: {err}", "check the file") from err
            columns |= names
            heads = {ds_key.split(".")[0], tag_key.split(".")[0], "data_source"}
            wanted = [c for c in (*heads, *row_format.reads) if c in names]
            rows = pq.read_table(path, columns=wanted).to_pylist() if wanted else [{}]
        else:
            rows = _rows(read_file(path, key), columns, read)
        for raw in rows:
            row = _formatted(row_format, raw, cfg)
            columns |= set(row)
            source = data_source_of(row, ds_key)
            tag = get_path(row, tag_key)
            samples.add(
                (source, source if tag is None or not isinstance(tag, str | int) else str(tag))
            )
    if not read[0]:
        raise empty_files_error(key, paths)
    return columns, samples


def _formatted(row_format: Any, row: dict[str, Any], cfg: TemperConfig) -> dict[str, Any]:
    """``row`` rewritten by ``data.row_format``; as it is where it does not fit (the
    loader reports that row)."""
    from temper.data.errors import RowProblem

    try:
        out: dict[str, Any] = row_format(row, cfg.data)
    except RowProblem:
        return row
    return out


def _rows(
    source_rows: Iterable[Any], columns: set[str], read: list[int]
) -> Iterable[dict[str, Any]]:
    for i, row in enumerate(source_rows):
        if i >= MAX_SCAN_ROWS:
            return
        read[0] += 1
        if row.row is not None:
            columns |= set(row.row)
            yield row.row


def _check_rewards(cfg: TemperConfig, samples: set[tuple[str, str]], key: str) -> None:
    """Every sample finds a reward: the route whose tags hold its tag, a catch-all route,
    else ``reward.function`` — which, for ``auto``, must know the sample's data source."""
    reward = cfg.reward
    if reward.function == "custom" or reward.custom_function.path:
        from temper.rewards.custom import load_custom_function

        load_custom_function(reward.custom_function.path, reward.custom_function.name)
        return
    routed = {t for r in reward.routes.values() for t in (r.tags or [])}
    if any(not r.tags for r in reward.routes.values()) or reward.function != "auto":
        return
    if reward.model.enable and not reward.routes:
        return  # verl: the reward model scores every sample
    from temper.rewards.functions.auto import DATA_SOURCES, function_name_for

    unknown = sorted(
        {s for s, tag in samples if tag not in routed and function_name_for(s) is None}
    )
    if unknown:
        missing = unknown == ["unknown"]
        reason = (
            f"the rows of {key} have no '{cfg.data.data_source_key}' column"
            if missing
            else f"no reward scores the data source(s) {', '.join(map(repr, unknown))} of {key}"
        )
        raise ConfigError(
            "reward.function",
            f"{reason}, and reward.function is auto, which picks a built-in reward by data source",
            "set reward.function (or a custom reward function), or use data sources auto "
            f"knows: {', '.join(sorted(DATA_SOURCES))}",
        )
