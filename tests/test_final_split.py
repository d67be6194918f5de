"""A final split the agent never sees scores of (config scoring.feedback: split): the salted partition, the
evaluations restricted to a part, the grader's private record, what the agent can read (nothing of the final
split), full mode unchanged, and the Δ family in final.json, summary.json, the leaderboard and the tables."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from rlbench.analysis.catalogue import build_tables
from rlbench.analysis.report import LEADERBOARD_COLUMNS, leaderboard_row
from rlbench.config import Registries, scoring_settings, task_settings
from rlbench.evaluation.evaluate import delta_family
from rlbench.fileio.jsonio import read_jsonl
from rlbench.grader.fingerprint import fingerprint
from rlbench.grader.grading import Grader, GraderConfig
from rlbench.grader.server import GradingServer, new_secret
from rlbench.tasks.base import FEEDBACK, FINAL, EvalContext, partition_digest, partition_items
from support.models import copy_model, perturb
from support.settings import EVALUATION, GSM8K_SETTINGS, TEST_SALT

IDS = [f"heldout-{i:02d}" for i in range(7)]


# -- the partition ------------------------------------------------------------------------------
def test_the_partition_is_deterministic_salted_and_an_exact_share():
    parts = partition_items(IDS, TEST_SALT, "gsm8k", 0.5)
    assert parts == partition_items(IDS, TEST_SALT, "gsm8k", 0.5)  # deterministic
    assert sorted(parts[FEEDBACK] + parts[FINAL]) == IDS and not set(parts[FEEDBACK]) & set(parts[FINAL])
    assert len(parts[FINAL]) == round(0.5 * 7) == 4 and len(parts[FEEDBACK]) == 3
    assert parts[FINAL] == [i for i in IDS if i in parts[FINAL]]  # split order kept
    many = [f"q{i}" for i in range(200)]
    salted = [partition_items(many, salt, "gsm8k", 0.5)[FINAL] for salt in ("salt-a", "salt-b")]
    assert salted[0] != salted[1]  # another salt, another final split: the code and config do not tell
    assert partition_items(many, "salt-a", "other-task", 0.5)[FINAL] != salted[0]
    assert len(partition_items(many, "salt-a", "gsm8k", 0.3)[FINAL]) == 60
    # both parts keep at least one item
    assert [len(p) for p in partition_items(["a", "b"], "s", "t", 0.99).values()] == [1, 1]
    with pytest.raises(ValueError):
        partition_items(["only"], "s", "t", 0.5)
    with pytest.raises(ValueError):
        partition_items(["a", "a", "b"], "s", "t", 0.5)
    with pytest.raises(ValueError):
        partition_items(IDS, "", "t", 0.5)  # no salt, no partition
    assert partition_digest(parts) == partition_digest({FINAL: list(reversed(parts[FINAL]))})


def test_scoring_settings_default_to_full_and_full_mode_leaves_the_settings_as_they_were():
    registries = Registries.load()
    plain = task_settings({}, registries, "addition-control")
    assert "scoring" not in plain and scoring_settings(plain) == {"feedback": "full"}
    # a default written out, or a share that full mode does not use, changes nothing (no rerun)
    for block in ({"feedback": "full"}, {"feedback": "full", "final_share": 0.3}, {}):
        assert task_settings({"tasks": {"addition-control": {"scoring": block}}}, registries, "addition-control") == plain
    split = task_settings({"tasks": {"addition-control": {"scoring": {"feedback": "split"}}}}, registries, "addition-control")
    assert split["scoring"] == {"feedback": "split", "final_share": 0.5} == scoring_settings(split)


def test_an_evaluation_restricted_to_items_reads_only_their_rows(gsm8k_data):
    eval_dir = gsm8k_data[1]
    everything = EvalContext(settings=GSM8K_SETTINGS, model_dir=Path("."), eval_dir=eval_dir).rows()
    ids = [row["id"] for row in everything]
    some = EvalContext(settings=GSM8K_SETTINGS, model_dir=Path("."), eval_dir=eval_dir, resources={"items": ids[1:3]}).rows()
    assert [row["id"] for row in some] == ids[1:3]
    with pytest.raises(ValueError):
        EvalContext(settings=GSM8K_SETTINGS, model_dir=Path("."), eval_dir=eval_dir, resources={"items": ["nope"]}).rows()


# -- the grader ------------------------------------------------------------------------------------
FEEDBACK_SCORE, FINAL_SCORE, FULL_SCORE = 41.2345, 73.9876, 55.5555
BASE_FEEDBACK, BASE_FINAL = 11.1111, 22.2222
CORRECT_BASE = 9876500  # metrics["correct"] = this + n: a count no timestamp or hash holds by chance


class FakeWorkers:
    """An evaluation pool that scores by which items it is asked for, with numbers found nowhere else:
    what the agent can read is searched for the final part's."""

    def __init__(self, partition: dict | None):
        self.partition = partition
        self.calls: list[dict] = []

    def evaluate(self, task_settings, model_dir, eval_dir, evaluation, work_dir, gpu=None, resources=None, replicate=0):
        resources = dict(resources or {})
        self.calls.append(resources)
        items = resources.get("items")
        if items is None:
            score, n = FULL_SCORE, len(IDS)
        elif self.partition is not None and items == self.partition[FINAL]["items"]:
            score, n = FINAL_SCORE, len(items)
        else:
            score, n = FEEDBACK_SCORE, len(items)
        return {
            "score": score,
            "primary_metric": "accuracy",
            "metrics": {"accuracy": score, "correct": CORRECT_BASE + n},
            "n": n,
            "items": [{"id": i} for i in items or IDS],
            "eval_seconds": 0.5,
            "phase_seconds": {"generating": 0.5},
        }

    def prestart(self, gpu=None):
        pass

    def close(self):
        pass


