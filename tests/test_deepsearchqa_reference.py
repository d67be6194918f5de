"""DeepSearchQA as the reference runs it: golden tests against RD-Agent's own output.

tests/fixtures/reference/deepsearchqa/reference_prompts.json holds what RD-Agent's code
(rdagent/scenarios/rl/autorl_bench/benchmarks/deepsearchqa/eval.py at commit 471eb30d, its
`_react_loop` and `_judge_answer`, with APIBackend's message builder) produced when run on fixed
inputs with a scripted model, a scripted search and scripted judge replies (its header says how).
Our protocol, replayed with the same scripted completions, must render the same prompts byte for
byte, end with the same answers, and our judge must send the same messages and read its replies
the same way. Also here: the registry's judge and search defaults, and that the sampled judge's
noise repeats are asked afresh."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlbench.scoring.judges import Answer, OpenAIJudge
from rlbench.tasks import get_task
from rlbench.tasks.deepsearchqa import grading, public
from rlbench.tasks.deepsearchqa.rollout import play_questions, search_tool

REPO = Path(__file__).resolve().parents[1]
FIXTURE = json.loads((REPO / "tests/fixtures/reference/deepsearchqa/reference_prompts.json").read_text())
COMMIT = "471eb30d1ec03f35631c532c58a52ce75d684037"


class Tool:
    """The scripted search the reference ran with."""

    def __init__(self):
        self.queries = []

    def search(self, query):
        self.queries.append(query)
        return f"Result one about {query} | Result two | Result three"


class Replay:
    """Returns the case's scripted completions in order, recording each request."""

    def __init__(self, completions):
        self.completions = list(completions)
        self.calls = []

    def __call__(self, prompt, max_tokens, stop):
        self.calls.append({"prompt": prompt, "max_tokens": max_tokens, "stop": list(stop)})
        return self.completions.pop(0)


def test_fixture_cites_the_reference():
    assert FIXTURE["source"]["commit"] == COMMIT and FIXTURE["source"]["repository"] == "microsoft/RD-Agent"
    assert "rdagent/scenarios/rl/autorl_bench/benchmarks/deepsearchqa/eval.py" in FIXTURE["source"]["files"]
    types = {case["answer_type"] for case in FIXTURE["episodes"].values()}
    assert types == {public.SINGLE, public.SET}


def test_preamble_is_the_references():
    assert public.REACT_SYSTEM_PROMPT == FIXTURE["react_system_prompt"]


@pytest.mark.parametrize("name", sorted(FIXTURE["episodes"]))
def test_episode_prompts_equal_the_references_byte_for_byte(name):
    case = FIXTURE["episodes"][name]
    model, tool = Replay(case["completions"]), Tool()
    answer, episode = public.play(case["question"], model, tool, case["answer_type"])
    expected = [{key: call[key] for key in ("prompt", "max_tokens", "stop")} for call in case["calls"]]
    assert model.calls == expected
    assert all(call["temperature"] == 0 for call in case["calls"])  # greedy, as our protocol says
    assert answer == case["answer"] and tool.queries == case["searches"] and not model.completions


def test_the_graders_lockstep_rollout_renders_the_same_prompts():
    cases = FIXTURE["episodes"]
    scripts = {name: list(case["completions"]) for name, case in cases.items()}
    seen = {name: [] for name in cases}

    class Generator:
        def generate(self, prompts, max_new_tokens, stop):
            for key, prompt in prompts.items():
                seen[key].append({"prompt": prompt, "max_tokens": max_new_tokens, "stop": list(stop)})
            return {key: scripts[key].pop(0) for key in prompts}

    played = play_questions(
        {name: (case["question"], case["answer_type"]) for name, case in cases.items()}, Generator(), Tool(), max_live=2
    )
    for name, case in cases.items():
        assert seen[name] == [{k: call[k] for k in ("prompt", "max_tokens", "stop")} for call in case["calls"]], name
        assert played[name]["answer"] == case["answer"]


def test_hide_answer_type_leaves_out_only_that_line():
    shown = public.first_prompt("Who?", public.SET)
    hidden = public.first_prompt("Who?", public.SET, public.HIDE_ANSWER_TYPE)
    assert shown == FIXTURE["react_system_prompt"] + "\n\nQuestion: Who?\nAnswer type: Set Answer\n\nThought:"
    assert hidden == shown.replace("\nAnswer type: Set Answer", "") and "Answer type" not in hidden
    assert public.first_prompt("Who?", None, public.HIDE_ANSWER_TYPE) == hidden
    with pytest.raises(ValueError, match="answer_type=row"):
        public.first_prompt("Who?")
    with pytest.raises(ValueError, match="reference, hide_answer_type"):
        public.first_prompt("Who?", public.SET, "no_such_prompt")


