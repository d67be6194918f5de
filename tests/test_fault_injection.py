"""Fault injection: kill -9 a part of a real sweep at a random moment, resume, audit.

Targets: (1) Snakemake, its main pid only (not its process group: what a user's crash or an OOM
kill does, and the harder case, since its jobs live on), (2) the runner (run_agent.py, the
grading server's process), (3) the agent (its root process, its main process or its whole
tree), (4) the grader's evaluation child. The moment is a seeded random delay after an event
(the runner's start, the first ledger entry, an evaluation child existing), so every trial is
reproducible from (RLBENCH_FAULT_SEED, target, index); `-k snakemake-3` reruns one.

Every trial then checks, for the fixed behaviour:
  - no acknowledged submission is lost: every response an agent logged (agent.log of the current
    attempt and of every archived attempts/<k>/) is in that attempt's ledger, same status, same score;
  - every ledger line of every attempt is valid JSON, no submission id twice;
  - nothing outlives the part it depends on (a runner its Snakemake, an evaluation child its
    grader, agent processes their runner), and once things settle (before the resume) nothing of
    the run is left: no process with an attempt's marker, no runner, no `rlbench.evaluation`
    child, no process working in the run's directory, no grading port accepting connections;
  - the resume (`snakemake --unlock`, then the profile again, as `make resume`) completes with
    run.json, final.json, summary.json and the leaderboard, and leaves nothing behind either;
  - a run killed mid-way starts again as a new attempt (attempt numbering in run.json), and each
    archived attempt (attempts/<k>/) keeps its ledger and the workspace's submitted checkpoints;
  - a killed evaluation is the grader's fault: 503 grader_error (retryable), not 422.

All trials are in the slow tier (`make test-all`, CI): one per target on a 120 s budget (the sft
agent on HumanEval, support.workflow.SFT_RUN_CONFIG, makes two submissions); Snakemake's is killed
just after the first submission is recorded, so the resume must start a new attempt and keep the old
one's ledger. RLBENCH_FAULT_TRIALS=N adds N more per target on 240 s, with the event drawn too:
`RLBENCH_FAULT_TRIALS=5 pytest -m slow tests/test_fault_injection.py` (CI runs the four fixed trials
only, to stay inside its time). The
figures (trials, acknowledged submissions, lost, leftovers) are printed at the end and, when
RLBENCH_FIGURES_DIR is set, written to $RLBENCH_FIGURES_DIR/faults.json.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from rlbench.recording.ledger import is_scored
from support.faults import (
    RUN_REL,
    Plan,
    Trial,
    Watch,
    attempt_dirs,
    audit_submissions,
    cleanup,
    inject,
    ledger_entries,
    ledger_entry,
    log_tail,
    prepare_copy,
    resume,
    settle,
    start_sweep,
    wait_sweep,
)
from support.workflow import SFT_RUN_CONFIG, make_workdir, snakemake

SEED = int(os.environ.get("RLBENCH_FAULT_SEED", "1130"))
TARGETS = ("snakemake", "runner", "agent", "eval_child")
# Drawn trials per target beyond the fixed one (0 in CI: see the docstring).
SLOW_TRIALS_PER_TARGET = int(os.environ.get("RLBENCH_FAULT_TRIALS", "0"))
CI_TIME_LIMIT_S = 120  # the sft agent's two rounds take about 40 s with its imports: two submissions
SLOW_TIME_LIMIT_S = 240  # room for two rounds (two distinct checkpoints) on a machine several times slower
SETTLE_S = 20  # after the fault (and the sweep's end), how long leftovers get to go away
# The moment: an event, then a random delay. The fixed trials take one event per target (the first
# ledger entry, a delay into the run, or an evaluation in flight); drawn trials draw the event too.
EVENTS = ("delay", "first_ledger_entry", "eval_child")
CI_EVENTS = {"snakemake": "first_ledger_entry", "runner": "eval_child", "agent": "delay", "eval_child": "eval_child"}
# Delay ranges (s). "delay" counts from the runner's start and stays inside the agent's run (about
# 35-40 s on 2 cores: imports, two rounds of about 10 s, two evaluations); Snakemake may also be
# killed later, while the run's results are evaluated and summarised. An evaluation in a warm
# worker takes a few seconds (the tiny model on HumanEval's 82 problems): a kill drawn later than
# 1 s after one is seen could find it over, and with two submissions there may be no next one.
DELAYS = {"first_ledger_entry": (0.0, 3.0), "eval_child": (0.0, 1.0)}
RUN_DELAYS = {"snakemake": {True: (5, 25), False: (3, 60)}, "other": {True: (5, 25), False: (3, 30)}}
FIGURES: list[Trial] = []


def plan_for(target: str, index: int, seed: int = SEED) -> Plan:
    rng = random.Random(f"{seed}:{target}:{index}")
    ci = index == 0
    if target == "eval_child":
        event = "eval_child"
    else:
        event = CI_EVENTS[target] if ci else rng.choice(EVENTS)
    if event == "delay":
        low, high = RUN_DELAYS["snakemake" if target == "snakemake" else "other"][ci]
    else:
        low, high = DELAYS[event]
    delay = round(rng.uniform(low, high), 1)
    variant = rng.choice(("root", "main", "tree")) if target == "agent" else "pid"
    return Plan(f"{target}-{index}", target, event, delay, variant, CI_TIME_LIMIT_S if ci else SLOW_TIME_LIMIT_S)


# Every trial is in the slow tier.
PLANS = [pytest.param(plan_for(target, 0), id=f"{target}-0", marks=pytest.mark.slow) for target in TARGETS] + [
    pytest.param(plan_for(target, index), id=f"{target}-{index}", marks=pytest.mark.slow)
    for index in range(1, SLOW_TRIALS_PER_TARGET + 1)
    for target in TARGETS
]


def sweep_config(time_limit_s: int, kill_grace_s: int = 2) -> dict:
    """The sft agent on HumanEval (support.workflow.SFT_RUN_CONFIG): a new checkpoint every round."""
    return {
        **SFT_RUN_CONFIG,
        "budget": {"time_limit_s": time_limit_s, "kill_grace_s": kill_grace_s},
    }


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A workdir run up to the agent (data, salt, model, baseline, workspace), copied per trial."""
    workdir = make_workdir(tmp_path_factory.mktemp("fault_template"), sweep_config(SLOW_TIME_LIMIT_S))
    snakemake(workdir, "--cores", "2", "--omit-from", "run_agent")
    assert (workdir / RUN_REL / "workspace.json").exists()
    assert (workdir / "results" / "baselines" / "humaneval" / "tiny.json").exists()
    return workdir