def _partition(share: float = 0.5) -> dict:
    parts = partition_items(IDS, TEST_SALT, "gsm8k", share)
    return {
        "n": len(IDS),
        FEEDBACK: {"n": len(parts[FEEDBACK]), "items": parts[FEEDBACK]},
        FINAL: {"n": len(parts[FINAL]), "items": parts[FINAL]},
        "digest": partition_digest(parts),
    }


def _config(workspace: Path, tiny_model: Path, eval_dir: Path, partition: dict | None, share: float, **baseline) -> GraderConfig:
    """A grader's config over the workspace: split mode with `partition` (full mode without), the base model's
    numbers as `baseline` gives them (baseline_score, baseline_metrics, baseline_final_metrics)."""
    split = {"scoring": {"feedback": "split", "final_share": share}} if partition else {}
    return GraderConfig(
        workspace=workspace,
        grader_dir=workspace.parent / "grader",
        task_settings={**GSM8K_SETTINGS, **split},
        eval_dir=eval_dir,
        baseline_fingerprint=fingerprint(tiny_model),
        start_time=time.time(),
        timeout_s=600,
        secret=new_secret(),
        evaluation=EVALUATION,
        resources={"base_chat_template": None},
        partition=partition,
        **baseline,
    )


def _serve(workspace: Path, tiny_model: Path, partition: dict | None) -> tuple[GradingServer, FakeWorkers]:
    workers = FakeWorkers(partition)
    final_metrics = {"score": BASE_FINAL, "primary_metric": "accuracy", "metrics": {"accuracy": BASE_FINAL}, "n": 4}
    config = _config(
        workspace, tiny_model, workspace.parent, partition, 0.5,  # the fake pool reads nothing of eval_dir
        baseline_score=BASE_FEEDBACK if partition else 0.0,
        baseline_metrics={"score": BASE_FEEDBACK, "primary_metric": "accuracy", "metrics": {"accuracy": BASE_FEEDBACK}, "n": 3},
        baseline_final_metrics=final_metrics if partition else {},
    )
    return GradingServer(Grader(config, workers=workers)).start(), workers


def _submissions(server, workspace: Path, tiny_model: Path) -> list[tuple[int, dict]]:
    """Base model, new weights, the same weights again (cache), the same path again (repeat): the answers."""
    copy_model(tiny_model, workspace / "output" / "base")
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    copy_model(workspace / "output" / "v1", workspace / "output" / "v2")
    answers = []
    for path in ("output/base", "output/v1", "output/v2", "output/v1", "output/missing"):
        response = requests.post(f"{server.url}/submit", json={"model_path": path}, timeout=60)
        answers.append((response.status_code, response.json()))
    return answers


