"""Offline distillation of a vision-language student on image rows (ROLL's VL distill
pipeline): tiny random Qwen2-VL student and teacher, rows in ROLL's columns (``problem``,
``solution``, ``image``). The step's divergence is the one computed by hand from the two
models' logits with the images; a short run lowers it and moves the student; ROLL's
fsdp2 example file passes ``temper check`` and trains with model, data, length, device
and output overrides; bad rows are reported by file and row; the SFT pipeline learns the
same rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from temper.cli.main import main
from temper.data.vision import MULTI_MODAL_INPUTS
from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config
from temper.utils.tiny_vlm import make_tiny_vlm

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
VL_FSDP2 = UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen2.5-vl-7B-distill/distill_vl_fsdp2.yaml"
COLORS = ("red", "green", "blue", "yellow")
TOPK, WEIGHT = 16, 0.85


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Qwen2-VL student and a confident teacher of the same architecture and
    tokenizer (another seed, its final norm ×16, so its top-k distribution is far from
    the random student's)."""
    from transformers import AutoModelForImageTextToText

    root = tmp_path_factory.mktemp("vl-distill")
    student = make_tiny_vlm(root / "student")
    teacher = make_tiny_vlm(root / "teacher", seed=7)
    model = AutoModelForImageTextToText.from_pretrained(teacher)
    with torch.no_grad():
        model.model.language_model.norm.weight.mul_(16.0)
    model.save_pretrained(teacher)
    return student, teacher


def image_rows(root: Path, bad: bool = False) -> Path:
    """Four rows in ROLL's VL distill columns, a 56×56 noise image each (4 image tokens);
    ``bad``: and a row whose image file is missing (line 3) and one whose image column
    is a number (line 5)."""
    (root / "img").mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for i, color in enumerate(COLORS):
        noise = torch.randint(0, 256, (56, 56, 3), generator=torch.Generator().manual_seed(i))
        Image.fromarray(noise.to(torch.uint8).numpy(), "RGB").save(root / "img" / f"{i}.png")
        rows.append({"problem": f"Which colour? #{i}", "solution": color, "image": f"img/{i}.png"})
    if bad:
        rows.insert(2, {"problem": "Which colour?", "solution": "red", "image": "img/none.png"})
        rows.insert(4, {"problem": "Which colour?", "solution": "red", "image": 7})
    path = root / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def native(root: Path, student: Path, teacher: Path, data: Path, **over) -> dict:
    cfg = {
        "pipeline": "distill",
        "model": {"path": str(student)},
        "data": {
            "train_files": [str(data)],
            "train_batch_size": 4,
            "row_format": "roll_distill_vl",
            "prompt_key": "problem",
        },
        "sft": {"max_length": 256, "response_key": "solution", "learn_prompt": True},
        "kd": {"objective": "forward_kl", "topk": TOPK, "loss_weight": WEIGHT},
        "distill": {"teachers": {"default": {"model_path": str(teacher)}}},
        "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 2, "optim": {"lr": 0.0}},
        "experiment": {"max_steps": 1, "output_dir": str(root / "run"), "trackers": ["jsonl"]},
    }
    for section, values in over.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


