"""Operating modes audited from the recorded code: free never violates, sft-only forbids RL and
preference methods, rl-only forbids SFT without RL (and a trained run without any RL method).

Real TRL code snippets, read by agent_code.training_methods; then summaries of runs the grader
recorded (code.git), summary.md and the leaderboard's mode columns.
"""

from __future__ import annotations

import csv
import shutil
import time
from pathlib import Path

import pytest
import requests

import rlbench.summaries.summary
from rlbench.summaries.agent_code import training_methods
from rlbench.summaries.markdown import summary_markdown
from rlbench.grader.fingerprint import fingerprint
from rlbench.fileio.jsonio import read_json, read_jsonl, write_json
from rlbench.summaries.modes import FINAL, audit_mode
from rlbench.analysis.report import LEADERBOARD_COLUMNS, write_leaderboard
from support.models import copy_model

SFT = """from trl import SFTConfig, SFTTrainer
trainer = SFTTrainer(model=model, args=SFTConfig(output_dir="out", learning_rate=2e-5), train_dataset=ds)
trainer.train()
"""
GRPO = """from trl import GRPOConfig, GRPOTrainer
trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=GRPOConfig(num_generations=4), train_dataset=ds)
trainer.train()
"""
DPO = """from trl import DPOConfig, DPOTrainer
trainer = DPOTrainer(model=model, args=DPOConfig(beta=0.1), train_dataset=pairs)
trainer.train()
"""
PPO = "trainer = PPOTrainer(args=config, model=policy, ref_model=ref, reward_model=rm, train_dataset=ds)\n"
IMPORTS_ONLY = "from trl import GRPOTrainer, DPOTrainer, SFTTrainer\nprint('planning')\n"


def methods(tmp_path: Path, name: str, files: dict[str, str]) -> set[str]:
    root = tmp_path / name
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return training_methods(root)


@pytest.fixture
def code(tmp_path):
    return {
        "sft": methods(tmp_path, "sft", {"sft.py": SFT}),
        "grpo": methods(tmp_path, "grpo", {"grpo.py": GRPO}),
        "dpo": methods(tmp_path, "dpo", {"dpo.py": DPO}),
        "ppo": methods(tmp_path, "ppo", {"ppo.py": PPO}),
        "sft+grpo": methods(tmp_path, "sftgrpo", {"sft.py": SFT, "rl/grpo.py": GRPO}),
        "sft+dpo": methods(tmp_path, "sftdpo", {"sft.py": SFT, "dpo.py": DPO}),
        "none": methods(tmp_path, "none", {"plan.py": IMPORTS_ONLY}),
    }


def test_the_snippets_show_the_methods_they_use(code):
    assert code["sft"] == {"sft"} and code["grpo"] == {"grpo"} and code["dpo"] == {"preference"}
    assert code["ppo"] == {"ppo"} and code["sft+grpo"] == {"sft", "grpo"} and code["none"] == set()


def test_free_never_violates(code):
    audit = audit_mode("free", [(i, m) for i, m in enumerate(code.values(), 1)], submitted_trained_weights=True)
    assert audit["violation"] is False and audit["violations"] == []
    assert audit["methods_used"] == ["grpo", "ppo", "preference", "sft"] and audit["evidence"] == "code revisions"
    assert audit_mode(None, [(1, code["grpo"])])["mode"] == "free"  # a run recorded before modes


@pytest.mark.parametrize("forbidden", ["grpo", "dpo", "ppo", "sft+grpo", "sft+dpo"])
def test_sft_only_forbids_rl_and_preference_methods(code, forbidden):
    audit = audit_mode("sft-only", [(1, code["sft"]), (2, code[forbidden]), (FINAL, code["sft"])], True)
    assert audit["violation"] is True
    assert [v["submission_id"] for v in audit["violations"]] == [2]
    assert audit["violations"][0]["methods"] == sorted(code[forbidden]) and "sft-only" in audit["violations"][0]["why"]


