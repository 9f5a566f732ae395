"""ROLL's env tool wrappers: the rewards of tool turns by hand, the python tool in the
sandbox, the search tool against a local BM25 retriever over a corpus shipped here."""

from __future__ import annotations

import json
import math

import pytest

from temper.config.errors import ConfigError
from temper.config.schema import EnvTagConfig, EnvToolWrapperConfig
from temper.envs import make_env, resolve_tag
from temper.envs.env_tools import PythonCodeTool, SearchTool
from temper.envs.retriever import BM25Index, bm25_scores, load_corpus, serve, tokenize
from temper.envs.tool_wrapper import LAST_CALL_NOTE, ToolEnvWrapper

CORPUS = [
    {"contents": "Eiffel Tower\nThe Eiffel Tower is a lattice tower in Paris, France."},
    {"contents": "Big Ben\nBig Ben is the nickname of the great bell of the clock in London."},
    {"title": "Colosseum", "text": "The Colosseum is an oval amphitheatre in Rome, Italy."},
]


@pytest.fixture
def math_file(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"problem": "What is 6 times 7?", "answer": "42"}))
    return path


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in CORPUS))
    return path


@pytest.fixture
def retriever(corpus_file):
    server, url = serve(BM25Index(load_corpus(corpus_file)))
    yield url
    server.shutdown()


def _math(math_file, **wrapper) -> ToolEnvWrapper:
    env = make_env("roll_math", dataset_name=str(math_file))
    return ToolEnvWrapper(env, [PythonCodeTool(timeout=5)], **wrapper)


def test_tool_rewards_by_hand(math_file) -> None:
    """tool_reward a = 0.1, tool_success_reward b = 0.5, two calls allowed: a successful
    call (a + b), a failed call (a, then the last-call note), a third call that goes to
    the env as an answer (no box: 0), so the episode returns 0.6 + 0.1 + 0 = 0.7."""
    env = _math(math_file, tool_reward=0.1, tool_success_reward=0.5, max_tool_uses=2)
    obs, info = env.reset(0)
    assert obs.startswith("What is 6 times 7?\n") and "<code>" in obs
    assert (info["tool_use_counter"], info["tool_success_counter"]) == (0, 0)
    o, r, term, trunc, info = env.step("Let me compute <code>print(6 * 7)</code> and see")
    assert o == "Code execution result: 42\n\n"
    assert (r, term, trunc) == (pytest.approx(0.6), False, False)
    o, r, term, _, info = env.step("<code>raise ValueError('boom')</code>")
    assert r == pytest.approx(0.1) and not term
    assert o.startswith("Code execution result: Traceback") and o.endswith(LAST_CALL_NOTE)
    assert (info["tool_use_counter"], info["tool_success_counter"]) == (2, 1)
    o, r, term, _, info = env.step("<code>print(1)</code>")  # no calls left: the env scores it
    assert (r, term, info["action_is_valid"]) == (0.0, True, False)
    assert info["tool_use_counter"] == 2


def test_a_correct_answer_after_a_call(math_file) -> None:
    env = _math(math_file, tool_reward=0.0, tool_success_reward=0.2, max_tool_uses=1)
    env.reset(0)
    assert env.step("<code>print(6*7)</code>")[1] == pytest.approx(0.2)
    _, r, term, _, info = env.step("So the answer is \\boxed{42}.")
    assert (r, term, info["success"]) == (1.0, True, True)


def test_python_tool_parsing_and_error_lines() -> None:
    tool = PythonCodeTool(timeout=5, keep_error_last_line=True)
    # the block that ends first is run; the parsed action ends with it
    code, upto = tool.parse("a ```python\nprint(1)\n``` b <code>print(2)</code>")
    assert code == "print(1)" and upto.endswith("```")
    out = tool.execute("<code>import sys; sys.exit('bad input')</code>")
    assert out.error and out.observation == "Code execution result: bad input\n"
    # a program missing its imports runs again with common ones prepended (as GEM does)
    out = tool.execute("<code>print(sqrt(16), Counter('aab')['a'])</code>")
    assert not out.error and out.observation.startswith("Code execution result: 4.0 2")
    assert not tool.execute("no code here").parsed
    assert tool.execute("<code>pass</code>").error  # printed nothing: a failed call