def summarize(trials: list[Trial]) -> dict:
    failed: dict[str, list[str]] = {}
    for trial in trials:
        for category, _ in trial.failures:
            failed.setdefault(category, [])
            if trial.plan.trial not in failed[category]:
                failed[category].append(trial.plan.trial)
    seconds = [t.seconds for t in trials]
    return {
        "seed": SEED,
        "trials": len(trials),
        "injected": sum(bool(t.injection.get("injected")) for t in trials),
        "acknowledged_submissions": sum(t.audit.get("acknowledged", 0) for t in trials),
        "lost": sum(len(t.audit.get("lost", [])) for t in trials),
        "invalid_ledger_lines": sum(len(t.audit.get("invalid_ledger_lines", [])) for t in trials),
        "leftovers": {
            "orphaned": sum(len(t.orphans) for t in trials),
            "after_fault": sum(len(t.after_fault) for t in trials),
            "after_resume": sum(len(t.after_resume) for t in trials),
        },
        "resumes_completed": sum(not any(c in ("resume_failed", "outputs_missing") for c, _ in t.failures) for t in trials),
        "trials_passed": sum(not t.failures for t in trials),
        "failed_checks": failed,
        "seconds_per_trial": {"mean": round(sum(seconds) / len(seconds), 1), "max": round(max(seconds), 1)},
        "per_trial": [
            {
                "trial": t.plan.trial,
                "plan": t.plan.describe(),
                "seconds": round(t.seconds, 1),
                "injection": t.injection,
                "acknowledged": t.audit.get("acknowledged", 0),
                "lost": t.audit.get("lost", []),
                "orphaned": t.orphans,
                "after_fault": t.after_fault,
                "after_resume": t.after_resume,
                "attempts": t.attempts,
                "resume": t.resume,
                "failures": [f"{c}: {m}" for c, m in t.failures],
            }
            for t in trials
        ],
    }