def metrics(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/distill_loss" in r]


def by_hand(cfg: dict, images_of=lambda i: i) -> tuple[float, float]:
    """``(KD, NLL)`` of the step's samples from the models' own forwards, one sample at a
    time, unpadded: at every learnt token the teacher's top-k logits, the student's
    logits at those ids, ``KL(p ‖ q) = Σ p (log p − log q)`` over the k tokens, and the
    student's NLL — token-means over all learnt tokens. ``images_of(i)``: whose pixels
    sample ``i`` is given (its own: the run's computation)."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from temper.data.sft import build_sft_datasets

    run_cfg = build_config(cfg)
    tok = AutoTokenizer.from_pretrained(run_cfg.model.path)
    train, _ = build_sft_datasets(run_cfg, tok)
    assert train is not None
    batch = train.make_batch(list(range(len(train))))
    student = AutoModelForImageTextToText.from_pretrained(run_cfg.model.path).float().eval()
    teacher_path = run_cfg.distill.teachers["default"].model_path
    teacher = AutoModelForImageTextToText.from_pretrained(teacher_path).float().eval()
    image_id = student.config.image_token_id
    kd = nll = count = 0.0
    pixels = batch.objects[MULTI_MODAL_INPUTS]
    width = batch["prompt_ids"].shape[1]
    for i in range(len(batch)):
        n = int(batch["attention_mask"][i, width:].sum())
        ids = torch.cat([batch["prompt_ids"][i], batch["response_ids"][i, :n]])[None]
        kwargs = {"mm_token_type_ids": (ids == image_id).int(), **pixels[images_of(i)]}
        with torch.no_grad():
            s = student(input_ids=ids, **kwargs).logits[0, width - 1 : width - 1 + n]
            t = teacher(input_ids=ids, **kwargs).logits[0, width - 1 : width - 1 + n]
        mask = batch["response_mask"][i, :n].bool()
        values, top = torch.topk(t[:, : len(tok)].float(), TOPK, dim=-1)
        log_p = torch.log_softmax(values, -1)
        log_q = torch.log_softmax(s.float().gather(-1, top), -1)
        per_token = (log_p.exp() * (log_p - log_q)).sum(-1)
        target = batch["response_ids"][i, :n]
        token_nll = -torch.log_softmax(s.float(), -1).gather(-1, target[:, None])[:, 0]
        kd += float(per_token[mask].sum())
        nll += float(token_nll[mask].sum())
        count += float(mask.sum())
    return kd / count, nll / count


def test_step_loss_is_the_hand_computed_divergence_on_images(tmp_path, models, monkeypatch):
    """Step 1's ``train/distill_loss`` and ``train/sft_loss`` (before its update) are the
    KL and NLL computed by hand from both models' logits with the images; other images
    give another divergence; a teacher that is the student gives zero."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    student, teacher = models
    cfg = native(tmp_path, student, teacher, image_rows(tmp_path))
    run_pipeline(build_config(cfg))
    (row,) = metrics(tmp_path / "run")
    kd, nll = by_hand(cfg)
    assert row["train/distill_loss"] == pytest.approx(kd, rel=1e-6)
    assert row["train/sft_loss"] == pytest.approx(nll, rel=1e-6)
    assert row["train/loss"] == pytest.approx((1 - WEIGHT) * nll + WEIGHT * kd, rel=1e-6)
    assert kd > 0.1
    # the pixels take part: each sample given another's image scores otherwise (the tiny
    # random vision tower moves the divergence little, but far more than the 1e-6 above)
    shifted, _ = by_hand(cfg, lambda i: (i + 1) % len(COLORS))
    assert shifted != pytest.approx(kd, rel=1e-4)
    same = native(tmp_path / "same", student, student, image_rows(tmp_path))
    run_pipeline(build_config(same))
    (row,) = metrics(tmp_path / "same" / "run")
    assert abs(row["train/distill_loss"]) < 1e-6


def _frozen(before_dir: Path, out: Path) -> list[str]:
    before = load_file(str(before_dir / "model.safetensors"))
    final = load_file(str(out / "final" / "actor" / "model.safetensors"))
    assert before.keys() == final.keys()
    return [k for k in before if torch.equal(before[k], final[k])]


def test_short_run_lowers_the_divergence_and_moves_the_student(
    tmp_path, models, monkeypatch, caplog
):
    """Three steps on the same four image rows (each step's batch): the divergence to the
    teacher falls, every parameter of the student (its vision tower too) moves; the two
    bad rows are reported by file and row and skipped."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    student, teacher = models
    data = image_rows(tmp_path, bad=True)
    over = {"actor": {"optim": {"lr": 3e-3}}, "experiment": {"max_steps": 3}}
    run_pipeline(build_config(native(tmp_path, student, teacher, data, **over)))
    rows = metrics(tmp_path / "run")
    kl = [r["train/distill_loss"] for r in rows]
    assert len(kl) == 3 and kl[-1] < kl[0], kl
    assert all(r["data/skipped_rows"] == 2 for r in rows)
    assert f"{data.name}:line 3: image 0 of column 'images': cannot read" in caplog.text
    assert f"{data.name}:line 5: image 0 of column 'images' must be bytes" in caplog.text
    frozen = _frozen(student, tmp_path / "run")
    assert not frozen, f"parameters that did not move: {frozen}"


def test_roll_vl_distill_file_passes_check_and_trains(tmp_path, models, monkeypatch):
    """ROLL's fsdp2 VL distillation example (2026-08) with only these overrides: model
    (the tiny student and teacher), data (rows in its columns), length (prompt_length
    256, 2 steps), device (one device, fsdp_size 1 for both workers), outputs. The
    file's divergence (forward KL, top 64, weight 0.85, on the prompt too), learning
    rate and batch arithmetic (1 row a step) are its own."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    student, teacher = models
    data = image_rows(tmp_path)
    out = tmp_path / "roll"
    args = [
        str(VL_FSDP2),
        f"student_pretrain={student}",  # model
        f"teacher_pretrain={teacher}",
        f"student.data_args.file_name=[{data}]",  # data
        "prompt_length=256",  # length
        "max_steps=2",
        "num_gpus_per_node=1",  # device
        "student.device_mapping=list(range(0,1))",
        "teacher.device_mapping=list(range(0,1))",
        "student.strategy_args.strategy_config.fsdp_size=1",
        "teacher.strategy_args.strategy_config.fsdp_size=1",
        f"output_dir={out}",  # outputs
        f"checkpoint_config.output_dir={out}/ckpt",
    ]
    assert main(["check", *args]) == 0
    assert main(["train", *args]) == 0
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["perf/samples"] == 1 and r["train/distill_loss"] > 0 for r in rows)


