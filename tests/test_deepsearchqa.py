"""DeepSearchQA (L3) through the real evaluation path: the generated knowledge base and questions,
the splits, the ReAct protocol, the search tool, both gradings and the scorer.

Scripted policies stand in for a model: an oracle that answers every question with its gold
answer at once must score 100 (accuracy and official F1), a nonsense policy 0. Scripted judges
stand in for an LLM judge. The held-out questions never reach a workspace."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from rlbench.fileio.jsonio import read_jsonl
from rlbench.scoring.judges import Answer, load_judge
from rlbench.tasks import get_task
from rlbench.tasks.base import EvalContext, new_salt, public_metrics, salt_fingerprint
from rlbench.tasks.deepsearchqa import grading, public
from rlbench.tasks.deepsearchqa.kb import build_kb, candidates, questions
from rlbench.tasks.deepsearchqa.rollout import play_questions

REPO = Path(__file__).resolve().parents[1]


def settings(**overrides) -> dict:
    base = {
        "name": "deepsearchqa",
        "module": "deepsearchqa",
        "level": "L3",
        "source": "offline",
        "metric": "accuracy",
        "train_size": 30,
        "eval_size": 40,
        "data_seed": 0,
        "kb_size": 120,
        "grader_noise_repeats": 3,
        "environment": {"max_steps": 6},
        "judge": {"backend": "match", "model": "string-match"},
        "search": {"provider": "auto", "api_key_var": "SERPAPI_KEY", "max_results": 3, "timeout_s": 10},
    }
    return {**base, **overrides}


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepsearchqa")
    task, salt = get_task(settings()), new_salt()
    built = {split: root / "levels" / split for split in ("train", "heldout")}
    manifests = {split: task.build_games(settings(), split, built[split], salt=salt) for split in built}
    train_dir, eval_dir = root / "data" / "train", root / "data" / "eval"
    train_manifest = task.prepare_train(settings(), train_dir, sources={"train_games": built["train"]})
    eval_manifest = task.prepare_eval(settings(), train_dir, eval_dir, salt=salt, sources={"heldout_games": built["heldout"]})
    return {"task": task, "salt": salt, "built": built, "manifests": manifests, "train": train_dir, "eval": eval_dir,
            "train_manifest": train_manifest, "eval_manifest": eval_manifest}  # fmt: skip


class OraclePolicy:
    """Searches for the question once, then answers with its gold answer, each action on the
    Thought's line."""

    name = "oracle"

    def __init__(self, rows: list[dict]):
        self.gold = {row["problem"]: row["answer"] for row in rows}

    def generate(self, prompts, max_new_tokens, stop):
        out = {}
        for key, prompt in prompts.items():
            problem = re.search(r"\nQuestion: (.*)\n", prompt).group(1)
            if "\nObservation: " not in prompt:
                out[key] = f" Let me look. Action: search[{problem}]"
            else:
                assert " | " in prompt.split("\nObservation: ")[1]  # the knowledge base's top pages
                out[key] = f" I know it. Action: answer[{self.gold[problem]}]"
        return out


class NonsensePolicy:
    name = "nonsense"

    def generate(self, prompts, max_new_tokens, stop):
        return {key: " Maybe the weather. Action: answer[purple elephants]" for key in prompts}


class Scripted:
    """Returns the next scripted completion for every prompt, recording what it was asked."""

    def __init__(self, completions: list):
        self.completions = list(completions)
        self.calls: list[tuple[int, list[str]]] = []

    def __call__(self, prompt, max_tokens, stop):
        self.calls.append((max_tokens, list(stop)))
        return self.completions.pop(0)


class StubTool:
    def __init__(self):
        self.queries: list[tuple[str, str]] = []

    def search(self, query):
        self.queries.append(("search", query))
        return f"results for {query}"


def evaluate(splits, backend, **overrides):
    ctx = EvalContext(settings(**overrides), model_dir=None, eval_dir=splits["eval"], backend=backend)
    try:
        return splits["task"].evaluate(ctx)
    finally:
        ctx.close()


# -- knowledge base and questions ----------------------------------------------------------------


