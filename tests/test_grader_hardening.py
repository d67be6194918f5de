"""The grading server against hostile and unlucky requests, over real HTTP to a live server.

Bad model_path values, oversized and deeply nested bodies, sloppy URLs, failures inside the
grader itself, concurrent submissions of one checkpoint and a killed evaluation child: each must
get a 4xx with a stable reason (or a retryable 503 for the grader's own faults), leave exactly one
ledger entry, and keep the ledger, /health and scores.json in agreement.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import requests
from safetensors.torch import load_file, save_file

from rlbench.evaluation import EvaluationError, GraderFault, _outcome
from rlbench.grader import app as grader_app
from rlbench.grader.app import MAX_BODY_BYTES
from rlbench.jsonio import read_json, write_json
from rlbench.ledger import MODEL_PATH_MAX_CHARS, is_submission, reference_view

REPO = Path(__file__).resolve().parents[1]


# -- helpers ---------------------------------------------------------------------------------
def copy_model(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    for path in dest.rglob("*"):
        path.chmod(0o644)
    return dest


def perturb(model_dir: Path) -> None:
    """One weight changed: new content, so a submission of it must really be evaluated."""
    weights = load_file(model_dir / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 0.01
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})


def post_raw(server, body: bytes, path: str = "/submit", **kwargs) -> requests.Response:
    return requests.post(f"{server.url}{path}", data=body, timeout=120, **kwargs)


def strict_json(raw: bytes) -> object:
    """Parse as strict JSON: UTF-8 only, no NaN/Infinity (what other languages' parsers accept)."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(raw.decode("utf-8"), parse_constant=refuse)


def ledger_entries(server) -> list[dict]:
    raw = server.grader.ledger_path.read_bytes()
    return [strict_json(line) for line in raw.splitlines() if line.strip()]


def assert_consistent(server) -> list[dict]:
    """Ledger lines are strict JSON, one per request, none pending; scores.json is its reference view."""
    entries = ledger_entries(server)
    health = requests.get(f"{server.url}/health", timeout=30).json()
    assert health["requests"] == len(entries) == len(server.grader.entries)
    assert not any(e.get("pending") for e in entries)
    assert not any(e.get("pending") for e in server.grader.entries)
    assert sorted(e["submission_id"] for e in entries) == list(range(1, len(entries) + 1))
    workspace = server.grader.config.workspace
    by_id = sorted(entries, key=lambda e: e["submission_id"])
    assert strict_json((workspace / "scores.json").read_bytes()) == reference_view(by_id)
    strict_json((workspace / "submissions.json").read_bytes())
    return entries


def assert_refused(response: requests.Response, status: int, reason: str) -> dict:
    body = strict_json(response.content)
    assert response.status_code == status, body
    assert body["reason"] == reason and body["error"]
    assert body["score"] == 0.0
    return body


# -- 1. model_path values the OS cannot take ---------------------------------------------------
@pytest.mark.parametrize(
    "model_path, label",
    [
        ("output/" + "a" * 300, "a 300-character name"),
        ("output/" + "a" * 5000, "a 5000-character name"),
        ("output/" + "ab/" * 1700, "a path over PATH_MAX"),
        ("output/v1\x00/x", "a NUL byte"),
    ],
)
def test_unrepresentable_model_path_is_invalid_path(workspace, start_grader, model_path, label):
    server = start_grader(workspace)
    body = assert_refused(post_raw(server, json.dumps({"model_path": model_path}).encode()), 400, "invalid_path")
    assert "output/v1" in body["error"]  # says what to send instead
    assert len(body["model_path"]) <= MODEL_PATH_MAX_CHARS + 100
    if len(model_path) > MODEL_PATH_MAX_CHARS:
        assert "more characters not shown" in body["model_path"]
    else:
        assert body["model_path"] == model_path
    entries = assert_consistent(server)
    # Like a missing path, a path no file can have is a submission for the reference (scored 0.0).
    assert entries[-1]["reason"] == "invalid_path" and is_submission(entries[-1])
    assert body["total_submissions"] == 1


def test_lone_surrogate_is_echoed_escaped(workspace, start_grader):
    server = start_grader(workspace)
    response = post_raw(server, b'{"model_path": "\\ud800"}', headers={"Content-Type": "application/json"})
    body = assert_refused(response, 400, "invalid_path")
    assert body["model_path"] == "\\ud800"  # backslash-escaped text, valid UTF-8
    # A lone surrogate in a "gpu" value is quoted back safely too.
    response = post_raw(server, b'{"model_path": "output/v1", "gpu": "x\\udfff"}')
    assert "\\udfff" in assert_refused(response, 400, "invalid_gpu")["error"]
    assert_consistent(server)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model_path": 5}',
        b'{"model_path": null}',
        b'{"model_path": ["output/v1"]}',
        b'{"model_path": {"path": "output/v1"}}',
        b'{"model_path": true}',
        b'{"model_path": NaN}',
        b'{"model_path": 1e400}',
        b'{"model_path": ' + b"1" * 5000 + b"}",  # over Python's int digit limit: ValueError
        b'{"model_path": ' + b"[" * 500 + b"]" * 500 + b"}",
        b"[" * 60000,  # RecursionError in json.loads, within the size limit
        b'"output/v1"',
        b"\xff\xfe\x00garbage",
    ],
)
def test_malformed_bodies_are_refused_and_recorded(workspace, start_grader, raw):
    server = start_grader(workspace)
    body = assert_refused(post_raw(server, raw), 400, "malformed_request")
    assert body["model_path"] is None or isinstance(body["model_path"], str)
    entries = assert_consistent(server)
    assert entries[-1]["reason"] == "malformed_request" and not is_submission(entries[-1])


