"""Hostile checkpoints: damaged ones, a disk that refuses a save, a signal during the final
export. Each case ends in one line (or goes on with a one-line warning), no traceback
reaches stderr, and the previous checkpoint stays loadable.

One tiny run (4 steps, a checkpoint every 2) is trained once; each test works on a copy of
its output directory. Runs go through ``temper.cli.main.main`` (what ``temper train``
runs), in this process where nothing is killed and as ``python -m temper`` subprocesses
where the kernel refuses a write or a signal arrives.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from temper.checkpoint import checkpoint_problem
from temper.cli.main import main
from temper.pipelines.run_lock import LOCK_NAME

pytestmark = pytest.mark.slow

STEPS = 4
REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Fraction of the response's characters that are digits."""
    return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))
'''


def _config(tmp: Path, model_dir: Path) -> dict:
    reward = tmp / "digits.py"
    reward.write_text(REWARD)
    return {
        "experiment": {
            "max_steps": STEPS,
            "seed": 1,
            "save_freq": 2,
            "trackers": ["jsonl"],
            "output_dir": str(tmp / "reference"),
        },
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": ["task:arithmetic?n=32&seed=3"],
            "train_batch_size": 2,
            "max_prompt_length": 96,
        },
        "rollout": {"n": 4, "response_length": 8, "temperature": 1.0},
        "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 4, "optim": {"lr": 3e-3}},
        "reward": {
            "function": "custom",
            "custom_function": {"path": str(reward)},
            "num_workers": 1,
        },
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """``(config file, reference output dir)``: the run trained to the end, once."""
    tmp = tmp_path_factory.mktemp("hostile-ckpt")
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(_config(tmp, tiny_model_dir)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEMPER_CACHE", str(tmp / "cache"))
        assert main(["train", str(path)]) == 0
        yield path, tmp / "reference"


@pytest.fixture
def cache(trained, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(trained[0].parent / "cache"))


def _copy(reference: Path, out: Path, steps: tuple[int, ...]) -> Path:
    """``out``: the reference run as it was when only ``steps`` were saved (metrics kept)."""
    (out / "checkpoints").mkdir(parents=True)
    shutil.copy(reference / "metrics.jsonl", out / "metrics.jsonl")
    for step in steps:
        name = f"global_step_{step}"
        shutil.copytree(reference / "checkpoints" / name, out / "checkpoints" / name)
    return out


def _flip_byte(path: Path) -> None:
    """Corrupt one byte in the middle of ``path``, keeping its size."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _train(config: Path, out: Path, *extra: str) -> int:
    return main(["train", str(config), f"experiment.output_dir={out}", *extra])


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _said(stderr: str) -> list[str]:
    """temper's own lines on stderr (not the libraries' progress bars), after checking
    that no traceback is among them."""
    assert "Traceback" not in stderr, stderr[-3000:]
    mine = ("resume:", "final:", "error:", "config error:", "SIGTERM:")
    return [line for line in _lines(stderr) if line.startswith(mine)]


def _assert_loadable(ckpt: Path) -> None:
    """Verified by its checksums, and its parts load."""
    assert checkpoint_problem(ckpt, verify=True) is None
    torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=True)
    load_file(str(ckpt / "actor_train" / "engine" / "model.safetensors"))
    torch.load(ckpt / "actor_train" / "engine" / "state.pt", map_location="cpu", weights_only=True)


def _same_final(a: Path, b: Path) -> None:
    wa = load_file(str(a / "final" / "actor" / "model.safetensors"))
    wb = load_file(str(b / "final" / "actor" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _rows(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))} for r in rows]


# --------------------------------------------------------------------------- damaged


@pytest.mark.parametrize("damaged", ["actor_train/engine/model.safetensors", "trainer_state.pt"])
def test_a_same_size_corruption_of_the_newest_checkpoint_falls_back_to_the_previous(
    trained, cache, tmp_path, capsys, damaged
):
    config, reference = trained
    out = _copy(reference, tmp_path / "run", (2, 4))
    _flip_byte(out / "checkpoints" / "global_step_4" / damaged)
    assert _train(config, out) == 0
    captured = capsys.readouterr()
    ckpts = out / "checkpoints"
    assert _said(captured.err) == [
        f"resume: {ckpts / 'global_step_4'} is damaged ({damaged}: checksum mismatch); "
        f"resuming from {ckpts / 'global_step_2'}"
    ]
    assert f"resumed from {ckpts / 'global_step_2'} at step 2" in captured.out
    _same_final(reference, out)  # steps 3 and 4 trained again, as the first time
    assert _rows(out) == _rows(reference)
    _assert_loadable(ckpts / "global_step_2")
    _assert_loadable(ckpts / "global_step_4")  # re-saved whole


def test_a_checkpoint_without_checksums_that_does_not_load_falls_back(
    trained, cache, tmp_path, capsys
):
    """A format-1 manifest (sizes only) cannot show a damaged trainer_state.pt: the load
    fails, and the run goes on from the previous checkpoint instead of a traceback."""
    config, reference = trained
    out = _copy(reference, tmp_path / "run", (2, 4))
    newest = out / "checkpoints" / "global_step_4"
    manifest = json.loads((newest / "manifest.json").read_text())
    old = {k: manifest[k] for k in ("step", "created", "meta", "files")}
    (newest / "manifest.json").write_text(json.dumps({"format": 1, **old}))
    state = newest / "trainer_state.pt"
    size = state.stat().st_size
    state.write_bytes(state.read_bytes()[: size // 2] + bytes(size - size // 2))
    assert _train(config, out) == 0
    err = _said(capsys.readouterr().err)
    assert len(err) == 1, err
    assert err[0].startswith(f"resume: {newest} is damaged (it does not load: ")
    assert err[0].endswith(f"); resuming from {out / 'checkpoints' / 'global_step_2'}")
    _same_final(reference, out)


def test_every_checkpoint_damaged_is_one_line_exit_2_and_nothing_is_replaced(
    trained, cache, tmp_path, capsys
):
    config, reference = trained
    out = _copy(reference, tmp_path / "run", (2, 4))
    ckpts = out / "checkpoints"
    _flip_byte(ckpts / "global_step_4" / "actor_train" / "engine" / "state.pt")
    _flip_byte(ckpts / "global_step_2" / "trainer_state.pt")
    before = _files(out)
    assert _train(config, out) == 2
    captured = capsys.readouterr()
    assert _said(captured.err) == [
        f"config error: experiment.output_dir: {out} holds a previous run (2 checkpoints "
        "(global_step_2, global_step_4; none valid), metrics.jsonl with steps 1–4); none of "
        "its checkpoints is valid (global_step_4: actor_train/engine/state.pt: checksum "
        "mismatch; global_step_2: trainer_state.pt: checksum mismatch), so this start would "
        "begin again at step 0 over it. Fix: choose another experiment.output_dir, or start "
        f"over with experiment.overwrite=true (moves it to {out}.old-<time>)"
    ]
    assert _files(out) == before


def test_resuming_a_named_damaged_checkpoint_is_one_line_naming_the_file(
    trained, cache, tmp_path, capsys
):
    """``resume_from_path`` names one checkpoint: no other stands in for it."""
    config, reference = trained
    out = _copy(reference, tmp_path / "run", (2, 4))
    named = out / "checkpoints" / "global_step_4"
    _flip_byte(named / "actor_train" / "state.pt")
    args = ["experiment.resume_mode=resume_path", f"experiment.resume_from_path={named}"]
    assert _train(config, tmp_path / "elsewhere", *args) == 2
    assert _said(capsys.readouterr().err) == [
        f"config error: experiment.resume_from_path: {named} is damaged (actor_train/state.pt: "
        "checksum mismatch). Fix: resume from an earlier checkpoint (its parent directory: "
        "the newest valid one), or use resume_mode=auto"
    ]
    _assert_loadable(out / "checkpoints" / "global_step_2")


def _files(root: Path) -> dict[Path, bytes]:
    """Every file under ``root`` and its bytes, the run lock (metadata of who holds the
    directory, rewritten by each start) excepted."""
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != LOCK_NAME}


def test_check_refuses_when_every_checkpoint_is_truncated(trained, cache, tmp_path, capsys):
    """The pre-flight checks sizes (cheap); train also checks sums (see above)."""
    config, reference = trained
    out = _copy(reference, tmp_path / "run", (2, 4))
    for step in (2, 4):
        weights = out / "checkpoints" / f"global_step_{step}" / "actor" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    assert main(["check", str(config), f"experiment.output_dir={out}"]) == 2
    err = _said(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith(f"config error: experiment.output_dir: {out} ")
    assert "global_step_4: actor/model.safetensors: 100 bytes, the manifest says" in err[0]


# --------------------------------------------------------------------------- a refused save


def _limit_file_size(limit: int):
    def apply() -> None:  # in the child: a write past ``limit`` fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def _env(trained) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_WAIT_POLICY": "PASSIVE",
        "TEMPER_CACHE": str(trained[0].parent / "cache"),
    }


def test_a_save_the_disk_refuses_is_one_line_and_the_same_command_resumes(
    trained, cache, tmp_path, capsys
):
    """The kernel refuses the checkpoint's writes (RLIMIT_FSIZE: EFBIG, the errno a full
    disk's ENOSPC shares the path with): one line, exit 1, nothing of the new checkpoint
    left, the previous one loads, and the same command, once writes work, finishes the run
    as if nothing happened."""
    config, reference = trained
    out = _copy(reference, tmp_path / "run", (2,))
    ckpts = out / "checkpoints"
    largest = max(p.stat().st_size for p in (ckpts / "global_step_2").rglob("*") if p.is_file())
    cmd = [sys.executable, "-m", "temper", "train", str(config), f"experiment.output_dir={out}"]
    done = subprocess.run(
        cmd,
        env=_env(trained),
        capture_output=True,
        text=True,
        preexec_fn=_limit_file_size(largest // 2),
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    err = _said(done.stderr)
    assert len(err) == 1, err
    assert err[-1].startswith(
        f"error: the checkpoint {ckpts / 'global_step_4'} could not be written ("
    ), err[-1]
    assert "File too large" in err[-1] or "unexpected pos" in err[-1], err[-1]  # torch: no errno
    assert err[-1].endswith(
        f" free there); nothing of it was kept, and {ckpts / 'global_step_2'} is intact: the same command "
        "resumes from it once the disk has room (free space there, or set "
        "experiment.checkpoint_dir / experiment.output_dir to a disk with room)"
    ), err[-1]
    assert sorted(p.name for p in ckpts.iterdir() if p.is_dir()) == ["global_step_2"]
    _assert_loadable(ckpts / "global_step_2")
    assert _train(config, out) == 0
    _same_final(reference, out)
    assert _rows(out) == _rows(reference)


def _unshare_works() -> bool:
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        try:
            done = subprocess.run(
                ["unshare", "-rm", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", where],
                capture_output=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
    return done.returncode == 0


needs_tmpfs = pytest.mark.skipif(
    not _unshare_works(), reason="needs `unshare -rm` to mount a small tmpfs (a disk that fills)"
)


def _on_small_disk(size: int, mount: Path, body: str, env: dict[str, str]) -> Path:
    """Run shell ``body`` with a ``size``-byte tmpfs on ``mount``, in a private mount
    namespace: a small disk that fills up for real. The tmpfs goes with the namespace, so
    what it held at the end is copied to ``<mount>.after``, which is returned."""
    after = mount.with_name(mount.name + ".after")
    mount.mkdir(parents=True, exist_ok=True)
    after.mkdir()
    script = (
        f"mount -t tmpfs -o size={size} tmpfs '{mount}' || exit 99\n"
        f"( {body} )\n"
        f"cp -a '{mount}/.' '{after}/'\n"
    )
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=env, timeout=600)
    assert done.returncode == 0, "the tmpfs could not be mounted"
    return after


def _temper(*args: str) -> str:
    return " ".join(f"'{a}'" for a in (sys.executable, "-m", "temper", *args))


@needs_tmpfs
def test_a_full_disk_during_a_save_is_one_line_naming_the_intact_checkpoint(trained, tmp_path):
    """A real ENOSPC: the checkpoint dir is a tmpfs with room for one more checkpoint than
    it holds, so the pre-flight passes, step 3's save fits and step 4's does not."""
    config, reference = trained
    out = _copy(reference, tmp_path / "run", ())
    ckpts = out / "checkpoints"
    source = reference / "checkpoints" / "global_step_2"
    one = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    log = tmp_path / "train.log"
    train = _temper("train", str(config), f"experiment.output_dir={out}", "experiment.save_freq=1")
    body = f"cp -a '{source}' '{ckpts}/' && {train} > '{log}.out' 2> '{log}'; echo $? > '{log}.rc'"
    after = _on_small_disk(int(one * 2.5), ckpts, body, _env(trained))
    text = log.read_text()
    assert (tmp_path / "train.log.rc").read_text().strip() == "1", text[-3000:]
    [last] = _said(text)
    assert last.startswith(
        f"error: the checkpoint {ckpts / 'global_step_4'} could not be written (No space "
        "left on device (errno 28); "
    ), last
    assert f"and {ckpts / 'global_step_3'} is intact: the same command resumes" in last
    assert sorted(p.name for p in after.iterdir() if p.is_dir()) == [
        "global_step_2",
        "global_step_3",
    ]
    _assert_loadable(after / "global_step_3")


@needs_tmpfs
def test_check_refuses_a_checkpoint_dir_without_room_for_one_checkpoint(trained, tmp_path):
    config, _reference = trained
    ckpts = tmp_path / "ckpts"
    log = tmp_path / "check.log"
    check = _temper(
        "check",
        str(config),
        f"experiment.output_dir={tmp_path / 'run'}",
        f"experiment.checkpoint_dir={ckpts}",
    )
    body = f"{check} > '{log}.out' 2> '{log}'; echo $? > '{log}.rc'"
    _on_small_disk(100_000, ckpts, body, _env(trained))
    text = log.read_text()
    assert (tmp_path / "check.log.rc").read_text().strip() == "2", text[-3000:]
    [line] = _said(text)
    assert line.startswith("config error: experiment.checkpoint_dir: a checkpoint takes about ")
    assert "× 4 bytes (fp32) × 4: the export, the trainer's copy and AdamW's two moments" in line
    free = line.split(f"and the disk of {ckpts} has ", 1)[1]  # a tmpfs rounds to pages
    assert re.fullmatch(
        r"\d+\.\d KB free\. Fix: free space there, or set experiment\.checkpoint_dir to a "
        r"disk with room",
        free,
    ), line


# --------------------------------------------------------------------------- the final export

HOLDING_ENGINE = '''
"""The torch engine, whose final export (into final/'s temp dir) pauses after the weights
are written until the test says go: a researcher's own engine, registered by name."""
import os
import time
from pathlib import Path