def test_knowledge_base_and_questions_are_deterministic_and_answerable():
    kb, again = build_kb(0, 120), build_kb(0, 120)
    assert kb.pages == again.pages and build_kb(1, 120).pages != kb.pages
    assert len(kb.pages) == 120 and len({page["title"] for page in kb.pages}) == 120
    titles = [page["title"].lower() for page in kb.pages]
    assert not any(a != b and a in b for a in titles for b in titles)  # a name found means one entity
    rows = questions(kb, 0, 60)
    assert rows == questions(kb, 0, 60) and rows != questions(kb, 1, 60)
    text = " ".join(f"{page['title']} {page['text']}" for page in kb.pages)
    for row in rows:
        assert all(item in text for item in row["gold_items"]), row
        assert row["answer"] == (", ".join(row["gold_items"]) or "None")
        assert "Answer" not in row["problem"]
    types = {row["answer_type"] for row in rows}
    assert types == {public.SINGLE, public.SET}
    assert any(row["answer"] == "None" and row["answer_type"] == public.SET for row in rows)
    assert len({row["problem_category"] for row in rows}) >= 4
    problems = [c.problem for c in candidates(kb)]
    assert len(problems) == len(set(problems))


def test_default_sizes_give_disjoint_splits_with_empty_gold_questions():
    kb = build_kb(0, 400)
    train = questions(kb, 0, 100)
    heldout = questions(kb, 12345, 200, exclude=train)
    assert len(heldout) == 200 and sum(row["answer"] == "None" for row in heldout) == 6
    assert 60 <= sum(row["answer_type"] == public.SINGLE for row in heldout) <= 80
    assert not {(r["template"], r["anchor"]) for r in train} & {(r["template"], r["anchor"]) for r in heldout}
    assert max(len(page["text"]) for page in kb.pages) <= public.PAGE_CHARS


def test_heldout_questions_never_ask_a_training_question(splits):
    train = list(read_jsonl(splits["built"]["train"] / "questions.jsonl"))
    heldout = list(read_jsonl(splits["built"]["heldout"] / "questions.jsonl"))
    assert len(train) == 30 and len(heldout) == 40
    assert not {row["problem"] for row in train} & {row["problem"] for row in heldout}
    assert not {(r["template"], r["anchor"]) for r in train} & {(r["template"], r["anchor"]) for r in heldout}
    assert splits["manifests"]["heldout"]["salt_sha256"] == salt_fingerprint(splits["salt"])
    assert splits["eval_manifest"]["salt_sha256"] == salt_fingerprint(splits["salt"])
    assert splits["eval_manifest"]["train_eval_overlap"] == 0 and splits["eval_manifest"]["eval_empty_gold"] >= 1
    # The same knowledge base on both sides; the held-out questions depend on the salt.
    assert (splits["train"] / "kb.jsonl").read_bytes() == (splits["eval"] / "kb.jsonl").read_bytes()
    other = splits["task"].build_games(settings(), "heldout", splits["built"]["heldout"].parent / "other", salt=new_salt())
    assert other["summary"]["questions"] == 40
    other_rows = list(read_jsonl(splits["built"]["heldout"].parent / "other" / "questions.jsonl"))
    assert [r["problem"] for r in other_rows] != [r["problem"] for r in heldout]
    with pytest.raises(ValueError, match="salt"):
        splits["task"].build_games(settings(), "heldout", splits["built"]["heldout"].parent / "nosalt")


def test_heldout_questions_never_reach_a_workspace(splits, tmp_path):
    from rlbench.agent_run.workspace import prepare_workspace

    workspace, model = tmp_path / "ws", tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    prepare_workspace(workspace, splits["task"], settings(), model, "org/base", splits["train"])
    everything = "\n".join(path.read_text(errors="replace") for path in workspace.rglob("*") if path.is_file())
    heldout = list(read_jsonl(splits["eval"] / "eval.jsonl"))
    assert not [row["problem"] for row in heldout if row["problem"] in everything]
    assert (workspace / "task.py").read_bytes() == Path(public.__file__).read_bytes()
    # task.py carries RD-Agent's prompt strings: its MIT notice goes with them.
    assert (workspace / "LICENSE-RD-Agent-prompts").read_text().startswith("MIT License")
    assert (workspace / "data" / "kb.jsonl").is_file() and len(list(read_jsonl(workspace / "data" / "train.jsonl"))) == 30
    description = (workspace / "description.md").read_text()
    assert "DeepSearchQA" in description and "Thought's own line" in description
    assert set(next(read_jsonl(workspace / "data" / "train.jsonl"))) == set(
        ["id", "problem", "problem_category", "answer", "answer_type", "gold_items"]
    )