@pytest.mark.parametrize("name", sorted(FIXTURE["judgements"]))
def test_judge_messages_and_reading_are_the_references(name):
    case = FIXTURE["judgements"][name]
    predicted, gold, answer_type = case["predicted"], case["gold"], case["answer_type"]
    assert grading.verdict_messages(answer_type, gold, predicted) == case["messages"]
    assert grading.verdict_messages(answer_type, gold, predicted, "reference") == case["messages"]
    if case["reply"].startswith("<raises"):  # a failed call: the reference's string match
        verdict = None
    else:
        verdict = grading.parse_verdict(case["reply"])
    if verdict is None:
        verdict = public.string_match(predicted, gold, answer_type)
    assert verdict == case["correct"]


def test_paraphrase_judge_prompt_is_a_named_option():
    reference = grading.verdict_messages(public.SET, "A, B", "A")
    paraphrase = grading.verdict_messages(public.SET, "A, B", "A", "paraphrase")
    assert reference[0] == paraphrase[0] and reference[1] != paraphrase[1]
    assert paraphrase[1]["content"].startswith("Decide whether the predicted answer")
    assert grading.verdict_prompt_sha256("reference") != grading.verdict_prompt_sha256("paraphrase")
    assert grading.judge_prompt_variant({}) == "reference"
    with pytest.raises(ValueError, match="reference, paraphrase"):
        grading.judge_prompt_variant({"judge_prompt": "mine"})


def test_registry_defaults_to_the_papers_judge_with_the_references_settings():
    entry = yaml.safe_load((REPO / "config" / "tasks" / "deepsearchqa.yaml").read_text())
    judge = entry["judge"]
    assert (judge["backend"], judge["model"], judge["api_key_var"]) == ("openai", "gpt-4o", "OPENAI_API_KEY")
    assert judge["base_url"] == "https://api.openai.com/v1"
    assert judge["temperature"] == FIXTURE["judge_settings"]["chat_temperature"] == 0.5
    assert entry["judge_prompt"] == "reference" and entry["prompt"] == "reference"
    assert entry["search"]["provider"] == "auto" and entry["search"]["api_key_var"] == "SERPAPI_KEY"
    assert entry["grader_noise_repeats"] >= 3
    task = get_task(entry)
    assert "LLM judge (gpt-4o)" in task.describe(entry) and "Answer type: <answer_type>" in task.describe(entry)
    hidden = {**entry, "prompt": "hide_answer_type"}
    assert "Answer type: <answer_type>" not in task.describe(hidden) and '"hide_answer_type"' in task.describe(hidden)
    with pytest.raises(ValueError, match="hide_answer_type"):
        task.describe({**entry, "prompt": "hidden"})


def test_the_sampled_judge_asks_each_noise_repeat_afresh(tmp_path):
    """Temperature 0.5 samples: repeat k > 0 must not reuse repeat 0's cached answers."""
    calls = []

    class Counting(OpenAIJudge):
        def _complete_calls(self, prompts, max_tokens):
            calls.extend(prompts)
            return [Answer(text="correct") for _ in prompts]

    judge = Counting("gpt-4o", temperature=0.5, cache_dir=tmp_path / "cache")
    assert not judge.deterministic and judge.text_decoding()["temperature"] == 0.5
    prompt = [grading.verdict_messages(public.SINGLE, "Google", "Google")]
    for replicate in (0, 1, 2):
        judge.ask(prompt, max_tokens=1024, purpose=grading.VERDICT_PURPOSE, replicate=replicate)
    assert len(calls) == 3
    judge.ask(prompt, max_tokens=1024, purpose=grading.VERDICT_PURPOSE, replicate=1)  # a rerun: cached
    assert len(calls) == 3 and judge.stats.cache_hits == 1


def _hub(search: dict) -> dict:
    base = {"provider": "auto", "api_key_var": "SERPAPI_KEY", "max_results": 3, "timeout_s": 10}
    return {"source": "hub", "search": {**base, **search}}


def test_search_provider_auto_uses_serpapi_when_its_key_is_set(monkeypatch):
    monkeypatch.delenv("SERPAPI_KEY", raising=False)
    tool, provider = search_tool(_hub({}), Path("."))
    assert provider == "duckduckgo" and tool.provider == "duckduckgo"
    monkeypatch.setenv("SERPAPI_KEY", "k" * 16)
    tool, provider = search_tool(_hub({}), Path("."))
    assert provider == "serpapi" and tool.api_key == "k" * 16
    monkeypatch.delenv("SERPAPI_KEY")
    monkeypatch.setenv("MY_SERP", "x" * 16)
    assert search_tool(_hub({"api_key_var": "MY_SERP"}), Path("."))[1] == "serpapi"
    assert search_tool(_hub({"provider": "duckduckgo", "api_key_var": "MY_SERP"}), Path("."))[1] == "duckduckgo"
    with pytest.raises(ValueError, match="unknown search.provider"):
        search_tool(_hub({"provider": "bing"}), Path("."))
