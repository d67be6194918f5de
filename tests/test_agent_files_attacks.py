"""The agent-visible files (run_meta.json, scores.json, submissions.json, timer.sh) are best-effort
copies of the grader's own records (issue 25, item 6): whatever the agent puts in their place (a
directory, a link to elsewhere, a FIFO, a read-only directory), the grader answers and records every
submission, finishes, and the runner writes run.json; no write follows the agent's link."""

from __future__ import annotations

import os
import stat
import threading
import time

import pytest
import requests

from rlbench.agent_run.runner import run_agent
from rlbench.fileio.jsonio import read_json, read_jsonl
from rlbench.grader.visible import write_timer
from support.grader import assert_consistent
from support.models import copy_model
from support.runs import spec_for

VISIBLE = ("run_meta.json", "scores.json", "submissions.json")
ATTACKS = ("directory", "symlink", "fifo", "read_only_directory")


def attack(workspace, name: str, how: str, outside) -> None:
    """Put something hostile where the grader writes `name`."""
    target = workspace / name
    target.unlink(missing_ok=True)
    if how == "directory":
        (target / "inner").mkdir(parents=True)  # not empty: a rename cannot replace it
        (target / "inner" / "x").write_text("agent\n")
    elif how == "symlink":
        target.symlink_to(outside)
    elif how == "fifo":
        os.mkfifo(target)
    elif how == "read_only_directory":
        target.mkdir()
        (target / "x").write_text("agent\n")
        target.chmod(0o555)
        workspace.chmod(0o555)  # and the workspace itself: no temporary file can be made beside it


def submit(server, model_path: str = "output/v1") -> requests.Response:
    return requests.post(f"{server.url}/submit", json={"model_path": model_path}, timeout=120)


@pytest.mark.parametrize("how", ATTACKS)
@pytest.mark.parametrize("name", VISIBLE)
def test_an_attacked_agent_file_never_stops_the_grader(workspace, start_grader, tiny_model, tmp_path, name, how):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    copy_model(tiny_model, workspace / "output" / "v1")
    server = start_grader(workspace)
    assert submit(server).status_code == 200
    attack(workspace, name, how, outside)
    try:
        for _ in range(2):
            response = submit(server)
            assert response.status_code == 200 and response.json()["status"] == "cached", response.text
        server.grader.finish(time.time())  # raised before: no run.json, the run vanished
    finally:
        workspace.chmod(0o755)
        if (workspace / name).is_dir():
            (workspace / name).chmod(0o755)
    assert outside.read_text() == "precious\n"
    entries = list(read_jsonl(server.grader.ledger_path))
    assert [e["submission_id"] for e in entries] == [1, 2, 3]
    if how == "read_only_directory" and os.geteuid() != 0:
        return  # the grader could write nothing into the workspace: best effort, the records stand
    # The other files stay up to date; the attacked one is the grader's again unless it is a directory.
    for other in VISIBLE:
        path = workspace / other
        if other == name and how.endswith("directory"):
            assert path.is_dir()
            continue
        assert stat.S_ISREG(os.lstat(path).st_mode), other
        if other == "run_meta.json":
            assert read_json(path)["end_time"] == server.grader.end_time
    if not (name != "run_meta.json" and how.endswith("directory")):
        assert_consistent(server)
    assert read_json(server.grader.config.grader_dir / "run_meta.json")["end_time"] == server.grader.end_time


def test_the_timer_is_written_without_following_a_link(tmp_path):
    workspace, outside = tmp_path / "workspace", tmp_path / "outside.sh"
    workspace.mkdir()
    outside.write_text("precious\n")
    (workspace / "timer.sh").symlink_to(outside)
    write_timer(workspace, time.time() + 60)
    assert outside.read_text() == "precious\n"
    assert not (workspace / "timer.sh").is_symlink() and "deadline=" in (workspace / "timer.sh").read_text()
    assert os.stat(workspace / "timer.sh").st_mode & 0o777 == 0o755