# -- the search tool and the protocol ------------------------------------------------------------


def test_search_tool_finds_pages_and_opens_them():
    kb = build_kb(0, 120)
    tool = public.SearchTool(kb.pages)
    company, facts = next(iter(kb.companies.items()))
    results = tool.search(f"{company} founded")
    assert results.split(" | ")[0].startswith(f"{company}: ") and facts["founder"] in results
    assert len(results.split(" | ")) <= 3
    assert tool.search("zzzqqq xyzzy") == public.NO_RESULTS and tool.search("the of") == public.NO_RESULTS
    assert facts["hq"] in tool.open(company.upper()) and tool.open("Nowhere Page").startswith("No page titled")


def test_prompt_shows_the_answer_type_unless_hidden():
    shown = public.episode_start("Who?", public.SINGLE).request.prompt
    hidden = public.episode_start("Who?", prompt=public.HIDE_ANSWER_TYPE).request.prompt
    assert shown.startswith(public.REACT_SYSTEM_PROMPT) and "open[" not in shown
    assert shown.endswith("\n\nQuestion: Who?\nAnswer type: Single Answer\n\nThought:")
    assert hidden.endswith("\n\nQuestion: Who?\n\nThought:") and "Answer type" not in hidden
    assert public.STOP == ["\nAction:", "\nThought:", "\nObservation:"]


def test_search_on_the_thought_line_then_answer():
    tool = StubTool()
    model = Scripted([" Need the founder. Action: search[Velm Works founder] and more", " Found it. Action: answer[Tel Varo]"])
    answer, episode = public.play("Who founded Velm Works?", model, tool, public.SINGLE)
    assert answer == "Tel Varo" and episode.request.end == "answer" and episode.steps == 2
    assert tool.queries == [("search", "Velm Works founder")] and episode.searches == 1
    assert "\nObservation: results for Velm Works founder\nThought: Found it." in episode.prompt
    assert model.calls == [(256, public.STOP)] * 2


def test_an_action_on_its_own_line_is_cut_by_the_stop_and_the_answer_forced():
    # A generator stops at "\nAction:", so a newline-prefixed action never reaches the loop.
    tool = StubTool()
    model = Scripted([" I should search for it.", " Tel Varo"])
    answer, episode = public.play("Who founded Velm Works?", model, tool, public.SINGLE)
    assert answer == "Tel Varo" and episode.request.end == "forced" and tool.queries == []
    assert model.calls == [(256, public.STOP), (128, ["]"])]
    assert episode.prompt.endswith("I should search for it.\nAction: answer[")


def test_placeholder_answer_is_refused_and_the_step_limit_falls_back_to_the_last_answer():
    model = Scripted([" Action: answer[your final answer]"] + [" Hmm. Action: search[Velm Works] Action: answer[Ana Kess]"] * 5)
    answer, episode = public.play("Q?", model, StubTool(), public.SET)
    assert "\nThat is not a valid answer. Please think again.\nThought:" in episode.prompt
    assert episode.steps == 6 and episode.request.end == "max_steps" and answer == "Ana Kess" and episode.searches == 5
    answer, episode = public.play("Q?", Scripted([" Action: search[x]"] * 6), StubTool(), public.SET)
    assert answer == "I don't know" and episode.request.end == "max_steps" and episode.searches == 6
    answer, episode = public.play("Q?", Scripted([" Action: search[x]", None]), StubTool(), public.SET)
    assert answer == "I don't know" and episode.request.end == "context"
    # open[] is no action of the protocol (the reference has none): the answer is forced.
    answer, episode = public.play("Q?", Scripted([" Action: open[Velm Works]", "x"]), StubTool(), public.SET)
    assert episode.request.end == "forced" and answer == "x"


