"""The code reward (stdin/stdout, call-based, ROLL cases; local sandbox and SandboxFusion),
IFEval scoring per instruction, the LLM judge's parsing, and the reward failure guard."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from temper.config.errors import ConfigError
from temper.config.schema import JudgeConfig, RewardConfig, RewardRoute, SandboxLimitsConfig
from temper.rewards import sandbox as sandbox_module
from temper.rewards.failures import FailureGuard, RewardFailureError
from temper.rewards.functions.code import compute_score as code_score
from temper.rewards.functions.code import extract_code, stdout_matches
from temper.rewards.functions.ifeval import compute_score as ifeval_score
from temper.rewards.judge import LLMJudge, parse_verdict
from temper.rewards.manager import RewardFailure, RewardScorer
from temper.rewards.preflight import check_rewards

from .conftest import make_batch

LIMITS = {"wall_time_s": 3.0, "cpu_time_s": 2.0, "memory_mb": 256, "max_processes": 16}
BOX = {"name": "bwrap", "limits": LIMITS, "sample_timeout_s": 20.0}

# stdin/stdout problems (codecontests/TACO style) and call-based ones (APPS/LeetCode)
STDIO = {"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]}
STDIO_OK = "a, b = map(int, input().split())\nprint(a + b)"
STDIO_WRONG = "a, b = map(int, input().split())\nprint(a - b)"
CALL = {
    "fn_name": "two_sum",
    "inputs": [[[2, 7, 11, 15], 9], [[3, 2, 4], 6]],
    "outputs": [[[0, 1]], [[1, 2]]],
}
CALL_OK = (
    "def two_sum(nums, target):\n    seen = {}\n    for i, n in enumerate(nums):\n"
    "        if target - n in seen:\n            return (seen[target - n], i)\n        seen[n] = i"
)
CALL_WRONG = "def two_sum(nums, target):\n    return [0, 0]"
LEETCODE_OK = "class Solution:\n    def two_sum(self, nums, target):\n" + "\n".join(
    "    " + line for line in CALL_OK.splitlines()[1:]
).replace("target - n", "target - n")


def fence(code: str, tag: str = "python") -> str:
    return f"Reasoning first.\n```{tag}\n{code}\n```\nDone."


@pytest.mark.parametrize(
    ("truth", "code", "expected"),
    [
        (STDIO, STDIO_OK, 1.0),
        (STDIO, STDIO_WRONG, 0.0),
        (json.dumps(STDIO), STDIO_OK, 1.0),  # PRIME stores the JSON string
        (CALL, CALL_OK, 1.0),
        (CALL, CALL_WRONG, 0.0),
        (
            json.dumps(CALL),
            "class Solution:\n    def two_sum(self, nums, target):\n        "
            "return next([i, j] for j in range(len(nums)) for i in range(j) "
            "if nums[i] + nums[j] == target)",
            1.0,
        ),
    ],
    ids=["stdio-ok", "stdio-wrong", "stdio-json", "call-ok", "call-wrong", "leetcode-class"],
)
def test_correct_solutions_score_1_and_wrong_ones_0(truth, code, expected) -> None:
    out = code_score("codecontests", fence(code), truth, sandbox=BOX)
    assert out["score"] == expected and out["format_ok"] is True


def test_fraction_mode_and_sample_time_limit() -> None:
    half = "a, b = map(int, input().split())\nprint(a + b if a else 1)"
    out = code_score("taco", fence(half), STDIO, sandbox=BOX, score_mode="fraction")
    assert out["score"] == pytest.approx(2 / 3) and out["passed"] == 2 and out["acc"] == 0.0
    # each test sleeps 1.6 s: the first ends inside the 3 s sample deadline even with a
    # slow start-up on a loaded machine, the second cannot (3.2 s of sleep alone)
    slow = "import time\ntime.sleep(1.6)\n" + STDIO_OK
    box = {**BOX, "limits": {**LIMITS, "wall_time_s": 5.0}, "sample_timeout_s": 3.0}
    out = code_score("taco", fence(slow), STDIO, sandbox=box, score_mode="fraction")
    assert out["passed"] == 1 and out["score"] == pytest.approx(1 / 3)  # 2 of 3 tests not run


def test_roll_pytest_assert_and_input_cases() -> None:
    pytest_cases = json.dumps([{"assert_code": "def test_a():\n    assert double(2) == 4\n"}])
    extra = {"case_type": "pytest", "test_cases": pytest_cases, "test_case_function": " "}
    ok = code_score("KodCode", fence("def double(x):\n    return 2 * x"), "", extra, sandbox=BOX)
    bad = code_score("KodCode", fence("def double(x):\n    return x"), "", extra, sandbox=BOX)
    assert (ok["score"], bad["score"]) == (1.0, 0.0)
    asserts = {"case_type": "assert", "test_cases": [{"assert_code": "assert double(3) == 6"}]}
    assert (
        code_score("k", fence("def double(x):\n    return 2 * x"), "", asserts, sandbox=BOX)[
            "score"
        ]
        == 1.0
    )
    io = {"case_type": "input", "test_cases": [{"stdin": "4 5\n", "expected_stdout": "9\n"}]}
    assert code_score("k", fence(STDIO_OK), "", io, sandbox=BOX)["score"] == 1.0
    with pytest.raises(ValueError, match="case_type 'text' is not supported"):
        code_score(
            "k", fence(STDIO_OK), "", {"case_type": "text", "test_cases": ["x"]}, sandbox=BOX
        )


def test_code_extraction_and_output_comparison() -> None:
    text = (
        "<think>```python\nprint(1)\n```</think> answer:\n```py\nprint(2)\n```\n```\nprint(3)\n```"
    )
    assert extract_code(text) == ("print(3)\n", "python")
    assert extract_code("no fence here") == (None, "python")
    assert extract_code("```cpp\nint main(){}\n```") == ("int main(){}\n", "cpp")
    assert stdout_matches("3 \n\n", "3") and stdout_matches("0.3333333", "0.33333334")
    assert not stdout_matches("3 4", "3") and not stdout_matches("1.5", "1.6")
    none = code_score("apps", "print(3) without a fence", STDIO, sandbox=BOX)
    assert none["score"] == 0.0 and none["format_ok"] is False
    cpp = code_score("apps", fence("int main(){}", "cpp"), STDIO, sandbox=BOX)
    assert cpp["score"] == 0.0 and cpp["format_ok"] is False  # a Python task answered in C++


def test_unreadable_test_cases_raise() -> None:
    with pytest.raises(ValueError, match="ground_truth must hold test cases"):
        code_score("apps", fence(STDIO_OK), "42", sandbox=BOX)
    with pytest.raises(ValueError, match="2 inputs for 1 outputs"):
        code_score("apps", fence(STDIO_OK), {"inputs": ["1", "2"], "outputs": ["1"]}, sandbox=BOX)


def test_scorer_runs_code_in_parallel_workers_and_records_bad_rows(tokenizer) -> None:
    responses = [fence(STDIO_OK), fence(STDIO_WRONG), fence(CALL_OK), fence(STDIO_OK)]
    truths = [STDIO, STDIO, CALL, "not test cases"]
    batch = make_batch(
        tokenizer, ["q"] * 4, ["x"] * 4, data_source=["apps"] * 4, ground_truth=truths
    )
    config = RewardConfig(
        function="code", num_workers=2, timeout_s=30.0, sandbox_limits=SandboxLimitsConfig(**LIMITS)
    )
    with RewardScorer(config) as scorer:
        specs = [scorer.spec_for(None)] * 4
        results = scorer._run(specs, ["apps"] * 4, responses, truths, [None] * 4, [{}] * 4)
        assert len(scorer.executor.worker_pids) == 2  # the samples ran in two workers
    assert [r.kind for r in results] == ["ok", "ok", "ok", "error"]
    assert [r.value["score"] for r in results[:3]] == [1.0, 0.0, 1.0]
    assert "ground_truth must hold test cases" in results[3].reason
    assert batch.objects["data_source"] == ["apps"] * 4


def test_check_refuses_the_code_reward_without_a_sandbox(monkeypatch) -> None:
    monkeypatch.setattr(sandbox_module, "_probe_bwrap", lambda: "bubblewrap is not installed")
    with pytest.raises(
        ConfigError, match=r"reward.sandbox: .*bubblewrap is not installed.*sandbox=none"
    ):
        check_rewards(RewardConfig(function="code"))
    routed = RewardConfig(routes={"c": RewardRoute(function="code", tags=["code"])})
    with pytest.raises(ConfigError, match="reward.sandbox"):
        check_rewards(routed)
    check_rewards(RewardConfig(function="code", sandbox="none"))  # explicit opt-out
    check_rewards(RewardConfig(function="gsm8k"))  # no code reward: nothing to check
    with pytest.raises(ConfigError, match="reward.sandbox_url"):
        check_rewards(RewardConfig(function="code", sandbox="sandbox_fusion"))


def test_unsandboxed_runner_scores_the_same() -> None:
    box = {**BOX, "name": "none"}
    assert code_score("apps", fence(STDIO_OK), STDIO, sandbox=box)["score"] == 1.0
    assert code_score("apps", fence(CALL_WRONG), CALL, sandbox=box)["score"] == 0.0


# --------------------------------------------------------------------------- SandboxFusion


class _FusionHandler(BaseHTTPRequestHandler):
    """SandboxFusion's POST /run_code, answered by running Python in a temp dir."""

    requests: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        with tempfile.TemporaryDirectory() as tmp:
            for name, data in (body.get("files") or {}).items():
                Path(tmp, name).write_bytes(base64.b64decode(data))
            Path(tmp, "main.py").write_text(body["code"])
            try:
                proc = subprocess.run(
                    [sys.executable, "main.py"],
                    cwd=tmp,
                    input=body.get("stdin") or "",
                    capture_output=True,
                    text=True,
                    timeout=body["run_timeout"],
                )
                run = {
                    "status": "Finished",
                    "return_code": proc.returncode,
                    "stdout": proc.stdout,
                    "stderr": proc.stderr,
                    "execution_time": 0.1,
                }
            except subprocess.TimeoutExpired:
                run = {
                    "status": "TimeLimitExceeded",
                    "return_code": None,
                    "stdout": "",
                    "stderr": "",
                }
        ok = run["status"] == "Finished" and run["return_code"] == 0
        answer = {
            "status": "Success" if ok else "Failed",
            "message": "",
            "run_result": run,
            "compile_result": None,
        }
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def fusion_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FusionHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _FusionHandler.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_sandbox_fusion_client_against_a_local_server(fusion_url) -> None:
    box = {
        "name": "sandbox_fusion",
        "url": fusion_url + "/run_code",
        "limits": LIMITS,
        "sample_timeout_s": 20.0,
    }
    assert code_score("apps", fence(STDIO_OK), STDIO, sandbox=box)["score"] == 1.0
    assert code_score("apps", fence(STDIO_WRONG), STDIO, sandbox=box)["score"] == 0.0
    assert code_score("apps", fence(CALL_OK), CALL, sandbox=box)["score"] == 1.0
    sent = _FusionHandler.requests[0]
    assert sent["language"] == "python" and sent["stdin"] == "1 2\n"
    assert sent["run_timeout"] == LIMITS["wall_time_s"]
    assert sent["memory_limit_MB"] == LIMITS["memory_mb"]
    assert "solution.py" in _FusionHandler.requests[-1]["files"]  # call-based harness