def test_check_refuses_a_teacher_that_reads_other_image_inputs(tmp_path, models, capsys):
    """The student's processor makes the image inputs of both models: a teacher with
    another image token is refused by ``temper check``, naming the teacher's key."""
    import shutil

    student, teacher = models
    other = tmp_path / "other-teacher"
    shutil.copytree(teacher, other)
    config = json.loads((other / "config.json").read_text())
    config["image_token_id"] = 5
    (other / "config.json").write_text(json.dumps(config))
    cfg = native(tmp_path, student, other, image_rows(tmp_path))
    path = tmp_path / "distill.yaml"
    path.write_text(json.dumps(cfg))
    assert main(["check", str(path)]) != 0
    said = capsys.readouterr()
    assert "distill.teachers.default.model_path: the teacher's image_token_id is 5" in (
        said.out + said.err
    )


def test_check_refuses_lora_for_a_megatron_vl_student(tmp_path, models, capsys):
    """The megatron engine runs the Qwen2-VL family without LoRA: ``temper check`` says
    so, naming the key, before any weight loads."""
    student, teacher = models
    cfg = native(tmp_path, student, teacher, image_rows(tmp_path))
    cfg["actor"] = {**cfg.get("actor", {}), "strategy": "megatron"}
    cfg["model"] = {**cfg["model"], "lora": {"rank": 4, "alpha": 8}}
    path = tmp_path / "distill.yaml"
    path.write_text(json.dumps(cfg))
    assert main(["check", str(path)]) != 0
    said = capsys.readouterr()
    assert "model.lora.rank: the megatron engine runs a vision-language model" in (
        said.out + said.err
    )


def test_sft_learns_the_same_image_rows(tmp_path, models, monkeypatch):
    """The supervised pipeline shares the rows: two SFT steps on the image rows lower the
    NLL, and validation scores them with their images."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    student, _ = models
    data = image_rows(tmp_path)
    cfg = native(tmp_path, student, student, data)
    cfg["pipeline"] = "sft"
    for key in ("kd", "distill"):
        del cfg[key]
    cfg["sft"]["learn_prompt"] = False
    cfg["data"]["val_files"] = [str(data)]
    cfg["actor"]["optim"] = {"lr": 3e-3}
    cfg["experiment"].update(max_steps=2, test_freq=2)
    summary = run_pipeline(build_config(cfg))
    loss = summary["curve_values"]
    assert len(loss) == 2 and loss[1] < loss[0], loss
    assert summary["val_after"] < loss[0]
