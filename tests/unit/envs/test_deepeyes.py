"""DeepEyes: the answer extraction and format rule, the judge's prompt and verdict, the
reward combination (hand-computed), and episodes of the env over a hand-made parquet
(zoom-in, error observations, the step cap, bad rows reported by file and row)."""

from __future__ import annotations

import logging

import pytest
from deepeyes_rows import SYSTEM, row, write_rows  # tests/ is on the path

from temper.data.errors import DataError
from temper.envs import make_env
from temper.envs.deepeyes import load_rows
from temper.envs.deepeyes_reward import (
    combine,
    extract_answer,
    judge_messages,
    verdict_score,
)
from temper.envs.judging import grade

W = {"acc_weight": 0.8, "format_weight": 0.2, "tool_weight": 1.2}  # the file's weights
ZOOM = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 60, 60]}}</tool_call>'


class Judge:
    """A judge that replies from a script and records what it was asked."""

    def __init__(self, *verdicts: str) -> None:
        self.verdicts, self.asked, self.kwargs = list(verdicts), [], []

    def complete(self, conversations, template_kwargs=None):
        self.asked += list(conversations)
        self.kwargs.append(dict(template_kwargs or {}))
        return [self.verdicts.pop(0) for _ in conversations]

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- reward parts


@pytest.mark.parametrize(
    ("response", "answer", "error"),
    [
        ("<think>look</think><answer>red</answer>", "red", False),
        ("<think>a</think><think>b</think> <answer> blue </answer>", "blue", False),
        ("<think>unclosed <answer>red</answer>", "red", True),  # think tags differ
        ("<think>x</think><answer>red", "red", True),  # answer tags differ after </think>
        ("<answer>a</answer><answer>b</answer>", "b", False),  # the last answer
        ("just red", "just red", False),  # no tags: the whole reply, no format error
        ("<answer>red</answer></think>", "red", True),  # 0 vs 1 think tags
    ],
)
def test_extract_answer(response, answer, error):
    assert extract_answer(response) == (answer, error)


@pytest.mark.parametrize(
    ("verdict", "score"),
    [
        ("1", 1.0),
        ("0", 0.0),
        (" 1\n", 1.0),
        ("Judgement: 1", 1.0),
        ("Judgement: 0", 0.0),
        ("blah Judgement: 10", 1.0),  # a 1 anywhere after the last Judgement: wins
        ("Judgement: yes", None),
        ("yes", None),
        ("11", None),  # no Judgement: the whole reply must be 1 or 0
    ],
)
def test_verdict_score(verdict, score):
    assert verdict_score(verdict) == score


def test_judge_prompt_holds_the_case_last():
    system, user = judge_messages("What colour?", "The car is red.", "red")
    assert system == {"role": "system", "content": "You are a helpful assistant."}
    assert user["role"] == "user"
    text = user["content"]
    assert text.endswith(
        "[Question]: What colour?\n[Standard Answer]: The car is red.\n[Model_answer] : red\n"
        "Judgement:"
    )
    assert text.count("Judgement: 1") >= 1 and text.count("Judgement: 0") >= 1  # examples


def test_combine_hand_computed():
    # right, well formed, answered at once: 0.8·1 + 0.2·0 + 1.2·0 = 0.8
    r = combine(1.0, False, answer_length=3, steps=1, tool_failed=False, **W)
    assert (r.reward, r.acc, r.format, r.tool) == pytest.approx((0.8, 1.0, 0.0, 0.0))
    # right after a zoom (2 steps), every call ran: 0.8 + 1.2 = 2.0
    assert combine(1.0, False, answer_length=3, steps=2, tool_failed=False, **W).reward == (
        pytest.approx(2.0)
    )
    # a failed call loses the tool bonus: 0.8
    assert combine(1.0, False, answer_length=3, steps=3, tool_failed=True, **W).reward == (
        pytest.approx(0.8)
    )
    # wrong after a zoom: no bonus; a format error: 0.2·(-1) = -0.2
    assert combine(0.0, True, answer_length=3, steps=2, tool_failed=False, **W).reward == (
        pytest.approx(-0.2)
    )
    # right but badly formed: 0.8 - 0.2 = 0.6, and the bonus still counts: 1.8 after a zoom
    assert combine(1.0, True, answer_length=3, steps=1, tool_failed=False, **W).reward == (
        pytest.approx(0.6)
    )
    assert combine(1.0, True, answer_length=3, steps=2, tool_failed=False, **W).reward == (
        pytest.approx(1.8)
    )
    # an answer of 1000 characters: accuracy 0 and a format error, whatever the judge said
    long_ = combine(1.0, False, answer_length=1000, steps=2, tool_failed=False, **W)
    assert (long_.reward, long_.acc, long_.format, long_.tool) == pytest.approx(
        (-0.2, 0.0, -1.0, 0.0)
    )
    assert combine(1.0, False, answer_length=999, steps=1, tool_failed=False, **W).acc == 1.0


