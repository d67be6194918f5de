"""The task interface: a task is data + rollout + scorer, evaluated into a metrics dict.

A complete task is written here, in a test, the way a new task folder would write it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlbench.config import ConfigError, load_schema, validate
from rlbench.evaluation.evaluate import noise_summary
from rlbench.generation.backends import GenerationBackend, cut_at_stop
from rlbench.fileio.jsonio import write_jsonl
from rlbench.recording.provenance import provenance
from rlbench.tasks import get_task
from rlbench.tasks.base import EVAL_FILE, TRAIN_FILE, EvalContext, EvalResult, Task, public_metrics
from rlbench.tasks.parts import SingleTurn

REPO = Path(__file__).resolve().parents[1]


class Echo(GenerationBackend):
    """Answers every prompt with its last message's text, recording the calls."""

    name = "echo"

    def __init__(self):
        self.calls = []

    def generate_chat(self, conversations, max_new_tokens, stop=None):
        self.calls.append((len(conversations), max_new_tokens, stop))
        return [cut_at_stop(c[-1]["content"], stop) for c in conversations]


class LengthScorer:
    """Scores the share of samples longer than three characters; a second metric beside it."""

    def score(self, rows, samples, ctx):
        long = sum(len(s) > 3 for s in samples)
        return EvalResult(
            metrics={"long_rate": 100.0 * long / len(rows), "mean_length": sum(map(len, samples)) / len(rows)},
            primary="long_rate",
            n=len(rows),
            items=[{"id": r["id"], "sample": s} for r, s in zip(rows, samples)],
        )


class WordsTask(Task):
    name = "words"
    public_module_path = REPO / "scripts/rlbench/tasks/addition_control/public.py"

    def prepare_train(self, settings, train_dir):
        write_jsonl(Path(train_dir) / TRAIN_FILE, [{"id": "t0", "text": "train"}])
        return {}

    def prepare_eval(self, settings, train_dir, eval_dir, *, salt=None):
        write_jsonl(Path(eval_dir) / EVAL_FILE, [{"id": f"e{i}", "text": t} for i, t in enumerate(["ab", "abcd|x", "abcdef"])])
        return {}

    def describe(self, settings):
        return "# words"

    def rollout(self, settings):
        return SingleTurn(lambda row: [{"role": "user", "content": row["text"]}], 7, stop=["|"])

    def scorer(self, settings):
        return LengthScorer()


def test_evaluate_runs_the_rollout_then_the_scorer_with_phases(tmp_path):
    task = WordsTask()
    task.prepare(SETTINGS := {"name": "words"}, tmp_path, tmp_path)
    phases, backend = [], Echo()
    ctx = EvalContext(SETTINGS, None, tmp_path, on_phase=phases.append, backend=backend)
    result = task.evaluate(ctx)
    assert backend.calls == [(3, 7, ["|"])]  # one batched call, the stop strings passed on
    assert [item["sample"] for item in result.items] == ["ab", "abcd", "abcdef"]  # cut at the stop string
    assert result.primary == "long_rate" and result.score == pytest.approx(66.6667)
    assert result.metrics["mean_length"] == pytest.approx(4.0)
    assert phases == ["generating", "scoring"]
    data = result.to_dict(with_items=False)
    assert data == {"score": 66.6667, "primary_metric": "long_rate", "metrics": result.metrics, "n": 3}


@pytest.mark.parametrize(
    "metrics, primary, message",
    [
        ({"a": 1.0}, "b", "not among"),
        ({"a": float("nan")}, "a", "finite"),
        ({"a": "high"}, "a", "finite"),
        ({"a": 101.0}, "a", "outside"),
        ({"a": True}, "a", "finite"),
    ],
)
def test_eval_result_refuses_a_primary_metric_that_is_not_a_score(metrics, primary, message):
    with pytest.raises(ValueError, match=message):
        EvalResult(metrics=metrics, primary=primary, n=1)


def test_the_registry_metric_must_be_the_scorers_primary_metric():
    result = EvalResult(metrics={"accuracy": 50.0, "correct": 1}, primary="accuracy", n=2)
    result.check_metric({"name": "words", "metric": "accuracy"})
    with pytest.raises(ValueError, match=r"registry entry says metric: 'pass@1', but its scorer's primary metric is "
                       r"'accuracy'.*set `metric: accuracy` in config/tasks/words.yaml"):
        result.check_metric({"name": "words", "metric": "pass@1"})
    # A documented fallback (AlpacaEval: the win rate where no length-controlled GLM fits) stands for the metric.
    fallback = EvalResult(metrics={"win_rate": 40.0}, primary="win_rate", n=2, stands_for="length_controlled_winrate")
    fallback.check_metric({"name": "alpaca-eval", "metric": "length_controlled_winrate"})