def test_sft_only_with_sft_alone_is_fine(code):
    audit = audit_mode("sft-only", [(1, code["sft"]), (2, code["none"]), (FINAL, code["sft"])], True)
    assert audit["violation"] is False and audit["methods_used"] == ["sft"]


def test_sft_only_counts_rl_code_left_in_the_final_state(code):
    audit = audit_mode("sft-only", [(1, code["sft"]), (FINAL, code["sft+grpo"])], True)
    assert [v["submission_id"] for v in audit["violations"]] == [FINAL]


def test_rl_only_allows_sft_as_a_warm_up_of_rl(code):
    audit = audit_mode(
        "rl-only", [(1, code["grpo"]), (2, code["sft+grpo"]), (3, code["ppo"]), (FINAL, code["sft+grpo"])], True
    )
    assert audit["violation"] is False and audit["methods_used"] == ["grpo", "ppo", "sft"]


def test_rl_only_forbids_a_submission_with_sft_and_no_rl(code):
    audit = audit_mode("rl-only", [(1, code["sft"]), (2, code["sft+grpo"])], True)
    assert audit["violation"] is True
    assert [(v["submission_id"], v["methods"]) for v in audit["violations"]] == [(1, ["sft"])]
    # SFT then DPO is no RL either.
    assert [v["submission_id"] for v in audit_mode("rl-only", [(1, code["sft+dpo"])], True)["violations"]] == [1, None]


def test_rl_only_forbids_trained_weights_without_any_rl_method(code):
    audit = audit_mode(
        "rl-only", [(1, code["dpo"]), (2, code["none"]), (FINAL, code["dpo"])], submitted_trained_weights=True
    )
    assert [v["submission_id"] for v in audit["violations"]] == [None]
    assert "no recorded code uses an RL method" in audit["violations"][0]["why"]
    # No trained weights (the base model resubmitted): nothing was trained against the mode.
    assert audit_mode("rl-only", [(1, code["none"])], submitted_trained_weights=False)["violation"] is False


def test_an_unknown_mode_is_audited_as_free_and_says_so(code):
    audit = audit_mode("multi-task", [(1, code["grpo"])], True)
    assert audit["violation"] is False and "unknown mode" in audit["note"]


# -- a recorded run: code.git revisions decide -------------------------------------------------------------
def recorded_run(workspace, start_grader, tiny_model, mode: str, steps: list[dict[str, str]]) -> Path:
    """One submission of the base model per step, the code/ files of that step written first;
    run.json and workspace.json as the workflow writes them."""
    run_dir = workspace.parent
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    for files in steps:
        shutil.rmtree(workspace / "code")
        (workspace / "code").mkdir()
        for rel, text in files.items():
            (workspace / "code" / rel).write_text(text)
        response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=120)
        assert response.status_code == 200, response.text
    write_json(
        run_dir / "run.json",
        {
            "status": "completed",
            "exit_code": 0,
            "start_time": server.grader.config.start_time,
            "end_time": time.time(),
            "time_limit_s": 600,
            "labels": {"task": "gsm8k", "model": "tiny", "agent": f"test-{mode}", "seed": 0},
        },
    )
    write_json(run_dir / "workspace.json", {"model": "models/rlbench/tiny-qwen2", "mode": mode})
    return run_dir


def summarize(run_dir: Path, tiny_model: Path, **kw) -> tuple[dict, list[dict]]:
    final = {"baseline_score": 0.0, "score": 0.0, "delta": 0.0}
    baseline = {"score": 0.0, "fingerprint": fingerprint(tiny_model)}
    run = read_json(run_dir / "run.json")
    return rlbench.summaries.summary.summarize(run_dir, run, final, baseline, level="L1", **kw)