# -- 2. body size ---------------------------------------------------------------------------------
def test_oversized_bodies_are_413_and_recorded(workspace, start_grader):
    server = start_grader(workspace)
    filler = json.dumps({"model_path": "output/v1", "pad": "x" * MAX_BODY_BYTES}).encode()
    assert_refused(post_raw(server, filler), 413, "request_too_large")  # Content-Length over the limit
    assert_refused(post_raw(server, b"[" * 100_000), 413, "request_too_large")

    def chunks():  # chunked: no Content-Length, the bytes themselves go over
        for _ in range(20):
            yield b" " * 8192

    assert_refused(post_raw(server, chunks()), 413, "request_too_large")
    # Declared far beyond what is worth reading: answered at once, without waiting for the body.
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    secret = server.grader.config.secret
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(
            f"POST /{secret}/submit HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {10**12}\r\n\r\n{{}}".encode()
        )
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            data = sock.recv(65536)
            if not data:
                break
            reply += data
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), head
    assert strict_json(payload)["reason"] == "request_too_large"
    # Exactly at the limit is still read (and refused only for what it says).
    at_limit = b'{"model_path": "output/nope"}'.ljust(MAX_BODY_BYTES, b" ")
    assert_refused(post_raw(server, at_limit), 404, "missing_path")
    entries = assert_consistent(server)
    assert [e["reason"] for e in entries] == ["request_too_large"] * 4 + ["missing_path"]
    assert [e["submission_id"] for e in reference_view(entries)] == [5]  # 413s are not submissions