# --------------------------------------------------------------------------- the env


@pytest.fixture
def rows_file(tmp_path):
    load_rows.cache_clear()
    yield write_rows(tmp_path / "deepeyes.parquet")
    load_rows.cache_clear()


def env(path, judge, **kw):
    e = make_env("deepeyes", data_args={"file_name": str(path)}, max_steps=3, **W, **kw)
    e.test_judge = judge
    return e


def step(e, text):
    """``e.step(text)``, then the judge's grading of an episode end, as the env manager
    runs them (:func:`temper.envs.judging.grade`)."""
    obs, reward, done, truncated, info = e.step(text)
    graded = grade([(0, e)], e.test_judge)
    if 0 in graded:
        reward += graded[0][0]
        info = {**info, **graded[0][1]}
    return obs, reward, done, truncated, info


def test_reset_shows_the_rows_prompt_and_image(rows_file):
    e = env(rows_file, Judge())
    obs, info = e.reset(7)
    assert obs.count("<image>") == 1 and "What colour is the square?" in obs
    assert e.system_prompt() == SYSTEM  # the row's own system message
    (img,) = e.observation_images()
    assert img.size == (112, 84)
    assert 0 <= info["index"] < 6
    obs2, info2 = e.reset(7)  # the seed picks the row
    assert (obs2, info2) == (obs, info)


def test_zoom_then_answer_earns_the_tool_bonus(rows_file):
    judge = Judge("1")
    e = env(rows_file, judge, enable_thinking=True)
    e.reset(1)
    truth = e.row.ground_truth
    obs, reward, done, truncated, info = step(e, f"<think>small</think>{ZOOM}")
    assert (reward, done, truncated) == (0.0, False, False)
    assert info["tool_call"] and not info["tool_error"]
    assert obs.startswith("<tool_response><image>") and obs.endswith("</tool_response>")
    (crop,) = e.observation_images()
    assert crop.size == (60, 60)
    assert e.render("rgb_array").shape == (60, 60, 3)  # the image shown now
    obs, reward, done, truncated, info = step(e, f"<think>it is</think><answer>{truth}</answer>")
    assert (done, truncated) == (True, False)
    assert reward == pytest.approx(0.8 + 1.2)  # right, after a tool call that ran
    assert info["acc_reward"] == 1.0 and info["success"]
    (asked,) = judge.asked
    assert asked[-1]["content"].endswith(f"[Model_answer] : {truth}\nJudgement:")
    assert "[Question]: What colour is the square?" in asked[-1]["content"]
    assert judge.kwargs == [{"enable_thinking": True}]
    assert e.observation_images() == []


def test_bad_call_is_an_error_observation_and_loses_the_bonus(rows_file):
    e = env(rows_file, Judge("Judgement: 1"))
    e.reset(2)
    bad = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 9, 9]}}</tool_call>'
    obs, reward, done, _, info = step(e, bad)
    assert obs.startswith("Error: ") and "too small" in obs
    assert e.observation_images() == [] and not done and info["tool_error"]
    _, reward, done, _, _ = step(e, "<answer>red</answer>")
    assert done and reward == pytest.approx(0.8)  # right, but a call failed: no bonus