@pytest.fixture(scope="module", autouse=True)
def figures(request):
    yield
    if not FIGURES:
        return
    summary = summarize(FIGURES)
    left = summary["leftovers"]
    lines = [
        f"fault injection (seed {SEED}): {summary['trials']} trials, {summary['injected']} faults injected, "
        f"{summary['acknowledged_submissions']} acknowledged submissions, {summary['lost']} lost, "
        f"{summary['invalid_ledger_lines']} invalid ledger lines; leftovers: {left['orphaned']} orphaned, "
        f"{left['after_fault']} after the fault settled, {left['after_resume']} after the resume; "
        f"{summary['resumes_completed']} resumes completed; {summary['trials_passed']} trials passed; "
        f"{summary['seconds_per_trial']['mean']} s per trial (max {summary['seconds_per_trial']['max']})",
        *(f"  failed check {c}: {', '.join(ids)}" for c, ids in summary["failed_checks"].items()),
    ]
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    for line in lines:
        reporter.write_line(line) if reporter is not None else print(line)
    directory = os.environ.get("RLBENCH_FIGURES_DIR")
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "faults.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def check(trial: Trial, workdir: Path) -> None:
    """Fill trial.failures (category, message) from what the trial saw."""
    fail = trial.failures.append
    run_dir = workdir / RUN_REL
    if not trial.injection.get("injected"):
        fail(("not_injected", f"the moment never came while the sweep ran ({trial.plan.describe()})"))
    if trial.plan.target in ("agent", "eval_child") and trial.first_sweep_rc != 0:
        # An agent's failure is a result, not an error: this sweep must finish on its own.
        fail(("sweep_failed", f"the sweep exited {trial.first_sweep_rc} after the {trial.plan.target} was killed"))
    audit = trial.audit
    if audit["lost"]:
        fail(("lost", f"{len(audit['lost'])} acknowledged submission(s) lost: " + "; ".join(audit["lost"])))
    if audit["invalid_ledger_lines"]:
        fail(("invalid_ledger", "; ".join(audit["invalid_ledger_lines"])))
    if audit["duplicate_ids"]:
        fail(("duplicate_ids", "; ".join(audit["duplicate_ids"])))
    if trial.orphans:
        fail(("orphaned", "; ".join(trial.orphans)))
    if trial.after_fault:
        fail(("left_after_fault", f"still there {SETTLE_S}s after the fault (before the resume): " + "; ".join(trial.after_fault)))
    if trial.resume.get("unlock_rc") != 0 or trial.resume.get("run_rc") != 0:
        fail(("resume_failed", f"snakemake --unlock exit {trial.resume.get('unlock_rc')}, run exit {trial.resume.get('run_rc')}"))
    outputs = [run_dir / "run.json", run_dir / "final.json", run_dir / "summary.json", workdir / "results" / "report" / "leaderboard.csv"]
    missing = [str(p.relative_to(workdir)) for p in outputs if not p.exists()]
    if missing:
        fail(("outputs_missing", "after the resume: " + ", ".join(missing)))
    if trial.after_resume:
        fail(("left_after_resume", "; ".join(trial.after_resume)))
    if (run_dir / "run.json").exists():
        run = json.loads((run_dir / "run.json").read_text())
        trial.attempts = run.get("attempt", 0)
        expected = [f"attempts/{k}" for k in range(1, run.get("attempt", 1))]
        if run.get("previous_attempts") != expected:
            fail(("attempt_numbering", f"run.json: attempt {run.get('attempt')}, previous {run.get('previous_attempts')}"))
        mid_run = trial.plan.target in ("snakemake", "runner") and trial.plan.event == "first_ledger_entry"
        if mid_run and trial.injection.get("injected") and trial.attempts < 2:
            # The run was killed before its run.json: the resume runs the agent again, as attempt 2.
            fail(("no_new_attempt", f"run.json: attempt {trial.attempts} after the {trial.plan.target} was killed mid-run"))
    for directory in attempt_dirs(run_dir)[:-1]:  # the archived attempts keep what their agent submitted
        entries = ledger_entries(directory)
        before = trial.injection.get("ledger_lines_before") or 0
        if str(trial.injection.get("attempt")) == directory.name and len(entries) < before:
            fail(("archived_ledger_short", f"attempts/{directory.name}: {len(entries)} ledger entries, {before} before the kill"))
        scored = {str(e["model_path"]) for e in entries if is_scored(e) and e.get("model_path")}
        gone = sorted(path for path in scored if not (directory / "workspace" / path).is_dir())
        if gone:
            fail(("archived_checkpoint_missing", f"attempts/{directory.name}/workspace lacks scored {', '.join(gone)}"))
    for killed in trial.injection.get("killed_evaluations", []):
        sid, attempt = killed["submission_id"], killed["attempt"]
        entry = ledger_entry(run_dir, attempt, sid)
        if killed.get("result_written") and entry is not None and entry.get("status") == "scored":
            continue  # the evaluation had ended (result written, answer on its way) when the worker was killed
        if entry is None:
            fail(("killed_eval_unrecorded", f"no ledger entry for submission {sid} (attempt {attempt}) whose evaluation was killed"))
        elif entry.get("status") != "grader_error" or entry.get("retryable") is not True:
            fail((
                "killed_eval_not_grader_error",
                f"submission {sid} whose evaluation child was killed is recorded as {entry.get('status')}/"
                f"{entry.get('reason')} (retryable {entry.get('retryable')}), not grader_error (the grader's fault, retryable)",
            ))
        counted = [e.get("submission_id") for e in scores_json(run_dir, attempt)]
        if sid in counted:
            fail(("killed_eval_counted", f"submission {sid} whose evaluation child was killed counts in scores.json: {counted}"))
        for response in audit["responses"]:
            if response["attempt_no"] == attempt and response["submission_id"] == sid and response["http"] != 503:
                fail(("killed_eval_not_503", f"submission {sid} whose evaluation child was killed was answered HTTP {response['http']}, not 503"))


