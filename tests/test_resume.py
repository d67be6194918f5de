"""An interrupted sweep resumes: kill -9 of Snakemake's whole process group while the agent runs, then
the documented resume (`make resume`); the killed agent run starts again as a new attempt, the old
ledger kept, and the fault-injection audit (tests/support/faults.py) finds no acknowledged
submission lost, no torn ledger line and no submission id twice. The slow tier's fault-injection
trials (tests/test_fault_injection.py) kill each part of the sweep at seeded random moments."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from rlbench.agent_run.attempts import marked_processes
from rlbench.fileio.jsonio import read_json, read_jsonl
from support.faults import audit_submissions
from support.workflow import (
    REPO,
    SFT_RUN,
    SFT_RUN_CONFIG,
    SNAKEMAKE_ENV,
    make_workdir,
    planned_jobs,
    snakemake,
    snakemake_argv,
)


# The sft agent's two rounds on HumanEval (support.workflow.SFT_RUN_CONFIG): the kill after the first
# submission lands while round 2 trains.
CONFIG = {**SFT_RUN_CONFIG, "sandbox": {"backend": "none"}}


@pytest.mark.slow  # 80-95 s; the fault-injection trials (slow tier too) kill the same run at other moments
def test_killed_sweep_resumes_with_a_new_attempt_and_keeps_the_old_ledger(tmp_path):
    workdir = make_workdir(tmp_path, CONFIG)
    run_dir = workdir / SFT_RUN
    ledger = run_dir / "grader" / "ledger.jsonl"
    sweep = subprocess.Popen(
        snakemake_argv(workdir, "--cores", "2"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=SNAKEMAKE_ENV,
        start_new_session=True,
    )
    deadline = time.time() + 300
    # Kill Snakemake and its jobs once the agent's first submission is in the ledger, mid-run.
    while not (ledger.exists() and ledger.read_text().strip()):
        assert sweep.poll() is None and time.time() < deadline, "the sweep ended before the first submission"
        time.sleep(0.5)
    first = read_json(run_dir / "attempt.json")
    os.killpg(sweep.pid, signal.SIGKILL)
    sweep.wait()
    assert not (run_dir / "run.json").exists()

    assert planned_jobs(workdir)["run_agent"] == 1
    # The documented resume (make resume): release the dead process's lock, run the profile again.
    snakemake(workdir, "--unlock")
    snakemake(workdir, "--profile", str(REPO / "workflow" / "profiles" / "local"), "--cores", "2")

    archived = run_dir / "attempts" / "1"
    old_entries = list(read_jsonl(archived / "grader" / "ledger.jsonl"))
    assert len(old_entries) >= 1 and old_entries[0]["submission_id"] == 1
    assert (archived / "workspace" / "output").is_dir()
    run = read_json(run_dir / "run.json")
    assert run["attempt"] == 2 and run["previous_attempts"] == ["attempts/1"] and run["status"] == "completed"
    assert list(read_jsonl(run_dir / "grader" / "ledger.jsonl"))  # the new attempt's own submissions
    assert marked_processes(first["marker"]) == []  # nothing of the killed attempt still runs
    assert (workdir / "results" / "report" / "leaderboard.csv").exists()

    # What the agent was told (its agent.log, every attempt) is what each attempt's ledger holds.
    audit = audit_submissions(run_dir)
    assert audit["acknowledged"] >= 1, audit
    assert audit["lost"] == [] and audit["invalid_ledger_lines"] == [] and audit["duplicate_ids"] == [], audit
