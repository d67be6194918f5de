"""The grader of a multi-task run over real HTTP: "task" all (the default) or one task, per-task numbers and their
mean, the cache per task and fingerprint, each task's best snapshot, the refusals; and a single-task run's
handling of "task"."""

from __future__ import annotations

import time

import pytest
import requests

from rlbench.fileio.jsonio import read_json
from rlbench.grader.fingerprint import fingerprint
from rlbench.grader.grading import Grader, GraderConfig
from rlbench.grader.server import GradingServer, new_secret
from rlbench.grader.targets import BEST_MODELS, TaskTarget
from rlbench.recording.ledger import reference_view, task_view
from rlbench.tasks.addition_control import AdditionControl
from support.grader import assert_consistent
from support.models import base_resources, copy_model, perturb
from support.settings import ADDITION, EVALUATION, GSM8K_SETTINGS, TEST_SALT, TINY_SPEC

BASELINES = {"gsm8k": 2.0, "addition-control": 10.0}


@pytest.fixture(scope="module")
def addition_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("addition")
    AdditionControl().prepare(ADDITION, root / "train", root / "eval", salt=TEST_SALT)
    return root / "train", root / "eval"


@pytest.fixture
def multi_server(workspace, tiny_model, gsm8k_data, addition_data, evaluation_workers):
    base = fingerprint(tiny_model)
    targets = {
        settings["name"]: TaskTarget(
            task_settings=settings,
            eval_dir=eval_dir,
            baseline_score=BASELINES[settings["name"]],
            baseline_fingerprint=base,
            baseline_metrics={"score": BASELINES[settings["name"]], "n": 4, "primary_metric": "accuracy"},
            resources=base_resources(tiny_model),
        )
        for settings, eval_dir in ((GSM8K_SETTINGS, gsm8k_data[1]), (ADDITION, addition_data[1]))
    }
    grader = Grader(
        GraderConfig(
            workspace=workspace,
            grader_dir=workspace.parent / "grader",
            task_settings={"name": "multi", "tasks": list(targets)},
            eval_dir=gsm8k_data[1],
            baseline_score=sum(BASELINES.values()) / 2,
            baseline_fingerprint=base,
            start_time=time.time(),
            timeout_s=600,
            secret=new_secret(),
            evaluation=EVALUATION,
            resources=base_resources(tiny_model),
            tasks=targets,
        ),
        workers=evaluation_workers,
    )
    with GradingServer(grader) as server:
        yield server


def _submit(server, **body):
    return requests.post(f"{server.url}/submit", json=body, timeout=600)


def test_all_tasks_by_default_then_one_task_from_the_cache(multi_server, workspace, tiny_model):
    server = multi_server
    health = requests.get(f"{server.url}/health", timeout=30).json()
    assert health["tasks"] == ["gsm8k", "addition-control"]
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))

    first = _submit(server, model_path="output/v1")
    body = first.json()
    assert first.status_code == 200, body
    assert body["task"] == "all" and set(body["tasks"]) == {"gsm8k", "addition-control"}
    for name, numbers in body["tasks"].items():
        assert numbers["baseline_score"] == BASELINES[name]
        assert numbers["improvement"] == pytest.approx(numbers["score"] - BASELINES[name])
        assert numbers["cached"] is False and numbers["n"] == 4
    mean = sum(t["score"] for t in body["tasks"].values()) / 2
    assert body["score"] == pytest.approx(mean) and body["baseline_score"] == pytest.approx(6.0)
    assert body["improvement"] == pytest.approx(mean - 6.0)
    assert body["summary"]["tasks"] == ["gsm8k", "addition-control"] and body["summary"]["statistic"] == "mean"
    assert "task_records" not in body and "fingerprint" not in body

    # the same weights on one task: from the cache, that task's numbers only, its own baseline
    again = _submit(server, model_path="output/v1", task="addition-control").json()
    assert again["status"] == "cached" and list(again["tasks"]) == ["addition-control"]
    assert again["score"] == body["tasks"]["addition-control"]["score"]
    assert again["baseline_score"] == BASELINES["addition-control"]

    # the untouched base model: every task's baseline without an evaluation
    base = _submit(server, model_path=f"models/{TINY_SPEC['hf_id']}")
    assert base.status_code == 200 and base.json()["status"] == "cached"
    assert base.json()["improvement"] == 0

    entries = assert_consistent(server)
    scores = read_json(workspace / "scores.json")
    assert scores == reference_view(entries) and all("tasks" in s and "task" in s for s in scores)
    # each task's best snapshot is kept, and the per-task view reads like a single-task ledger
    grader_dir = workspace.parent / "grader"
    best = read_json(grader_dir / "best_by_task.json")
    assert set(best) == {"gsm8k", "addition-control"}
    for name in best:
        assert (grader_dir / BEST_MODELS / name / "config.json").is_file()
        view = task_view(entries, name)
        assert [e["submission_id"] for e in view] == ([1, 2, 3] if name == "addition-control" else [1, 3])
        assert all("tasks" not in e for e in view)
        assert view[0]["score"] == body["tasks"][name]["score"]
        assert view[0]["baseline_score"] == BASELINES[name] and view[0]["status"] == "scored"
    assert task_view(entries, "addition-control")[1]["status"] == "cached"
    assert not (grader_dir / "snapshots" / "0001" / "model").exists()  # kept only under best_models/


def test_unknown_or_malformed_task_is_refused_and_not_a_submission(multi_server, workspace, tiny_model):
    server = multi_server
    copy_model(tiny_model, workspace / "output" / "v1")
    for task, reason in (("humaneval", "unknown_task"), (3, "malformed_request"), ("", "unknown_task")):
        response = _submit(server, model_path="output/v1", task=task)
        assert response.status_code == 400, response.text
        body = response.json()
        assert body["reason"] == reason and "'all'" in body["error"] and "'gsm8k'" in body["error"]
    assert read_json(workspace / "scores.json") == []
    assert_consistent(server)


def test_single_task_run_accepts_its_own_task_and_refuses_others(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    for task in ("gsm8k", "all"):
        body = _submit(server, model_path="output/v1", task=task).json()
        assert body["status"] in ("scored", "cached") and "tasks" not in body and "task" not in body
    refused = _submit(server, model_path="output/v1", task="alfworld")
    assert refused.status_code == 400 and refused.json()["reason"] == "unknown_task"
    assert "'gsm8k'" in refused.json()["error"]
    assert_consistent(server)