def scores_json(run_dir: Path, attempt: int | None) -> list[dict]:
    """The agent-visible scores.json (the reference's view: what counts as a submission) of one attempt."""
    for directory in attempt_dirs(run_dir):
        try:
            if json.loads((directory / "attempt.json").read_text())["attempt"] == attempt:
                return json.loads((directory / "workspace" / "scores.json").read_text())
        except (OSError, ValueError, KeyError):
            continue
    return []


def run_trial(plan: Plan, template: Path, tmp_path: Path) -> Trial:
    trial = Trial(plan)
    started = time.time()
    workdir = tmp_path / "work"
    prepare_copy(template, workdir, sweep_config(plan.time_limit_s, plan.kill_grace_s))
    watch = Watch(workdir, plan.kill_grace_s)
    sweeps = []
    try:
        sweep = start_sweep(workdir, tmp_path / "sweep.log")
        sweeps.append(sweep)
        trial.injection = inject(plan, sweep, watch, timeout_s=plan.time_limit_s + 300)
        trial.first_sweep_rc = wait_sweep(sweep, watch, plan.time_limit_s + 400)
        if trial.first_sweep_rc is None:
            trial.failures.append(("sweep_hung", "the faulted sweep did not end"))
            sweep.kill()
            sweep.wait()
        trial.after_fault = settle(workdir, watch, SETTLE_S + plan.kill_grace_s)
        trial.resume = resume(workdir, watch, tmp_path / "resume.log", plan.time_limit_s + 600)
        trial.after_resume = settle(workdir, watch, SETTLE_S)
        trial.orphans = sorted(watch.violations.values())
        trial.audit = audit_submissions(watch.run_dir)
        check(trial, workdir)
    finally:
        cleanup(workdir, watch, sweeps)
        trial.seconds = time.time() - started
    return trial