def test_lockstep_batches_by_request_and_keeps_at_most_max_live():
    class Recorder:
        def __init__(self):
            self.batches, self.released = [], []

        def generate(self, prompts, max_new_tokens, stop):
            self.batches.append((sorted(prompts), max_new_tokens))
            # "a" forces its answer (no action), "b" searches then answers, "c" answers at once.
            return {
                key: {"a": " thinking" if max_new_tokens == 256 else " A", "b": " Action: search[q]" if prompt.count("Observation") == 0 else " Action: answer[B]", "c": " Action: answer[C]"}[key]
                for key, prompt in prompts.items()
            }  # fmt: skip

        def release(self, key):
            self.released.append(key)

    generator = Recorder()
    episodes = play_questions({k: (f"{k}?", public.SINGLE) for k in "abc"}, generator, StubTool(), max_live=2)
    assert {key: e["answer"] for key, e in episodes.items()} == {"a": "A", "b": "B", "c": "C"}
    assert {key: e["end"] for key, e in episodes.items()} == {"a": "forced", "b": "answer", "c": "answer"}
    assert all(len(keys) <= 2 for keys, _ in generator.batches)
    assert generator.batches[0] == (["a", "b"], 256) and sorted(generator.released) == ["a", "b", "c"]
    assert (["a"], 128) in generator.batches  # the forced answer: a call of its own


# -- answer checks and grading -----------------------------------------------------------------


def test_string_match_follows_the_reference_and_handles_none_gold():
    assert public.string_match("It is Velmoria.", "Velmoria", public.SINGLE)
    assert public.string_match("Varo", "Tel Varo", public.SINGLE)  # prediction inside the gold
    assert not public.string_match("a", "Tel Varo", public.SINGLE) and not public.string_match("", "Tel Varo", public.SINGLE)
    assert public.string_match("B, A and C extra", "A, B", public.SET)  # extras are not penalised
    assert not public.string_match("A", "A, B", public.SET)
    for none in ("None", "none of them.", "No such companies", "N/A", "Nobody"):
        assert public.string_match(none, "None", public.SET) and public.string_match(none, None, public.SET)
    assert not public.string_match("Norway", "None", public.SET) and not public.string_match("", "None", public.SET)
    assert not public.string_match("None", "A, B", public.SET)


def test_official_metrics_on_hand_made_cases():
    partial = public.official_metrics({"Belgium": True, "France": True, "Spain": False}, ["Italy"])
    assert (partial["tp"], partial["fn"], partial["fp"]) == (2, 1, 1)
    assert partial["precision"] == pytest.approx(2 / 3) and partial["recall"] == pytest.approx(2 / 3)
    assert partial["f1"] == pytest.approx(2 / 3) and partial["partially_correct"]
    full = public.official_metrics({"A": True}, [])
    assert full["fully_correct"] and full["f1"] == 1.0 and not full["partially_correct"]
    extras = public.official_metrics({"A": True, "B": True}, ["C"])
    assert extras["correct_with_excessive_answers"] and not extras["fully_correct"]
    wrong = public.official_metrics({"A": False}, ["Z"])
    assert wrong["fully_incorrect"] and wrong["f1"] == 0.0
    empty = public.official_metrics({}, [])
    assert empty["fully_correct"] and empty["f1"] == 0.0  # the literal formula: no items, no F1
    assert public.official_metrics({}, ["X"])["correct_with_excessive_answers"]


def test_match_official_counts_items_and_extras():
    details, extras = grading.match_official("Tel Varo, Ana Kess and Bo Rin", "Tel Varo, Ana Kess", public.SET)
    assert details == {"Tel Varo": True, "Ana Kess": True} and extras == ["Bo Rin"]
    assert grading.match_official("Varos Lab", "Varo", public.SINGLE)[0] == {"Varo": False}
    assert grading.match_official("Washington, D.C.", "Washington, D.C.", public.SINGLE) == ({"Washington, D.C.": True}, [])
    assert grading.match_official("None.", "None", public.SET) == ({"None": True}, [])
    assert grading.match_official("Tel Varo", "None", public.SET) == ({"None": False}, ["Tel Varo"])