def test_an_agent_cannot_erase_its_run_record(workspace, tiny_model, gsm8k_data, tmp_path):
    """The issue's attack through the real runner: run_meta.json replaced by a directory (and the
    other files by a link and a FIFO); the run is still recorded, both submissions with it."""
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    submit_py = (
        "import json, os, urllib.request as u, urllib.error as e\n"
        "r = u.Request(os.environ['GRADING_SERVER_URL'] + '/submit', json.dumps({'model_path': 'output/v1'}).encode())\n"
        "try:\n    print(u.urlopen(r, timeout=120).status)\nexcept e.HTTPError as err:\n    print(err.code)\n"
    )
    (workspace / "code" / "submit.py").write_text(submit_py)
    script = (
        'cp -r "$MODEL_PATH" "$OUTPUT_DIR/v1" && python3 code/submit.py >> code/statuses.txt && '
        "rm run_meta.json && mkdir -p run_meta.json/inner && touch run_meta.json/inner/x && "
        f"rm scores.json && ln -s {outside} scores.json && rm submissions.json && mkfifo submissions.json && "
        "python3 code/submit.py >> code/statuses.txt"
    )
    record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script]))
    run = read_json(workspace.parent / "run.json")
    assert run["status"] == record.status == "completed", (workspace / "agent.log").read_text()
    assert run["submissions"] == 2 and run["valid_submissions"] == 2
    assert (workspace / "code" / "statuses.txt").read_text().split() == ["200", "200"]
    assert len(list(read_jsonl(workspace.parent / "grader" / "ledger.jsonl"))) == 2
    assert outside.read_text() == "precious\n"
    # The grader's files again where it could write them (not over the agent's directory).
    assert [s["submission_id"] for s in read_json(workspace / "scores.json")] == [1]  # the second repeats it
    assert read_json(workspace / "submissions.json")["requests"] == 2
    assert (workspace / "run_meta.json").is_dir()
    assert read_json(workspace.parent / "grader" / "run_meta.json")["end_time"] == int(run["end_time"])


@pytest.mark.parametrize("how", ["directory", "fifo", "symlink", "forged"])
def test_the_summary_reads_the_graders_run_meta_not_the_agents(tmp_path, how):
    """summarize_run read workspace/run_meta.json: a directory there failed it (the run left the
    leaderboard), a FIFO hung it, forged times changed the process metrics. It reads the grader's."""
    from rlbench.fileio.jsonio import write_json
    from rlbench.summaries.summary import summarize
    from support.diagnostics import BASE, BASE_FP, BASELINE, META, entry, make_run

    run_dir, run = make_run(tmp_path, [entry(1, 120.0, 45.0)], {}, {})
    meta = run_dir / "workspace" / "run_meta.json"
    write_json(run_dir / "grader" / "run_meta.json", META)  # what Grader.finish records
    meta.unlink()
    if how == "directory":
        (meta / "inner").mkdir(parents=True)
    elif how == "fifo":
        os.mkfifo(meta)
    elif how == "symlink":
        other = tmp_path / "elsewhere.json"
        write_json(other, {**META, "start_time": META["start_time"] - 10_000})
        meta.symlink_to(other)
    else:
        write_json(meta, {**META, "start_time": META["start_time"] - 10_000, "end_time": META["start_time"] + 60})
    final = {"baseline_score": BASELINE, "score": 45.0, "delta": 5.0}
    done: list = []
    worker = threading.Thread(
        target=lambda: done.append(summarize(run_dir, run, final, {"score": BASELINE, "fingerprint": BASE_FP}, base_model=BASE)),
        daemon=True,
    )
    worker.start()
    worker.join(20)
    if worker.is_alive():
        with open(meta, "wb"):  # unblock the reader of the FIFO
            pass
        pytest.fail("summarize hung on the agent's run_meta.json")
    assert done, "summarize raised (see the thread's exception above)"
    summary = done[0][0]
    assert summary["run_meta"] == {k: META[k] for k in ("start_time", "timeout_s", "end_time", "last_submit_time")}