def test_the_audit_catches_a_lost_submission_a_changed_answer_and_a_torn_ledger_line(tmp_path):
    """The checker itself, on a made-up run: without this the trials could pass by seeing nothing."""
    run_dir = tmp_path / RUN_REL
    archived = run_dir / "attempts" / "1"
    for directory, number in ((archived, 1), (run_dir, 2)):
        (directory / "grader").mkdir(parents=True)
        (directory / "workspace").mkdir(parents=True)
        (directory / "attempt.json").write_text(json.dumps({"attempt": number, "marker": f"m{number}"}))
    answer = {"submission_id": 1, "status": "scored", "score": 25.0}
    (archived / "workspace" / "agent.log").write_text(
        f"[10:00:00] submit output/v1 -> HTTP 200: {json.dumps(answer)}\n"
        f"[10:00:09] submit output/v2 -> HTTP 200: {json.dumps({**answer, 'submission_id': 2})}\n"
        "[10:00:10] submit output/v3 -> HTTP 200: {\"submission_id\": 3, \"sta\n"  # torn: the agent died writing it
    )
    (archived / "grader" / "ledger.jsonl").write_text(json.dumps(answer) + "\n" + '{"submission_id": 2, "sta\n')
    (run_dir / "workspace" / "agent.log").write_text(
        f"[10:01:00] submit output/v1 -> HTTP 503: {json.dumps({**answer, 'status': 'grader_error', 'score': 0.0})}\n"
    )
    (run_dir / "grader" / "ledger.jsonl").write_text(json.dumps({**answer, "status": "failed", "score": 0.0}) + "\n")
    audit = audit_submissions(run_dir)
    assert audit["acknowledged"] == 3 and audit["torn_log_lines"] == 1
    assert len(audit["lost"]) == 2  # attempt 1's submission 2 (its ledger line is torn), attempt 2's changed answer
    assert "attempts/1: HTTP 200 for submission 2" in audit["lost"][0] and "grader_error/0.0" in audit["lost"][1]
    assert len(audit["invalid_ledger_lines"]) == 1 and "attempts/1 ledger line 2" in audit["invalid_ledger_lines"][0]
    assert [r["attempt_no"] for r in audit["responses"]] == [1, 1, 2]