# --------------------------------------------------------------------------- IFEval


def test_ifeval_row_scores_per_instruction() -> None:
    truth = {
        "instruction_id_list": [
            "punctuation:no_comma",
            "keywords:existence",
            "detectable_format:title",
        ],
        "kwargs": [{}, {"keywords": ["apple"]}, {}],
    }
    assert ifeval_score("ifeval", "<<Pie>> I like apple pie.", truth)["score"] == 1.0
    two = ifeval_score("ifeval", "<<Pie>> I like apple, pie.", json.dumps(truth))
    assert two["score"] == pytest.approx(2 / 3) and two["followed"] == 2
    one = ifeval_score("ifeval", "I like pears, a lot.", truth)
    assert one["score"] == pytest.approx(0.0) and one["instructions"] == 3
    strict = ifeval_score("ifeval", "<<Pie>> I like apple, pie.", truth, score_mode="all")
    assert strict["score"] == 0.0
    in_extra = ifeval_score(
        "ifeval",
        "apple",
        None,
        {"instruction_id_list": ["keywords:existence"], "kwargs": [{"keywords": ["apple"]}]},
    )
    assert in_extra["score"] == 1.0
    with pytest.raises(ValueError, match="unknown instruction id"):
        ifeval_score("ifeval", "x", {"instruction_id_list": ["nope:x"], "kwargs": [{}]})