def test_sft_only_run_with_grpo_code_is_a_violation(workspace, start_grader, tiny_model, tmp_path):
    run_dir = recorded_run(
        workspace, start_grader, tiny_model, "sft-only", [{"sft.py": SFT}, {"sft.py": SFT, "grpo.py": GRPO}]
    )
    # The snapshots are gone: the code revisions alone decide.
    for snapshot in (run_dir / "grader" / "snapshots").glob("*/code"):
        shutil.rmtree(snapshot)
    summary, records = summarize(run_dir, tiny_model)
    audit = summary["mode_audit"]
    assert summary["mode"] == "sft-only" and audit["violation"] is True
    assert audit["evidence"] == "code revisions + final code/"
    assert [(v["submission_id"], v["methods"]) for v in audit["violations"]] == [
        (2, ["grpo", "sft"]),
        (FINAL, ["grpo", "sft"]),
    ]
    assert [r["submission_id"] for r in audit["revisions"]] == [1, 2, FINAL]
    revisions = [e["code_revision"] for e in read_jsonl(run_dir / "grader" / "ledger.jsonl")]
    assert all(revisions)
    text = summary_markdown(summary, records)
    assert (
        "- mode: sft-only: **MODE VIOLATION**" in text and "  - submission 2: sft-only, but the code uses grpo" in text
    )
    # The leaderboard carries the mode and the verdict.
    write_json(tmp_path / "summary.json", summary)
    out = tmp_path / "leaderboard.csv"
    write_leaderboard([tmp_path / "summary.json"], out)
    row = next(csv.DictReader(open(out)))
    assert (row["mode"], row["mode_violation"]) == ("sft-only", "yes")


def test_rl_only_run_with_a_warm_up_is_fine(workspace, start_grader, tiny_model):
    run_dir = recorded_run(
        workspace, start_grader, tiny_model, "rl-only", [{"grpo.py": GRPO}, {"sft.py": SFT, "grpo.py": GRPO}]
    )
    summary, records = summarize(run_dir, tiny_model)
    assert summary["mode"] == "rl-only" and summary["mode_audit"]["violation"] is False
    assert summary["mode_audit"]["methods_used"] == ["grpo", "sft"]
    assert "- mode: rl-only (no violation; training methods in the code: grpo, sft)" in summary_markdown(
        summary, records
    )


def test_the_mode_given_overrides_the_manifest(workspace, start_grader, tiny_model):
    run_dir = recorded_run(workspace, start_grader, tiny_model, "free", [{"dpo.py": DPO}])
    assert summarize(run_dir, tiny_model)[0]["mode_audit"]["violation"] is False
    summary, _ = summarize(run_dir, tiny_model, mode="sft-only")
    assert summary["mode"] == "sft-only" and summary["mode_audit"]["violation"] is True


def test_leaderboard_mode_columns(tmp_path):
    base = {"level": "L1", "baseline": 1.0, "best": 2.0, "delta": 1.0, "submissions": 1, "status": "completed"}
    summaries = {
        "free": {
            **base,
            "labels": {"task": "t", "model": "m", "agent": "a", "seed": 0},
            "mode": "free",
            "mode_audit": {"violation": False},
        },
        "rl": {
            **base,
            "labels": {"task": "t", "model": "m", "agent": "b", "seed": 0},
            "mode": "rl-only",
            "mode_audit": {"violation": True},
        },
        "old": {**base, "labels": {"task": "t", "model": "m", "agent": "c", "seed": 0}},  # summarized before modes
    }
    paths = []
    for name, summary in summaries.items():
        paths.append(tmp_path / f"{name}.json")
        write_json(paths[-1], summary)
    out = tmp_path / "leaderboard.csv"
    assert write_leaderboard(paths, out) == 3
    reader = csv.DictReader(open(out))
    assert tuple(reader.fieldnames) == LEADERBOARD_COLUMNS and "mode" in LEADERBOARD_COLUMNS
    rows = {r["agent"]: (r["mode"], r["mode_violation"]) for r in reader}
    assert rows == {"a": ("free", "no"), "b": ("rl-only", "yes"), "c": ("", "")}