def test_no_tool_call_ends_the_episode_and_the_step_cap_truncates(rows_file):
    e = env(rows_file, Judge("0", "1"))
    e.reset(3)
    _, reward, done, truncated, info = step(e, "I do not know")  # no answer, no call
    assert (done, truncated) == (True, False)
    assert reward == pytest.approx(0.0) and info["acc_reward"] == 0.0
    e.reset(3)
    for _ in range(2):
        assert not step(e, ZOOM)[2]
    _, reward, done, truncated, _ = step(e, ZOOM)  # the third of max_steps 3
    assert (done, truncated) == (False, True)
    # scored as it stands: the judge's 1 on the whole reply (no answer tags), 3 steps
    assert reward == pytest.approx(0.8 + 1.2)


def test_no_pending_episode_end_without_a_finished_episode(rows_file):
    e = env(rows_file, Judge())
    e.reset(5)
    step(e, ZOOM)
    assert e.judge_request() is None  # the episode goes on
    with pytest.raises(ValueError, match="no episode end is waiting"):
        e.judged("1")


def test_judge_failure_scores_zero_and_is_recorded(rows_file):
    class Broken(Judge):
        def complete(self, conversations, template_kwargs=None):
            raise RuntimeError("engine down")

    e = env(rows_file, Broken())
    e.reset(4)
    _, reward, done, _, info = step(e, "<answer>red</answer>")
    assert done and reward == 0.0 and "engine down" in info["judge_error"]


def test_bad_rows_are_reported_by_file_and_row(rows_file, caplog):
    with caplog.at_level(logging.WARNING, logger="temper.data"):
        rows = load_rows((str(rows_file),))
    assert len(rows) == 6
    text = caplog.text
    assert f"{rows_file}:row 6: no image" in text
    assert f"{rows_file}:row 7: no ground truth" in text


def test_a_file_without_usable_rows_is_a_data_error(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    load_rows.cache_clear()
    bad = row(0, "red")
    bad["prompt"] = [{"role": "user", "content": "no image mark"}]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([bad]), path)
    with pytest.raises(DataError, match=r"no usable DeepEyes row .*row 0: .*0 <image> marks"):
        load_rows((str(path),))
    load_rows.cache_clear()


def test_config_errors():
    with pytest.raises(ValueError, match="file_name is required"):
        make_env("deepeyes", data_args={})
    with pytest.raises(ValueError, match="data_args cache_dir: not read"):
        make_env("deepeyes", data_args={"file_name": "x", "cache_dir": "y"})
    missing = make_env("deepeyes", data_args={"file_name": "/nowhere/d.parquet"})
    assert "is not a file on this machine" in missing.problem()


def test_jsonl_rows_with_image_paths(tmp_path, caplog):
    """Any data file format temper reads; an image may be a path (relative to the file)."""
    import json

    from deepeyes_rows import COLOURS, square_png

    load_rows.cache_clear()
    (tmp_path / "sq.png").write_bytes(square_png(COLOURS["green"]))
    good = row(0, "green")
    good["images"] = ["sq.png"]
    odd = row(1, "red")
    odd["images"] = ["sq.png"]
    odd["reward_model"] = "red"  # not an object
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (good, odd)) + "\n")
    with caplog.at_level(logging.WARNING, logger="temper.data"):
        (only,) = load_rows((str(path),))
    assert only.ground_truth == "green"
    assert f"{path}:line 2: column 'reward_model' is str" in caplog.text
    load_rows.cache_clear()


def test_grade_batches_by_template_arguments(rows_file):
    """One judge call per distinct chat-template arguments, envs in order; envs still
    playing ask nothing."""
    judge = Judge("1", "0", "1")
    envs = [env(rows_file, judge, enable_thinking=t) for t in (False, True, False, False)]
    for k, e in enumerate(envs):
        e.reset(k)
        e.step("<answer>red</answer>" if k != 3 else ZOOM)  # env 3 goes on
    graded = grade(list(enumerate(envs)), judge)
    assert sorted(graded) == [0, 1, 2]
    assert judge.kwargs == [{"enable_thinking": False}, {"enable_thinking": True}]
    assert [len(c) for c in (judge.asked[:2], judge.asked[2:])] == [2, 1]
    # envs 0 and 2 got "1" and "0" (one call, in order), env 1 the second call's "1"
    assert [graded[k][1]["acc_reward"] for k in (0, 1, 2)] == [1.0, 1.0, 0.0]