# -- 5. sloppy URLs --------------------------------------------------------------------------------
def test_repeated_and_trailing_slashes_are_accepted(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    for url in (f"{server.url}//submit", f"{server.url}/submit/", f"{server.url}//submit//"):
        response = requests.post(url, json={"model_path": "output/v1"}, timeout=60, allow_redirects=False)
        assert response.status_code == 200, (url, response.text)
    parts = urlsplit(server.url)
    doubled = f"{parts.scheme}://{parts.netloc}//{server.grader.config.secret}//"
    assert requests.get(f"{doubled}time/", timeout=30, allow_redirects=False).status_code == 200
    assert requests.get(f"{doubled}health", timeout=30, allow_redirects=False).json()["status"] == "ok"
    assert requests.get(f"{server.url}/time//", timeout=30, allow_redirects=False).status_code == 200
    wrong = f"{parts.scheme}://{parts.netloc}//wrong-secret//submit/"
    assert requests.post(wrong, json={"model_path": "output/v1"}, timeout=30).status_code == 404
    assert requests.get(f"{parts.scheme}://{parts.netloc}//wrong-secret/health/", timeout=30).status_code == 404
    assert len(assert_consistent(server)) == 3


# -- 1. whatever raises where, the reserved id is recorded --------------------------------------------
def test_failures_inside_the_grader_still_record_the_submission(workspace, start_grader, tiny_model, monkeypatch):
    server = start_grader(workspace)
    grader = server.grader
    copy_model(tiny_model, workspace / "output" / "v1")

    def boom(*args, **kwargs):
        raise RuntimeError("injected failure")

    # A bug before the evaluation: a retryable grader error, not the agent's fault.
    monkeypatch.setattr(grader_app, "resolve_submission", boom)
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=60)
    body = assert_refused(response, 503, "grader_error")
    assert body["status"] == "grader_error" and body["retryable"] is True
    assert int(response.headers["Retry-After"]) > 0 and "not a problem with your model" in body["error"]
    monkeypatch.undo()
    # A failure while completing the record (inside _record).
    monkeypatch.setattr(grader, "_earlier_result", boom)
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=60)
    assert_refused(response, 503, "grader_error")
    monkeypatch.undo()
    # The agent's files cannot be written: the answer and the ledger line stand.
    monkeypatch.setattr(grader, "_write_agent_files", boom)
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=60)
    assert response.status_code == 200 and response.json()["status"] == "cached"
    monkeypatch.undo()
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/nope"}, timeout=60)
    assert_refused(response, 404, "missing_path")
    entries = assert_consistent(server)  # the next write brought scores.json up to date
    assert [e["status"] for e in entries] == ["grader_error", "grader_error", "cached", "refused"]
    # Grader errors are not submissions: not in scores.json, not in the counts.
    assert [e["submission_id"] for e in reference_view(entries)] == [3, 4]
    assert read_json(workspace / "run_meta.json")["last_submit_time"] == int(entries[3]["responded_at"])


# -- 3. one evaluation per content ------------------------------------------------------------------
def evaluations_run(server) -> int:
    return len(list((server.grader.snapshots).glob("*/eval/result.json")))


def test_concurrent_identical_submissions_are_evaluated_once(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    barrier = threading.Barrier(20)

    def one(_: int) -> requests.Response:
        barrier.wait()
        return requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=300)

    with ThreadPoolExecutor(max_workers=20) as pool:
        responses = list(pool.map(one, range(20)))
    bodies = [r.json() for r in responses]
    assert all(r.status_code == 200 for r in responses), bodies
    assert len({b["score"] for b in bodies}) == 1
    assert evaluations_run(server) == 1
    entries = assert_consistent(server)
    assert len(entries) == 20
    scored = [e for e in entries if e["status"] == "scored"]
    assert len(scored) == 1 and sum(e["status"] == "cached" for e in entries) == 19
    # The waiters repeat that one evaluation of the same path: one submission in scores.json.
    assert {e.get("repeat_of") for e in entries if e["status"] == "cached"} == {scored[0]["submission_id"]}
    assert [s["submission_id"] for s in read_json(workspace / "scores.json")] == [scored[0]["submission_id"]]


# -- 4. the grader's faults are not the model's ------------------------------------------------------------
def evaluation_children(root: psutil.Process | None = None) -> list[psutil.Process]:
    found = []
    for child in (root or psutil.Process()).children(recursive=True):
        try:
            if "rlbench.evaluation" in child.cmdline():
                found.append(child)
        except psutil.Error:
            pass
    return found