def test_ifeval_check_without_nltk_data_names_the_download(monkeypatch) -> None:
    import nltk

    def missing(*args, **kwargs):
        raise LookupError("Resource punkt not found")

    monkeypatch.setattr(nltk.data, "load", missing)
    from if_verifiable.ifeval import instructions_util

    instructions_util._get_sentence_tokenizer.cache_clear()
    truth = {
        "instruction_id_list": ["length_constraints:number_sentences"],
        "kwargs": [{"num_sentences": 1, "relation": "at least"}],
    }
    with pytest.raises(RuntimeError, match="nltk.downloader punkt punkt_tab"):
        ifeval_score("ifeval", "One. Two.", truth)
    instructions_util._get_sentence_tokenizer.cache_clear()


def test_ifeval_roll_func_name_rows() -> None:
    exactly_two = json.dumps({"func_name": "verify_keyword_frequency", "word": "cat", "N": 2})
    assert ifeval_score("ifeval", "cat and cat", exactly_two)["score"] == 1.0
    assert ifeval_score("ifeval", "cat and cat and cat", exactly_two)["acc"] == 0.0
    # ROLL adds its repetition penalty: -0.5 · (1 - distinct 3-grams / 3-grams)
    assert ifeval_score("ifeval", "cat and cat and cat", exactly_two)["score"] == pytest.approx(
        -1 / 6
    )
    around = {"func_name": "validate_word_constraint", "N": 10, "quantifier": "around"}
    assert ifeval_score("ifeval", " ".join(["w"] * 11), around)["acc"] == 1.0
    assert ifeval_score("ifeval", " ".join(["w"] * 13), around)["acc"] == 0.0
    assert (
        ifeval_score("ifeval", "b", {"func_name": "validate_choice", "options": ["a", "b"]})["acc"]
        == 1.0
    )
    with pytest.raises(ValueError, match="unknown func_name 'nope'"):
        ifeval_score("ifeval", "x", {"func_name": "nope"})