def test_verdict_and_official_parsers():
    # The reference's reading: the first line stripped of ".!,;:" and whitespace (not of "*" or quotes).
    assert grading.parse_verdict("Correct.\nBecause...") and not grading.parse_verdict("**correct**")
    assert not grading.parse_verdict("incorrect") and not grading.parse_verdict("The answer is correct")
    assert grading.parse_verdict("") is None and grading.parse_verdict(" \n") is None  # the reference falls back
    fenced = 'Here you go:\n```json\n{"explanation": "x", "correctness_details": {"A": true, "B": "false"}, "excessive_answers": ["C"]}\n```'
    assert grading.parse_official(fenced) == ({"A": True, "B": False}, ["C"])
    assert grading.parse_official("no json here") is None
    assert grading.parse_official('{"explanation": "x"}') is None
    assert grading.parse_official('{"correctness_details": {"A": "maybe"}, "excessive_answers": []}') is None
    messages = grading.verdict_messages(public.SET, "A, B", "A")
    assert messages[0] == {"role": "system", "content": "You are a strict answer evaluator."}
    assert messages[1]["content"].endswith('Reply with ONLY "correct" or "incorrect". No explanation.')
    official = grading.official_messages("Which?", public.SET, "A, B", "A")[0]["content"]
    assert "<prompt>\nWhich?\n</prompt>" in official and "Prompt Type: Set Answer" in official
    assert official.endswith("<response>\nA\n</response>\n\nRating:")


# -- the whole evaluation ------------------------------------------------------------------------


def test_oracle_scores_100_and_nonsense_0_with_the_match_judge(splits):
    rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))
    result = evaluate(splits, OraclePolicy(rows))
    assert result.primary == "accuracy" and result.score == 100.0 and result.n == 40
    assert result.metrics["official_f1"] == 100.0 and result.metrics["official_fully_correct"] == 100.0
    assert result.metrics["accuracy_single"] == 100.0 and result.metrics["accuracy_set"] == 100.0
    assert result.metrics["judge_backend"] == "match" and result.metrics["judge_failures"] == 0
    assert result.metrics["episode_ends"] == {"answer": 40} and result.metrics["mean_searches"] == 1
    assert result.metrics["mean_steps"] == 2 and result.metrics["context_exhausted"] == 0
    assert result.metrics["prompt"] == "reference" and result.metrics["search_provider"] == "offline"
    assert result.metrics["judge_model"] == "string-match" and result.metrics["judge_prompt"] is None
    public_view = public_metrics(result.to_dict())
    assert "items" not in public_view and public_view["metrics"]["official_f1"] == 100.0
    hidden = evaluate(splits, OraclePolicy(rows), prompt="hide_answer_type")
    assert hidden.score == 100.0 and hidden.metrics["prompt"] == "hide_answer_type"
    nonsense = evaluate(splits, NonsensePolicy())
    assert nonsense.score == 0.0 and nonsense.metrics["official_f1"] == 0.0
    assert nonsense.metrics["official_fully_incorrect"] == 100.0


def test_an_llm_judge_is_parsed_and_its_failures_fall_back_to_string_matching(splits, monkeypatch):
    rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))

    @dataclass
    class FakeJudge:
        backend: str = "openai"
        model: str = "fake"
        deterministic: bool = False

        def __post_init__(self):
            self.asked = []

        def text_decoding(self):
            return {"base_url": "https://example.invalid/v1", "temperature": 0.5, "top_p": 1.0}

        def ask(self, prompts, *, max_tokens, purpose, replicate=None):
            self.asked.append((purpose, len(prompts), max_tokens, replicate))
            answers = []
            for index, _ in enumerate(prompts):
                if index == 0:  # the first question's calls fail
                    answers.append(Answer(failure="timeout", detail="slow"))
                elif purpose == grading.VERDICT_PURPOSE:
                    answers.append(Answer(text="Incorrect" if index == 1 else "" if index == 3 else "correct\nfine"))
                elif index == 2:
                    answers.append(Answer(text="I cannot grade this"))
                else:
                    answers.append(Answer(text='```json\n{"explanation": "", "correctness_details": {"x": true}, "excessive_answers": ["y"]}\n```'))
            return answers

    import rlbench.scoring.judges

    judge = FakeJudge()
    monkeypatch.setattr(rlbench.scoring.judges, "load_judge", lambda *args, **kwargs: judge)
    llm = settings(judge={"backend": "openai", "model": "fake"})
    ctx = EvalContext(llm, model_dir=None, eval_dir=splits["eval"], backend=OraclePolicy(rows), replicate=2)
    try:
        result = splits["task"].evaluate(ctx)
    finally:
        ctx.close()
    assert [a[0] for a in judge.asked] == [grading.VERDICT_PURPOSE, grading.OFFICIAL_PURPOSE]
    assert judge.asked[0][1:] == (40, 1024, 2)
    # Questions 0 (failed call) and 3 (empty reply): fallback (oracle: correct); question 1:
    # "Incorrect"; the rest "correct".
    assert result.metrics["correct"] == 39 and result.metrics["judge_fallbacks"] == 2
    assert result.items[0]["verdict_source"] == "fallback" and not result.items[1]["correct"]
    # Official: questions 0 (failed call) and 2 (no JSON) by the match rules, the rest judged partial.
    assert result.metrics["official_fallbacks"] == 2
    assert result.metrics["official_correct_with_extras"] == pytest.approx(100 * 38 / 40)
    assert result.metrics["judge_failures"] == 4
    assert result.metrics["judge_failures_by_kind"] == {"timeout": 2, "unparsable": 2}
    assert result.metrics["judge_backend"] == "openai" and result.metrics["judge_model"] == "fake"
    assert result.metrics["judge_prompt"] == "reference" and result.metrics["judge_temperature"] == 0.5
    assert result.metrics["judge_prompt_sha256"] == grading.verdict_prompt_sha256("reference")