def test_evaluate_model_refuses_a_registry_metric_its_scorer_does_not_report(tmp_path, monkeypatch):
    """The check runs at every evaluation (grader, baseline, final): a mismatch is a clear error, not a Δ
    silently computed on another metric than the registry names."""
    import rlbench.generation.backends
    import rlbench.tasks
    from rlbench.evaluation.evaluate import evaluate_model

    task = WordsTask()
    task.prepare({"name": "words"}, tmp_path, tmp_path)
    monkeypatch.setattr(rlbench.tasks, "get_task", lambda settings: task)
    monkeypatch.setattr(rlbench.generation.backends, "load_backend", lambda *args, **kwargs: Echo())
    assert evaluate_model({"name": "words", "metric": "long_rate"}, tmp_path, tmp_path, {})["score"] == 66.6667
    with pytest.raises(ValueError, match="registry entry says metric: 'accuracy', but its scorer's primary metric is 'long_rate'"):
        evaluate_model({"name": "words", "metric": "accuracy"}, tmp_path, tmp_path, {})


def test_public_metrics_keep_numbers_and_labels_never_text():
    result = {
        "score": 50.0,
        "primary_metric": "length_controlled_winrate",
        "n": 4,
        "items": [{"completion": "held-out text"}],
        "metrics": {
            "length_controlled_winrate": 50.0,
            "lc_method": "length_controlled_minimal",
            "judge_failures": {"timeout": 1, "unparsable": 0, "note": "a sentence with spaces"},
            "example": "What is the capital of the held-out question?",
            "nan": float("nan"),
        },
    }
    public = public_metrics(result)
    assert "items" not in public and public["score"] == 50.0 and public["n"] == 4
    assert public["metrics"]["lc_method"] == "length_controlled_minimal"
    assert public["metrics"]["judge_failures"] == {"timeout": 1, "unparsable": 0, "note": None}
    assert public["metrics"]["example"] is None and public["metrics"]["nan"] is None


def test_code_files_cover_the_folder_and_the_parts_used():
    gsm8k = get_task({"module": "gsm8k"})
    files = {str(p.relative_to(REPO / "scripts/rlbench")) for p in gsm8k.code_files({})}
    assert {"tasks/gsm8k/__init__.py", "tasks/gsm8k/public.py", "tasks/base.py", "tasks/parts.py"} <= files
    assert not any("addition_control" in f for f in files)  # another task's code is not this score's


def test_provenance_hashes_the_task_code_actually_used():
    record = provenance({"name": "gsm8k", "module": "gsm8k", "level": "L1"})
    assert "tasks/gsm8k/public.py" in record["code"]["task_files"] and len(record["code"]["task_sha256"]) == 64
    other = provenance({"name": "addition-control", "module": "addition_control", "level": "control"})
    assert other["code"]["task_sha256"] != record["code"]["task_sha256"]


def test_unknown_task_module_is_a_clear_error():
    with pytest.raises(ValueError, match="not a task folder"):
        get_task({"name": "nope", "module": "no_such_task"})


def test_noise_summary_is_the_spread_of_the_repeats():
    noise = noise_summary([10.0, 13.0, 7.5])
    assert noise["repeats"] == 3 and noise["band"] == 2.75 and noise["min"] == 7.5 and noise["max"] == 13.0
    assert noise["std"] == pytest.approx(2.7538, abs=1e-4)
    assert noise_summary([42.0]) == {"repeats": 1, "scores": [42.0], "mean": 42.0, "std": 0.0, "min": 42.0, "max": 42.0, "band": 0.0}


def test_task_schema_requires_a_judge_and_repeats_for_level_two():
    schema = load_schema("task")
    entry = {"name": "x", "level": "L2", "module": "x", "description": "x", "source": "offline", "metric": "m"}
    with pytest.raises(ConfigError, match="judge"):
        validate(entry, schema, "task")
    judge = {"backend": "openai", "model": "gpt-4o", "api_key_var": "OPENAI_API_KEY"}
    with pytest.raises(ConfigError, match="grader_noise_repeats"):
        validate({**entry, "judge": judge}, schema, "task")
    with pytest.raises(ConfigError):
        validate({**entry, "judge": judge, "grader_noise_repeats": 2}, schema, "task")
    validate({**entry, "judge": judge, "grader_noise_repeats": 3}, schema, "task")
    validate({**entry, "level": "L1"}, schema, "task")  # L1 needs neither
    with pytest.raises(ConfigError, match="api_key_var"):
        validate({**entry, "judge": {**judge, "api_key_var": "sk-live key"}, "grader_noise_repeats": 3}, schema, "task")


def test_cut_at_stop_takes_the_earliest_stop_string():
    assert cut_at_stop("a\ndef b|c", ["|", "\ndef"]) == "a"
    assert cut_at_stop("abc", None) == "abc" and cut_at_stop("abc", ["z"]) == "abc"
    assert json.dumps(cut_at_stop("", ["x"])) == '""'