def test_bm25_by_hand() -> None:
    docs = [["a", "b"], ["b", "c", "c"]]
    # N=2, avgdl=2.5; idf(c) = ln(1 + (2-1+0.5)/(1+0.5)) = ln 2; f(c, D2) = 2, |D2| = 3
    norm = 1.5 * (1 - 0.75 + 0.75 * 3 / 2.5)
    expected = math.log(2) * 2 * 2.5 / (2 + norm)
    assert bm25_scores(["c"], docs) == [0.0, pytest.approx(expected)]
    assert tokenize("The Eiffel-Tower, 1889!") == ["the", "eiffel", "tower", "1889"]


def test_search_tool_against_the_local_retriever(retriever) -> None:
    tool = SearchTool(search_url=retriever, topk=2)
    assert tool.problem() is None
    out = tool.execute("<think>where?</think><search>tower in Paris</search> more text")
    assert out.parsed and not out.error
    assert out.parsed_action.endswith("</search>")
    assert out.observation.startswith("\n\n<information>Doc 1(Title: Eiffel Tower) The Eiffel")
    assert out.observation.endswith("</information>\n\n")
    assert tool.query("amphitheatre Rome")[0]["document"]["contents"].startswith("Colosseum\n")


def test_search_wrapper_rewards_and_an_unreachable_retriever(tmp_path, retriever) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"problem": "Where is the Eiffel Tower?", "answer": "Paris"}))
    qa = make_env("roll_qa", dataset_name=str(path), question_key="problem")
    env = ToolEnvWrapper(qa, [SearchTool(search_url=retriever)], tool_success_reward=0.3)
    env.reset(0)
    o, r, *_ = env.step("<search>Eiffel Tower</search>")
    assert r == pytest.approx(0.3) and "Paris" in o
    assert env.step("<answer>Paris</answer>")[1] == 1.0
    dead = SearchTool(search_url="http://127.0.0.1:9/retrieve", timeout=1)
    assert "does not answer" in str(dead.problem())
    env = ToolEnvWrapper(qa, [dead], tool_reward=0.05, tool_success_reward=0.3)
    env.reset(0)
    o, r, *_ = env.step("<search>x</search>")
    assert r == pytest.approx(0.05) and "[SearchTool Error:" in o  # a call, failed


def test_resolve_tag_builds_and_checks_the_wrapper(math_file) -> None:
    wrapper = EnvToolWrapperConfig(
        tools={"python_code": {"timeout": 5, "sandbox": "bwrap"}}, max_tool_uses=1
    )
    tag = EnvTagConfig(
        env_type="roll_math", env_config={"dataset_name": str(math_file)}, tool_wrapper=wrapper
    )
    env = resolve_tag("Math", tag).make()
    assert isinstance(env, ToolEnvWrapper) and env.max_tool_uses == 1
    bad = {
        "mcp": ({"mcp": {"server_url": "x"}}, "tools.mcp: the mcp tool cannot run here"),
        "typo": ({"pyton_code": {}}, "did you mean 'python_code'"),
        "arg": ({"python_code": {"timeut": 5}}, "tools.python_code.timeut: unknown argument"),
    }
    for tools, message in bad.values():
        tag.tool_wrapper = EnvToolWrapperConfig(tools=tools)
        with pytest.raises(ConfigError, match=message):
            resolve_tag("Math", tag)
    sokoban = EnvTagConfig(env_type="sokoban", tool_wrapper=wrapper)
    with pytest.raises(ConfigError, match="reads the actions the manager extracts"):
        resolve_tag("S", sokoban)


def test_the_manager_counts_tool_calls(math_file) -> None:
    from temper.config.schema import EnvManagerConfig
    from temper.envs import EnvManager

    wrapper = EnvToolWrapperConfig(tools={"python_code": {}}, tool_success_reward=0.5)
    tag = EnvTagConfig(
        env_type="roll_math",
        max_turns=4,
        env_config={"dataset_name": str(math_file)},
        tool_wrapper=wrapper,
    )
    manager = EnvManager(EnvManagerConfig(num_env_groups=1, group_size=1, tags=["M"]), {"M": tag})
    manager.reset(0)
    answers = ["<code>print(6*7)</code>", "<code>1/0</code>", "\\boxed{42}"]
    results = [manager.step([0], [a])[0] for a in answers]
    assert [r.reward for r in results] == [0.5, 0.0, 1.0]  # no format penalty on tool turns
    assert [r.done for r in results] == [False, False, True]
    stats = manager.episode_stats(0)
    assert (stats["tool_calls"], stats["tool_successes"], stats["success"]) == (2, 1, True)
    assert stats["return"] == 1.5