# --------------------------------------------------------------------------- judge


def test_judge_parsers() -> None:
    assert parse_verdict("YES", "yes_no", 10) == 1.0
    assert parse_verdict("**No**, it does not match", "yes_no", 10) == 0.0
    assert parse_verdict("Score: 7", "score", 10) == pytest.approx(0.7)
    assert parse_verdict("rating=4/5", r"rating=(\d)", 5) == pytest.approx(0.8)
    for text, parser in (("maybe", "yes_no"), ("great answer", "score")):
        with pytest.raises(ValueError):
            parse_verdict(text, parser, 10)


class _Echo:
    """A judge engine that answers from a table (the prompt's response decides)."""

    def __init__(self) -> None:
        self.seen: list[list[dict[str, str]]] = []

    def complete(self, conversations):
        self.seen += conversations
        return [
            "YES" if "Paris" in c[0]["content"].split("Reference")[0] else "hmm"
            for c in conversations
        ]

    def close(self) -> None:
        pass


def test_judge_scores_and_records_unparsable_verdicts(tokenizer) -> None:
    batch = make_batch(
        tokenizer,
        ["q1", "q2", "q3"],
        ["Paris", "Berlin", "Paris"],
        data_source=["geo"] * 3,
        ground_truth=["Paris"] * 3,
        raw_prompt=[[{"role": "user", "content": "Capital of France?"}]] * 3,
    )
    config = RewardConfig(function="llm_judge", num_workers=0, judge=JudgeConfig(model_path="m"))
    engine = _Echo()
    with RewardScorer(config, judge=engine) as scorer:
        scores, _, metrics, failures = scorer.score_batch(batch, tokenizer)
    assert scores.tolist() == [1.0, 0.0, 1.0]
    assert [f.index for f in failures] == [1] and failures[0].kind == "invalid"
    assert "neither YES nor NO" in failures[0].reason
    assert "Capital of France?" in engine.seen[0][0]["content"]
    assert metrics["train/reward_failures"] == 1


def test_judge_config_errors() -> None:
    with pytest.raises(ConfigError, match="reward.judge.model_path"):
        check_rewards(RewardConfig(function="llm_judge"))
    bad = JudgeConfig(model_path="m", prompt_template="{question} {answer}")
    with pytest.raises(ConfigError, match=r"prompt_template: uses \{answer\}"):
        LLMJudge(bad, _Echo())
    with pytest.raises(ConfigError, match="has no group"):
        check_rewards(
            RewardConfig(function="llm_judge", judge=JudgeConfig(model_path="m", parser="x+"))
        )


# --------------------------------------------------------------------------- failure guard


def _failures(n: int) -> list[RewardFailure]:
    return [
        RewardFailure(i, "my/data", "auto", "error", "KeyError: boom\nline two") for i in range(n)
    ]


def test_failure_guard_stops_after_consecutive_failed_steps() -> None:
    guard = FailureGuard(0.5, 2)
    guard.observe(8, _failures(8))
    guard.observe(8, _failures(4))  # exactly half: not a failed step, the streak resets
    guard.observe(8, _failures(5))
    with pytest.raises(RewardFailureError) as err:
        guard.observe(8, _failures(8))
    message = str(err.value)
    assert "\n" not in message and "8/8 samples in 2 training steps" in message
    assert "data_source 'my/data', reward auto: KeyError: boom line two" in message
    never = FailureGuard(0.5, 0)
    for _ in range(5):
        never.observe(4, _failures(4))