from temper.config.catalog import ONE_PROCESS
from temper.training.registry import register_engine
from temper.training.torch_engine import TorchEngine


class HoldingExport(TorchEngine):
    def save_hf(self, path, **kwargs):
        super().save_hf(path, **kwargs)
        if Path(path).parent.name.startswith(".final"):
            hold = Path(os.environ["HOLD_DIR"])
            (hold / "ready").touch()
            while not (hold / "go").exists():
                time.sleep(0.02)


register_engine("holding_torch", HoldingExport, needs=frozenset({ONE_PROCESS}))
'''


def _start_held(trained, tmp_path: Path, out: Path) -> tuple[subprocess.Popen, Path, Path]:
    """``temper train`` (with the holding engine) from ``out``; returns the process, the
    hold directory and its stderr file."""
    config, _ = trained
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "holding_engine.py").write_text(HOLDING_ENGINE)
    hold = tmp_path / "hold"
    hold.mkdir()
    env = {
        **_env(trained),
        "HOLD_DIR": str(hold),
        "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")]),
    }
    code = "import sys, holding_engine; from temper.cli.main import main; sys.exit(main())"
    args = [
        "train",
        str(config),
        f"experiment.output_dir={out}",
        "actor.strategy=holding_torch",  # the torch engine's math: the resume goes on
        "experiment.resume_strict=false",
    ]
    err = tmp_path / "stderr.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=err.open("wb"),
    )
    return proc, hold, err


def _wait(cond, proc: subprocess.Popen, what: str, timeout: float = 300.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def _same_as_checkpoint(out: Path, step: int) -> None:
    """``final/actor`` is whole and holds the weights of ``global_step_<step>/actor``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = out / "final" / "actor"
    assert checkpoint_problem(out / "final", verify=True) is None
    AutoTokenizer.from_pretrained(final)
    model = AutoModelForCausalLM.from_pretrained(final)
    saved = load_file(
        str(out / "checkpoints" / f"global_step_{step}" / "actor" / "model.safetensors")
    )
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert not [p for p in out.iterdir() if p.name.startswith(".final")]


def test_sigterm_during_the_final_export_lets_it_finish_whole_then_exits_143(trained, tmp_path):
    _config_file, reference = trained
    out = _copy(reference, tmp_path / "run", (2,))
    proc, hold, err = _start_held(trained, tmp_path, out)
    _wait((hold / "ready").exists, proc, "the final export")
    assert not (out / "final").exists()  # being written aside
    proc.send_signal(signal.SIGTERM)
    _wait(lambda: b"SIGTERM:" in err.read_bytes(), proc, "the signal's line")
    (hold / "go").touch()
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM, err.read_text()[-3000:]
    said = _said(err.read_text())
    assert len(said) == 1 and said[0].startswith("SIGTERM: "), said
    _same_as_checkpoint(out, STEPS)
    _same_final(reference, out)


def test_a_second_sigterm_abandons_the_export_and_the_rerun_writes_it(
    trained, cache, tmp_path, capsys
):
    _config_file, reference = trained
    out = _copy(reference, tmp_path / "run", (2,))
    proc, hold, err = _start_held(trained, tmp_path, out)
    _wait((hold / "ready").exists, proc, "the final export")
    proc.send_signal(signal.SIGTERM)
    _wait(lambda: b"SIGTERM:" in err.read_bytes(), proc, "the signal's line")
    proc.send_signal(signal.SIGTERM)  # the second one stops at once, mid-export
    assert proc.wait(timeout=120) == -signal.SIGTERM
    assert not (out / "final").exists()  # no empty or partial final/actor
    _assert_loadable(out / "checkpoints" / f"global_step_{STEPS}")
    # the same run (here in this process, with the torch engine it was trained with)
    assert _train(trained[0], out, "experiment.resume_strict=false") == 0
    captured = capsys.readouterr()
    assert _said(captured.err) == []
    assert (
        f"final: {out / 'final' / 'actor'} is missing; writing it from "
        f"{out / 'checkpoints' / f'global_step_{STEPS}'}" in captured.out
    )
    _same_as_checkpoint(out, STEPS)
    _same_final(reference, out)


@pytest.mark.parametrize("cut", ["weights", "manifest"])
def test_a_finished_runs_rerun_repairs_a_cut_final_export(trained, cache, tmp_path, capsys, cut):
    """A file of final/actor lost, or an export written before final/ had a manifest (a
    SIGTERM then left it empty): the rerun rewrites it instead of saying "done"."""
    _config_file, reference = trained
    out = _copy(reference, tmp_path / "run", (2, STEPS))
    shutil.copytree(reference / "final", out / "final")
    if cut == "weights":
        (out / "final" / "actor" / "model.safetensors").unlink()
        problem = "incomplete (actor/model.safetensors: missing)"
    else:
        (out / "final" / "manifest.json").unlink()
        problem = "not known to be whole (no final/manifest.json)"
    assert _train(trained[0], out) == 0
    captured = capsys.readouterr()
    assert _said(captured.err) == []
    assert f"final: {out / 'final' / 'actor'} is {problem}; writing it from" in captured.out
    _same_as_checkpoint(out, STEPS)
    assert _train(trained[0], out) == 0  # whole now: nothing to do, nothing rewritten
    assert "final:" not in capsys.readouterr().out