def test_the_checks_catch_a_resume_without_a_new_attempt_and_an_archive_that_lost_a_checkpoint(tmp_path):
    """check() on a made-up resumed run: Snakemake killed just after attempt 1's first two ledger entries."""
    workdir = tmp_path / "work"
    run_dir = workdir / RUN_REL
    archived = run_dir / "attempts" / "1"
    for directory, number in ((archived, 1), (run_dir, 2)):
        (directory / "grader").mkdir(parents=True)
        (directory / "workspace" / "output" / "v1").mkdir(parents=True)
        (directory / "attempt.json").write_text(json.dumps({"attempt": number, "marker": f"m{number}"}))
    scored = {"submission_id": 1, "status": "scored", "score": 25.0, "model_path": "output/v1"}
    (archived / "grader" / "ledger.jsonl").write_text(json.dumps(scored) + "\n")
    outputs = [run_dir / "final.json", run_dir / "summary.json", workdir / "results" / "report" / "leaderboard.csv"]
    for path in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")

    def failures(attempt: int, ledger_lines_before: int = 1) -> set[str]:
        (run_dir / "run.json").write_text(json.dumps(
            {"attempt": attempt, "previous_attempts": [f"attempts/{k}" for k in range(1, attempt)]}))
        trial = Trial(plan_for("snakemake", 0), resume={"unlock_rc": 0, "run_rc": 0},
                      injection={"injected": True, "attempt": 1, "ledger_lines_before": ledger_lines_before},
                      audit=audit_submissions(run_dir))
        check(trial, workdir)
        return {category for category, _ in trial.failures}

    assert plan_for("snakemake", 0).event == "first_ledger_entry"
    assert failures(2) == set()
    assert failures(1) == {"no_new_attempt"}  # the resume reused the killed attempt's run
    assert failures(2, ledger_lines_before=2) == {"archived_ledger_short"}  # an entry recorded before the kill is gone
    (archived / "workspace" / "output" / "v1").rmdir()
    assert failures(2) == {"archived_checkpoint_missing"}


def test_trial_plans_are_reproducible_and_cover_every_target():
    assert [plan_for(t, i) for t in TARGETS for i in range(3)] == [plan_for(t, i) for t in TARGETS for i in range(3)]
    assert plan_for("agent", 2, seed=1) != plan_for("agent", 2, seed=2)
    plans = [p.values[0] for p in PLANS]
    # One fixed trial per target, on the short budget, the three events among them; then the drawn ones.
    fixed = [p for p in plans if p.trial.endswith("-0")]
    assert [p.target for p in fixed] == list(TARGETS) and {p.time_limit_s for p in fixed} == {CI_TIME_LIMIT_S}
    assert len(plans) == len(TARGETS) * (1 + SLOW_TRIALS_PER_TARGET)
    # Drawn trials (RLBENCH_FAULT_TRIALS=N) take the long budget and draw their event: five per target
    # cover all three events and the three ways of killing an agent.
    drawn = [plan_for(t, i, seed=1130) for t in TARGETS for i in range(1, 6)]
    assert {p.time_limit_s for p in drawn} == {SLOW_TIME_LIMIT_S}
    assert {p.event for p in drawn} == set(EVENTS)
    assert {p.variant for p in drawn if p.target == "agent"} == {"root", "main", "tree"}


@pytest.mark.parametrize("plan", PLANS)
def test_kill_9_loses_no_acknowledged_submission_and_leaves_nothing_behind(plan, template, tmp_path):
    trial = run_trial(plan, template, tmp_path)
    FIGURES.append(trial)
    injection = trial.injection
    print(
        f"\n[{plan.trial}] {plan.describe()}: killed {'+'.join(injection.get('killed_names', [])) or 'nothing'} "
        f"{injection.get('since_runner_start_s')}s into attempt {injection.get('attempt')}; "
        f"{trial.audit.get('acknowledged', 0)} acknowledged, {len(trial.audit.get('lost', []))} lost; "
        f"leftovers {len(trial.orphans)} orphaned / {len(trial.after_fault)} after fault / "
        f"{len(trial.after_resume)} after resume; final attempt {trial.attempts}; {trial.seconds:.0f}s"
    )
    assert not trial.failures, (
        f"{plan.trial}: {plan.describe()}; injected: {json.dumps(injection)}\n"
        + "\n".join(f"- {category}: {message}" for category, message in trial.failures)
        + f"\n--- sweep log tail:\n{log_tail(tmp_path / 'sweep.log')}\n--- resume log tail:\n{log_tail(tmp_path / 'resume.log')}"
    )