def wait_for(predicate, timeout: float = 120.0, interval: float = 0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out waiting")


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_killed_evaluation_is_a_retryable_grader_error(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(requests.post, f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=300)
        child = wait_for(evaluation_children)[0]
        child.send_signal(signal.SIGKILL)
        response = pending.result()
    body = assert_refused(response, 503, "grader_error")
    assert body["retryable"] is True and response.headers["Retry-After"]
    assert "SIGKILL" in body["error"] and "submit it again" in body["error"]
    assert body["total_submissions"] == 0  # not counted against the agent
    again = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=300)
    assert again.status_code == 200 and again.json()["status"] == "scored"  # not cached from the failure
    entries = assert_consistent(server)
    assert [e["status"] for e in entries] == ["grader_error", "scored"]
    assert [s["submission_id"] for s in read_json(workspace / "scores.json")] == [2]


def test_missing_held_out_split_is_the_graders_fault(workspace, start_grader, tiny_model, tmp_path):
    server = start_grader(workspace)
    server.grader.config.eval_dir = tmp_path / "no-such-split"
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=300)
    body = assert_refused(response, 503, "grader_error")
    assert "setup" in body["error"]
    assert_consistent(server)


def test_child_failures_are_classified_by_phase(tmp_path):
    result, error, log = tmp_path / "result.json", tmp_path / "error.json", tmp_path / "eval.log"
    log.write_text("Traceback ...\nOSError: boom\n")
    with pytest.raises(GraderFault, match="SIGKILL"):
        _outcome(-signal.SIGKILL, result, error, log)
    with pytest.raises(GraderFault, match="without a result"):
        _outcome(0, result, error, log)
    with pytest.raises(GraderFault):
        _outcome(1, result, error, log)  # died before it could say where
    for phase, expected in (
        ("loading", EvaluationError),
        ("generating", EvaluationError),
        ("setup", GraderFault),
        ("writing", GraderFault),
    ):
        write_json(error, {"phase": phase, "fault": "x", "error": "boom"})
        with pytest.raises(expected):
            _outcome(1, result, error, log)
    write_json(result, {"score": 1.0})
    assert _outcome(0, result, error, log) == {"score": 1.0}


ORPHAN_PARENT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from rlbench.evaluation import run_in_child
settings, model, eval_dir, work = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
import json
run_in_child(json.loads(settings), Path(model), Path(eval_dir), {"backend": "hf", "batch_size": 8}, Path(work))
"""


def test_evaluation_child_dies_with_its_grader(tmp_path, tiny_model, gsm8k_data):
    """kill -9 of the process that started an evaluation leaves no orphan evaluation behind.

    The held-out split is a FIFO the test holds open: the child blocks reading it, after loading
    the model, and would wait there forever if the kernel did not kill it with its parent."""
    from conftest import GSM8K_SETTINGS
    from rlbench.tasks.gsm8k import EVAL_FILE

    eval_dir = tmp_path / "split"
    eval_dir.mkdir()
    fifo = eval_dir / EVAL_FILE
    os.mkfifo(fifo)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            ORPHAN_PARENT,
            str(REPO / "scripts"),
            json.dumps(GSM8K_SETTINGS),
            str(tiny_model),
            str(eval_dir),
            str(tmp_path / "eval"),
        ]
    )
    child, writer = None, None

    def reader_waiting() -> int | None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until the child opens it
        except OSError:
            return None

    try:
        child = wait_for(lambda: evaluation_children(psutil.Process(parent.pid)), timeout=60)[0]
        writer = wait_for(reader_waiting, timeout=120)  # the child is now stuck mid-evaluation
        os.kill(parent.pid, signal.SIGKILL)  # the grader dies without a chance to clean up
        parent.wait(timeout=30)
        wait_for(lambda: gone(child), timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
        if child is not None and not gone(child):
            child.kill()  # only on failure: it should already be gone
        if writer is not None:
            os.close(writer)