def test_match_judge_from_the_registry_answers_nothing():
    judge = load_judge({"backend": "match", "model": "string-match"})
    assert judge.backend == "match" and judge.deterministic


# -- sources and registry -------------------------------------------------------------------------


def test_hub_source_splits_as_the_reference(monkeypatch, tmp_path):
    import datasets

    records = [
        {"problem": f"Question {i}?", "problem_category": "History", "answer": None if i % 97 == 0 else f"A{i}, B{i}",
         "answer_type": "Set Answer" if i % 2 else "Single Answer"}
        for i in range(320)
    ]  # fmt: skip
    calls = []

    def fake_load(path, split):
        calls.append((path, split))
        return datasets.Dataset.from_list(records)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    hub = settings(source="hub", hub={"path": "google/deepsearchqa"}, train_size=100, eval_size=200)
    task = get_task(hub)
    train = task.build_games(hub, "train", tmp_path / "train")
    heldout = task.build_games(hub, "heldout", tmp_path / "heldout")
    assert calls[0] == ("google/deepsearchqa", "eval")
    assert train["summary"]["questions"] == 100 and heldout["summary"]["questions"] == 200
    order = datasets.Dataset.from_list(records).add_column("i", list(range(320))).shuffle(seed=42)["i"]
    train_rows = list(read_jsonl(tmp_path / "train" / "questions.jsonl"))
    heldout_rows = list(read_jsonl(tmp_path / "heldout" / "questions.jsonl"))
    assert [row["problem"] for row in train_rows] == [f"Question {i}?" for i in order[:100]]
    assert [row["problem"] for row in heldout_rows] == [f"Question {i}?" for i in order[100:300]]
    nones = [row for row in train_rows + heldout_rows if row["answer"] == "None"]
    assert nones and all(row["gold_items"] == [] for row in nones)
    task.prepare_train(hub, tmp_path / "t", sources={"train_games": tmp_path / "train"})
    manifest = task.prepare_eval(hub, tmp_path / "t", tmp_path / "e", sources={"heldout_games": tmp_path / "heldout"})
    assert manifest["eval_rows"] == 200 and "salt_sha256" not in manifest and not (tmp_path / "e" / "kb.jsonl").exists()

    def offline_load(path, split):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline_load)
    with pytest.raises(RuntimeError, match="google/deepsearchqa.*HF cache"):
        task.build_games(hub, "train", tmp_path / "x")


def test_registry_entry_names_the_task():
    entry = yaml.safe_load((REPO / "config" / "tasks" / "deepsearchqa.yaml").read_text())
    assert entry["module"] == "deepsearchqa" and entry["metric"] == "accuracy" and entry["level"] == "L3"
    task = get_task(entry)
    assert task.name == "deepsearchqa" and task.noise_repeats(entry) == 3
    assert "LLM judge (gpt-4o)" in task.describe(entry) and "open[" not in task.describe(entry)


