"""The ledger on a full disk (issue 25, item 5): a submission whose ledger line cannot be written is
never acknowledged (503, retryable, Retry-After), a partial line is truncated back, the ledger stays
readable, and the grader records again once there is room."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest

from rlbench.fileio.jsonio import read_json
from rlbench.recording.ledger import is_submission, reference_view
from support.full_disk import run_on_small_fs, unavailable_reason
from support.grader import assert_consistent, strict_json
from support.models import copy_model, perturb
from support.needs import unavailable

REPO = Path(__file__).resolve().parents[1]


def test_a_full_disk_never_acknowledges_an_unrecorded_submission(workspace, tiny_model, gsm8k_data, tmp_path):
    why = unavailable_reason()
    if why is not None:  # the sandbox (bubblewrap) needs user namespaces too: where CI requires it, this fails
        unavailable("sandbox", why)
    copy_model(tiny_model, workspace / "output" / "v1")
    grader_dir, small, out = workspace.parent / "grader", tmp_path / "small", tmp_path / "out"
    for directory in (grader_dir, small, out):
        directory.mkdir(parents=True, exist_ok=True)
    (grader_dir / "ledger.jsonl").touch()  # the mount point of the ledger on the small file system
    config = {
        "workspace": str(workspace),
        "grader_dir": str(grader_dir),
        "eval_dir": str(gsm8k_data[1]),
        "tiny_model": str(tiny_model),
        "small": str(small),
        "out": str(out),
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO / "scripts")])}
    done = run_on_small_fs(
        small,
        [grader_dir / "ledger.jsonl"],
        [sys.executable, "-m", "support.full_disk", str(tmp_path / "config.json")],
        env=env,
        cwd=REPO / "tests",
    )
    assert done.returncode == 0, done.stderr[-4000:]
    responses = json.loads((out / "responses.json").read_text())
    raw = (out / "ledger.jsonl").read_bytes()
    report = [(r["phase"], r["status"], r["body"].get("submission_id"), r["ledger_bytes"]) for r in responses]

    # Every line whole, strict JSON: nothing torn, nothing glued.
    assert raw.endswith(b"\n"), (report, raw[-300:])
    entries = [strict_json(line) for line in raw.splitlines()]
    by_id = {e["submission_id"]: e for e in entries}
    assert sorted(by_id) == list(range(1, len(entries) + 1)), report

    # The disk refused some lines: those requests were told to retry, never acknowledged.
    refused = [r for r in responses if r["status"] == 503]
    assert refused, f"the small file system never refused a ledger line: {report}"
    for answer in refused:
        body = answer["body"]
        assert body["retryable"] is True and body["reason"] == "grader_error", body
        assert int(answer["retry_after"]) > 0
        assert "No space left on device" in body["error"] and "submit it again" in body["error"], body
        # Its id is recorded as what it was answered with: a grader error, not a submission.
        assert by_id[body["submission_id"]]["status"] == "grader_error", (report, by_id[body["submission_id"]])

    # No acknowledgement without its ledger line, and the line says what the answer said.
    for answer in responses:
        body = answer["body"]
        assert body["submission_id"] in by_id, report
        line = by_id[body["submission_id"]]
        assert (line["status"], line.get("reason")) == (body["status"], body.get("reason")), (report, line, body)

    # Once there was room again the next submission was recorded, and the counts agree.
    assert responses[-1]["phase"] == "freed" and responses[-1]["status"] == 200, report
    health = json.loads((out / "health.json").read_text())
    assert health["requests"] == len(entries)
    assert health["total_submissions"] == sum(map(is_submission, entries))
    assert read_json(workspace / "scores.json") == reference_view(sorted(entries, key=lambda e: e["submission_id"]))


def test_the_ledger_readers_skip_a_torn_last_line_and_refuse_a_corrupt_middle(tmp_path):
    """What a crash in the middle of an append leaves: the summary and the reconstruction read the
    whole lines before it; a torn line with another glued on is corruption, reported, never skipped."""
    from rlbench.recording.reconstruct import reconstruct
    from rlbench.summaries.summary import summarize
    from support.diagnostics import BASE, BASE_FP, BASELINE, entry, make_run

    run_dir, run = make_run(tmp_path, [entry(1, 120.0, 45.0), entry(2, 300.0, 50.0)], {}, {})
    ledger = run_dir / "grader" / "ledger.jsonl"
    whole = ledger.read_bytes()
    ledger.write_bytes(whole + b'{"submission_id": 3, "score": 9')
    final = {"baseline_score": BASELINE, "score": 50.0, "delta": 10.0}
    summary, _ = summarize(run_dir, run, final, {"score": BASELINE, "fingerprint": BASE_FP}, base_model=BASE)
    assert summary["submissions"] == 2
    assert [s["submission_id"] for s in reconstruct(run_dir)["submissions"]] == [1, 2]
    lines = whole.splitlines(keepends=True)
    ledger.write_bytes(lines[0][:40] + lines[1])  # a torn line with the next one glued on
    with pytest.raises(ValueError, match="line 1 is not valid JSON"):
        summarize(run_dir, run, final, {"score": BASELINE, "fingerprint": BASE_FP}, base_model=BASE)
    with pytest.raises(ValueError, match="line 1 is not valid JSON"):
        reconstruct(run_dir)


def test_an_evaluation_whose_line_was_refused_counts_for_nothing(workspace, start_grader, tiny_model, monkeypatch):
    """A scored submission whose ledger line the disk refuses: not in the cache (the next one is
    evaluated again), not the best, not in the agent's files or /health; its id is recorded as the
    grader error it was answered with once the disk takes lines again, before the next one."""
    import requests

    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    server = start_grader(workspace)
    grader = server.grader
    real_append, refusing = grader.ledger.append, [True]

    def append(entry, attempts=3):
        if refusing[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_append(entry, attempts)

    monkeypatch.setattr(grader.ledger, "append", append)
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=300)
    body = response.json()
    assert response.status_code == 503 and body["retryable"] is True and int(response.headers["Retry-After"]) > 0, body
    assert (body["submission_id"], body["status"], body["model_path"]) == (1, "grader_error", "output/v1")
    assert requests.get(f"{server.url}/health", timeout=30).json()["requests"] == 0
    assert read_json(workspace / "scores.json") == [] and read_json(workspace / "submissions.json")["requests"] == 0
    assert grader.best is None and not (grader.snapshots / "0001").exists()
    assert grader.ledger_path.read_bytes() == b""

    refusing[0] = False
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=300)
    assert response.status_code == 200 and response.json()["status"] == "scored", response.text  # evaluated again
    entries = assert_consistent(server)
    assert [(e["submission_id"], e["status"]) for e in entries] == [(1, "grader_error"), (2, "scored")]
    assert "No space left on device" in entries[0]["error"] and grader.best["submission_id"] == 2
