"""Process metrics, route labels, failure types and summaries against hand-computed values.

Synthetic ledgers, run records and code directories only: no model, no grader, fast. The paper
metrics follow the reference's core/metrics.py (RD-Agent AutoRL-Bench); the expected values
below are worked out by hand from its definitions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlbench.summaries.agent_code import key_configuration
from rlbench.summaries.artifacts import collect_artifacts
from rlbench.summaries.failures import FAILURE_TYPES, failure_type, improvement_success, iteration_failure
from rlbench.summaries.iterations import jsonl_record
from rlbench.summaries.markdown import summary_markdown
from rlbench.summaries.metrics import extra_metrics, load_run_meta, paper_metrics
from rlbench.summaries.routes import ROUTE_LABELS, coding_success, detect_route, run_route, train_type
from rlbench.summaries.submissions import finished_at, recorded_submissions
from rlbench.summaries.summary import summarize
from rlbench.fileio.jsonio import write_json
from rlbench.recording.ledger import iso_timestamp
from support.diagnostics import (
    BASE,
    BASE_FP,
    BASELINE,
    META,
    PAPER_NAMES,
    START,
    code,
    entry,
    failed,
    make_run,
    refused,
)


def paper(submissions, meta=META, workspace=Path("/nonexistent/ws"), base=BASE, baseline=BASELINE):
    return paper_metrics(submissions, meta, baseline, workspace, base)


@pytest.fixture
def ledger():
    """Five recorded submissions around one request the reference never records."""
    return [
        failed(1, 100.9),  # evaluation failed: 0.0 in the trajectory
        refused(2, 150.0, "outside_workspace"),  # a 400 for the reference: not a submission
        entry(3, 300.5, 30.0),  # valid (score > 0) but below the baseline
        entry(4, 600.2, 45.0),  # first improvement
        entry(5, 900.7, 50.0, fp="5" * 64),  # best
        entry(6, 1000.1, 50.0, status="cached", fp="5" * 64),  # tie for best (resubmitted)
        entry(7, 1500.99, 20.0),
    ]


# -- the paper's ten metrics -------------------------------------------------------------------------
def test_paper_metrics_hand_computed(ledger):
    submissions = recorded_submissions(ledger)
    assert [e["submission_id"] for e in submissions] == [1, 3, 4, 5, 6, 7]
    m = paper(submissions)
    assert list(m) == PAPER_NAMES
    assert m["score_trajectory"] == [0.0, 30.0, 45.0, 50.0, 50.0, 20.0]
    assert m["valid_submission_rate"] == pytest.approx(5 / 6)  # the failed one has score 0
    assert m["first_valid_idx"] == 2  # 1-based among recorded submissions (the refusal is not one)
    assert m["first_valid_delay"] == 300  # int(300.5): truncated, not rounded
    assert m["time_to_first_improvement"] == 600  # the first score above 40, not the best
    assert m["time_to_best"] == 900  # the first of the two 50.0 entries
    assert m["monotonic_ratio"] == pytest.approx(3 / 5)  # 0<30<45<50, 50=50 and 50>20 are not increases
    assert m["copy_model_count"] == 0
    assert m["time_used_ratio"] == pytest.approx(0.5)  # (end - start) / timeout_s = 1800 / 3600
    assert m["last_submit_gap"] == 300  # end - last_submit_time


def test_paper_metrics_no_submissions():
    m = paper([], meta={**META, "last_submit_time": None})
    assert m == {
        "valid_submission_rate": None,
        "first_valid_idx": None,
        "first_valid_delay": None,
        "score_trajectory": [],
        "time_to_first_improvement": None,
        "time_to_best": None,
        "monotonic_ratio": None,
        "copy_model_count": 0,
        "time_used_ratio": 0.5,
        "last_submit_gap": None,
    }


def test_paper_metrics_one_submission():
    m = paper([entry(1, 59.99, 42.0)])
    assert m["valid_submission_rate"] == 1.0
    assert (m["first_valid_idx"], m["first_valid_delay"]) == (1, 59)
    assert m["time_to_first_improvement"] == 59 and m["time_to_best"] == 59
    assert m["monotonic_ratio"] is None  # fewer than two entries
    m = paper([entry(1, 59.99, 42.0)], meta={**META, "end_time": START + 1800.7})
    assert m["last_submit_gap"] == 300 and m["time_used_ratio"] == pytest.approx(1800.7 / 3600)  # int() as the reference


def test_paper_metrics_all_failed():
    m = paper([failed(1, 100.0), refused(2, 200.0, "lora_adapter"), failed(3, 300.0)])
    assert m["score_trajectory"] == [0.0, 0.0, 0.0]
    assert m["valid_submission_rate"] == 0.0
    assert m["first_valid_idx"] is None and m["first_valid_delay"] is None
    assert m["time_to_first_improvement"] is None
    assert m["time_to_best"] == 100  # the reference's max() over all-zero scores picks the first entry
    assert m["monotonic_ratio"] == 0.0


def test_paper_metrics_without_baseline_or_base_model():
    m = paper([entry(1, 10.0, 50.0)], base=None, baseline=None)
    assert m["time_to_first_improvement"] is None  # the reference needs a baseline
    assert m["copy_model_count"] is None  # ... and a base model path


def test_refusals_the_reference_records_are_counted_request_errors_are_not():
    ledger = [
        refused(1, 10.0, "malformed_request"),
        refused(2, 20.0, "invalid_gpu"),
        refused(3, 30.0, "deadline_passed"),
        refused(4, 40.0, "lora_adapter"),  # the reference evaluates it and records score 0
        entry(5, 50.0, 45.0),
    ]
    submissions = recorded_submissions(ledger)
    assert [e["submission_id"] for e in submissions] == [4, 5]
    m = paper(submissions)
    assert m["valid_submission_rate"] == 0.5 and m["first_valid_idx"] == 2
    extra = extra_metrics(ledger, submissions, BASELINE, BASE_FP)
    assert extra["requests"] == 5 and extra["refused_requests"] == 3
    assert extra["status_counts"] == {"refused": 1, "scored": 1}


def test_copies_by_path_and_by_fingerprint(tmp_path, monkeypatch):
    ws = tmp_path / "run" / "workspace"
    (ws / BASE).mkdir(parents=True)
    (ws / "output").mkdir()
    os.symlink(ws / BASE, ws / "output" / "link")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / BASE).mkdir(parents=True)
    monkeypatch.chdir(elsewhere)  # relative paths resolve against the workspace, not the CWD
    submissions = [
        entry(1, 10.0, BASELINE, path=BASE, fp=BASE_FP, status="cached"),  # path and weights
        entry(2, 20.0, BASELINE, path=str(ws / BASE), fp=BASE_FP, status="cached"),  # absolute path
        entry(3, 30.0, BASELINE, path="./models/org/../org/base", fp=BASE_FP, status="cached"),
        entry(4, 40.0, BASELINE, path="output/link", fp=BASE_FP, status="cached"),  # symlink to the base
        entry(5, 50.0, BASELINE, path="output/v1", fp=BASE_FP, status="cached"),  # a copy saved elsewhere
        entry(6, 60.0, 45.0, path="output/v2"),  # trained
        # the run directory moved since: the absolute path is stale, the grader's resolution is not
        entry(7, 70.0, BASELINE, path="/old/ws/models/org/base", fp=BASE_FP, status="cached", resolved_path=BASE),
        refused(8, 80.0, "missing_path", path="models/org/nothing"),
    ]
    assert paper(submissions, workspace=ws)["copy_model_count"] == 5  # entries 1, 2, 3, 4, 7
    assert extra_metrics(submissions, submissions, BASELINE, BASE_FP)["copy_weights_count"] == 6  # 1-5, 7


def test_run_meta_from_the_workspace_with_run_json_fallbacks(tmp_path):
    run = {"start_time": START + 0.9, "end_time": START + 1234.8, "time_limit_s": 3600.0}
    submissions = [entry(1, 100.4, 50.0), entry(2, 700.6, 45.0)]
    fallback = load_run_meta(tmp_path, run, submissions)  # no run_meta.json
    assert fallback == {"start_time": START, "timeout_s": 3600, "end_time": START + 1234, "last_submit_time": START + 700}
    write_json(tmp_path / "run_meta.json", {**META, "last_submit_time": None})
    assert load_run_meta(tmp_path, run, submissions) == {**META, "last_submit_time": START + 700}
    write_json(tmp_path / "run_meta.json", META)
    assert load_run_meta(tmp_path, run, submissions) == META


def test_finish_time_is_the_instant_the_iso_timestamp_names_whatever_the_time_zone():
    e = entry(1, 100.25, 50.0)
    assert finished_at(e) == pytest.approx(START + 100.25)
    shifted = {**e, "timestamp": iso_timestamp(START + 100.25 + 7200)}  # written under another TZ
    assert finished_at(shifted) == START + 100.25
    old = {**e, "timestamp": START + 90.0}  # an old ledger: unix timestamp of arrival
    assert finished_at(old) == START + 100.25
    assert finished_at({"timestamp": iso_timestamp(START + 5)}) == pytest.approx(START + 5)
    assert finished_at({}) is None


# -- our metrics -----------------------------------------------------------------------------------
def test_extra_metrics_hand_computed(ledger):
    submissions = recorded_submissions(ledger)
    extra = extra_metrics(ledger, submissions, BASELINE, BASE_FP)
    assert not set(extra) & set(PAPER_NAMES)
    assert extra == {
        "requests": 7,
        "refused_requests": 1,
        "status_counts": {"failed": 1, "scored": 4, "cached": 1},
        "scored_submissions": 5,
        "scored_submission_rate": pytest.approx(5 / 6),
        "first_scored_idx": 2,
        "first_scored_since_start_s": 290.5,
        "first_improvement_idx": 3,
        "best_scored_idx": 4,  # the first of the tied 50.0 entries
        "best_scored_since_start_s": 890.7,
        "nondecreasing_ratio": 0.75,  # over 30, 45, 50, 50, 20: three of four steps do not drop
        "copy_weights_count": 0,
    }


def test_extra_metrics_no_submissions():
    extra = extra_metrics([], [], BASELINE, BASE_FP)
    assert extra["scored_submission_rate"] is None and extra["first_scored_idx"] is None
    assert extra["nondecreasing_ratio"] is None and extra["best_scored_idx"] is None
    assert extra["copy_weights_count"] == 0 and extra["requests"] == 0


def test_score_zero_is_scored_but_not_valid():
    submissions = [entry(1, 10.0, 0.0), entry(2, 20.0, 10.0)]
    assert paper(submissions)["valid_submission_rate"] == 0.5
    assert extra_metrics(submissions, submissions, BASELINE, BASE_FP)["scored_submission_rate"] == 1.0


# -- route labels ------------------------------------------------------------------------------------
SFT_CODE = "from trl import SFTConfig, SFTTrainer\ntrainer = SFTTrainer(model=m, args=SFTConfig(learning_rate=2e-5))\n"
GRPO_CODE = "from trl import GRPOConfig, GRPOTrainer\ntrainer = GRPOTrainer(model=m, reward_funcs=[r])\n"


@pytest.mark.parametrize(
    "files, label",
    [
        ({"train.py": GRPO_CODE}, "GRPO"),
        ({"run.sh": "python -m verl.trainer.main algorithm.adv_estimator=grpo\n"}, "GRPO"),
        ({"train.py": "trainer = PPOTrainer(config, model, ref_model, tok)\n"}, "PPO"),
        ({"train.py": "trainer = RLOOTrainer(model=m)\n"}, "PPO"),
        ({"train.py": "trainer = DPOTrainer(model=m, train_dataset=pairs)\n"}, "DPO"),
        ({"train.py": "trainer = ORPOTrainer(model=m)\n"}, "DPO"),
        ({"cfg.yaml": "loss_type: simpo\n"}, "DPO"),
        ({"train.py": SFT_CODE}, "SFT-only"),
        ({"train.py": "trainer = Trainer(model=m, args=args, train_dataset=ds)\n"}, "SFT-only"),
        ({"run.sh": "trl sft --model_name_or_path $MODEL_PATH\n"}, "SFT-only"),
        ({"sft.py": SFT_CODE, "rl/grpo.py": GRPO_CODE}, "SFT+RL"),
        ({"sft.py": SFT_CODE, "ppo.py": "PPOTrainer(config, m)\n"}, "SFT+RL"),
        ({"sft.py": SFT_CODE, "dpo.py": "DPOTrainer(model=m)\n"}, "DPO"),  # preference, not online RL
        ({"train.py": "from trl import GRPOTrainer, DPOTrainer\nprint('hi')\n"}, None),  # imports only
        ({"train.py": "# TODO: try GRPO next\nx = 1\n"}, None),  # comments only
        ({"notes.md": "plan: GRPOTrainer( then DPO\n"}, None),  # prose is not code
        ({}, None),
    ],
)
def test_detect_route(tmp_path, files, label):
    assert detect_route(code(tmp_path, "code", files)) == label


def test_detect_route_without_code():
    assert detect_route(None) is None
    assert detect_route(Path("/nonexistent/code")) is None


def test_train_type_copy_placeholder_unknown(tmp_path):
    ws, grpo = tmp_path / "ws", code(tmp_path, "grpo", {"train.py": GRPO_CODE})
    kw = {"baseline_fingerprint": BASE_FP, "workspace": ws, "base_model": BASE}
    assert train_type(entry(1, 1.0, BASELINE, fp=BASE_FP), grpo, **kw) == "Copy"  # weights
    assert train_type(entry(2, 1.0, BASELINE, path=BASE, fp=""), None, **kw) == "Copy"  # path
    assert train_type(entry(3, 1.0, 45.0), grpo, **kw) == "GRPO"
    assert train_type(entry(4, 1.0, 45.0), None, **kw) == "unknown"  # evaluated, code not in code/
    assert train_type(refused(5, 1.0, "missing_path"), None, **kw) == "Placeholder/Missing"
    assert train_type(failed(6, 1.0), code(tmp_path, "empty", {"a.py": "x = 1\n"}), **kw) == "Placeholder/Missing"


def rec(label, score, status="scored", failure=None):
    return {
        "grader_status": status,
        "train_type": label,
        "score": score,
        "improvement": round(score - BASELINE, 4),
        "failure_type": failure,
    }


def test_run_route_labels():
    assert run_route([]) == "Placeholder/Missing"
    assert run_route([rec("GRPO", 0.0, status="failed")]) == "Placeholder/Missing"  # nothing evaluated
    assert run_route([rec("Copy", BASELINE, status="cached"), rec("Copy", BASELINE, status="cached")]) == "Copy"
    assert run_route([rec("SFT-only", 45.0), rec("GRPO", 50.0), rec("Copy", BASELINE)]) == "GRPO"  # the best
    assert run_route([rec("SFT-only", 50.0), rec("GRPO", 50.0)]) == "SFT-only"  # tie: the first
    assert run_route([rec("unknown", 50.0), rec("DPO", 42.0), rec("PPO", 41.0)]) == "PPO"  # latest with code
    assert run_route([rec("unknown", 50.0)]) == "unknown"
    assert run_route([rec("SFT+RL", 39.0)]) == "SFT+RL"


def test_coding_and_improvement_success():
    assert [coding_success(label) for label in ROUTE_LABELS] == [True] * 5 + [False] * 3
    assert improvement_success([rec("SFT-only", 40.01)])
    assert not improvement_success([rec("SFT-only", 40.0), rec("GRPO", 12.0)])
    # a failed entry's improvement is negative; a positive one on an unevaluated entry does not count
    assert not improvement_success([{**rec("GRPO", 0.0, status="failed"), "improvement": 5.0}])
    assert not improvement_success([])


# -- failure types ---------------------------------------------------------------------------------------
def test_iteration_failure_types():
    f = iteration_failure
    assert f(entry(1, 1.0, 45.0), "GRPO", BASELINE, "L1") is None  # improved
    assert f(entry(1, 1.0, BASELINE, fp=BASE_FP), "Copy", BASELINE, "L1") == "copy_model_fallback"
    assert f(failed(1, 1.0), "GRPO", BASELINE, "L1") == "code_error_runtime"
    assert f(refused(1, 1.0, "lora_adapter"), "Placeholder/Missing", BASELINE, "L1") == "code_error_runtime"
    assert f(entry(1, 1.0, 30.0), "SFT-only", BASELINE, "L1") == "training_diverged"
    assert f(entry(1, 1.0, 30.0), "GRPO", BASELINE, "L3") == "rollout_logic_wrong"
    assert f(entry(1, 1.0, BASELINE), "SFT+RL", BASELINE, "L3") == "rollout_logic_wrong"
    assert f(entry(1, 1.0, 30.0), "SFT-only", BASELINE, "L3") == "training_diverged"  # no rollouts
    assert f(entry(1, 1.0, BASELINE), "SFT-only", BASELINE, "L1") == "unknown"  # no gain, no drop
    assert f(entry(1, 1.0, 0.0, status="grader_error"), "GRPO", BASELINE, "L1") == "unknown"  # not the agent
    assert f(entry(1, 1.0, 45.0), "GRPO", None, "L1") == "unknown"  # no baseline to compare with


@pytest.mark.parametrize(
    "run, records, level, expected",
    [
        ({"status": "timeout", "timed_out": True}, [], "L1", "timeout_no_submission"),
        ({"status": "failed", "exit_code": 1}, [], "L1", "code_error_runtime"),
        ({"status": "completed", "exit_code": 0}, [], "L1", "unknown"),
        (
            {"status": "timeout"},
            [rec("GRPO", 0.0, "failed", "code_error_runtime"), rec("Placeholder/Missing", 0.0, "refused", "code_error_runtime")],
            "L1",
            "code_error_runtime",
        ),
        ({"status": "completed"}, [rec("GRPO", 0.0, "grader_error", "unknown")], "L1", "unknown"),
        ({"status": "completed"}, [rec("Copy", BASELINE, "cached"), rec("GRPO", 0.0, "failed")], "L1", "copy_model_fallback"),
        ({"status": "completed"}, [rec("SFT-only", 30.0), rec("SFT-only", 35.5)], "L1", "training_diverged"),
        ({"status": "completed"}, [rec("GRPO", 30.0), rec("Copy", BASELINE)], "L2", "training_diverged"),
        ({"status": "completed"}, [rec("GRPO", 30.0)], "L3", "rollout_logic_wrong"),
        ({"status": "completed"}, [rec("SFT-only", 30.0)], "L3", "training_diverged"),
        ({"status": "completed"}, [rec("SFT-only", 30.0), rec("DPO", BASELINE)], "L1", "unknown"),
        ({"status": "timeout"}, [rec("GRPO", 30.0), rec("GRPO", 41.0)], "L3", None),  # improved: no failure
    ],
)
def test_run_failure_types(run, records, level, expected):
    assert failure_type(run, records, level) == expected


def test_every_failure_type_and_route_label_is_exercised():
    assert set(FAILURE_TYPES) == {
        "code_error_runtime",
        "rollout_logic_wrong",
        "timeout_no_submission",
        "copy_model_fallback",
        "training_diverged",
        "unknown",
    }
    assert set(ROUTE_LABELS) == {"GRPO", "PPO", "DPO", "SFT-only", "SFT+RL", "Copy", "Placeholder/Missing", "unknown"}


# -- iterations, summary.json, summary.jsonl, summary.md ----------------------------------------------
@pytest.fixture
def summarized(tmp_path):
    ledger = [
        entry(1, 100.9, 30.0),
        refused(2, 150.0, "outside_workspace", path="/etc"),
        refused(3, 200.3, "lora_adapter", path="output/adapter"),
        entry(4, 600.2, 45.0),
        entry(5, 900.7, BASELINE, path=BASE, fp=BASE_FP, status="cached"),
        failed(6, 1500.99),
    ]
    snapshots = {
        1: {"sft.py": SFT_CODE.replace("2e-5", "5e-4") + "args = dict(num_train_epochs=3, per_device_train_batch_size=8)\n"},
        4: {"sft.py": SFT_CODE, "grpo.py": GRPO_CODE},
        5: {"sft.py": SFT_CODE, "grpo.py": GRPO_CODE},
        6: {"sft.py": SFT_CODE, "grpo.py": GRPO_CODE},
    }
    # the final code is DPO: train types must come from the snapshots, not from here
    run_dir, run = make_run(tmp_path, ledger, snapshots, {"dpo.py": "DPOTrainer(model=m)\n"})
    final = {"baseline_score": BASELINE, "score": 45.0, "delta": 5.0}
    baseline = {"score": BASELINE, "fingerprint": BASE_FP}
    summary, records = summarize(run_dir, run, final, baseline, level="L1", base_model=BASE)
    return run_dir, summary, records


def test_summary_json(summarized):
    _, summary, _ = summarized
    assert list(summary["metrics"]) == PAPER_NAMES  # paper names only, nothing of ours
    assert not set(summary["metrics_extra"]) & set(PAPER_NAMES)
    assert summary["metrics"] == {
        "valid_submission_rate": 0.6,  # 30, 45, 40 of [30, 0, 45, 40, 0]
        "first_valid_idx": 1,
        "first_valid_delay": 100,
        "score_trajectory": [30.0, 0.0, 45.0, 40.0, 0.0],
        "time_to_first_improvement": 600,
        "time_to_best": 600,
        "monotonic_ratio": 0.25,  # only 0 -> 45 increases, of four steps
        "copy_model_count": 1,
        "time_used_ratio": 0.5,
        "last_submit_gap": 300,
    }
    assert summary["metrics_extra"]["copy_weights_count"] == 1
    assert summary["metrics_extra"]["refused_requests"] == 1
    assert (summary["submissions"], summary["valid_submissions"], summary["scored_submissions"]) == (5, 3, 3)
    assert summary["route"] == "SFT+RL" and summary["coding_success"] is True
    assert summary["improvement_success"] is True and summary["failure_type"] is None
    assert summary["run_meta"] == META


def test_summary_jsonl_records(summarized):
    _, _, records = summarized
    lines = [jsonl_record(r) for r in records]
    assert [list(r)[:9] for r in lines] == [
        ["iteration", "timestamp", "duration_s", "status", "exit_code", "score", "improvement", "train_type", "failure_type"]
    ] * 5
    assert all("error" not in r and "key_config" not in r for r in lines)
    json.dumps(lines)  # serialisable
    got = [
        (r["iteration"], r["duration_s"], r["status"], r["exit_code"], r["score"], r["improvement"])
        + (r["train_type"], r["failure_type"], r["refusal"], r["best_so_far"], r["best_iteration"])
        for r in records
    ]
    assert got == [
        (1, 100, "success", None, 30.0, -10.0, "SFT-only", "training_diverged", None, 30.0, 1),
        (2, 99, "failed", None, 0.0, -40.0, "Placeholder/Missing", "code_error_runtime", "lora_adapter", 30.0, 1),
        (3, 399, "success", None, 45.0, 5.0, "SFT+RL", None, None, 45.0, 3),
        (4, 300, "success", None, 40.0, 0.0, "Copy", "copy_model_fallback", None, 45.0, 3),
        (5, 600, "failed", -15, 0.0, -40.0, "SFT+RL", "code_error_runtime", None, 45.0, 3),
    ]
    assert records[0]["timestamp"] == iso_timestamp(START + 100.9)
    assert records[0]["key_config"] == {
        "learning_rate": "5e-4",
        "num_train_epochs": "3",
        "per_device_train_batch_size": "8",
    }


def test_summary_markdown(summarized):
    _, summary, records = summarized
    text = summary_markdown(summary, records)
    assert text.startswith("# gsm8k / tiny / agent / seed 0\n")
    assert "- route: SFT+RL (coding success: yes, improvement success: yes)" in text
    assert "valid_submission_rate 0.6, first_valid_idx 1, first_valid_delay 100," in text
    assert "- score trajectory: 30 → 0 → 45 → 40 → 0" in text
    assert text.count("\n## Iteration ") == 5
    assert "- score 45 | improvement +5 | best so far 45 (iteration 3)" in text
    assert "- training type: SFT-only\n- key configuration: learning_rate=5e-4, num_train_epochs=3," in text
    assert "- problem: code_error_runtime (refused: lora_adapter): refused: lora_adapter; valid_submission_rate so far 1/2" in text
    assert "- progress: +5 over the baseline, new best; valid_submission_rate so far 2/3" in text
    assert "- problem: copy_model_fallback; valid_submission_rate so far 3/4" in text
    assert "- status: failed (grader: failed; agent exit code -15)" in text  # the last iteration
    assert "- status: success (grader: scored)\n" in text


def test_summary_of_a_run_without_submissions(tmp_path):
    run_dir, run = make_run(tmp_path, [refused(1, 5.0, "outside_workspace")], {}, {})
    write_json(run_dir / "workspace" / "run_meta.json", {**META, "last_submit_time": None})
    final = {"baseline_score": BASELINE, "score": None, "delta": None}
    summary, records = summarize(run_dir, run, final, {"score": BASELINE, "fingerprint": BASE_FP}, level="L1")
    assert records == []
    assert summary["route"] == "Placeholder/Missing" and summary["coding_success"] is False
    assert summary["improvement_success"] is False and summary["failure_type"] == "timeout_no_submission"
    assert summary["metrics"]["copy_model_count"] == 0  # the base model directory was found under models/
    assert summary["metrics"]["last_submit_gap"] is None and summary["submissions"] == 0
    assert summary["metrics_extra"]["requests"] == 1
    assert summary_markdown(summary, records).rstrip().endswith("No submission was recorded.")


def test_summary_of_a_copy_run(tmp_path):
    ledger = [entry(1, 60.0, BASELINE, path="output/base", fp=BASE_FP)]
    run_dir, run = make_run(tmp_path, ledger, {1: {"agent/copy_agent.py": "shutil.copyfile(a, b)\n"}}, {})
    final = {"baseline_score": BASELINE, "score": BASELINE, "delta": 0.0}
    summary, records = summarize(run_dir, run, final, {"score": BASELINE, "fingerprint": BASE_FP}, "L1", BASE)
    assert [r["train_type"] for r in records] == ["Copy"]
    assert summary["route"] == "Copy" and summary["failure_type"] == "copy_model_fallback"
    assert summary["metrics"]["copy_model_count"] == 0  # saved under output/: not the base directory
    assert summary["metrics_extra"]["copy_weights_count"] == 1


def test_collect_artifacts(tmp_path):
    ledger = [refused(1, 5.0, "outside_workspace"), entry(2, 60.0, 45.0), failed(3, 90.0)]
    run_dir, _ = make_run(tmp_path, ledger, {2: {"train.py": GRPO_CODE}}, {"train.py": GRPO_CODE})
    artifacts = collect_artifacts(run_dir, {"model": BASE})
    assert (artifacts["requests"], artifacts["submissions"], artifacts["scored_submissions"]) == (3, 2, 1)
    assert artifacts["base_model"] == BASE and artifacts["final_code_route"] == "GRPO"
    assert artifacts["snapshots"] == ["0002"] and artifacts["code_files"] == ["code/train.py"]
    assert collect_artifacts(run_dir)["base_model"] == BASE  # found under models/ without a manifest


def test_key_configuration(tmp_path):
    root = code(
        tmp_path,
        "code",
        {
            "train.py": 'lr = env_float("LR", 1e-5)  # note\nif lr == 0: pass\n'
            "cfg = GRPOConfig(num_generations=4, beta=0.04, max_steps=int(n * 2), learning_rate=lr)\n",
            "conf.yaml": "batch_size: 16\n",
        },
    )
    assert key_configuration(root) == {
        "learning_rate": "lr",
        "lr": 'env_float("LR", 1e-5)',
        "max_steps": "int(n * 2)",
        "batch_size": "16",
        "num_generations": "4",
        "beta": "0.04",
    }
    assert key_configuration(None) == {}