def test_web_search_reads_serpapi_and_duckduckgo_answers_as_the_reference(monkeypatch):
    from rlbench.tasks.deepsearchqa.rollout import WebSearch, search_tool

    replies = {
        "serpapi": {"organic_results": [{"snippet": f"s{i}"} for i in range(5)]},
        "abstract": {"AbstractText": "An abstract.", "RelatedTopics": [{"Text": "t"}]},
        "topics": {"AbstractText": "", "RelatedTopics": [{"Topics": []}, {"Text": "t1"}, {"Text": "t2"}]},
        "nothing": {"AbstractText": "", "RelatedTopics": []},
    }
    asked = []

    def fake_get(self, url, params):
        asked.append((url, params))
        if params["q"] == "boom":
            raise TimeoutError("timed out")
        return replies["serpapi" if "serpapi" in url else params["q"]]

    monkeypatch.setattr(WebSearch, "_get", fake_get)
    serp = WebSearch("serpapi", "key")
    assert serp.search("anything") == "s0 | s1 | s2" and asked[-1][1] == {"q": "anything", "api_key": "key", "num": 3}
    ddg = WebSearch("duckduckgo")
    assert ddg.search("abstract") == "An abstract." and ddg.search("topics") == "t1"  # the first two topics; a group has no text
    assert ddg.search("nothing") == public.NO_RESULTS and ddg.search("boom") == "Search error: timed out"
    assert asked[-1][1] == {"q": "boom", "format": "json", "no_html": 1}
    # Many episodes stepping in threads, as a web search does.
    model = type("M", (), {"generate": lambda self, p, n, s: {k: " Action: search[topics]" if "Observation" not in v else " Action: answer[x]" for k, v in p.items()}})()
    played = play_questions({i: (f"{i}?", public.SET) for i in range(5)}, model, ddg, workers=3)
    assert all(e["answer"] == "x" and e["searches"] == 1 for e in played.values())
    monkeypatch.delenv("SERPAPI_KEY", raising=False)
    with pytest.raises(ValueError, match="SERPAPI_KEY"):
        search_tool(settings(source="hub", search={**settings()["search"], "provider": "serpapi"}), Path("."))
    with pytest.raises(ValueError, match="auto, serpapi or duckduckgo"):
        search_tool(settings(source="hub", search={**settings()["search"], "provider": "offline"}), Path("."))
    assert search_tool(settings(source="hub"), Path("."))[1] == "duckduckgo"  # auto without a key


def test_a_local_llm_judge_grades_through_the_judge_layer_and_its_cache(splits, tiny_model, tmp_path):
    """The offline LLM path: the tiny model reads both grading prompts (through Judge.ask, cached),
    its answers are parsed by the task's rules, and a rerun asks it nothing."""
    rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))[:6]
    eval_dir = tmp_path / "eval"
    eval_dir.mkdir()
    (eval_dir / "eval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (eval_dir / "kb.jsonl").write_bytes((splits["eval"] / "kb.jsonl").read_bytes())
    judge = {"backend": "local", "model": "tiny", "max_tokens": 8, "batch_size": 6}
    resources = {"judge_model_dir": tiny_model, "judgment_cache": tmp_path / "judgments"}

    def run():
        ctx = EvalContext(settings(eval_size=6, judge=judge), model_dir=None, eval_dir=eval_dir,
                          backend=OraclePolicy(rows), resources=resources)  # fmt: skip
        try:
            return splits["task"].evaluate(ctx), ctx.judge().stats
        finally:
            ctx.close()

    first, stats = run()
    assert first.n == 6 and first.metrics["judge_backend"] == "local"
    # 6 official gradings (each quotes its question) + the distinct verdict prompts: the yes/no
    # prompt shows no question, so two questions with the same gold answer ask it once.
    verdict_prompts = len({(row["answer_type"], row["answer"]) for row in rows})
    assert stats.judged == 6 + verdict_prompts and stats.cache_hits == 0
    # Whatever the tiny judge wrote, each question got a verdict: its own reading, or the fallback.
    # The tiny judge never writes "correct": the reference's rule reads a line as incorrect, and an
    # empty reply (no line) falls back to the string rules, which credit the oracle; it never
    # writes the rubric's JSON: each official grading is unparsable, counted, and decided by the
    # string rules instead (which credit the oracle in full).
    fallbacks = first.metrics["judge_fallbacks"]
    assert first.score == pytest.approx(100.0 * fallbacks / 6)
    assert all(item["correct"] == (item["verdict_source"] == "fallback") for item in first.items)
    assert first.metrics["official_fallbacks"] == 6
    assert first.metrics["judge_failures_by_kind"] == {"unparsable": 6 + fallbacks}
    assert first.metrics["official_f1"] == 100.0
    again, stats = run()
    assert stats.judged == 0 and stats.cache_hits == 12 and again.metrics == first.metrics