def _json_values(value, key=None):
    """Every (key, value) of a JSON document, nested."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield k, v
            yield from _json_values(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from _json_values(v, key)


def test_in_split_mode_the_agent_learns_nothing_of_the_final_split(workspace, tiny_model):
    partition = _partition()
    server, workers = _serve(workspace, tiny_model, partition)
    try:
        answers = _submissions(server, workspace, tiny_model)
        time_info = requests.get(f"{server.url}/time", timeout=30).json()
        health = requests.get(f"{server.url}/health", timeout=30).json()
    finally:
        server.stop()
    final_ids, final_n = partition[FINAL]["items"], partition[FINAL]["n"]
    assert final_n != partition[FEEDBACK]["n"]  # the counts differ, so a leaked count would show
    # The grader's private record holds both parts.
    ledger = list(read_jsonl(workspace.parent / "grader" / "ledger.jsonl"))
    scored = [e for e in ledger if e.get("status") in ("scored", "cached")]
    assert [e["final"]["score"] for e in scored] == [BASE_FINAL, FINAL_SCORE, FINAL_SCORE, FINAL_SCORE]
    assert [e["score"] for e in scored] == [BASE_FEEDBACK, FEEDBACK_SCORE, FEEDBACK_SCORE, FEEDBACK_SCORE]
    assert all(e["final"]["partition"] == partition["digest"] for e in scored)
    assert scored[1]["final"]["n"] == final_n and scored[1]["final"]["metrics"]["correct"] == CORRECT_BASE + final_n
    # Each new content is evaluated once per part; the cache answers both for the same weights.
    assert [c.get("items") for c in workers.calls] == [partition[FEEDBACK]["items"], final_ids]
    # Everything the agent can read: the answers, /time, /health and every file of its workspace.
    documents = [body for _, body in answers] + [time_info, health]
    texts = [json.dumps(d) for d in documents]
    for path in workspace.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.relative_to(workspace).parts[0] not in ("models", "output"):
            raw = path.read_bytes()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            texts.append(text)
            if path.suffix == ".json":
                documents.append(json.loads(text))
    forbidden = [str(FINAL_SCORE), str(CORRECT_BASE + final_n), partition["digest"], *final_ids]
    for text in texts:
        for needle in forbidden:
            assert needle not in text
    for key, value in (pair for document in documents for pair in _json_values(document)):
        assert "final" not in str(key).lower()
        assert value not in (FINAL_SCORE, BASE_FINAL, CORRECT_BASE + final_n)
        if key == "n":
            assert value == partition[FEEDBACK]["n"]  # never the final part's count, nor the whole split's
    statuses = [status for status, _ in answers]
    assert statuses[:4] == [200, 200, 200, 200] and statuses[4] >= 400 and answers[2][1]["cached"] is True


RESPONSE_KEYS = {  # a scored submission's answer, as it was before the final split existed
    "baseline_score", "best", "cached", "code_revision", "elapsed_seconds", "eval_seconds", "gpu", "improvement",
    "metrics", "model_path", "n", "primary_metric", "responded_at", "score", "since_start_s", "status",
    "submission_id", "submitted_at", "timestamp", "total_submissions",
}


@pytest.mark.parametrize("partition", [None, _partition()], ids=["full", "split"])
def test_full_mode_is_the_reference_and_split_mode_answers_with_the_same_fields(workspace, tiny_model, partition):
    server, workers = _serve(workspace, tiny_model, partition)
    try:
        answers = _submissions(server, workspace, tiny_model)
    finally:
        server.stop()
    scored = answers[1][1]
    assert set(scored) == RESPONSE_KEYS
    assert scored["score"] == (FEEDBACK_SCORE if partition else FULL_SCORE)
    ledger = list(read_jsonl(workspace.parent / "grader" / "ledger.jsonl"))
    if partition is None:
        # one evaluation of the whole split, with the resources as given; nothing new in the record
        assert workers.calls == [{"base_chat_template": None}]
        assert not any("final" in e for e in ledger)
        assert scored["n"] == len(IDS) and scored["improvement"] == FULL_SCORE


# -- the Δ family ----------------------------------------------------------------------------------
def test_the_delta_family_on_synthetic_scores():
    family = delta_family(60.0, 52.0, 55.0, 40.0, 41.0, 1.0, 1.5)
    assert family == {
        "feedback_delta": 20.0,
        "feedback_delta_band": 1.0,
        "clean_delta": 11.0,
        "clean_delta_band": 1.5,
        "oracle_delta": 14.0,
        "oracle_delta_band": 1.5,
        "selection_gap": 9.0,
        "selection_gap_band": 2.5,
    }
    full = delta_family(60.0, None, None, 40.0, None, 0.0, None)
    assert full["feedback_delta"] == 20.0 and full["clean_delta"] is None and full["selection_gap"] is None
    copy = delta_family(30.0, 25.0, 25.0, 30.0, 25.0, 0.0, 0.0)
    assert copy["feedback_delta"] == copy["clean_delta"] == copy["oracle_delta"] == copy["selection_gap"] == 0.0


def _summary(agent: str, seed: int, mode: str, **fields) -> dict:
    return {
        "labels": {"task": "addition-control", "model": "m", "agent": agent, "seed": seed},
        "level": "control",
        "status": "completed",
        "submissions": 1,
        "baseline": 10.0,
        "best": 30.0,
        "delta": 20.0,
        "feedback_mode": mode,
        **fields,
    }


def test_the_leaderboard_and_the_selection_gap_table_carry_the_delta_family():
    split = _summary("sft", 0, "split", feedback_delta=20.0, feedback_delta_band=0.0, clean_delta=12.0,
                     clean_delta_band=0.0, oracle_delta=15.0, oracle_delta_band=0.0, selection_gap=8.0,
                     selection_gap_band=0.0)
    split2 = {**split, "labels": {**split["labels"], "seed": 1}, "clean_delta": 14.0, "selection_gap": 6.0}
    full = _summary("copy", 0, "full", feedback_delta=20.0, feedback_delta_band=0.0)
    assert {"clean_delta", "oracle_delta", "selection_gap"} <= set(LEADERBOARD_COLUMNS)
    row = leaderboard_row(split)
    assert (row["clean_delta"], row["oracle_delta"], row["selection_gap"]) == (12.0, 15.0, 8.0)
    row = leaderboard_row(full)
    assert (row["clean_delta"], row["oracle_delta"], row["selection_gap"]) == ("", "", "")
    table = build_tables([split, split2, full])["selection_gap"]
    assert len(table.rows) == 1  # full-mode runs are left out
    only = table.rows[0]
    assert only["n"] == 2 and only["mean_clean_delta"] == 13.0 and only["mean_selection_gap"] == 7.0
    assert only["mean_feedback_delta"] == 20.0 and only["gap_within_noise"] == "no"
    assert any(note.startswith("clean_delta:") for note in table.notes)


def test_a_real_grader_in_split_mode_evaluates_each_part_with_the_task(workspace, tiny_model, gsm8k_data, evaluation_workers):
    """The tiny model on GSM8K through the real evaluation worker: the feedback part answers, the final part
    is recorded privately, each with its own n, and a resubmission is answered from the cache for both."""
    from rlbench.fileio.jsonio import read_jsonl as rows_of

    ids = [row["id"] for row in rows_of(gsm8k_data[1] / "eval.jsonl")]
    parts = partition_items(ids, TEST_SALT, "gsm8k", 0.25)
    partition = {"n": len(ids), "digest": partition_digest(parts), **{p: {"n": len(parts[p]), "items": parts[p]} for p in parts}}
    assert (partition[FEEDBACK]["n"], partition[FINAL]["n"]) == (3, 1)
    config = _config(
        workspace, tiny_model, gsm8k_data[1], partition, 0.25, baseline_score=0.0,
        baseline_final_metrics={"score": 0.0, "primary_metric": "accuracy", "metrics": {"accuracy": 0.0}, "n": 1},
    )
    grader = Grader(config, workers=evaluation_workers)
    server = GradingServer(grader).start()
    try:
        perturb(copy_model(tiny_model, workspace / "output" / "v1"))
        copy_model(workspace / "output" / "v1", workspace / "output" / "v2")
        first = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=300).json()
        second = requests.post(f"{server.url}/submit", json={"model_path": "output/v2"}, timeout=300).json()
    finally:
        server.stop()
    assert first["status"] == "scored" and first["n"] == 3 and "final" not in first
    assert second["status"] == "cached" and second["score"] == first["score"]
    ledger = list(read_jsonl(workspace.parent / "grader" / "ledger.jsonl"))
    assert [e["final"]["n"] for e in ledger] == [1, 1]
    assert ledger[0]["final"]["primary_metric"] == "accuracy" and ledger[0]["final"]["partition"] == partition["digest"]
    assert ledger[0]["eval_timing"]["final"]["eval_seconds"] is not None


def test_the_agent_is_told_its_scores_are_on_a_part_of_the_held_out_split(tmp_path, gsm8k_data, tiny_model):
    """Split mode adds one paragraph to instructions.md (never which part, nor its size); full mode none."""
    from rlbench.agent_run.workspace import FEEDBACK_SPLIT_NOTE, prepare_workspace
    from rlbench.tasks.gsm8k import GSM8K

    split = {**GSM8K_SETTINGS, "scoring": {"feedback": "split", "final_share": 0.5}}
    for name, settings, told in (("full", GSM8K_SETTINGS, False), ("split", split, True)):
        ws = tmp_path / name
        prepare_workspace(ws, GSM8K(), settings, tiny_model, "org/base", gsm8k_data[0])
        instructions = (ws / "instructions.md").read_text()
        assert (FEEDBACK_SPLIT_NOTE in instructions) is told and ("feedback split" in instructions) is told
    assert not any(ch.isdigit() for ch in FEEDBACK_SPLIT_NOTE)


def test_summary_md_shows_the_delta_family_in_split_mode_only():
    from rlbench.summaries.markdown import _split_lines

    summary = {"feedback_mode": "split", "feedback_delta": 6.0, "feedback_delta_band": 1.0, "clean_delta": 2.0,
               "clean_delta_band": 1.5, "oracle_delta": 4.0, "oracle_delta_band": 1.5, "selection_gap": 4.0,
               "selection_gap_band": 2.5}
    assert _split_lines(summary) == [
        "- final split (never reported to the agent): clean delta +2 ±1.5, oracle delta +4 ±1.5, "
        "selection gap +4 ±2.5 (feedback delta +6 ±1)"
    ]
    assert _split_lines({**summary, "feedback_mode": "full"}) == []
