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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
import requests
from safetensors.torch import save_file

from rlbench.evaluation.request import EvaluationError, GraderFault, read_outcome
from rlbench.grader import grading as grader_grading
from rlbench.grader.http import MAX_BODY_BYTES
from rlbench.grader.visible import PRIVATE_FIELDS
from rlbench.fileio.jsonio import read_json, write_json
from rlbench.recording.ledger import MODEL_PATH_MAX_CHARS, is_submission, reference_view
from support.grader import (
    assert_consistent,
    evaluation_children,
    gone,
    pool_workers,
    strict_json,
    wait_for,
)
from support.models import copy_model, perturb

REPO = Path(__file__).resolve().parents[1]


# -- helpers ---------------------------------------------------------------------------------


def post_raw(server, body: bytes, path: str = "/submit", **kwargs) -> requests.Response:
    return requests.post(f"{server.url}{path}", data=body, timeout=120, **kwargs)


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
    monkeypatch.setattr(grader_grading, "resolve_submission", boom)
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
def test_killed_evaluation_is_a_retryable_grader_error(workspace, start_grader, tiny_model, tmp_path):
    """The evaluation process (the warm worker) is killed mid-evaluation: that submission is a
    grader error, and the next one is scored by a new worker. The held-out split is first a FIFO
    nobody writes, so that the evaluation is surely still running (generating) when it is killed."""
    from rlbench.tasks.gsm8k import EVAL_FILE

    server = start_grader(workspace, own_workers=True)
    split = tmp_path / "fifo-split"
    split.mkdir()
    os.mkfifo(split / EVAL_FILE)
    real_split, server.grader.config.eval_dir = server.grader.config.eval_dir, split
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    phase_file = server.grader.snapshots / "0001" / "eval" / "phase.json"

    def generating() -> bool:
        try:
            return read_json(phase_file)["phase"] == "generating"
        except (OSError, ValueError, KeyError):
            return False

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(requests.post, f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=300)
        wait_for(generating, timeout=120)
        child = wait_for(lambda: pool_workers(server))[0]
        child.send_signal(signal.SIGKILL)
        response = pending.result()
    server.grader.config.eval_dir = real_split
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
        read_outcome(-signal.SIGKILL, result, error, log)
    with pytest.raises(GraderFault, match="without a result"):
        read_outcome(0, result, error, log)
    with pytest.raises(GraderFault):
        read_outcome(1, result, error, log)  # died before it could say where
    for phase, expected in (
        ("loading", EvaluationError),
        ("generating", EvaluationError),
        ("setup", GraderFault),
        ("writing", GraderFault),
    ):
        write_json(error, {"phase": phase, "fault": "x", "error": "boom"})
        with pytest.raises(expected):
            read_outcome(1, result, error, log)
    write_json(result, {"score": 1.0})
    assert read_outcome(0, result, error, log) == {"score": 1.0}


def test_a_failure_after_the_split_was_read_keeps_what_it_quotes_private(tmp_path):
    """A model's failure while generating may quote the prompt (a held-out question): the agent is
    told the exception's type and why the rest is withheld; the detail is for the private ledger."""
    result, error, log = tmp_path / "result.json", tmp_path / "error.json", tmp_path / "eval.log"
    question = "Natalia sold clips to 48 of her friends in April"
    log.write_text(f"Traceback ...\nValueError: cannot encode {question!r}\n")
    write_json(error, {"phase": "generating", "fault": "model", "type": "ValueError", "error": f"ValueError: {question}"})
    with pytest.raises(EvaluationError) as failed:
        read_outcome(1, result, error, log)
    told = str(failed.value)
    assert question not in told and "ValueError" in told and "withheld" in told
    assert "format_prompt" in told and "training data" in told  # how to debug it without the split
    assert question in failed.value.detail


ORPHAN_PARENT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from rlbench.evaluation.child import run_in_child
settings, model, eval_dir, work = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
import json
run_in_child(json.loads(settings), Path(model), Path(eval_dir), {"backend": "hf", "batch_size": 8}, Path(work))
"""


def test_evaluation_child_dies_with_its_grader(tmp_path, tiny_model, gsm8k_data):
    """kill -9 of the process that started an evaluation leaves no orphan evaluation behind.

    The held-out split is a FIFO the test holds open: the child blocks reading it, after loading
    the model, and would wait there forever if the kernel did not kill it with its parent."""
    from rlbench.tasks.gsm8k import EVAL_FILE
    from support.settings import GSM8K_SETTINGS

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


# -- 6. held-out data never travels back in an error -----------------------------------------------
def held_out_questions(eval_dir: Path) -> list[str]:
    from rlbench.tasks.gsm8k import EVAL_FILE

    rows = (eval_dir / EVAL_FILE).read_text().splitlines()
    return [json.loads(line)["question"] for line in rows if line.strip()]


def quotes_any(text: str, questions: list[str]) -> list[str]:
    """The questions that `text` quotes, whole or a 40-character piece of their opening (the split's
    questions share a closing instruction, which alone proves nothing)."""
    return [q for q in questions if q in text or any(q[i : i + 40] in text for i in range(0, min(len(q), 120), 10))]


# Chat templates that would make the evaluation fail with the held-out question in the exception text,
# were they run on it (the grader's rendering never runs a submitted template on a message's content:
# generation.chat_format; the private error_detail keeps whatever an evaluation failure quotes).
LEAKING_TEMPLATES = {
    "raise_exception": "{{ raise_exception(messages[-1]['content'] | replace('\\n', ' ')) }}",
    "undefined_attribute": "{{ ({}[messages[-1]['content'] | replace('\\n', ' ')]).x }}",
}


@pytest.mark.parametrize("label", sorted(LEAKING_TEMPLATES))
def test_a_failing_chat_template_cannot_send_held_out_questions_back(
    workspace, start_grader, tiny_model, gsm8k_data, label
):
    server = start_grader(workspace)
    questions = held_out_questions(gsm8k_data[1])
    model = copy_model(tiny_model, workspace / "output" / "leak")
    (model / "chat_template.jinja").write_text(LEAKING_TEMPLATES[label])
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/leak"}, timeout=300)
    body = strict_json(response.content)
    # The template fails on the probe's placeholders, so it is ignored: scored with the base model's.
    assert response.status_code == 200 and body["status"] == "scored", body
    assert body["chat_template"]["used"] == "base" and "fails" in body["chat_template"]["reason"], body
    entries = assert_consistent(server)
    for where, text in (
        ("response", response.text),
        ("ledger", json.dumps(entries[-1])),
        ("scores.json", (workspace / "scores.json").read_text()),
        ("submissions.json", (workspace / "submissions.json").read_text()),
        ("run_meta.json", (workspace / "run_meta.json").read_text()),
    ):
        assert not quotes_any(text, questions), f"{where} quotes a held-out question"


# -- 7. a checkpoint reaches nothing outside itself ----------------------------------------------------
def safetensors_names(path: Path) -> list[str]:
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        return [k for k in json.loads(handle.read(size)) if k != "__metadata__"]


def empty_safetensors(path: Path) -> None:
    save_file({}, path, metadata={"format": "pt"})


def index_for(weights: Path, target: str) -> dict:
    weight_map = {name: target for name in safetensors_names(weights)}
    return {"metadata": {"total_size": weights.stat().st_size}, "weight_map": weight_map}


@pytest.mark.parametrize("where", ["absolute", "dotdot", "missing"])
def test_shard_index_naming_files_outside_the_checkpoint_is_refused(workspace, start_grader, tiny_model, where):
    """A checkpoint without weights of its own whose index maps every tensor to another model's file
    (os.path.join(dir, "/abs") is "/abs") would load, and be scored as, that model."""
    server = start_grader(workspace)
    perturb(copy_model(tiny_model, workspace / "output" / "other"))  # a better model, elsewhere in the workspace
    model = copy_model(tiny_model, workspace / "output" / "escape")
    (model / "model.safetensors").unlink()
    empty_safetensors(model / "unused.safetensors")  # a *.safetensors file, so that it is not refused for that
    target = {
        "absolute": str(tiny_model / "model.safetensors"),
        "dotdot": "../other/model.safetensors",
        "missing": "model-00001-of-00002.safetensors",
    }[where]
    (model / "model.safetensors.index.json").write_text(json.dumps(index_for(tiny_model / "model.safetensors", target)))
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/escape"}, timeout=300)
    body = assert_refused(response, 422, "bad_file_reference")
    assert "weight_map" in body["error"] and "save_pretrained" in body["error"]
    assert evaluations_run(server) == 0  # refused before any evaluation
    entries = assert_consistent(server)
    assert entries[-1]["status"] == "refused" and not list(server.grader.snapshots.glob("*/model"))


@pytest.mark.parametrize(
    "file, change, key",
    [
        ("tokenizer_config.json", {"fast_tokenizer_files": ["/etc/tokenizer.4.0.0.json"]}, "fast_tokenizer_files"),
        ("tokenizer_config.json", {"fast_tokenizer_files": ["../tokenizer.4.0.0.json"]}, "fast_tokenizer_files"),
        ("config.json", {"transformers_weights": "sub/model.safetensors.index.json"}, "transformers_weights"),
        ("config.json", {"transformers_weights": "/elsewhere/model.safetensors"}, "transformers_weights"),
    ],
)
def test_other_file_references_outside_the_checkpoint_are_refused(
    workspace, start_grader, tiny_model, file, change, key
):
    """Other names transformers joins to the checkpoint's directory: the tokenizer file to load
    (fast_tokenizer_files) and the weights to load (transformers_weights)."""
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    data = json.loads((model / file).read_text())
    data.update(change)
    (model / file).write_text(json.dumps(data))
    body = assert_refused(requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=60), 422,
                          "bad_file_reference")
    assert key in body["error"]
    assert_consistent(server)


def test_sharded_checkpoint_with_plain_shard_names_is_scored(workspace, start_grader, tiny_model):
    """The check refuses escapes only: a real sharded checkpoint (plain names, files present) loads."""
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "sharded")
    shard = "model-00001-of-00001.safetensors"
    (model / "model.safetensors").rename(model / shard)
    (model / "model.safetensors.index.json").write_text(json.dumps(index_for(model / shard, shard)))
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/sharded"}, timeout=300)
    assert response.status_code == 200 and response.json()["status"] == "scored", response.text
    assert_consistent(server)


# -- 8. the code snapshot follows no link, and is bounded ---------------------------------------------------
def code_snapshots(server) -> list[Path]:
    return [p for p in server.grader.snapshots.glob("*/code/**/*") if p.is_file()]


def test_symlinked_code_dir_is_not_copied(workspace, start_grader, tiny_model, gsm8k_data):
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "base")  # cached: snapshotted, never evaluated
    shutil.rmtree(workspace / "code")
    (workspace / "code").symlink_to(gsm8k_data[1], target_is_directory=True)  # the held-out split
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/base"}, timeout=60)
    assert response.status_code == 200 and response.json()["status"] == "cached"
    assert code_snapshots(server) == []
    # Links inside a real code/ are not followed either (to a directory or to a file).
    (workspace / "code").unlink()
    (workspace / "code").mkdir()
    (workspace / "code" / "train.py").write_text("print('mine')\n")
    (workspace / "code" / "split").symlink_to(gsm8k_data[1], target_is_directory=True)
    (workspace / "code" / "rows.jsonl").symlink_to(next(gsm8k_data[1].glob("*.jsonl")))
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/base"}, timeout=60)
    assert response.status_code == 200
    assert sorted(p.name for p in code_snapshots(server)) == [".snapshot.json", "train.py"]
    assert_consistent(server)


def test_code_snapshot_is_bounded(workspace, start_grader, tiny_model, monkeypatch):
    from rlbench.grader import snapshot

    monkeypatch.setattr(snapshot, "CODE_SNAPSHOT_MAX_FILES", 5)
    monkeypatch.setattr(snapshot, "CODE_SNAPSHOT_MAX_TOTAL_BYTES", 1000)
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "base")
    for i in range(20):
        (workspace / "code" / f"f{i:02d}.py").write_text("x" * 150)
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/base"}, timeout=60)
    assert response.status_code == 200
    copied = [p for p in code_snapshots(server) if p.name != ".snapshot.json"]
    assert 0 < len(copied) <= 5 and sum(p.stat().st_size for p in copied) <= 1000
    note = json.loads(next(server.grader.snapshots.glob("*/code/.snapshot.json")).read_text())
    assert note["truncated"] is True


# -- 9. what is checked is what is copied (no time-of-check/time-of-use race) ---------------------------------
def swap_after_check(monkeypatch, swap) -> None:
    """Run `swap` right after resolve_submission has checked the submission: the race, won every time."""
    real = grader_grading.resolve_submission

    def checked_then_swapped(workspace, model_path):
        resolved = real(workspace, model_path)
        swap()
        return resolved

    monkeypatch.setattr(grader_grading, "resolve_submission", checked_then_swapped)


def test_file_swapped_for_a_link_after_the_check_is_not_copied(
    workspace, start_grader, tiny_model, tmp_path, monkeypatch
):
    server = start_grader(workspace)
    secret = tmp_path / "host-secret.txt"
    secret.write_text("a host file the grader must not copy\n")
    model = copy_model(tiny_model, workspace / "output" / "v1")
    (model / "notes.txt").write_text("mine\n")

    def swap():
        (model / "notes.txt").unlink()
        (model / "notes.txt").symlink_to(secret)

    swap_after_check(monkeypatch, swap)
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=60)
    body = assert_refused(response, 422, "not_a_regular_file")
    assert "notes.txt" in body["error"] and "dereference" in body["error"]
    copied = [p for p in server.grader.snapshots.rglob("*") if p.is_file() and p.read_bytes() == secret.read_bytes()]
    assert copied == []
    assert_consistent(server)


def test_directory_swapped_for_a_link_after_the_check_is_not_copied(
    workspace, start_grader, tiny_model, tmp_path, monkeypatch
):
    """output/v1 checked, then replaced by a link to a model outside: the copy must not follow it."""
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    outside = copy_model(tiny_model, tmp_path / "outside-better")
    perturb(outside)

    def swap():
        model.rename(workspace / "output" / "v1.parked")
        model.symlink_to(outside, target_is_directory=True)

    swap_after_check(monkeypatch, swap)
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=60)
    assert_refused(response, 409, "checkpoint_changed")
    assert evaluations_run(server) == 0
    assert_consistent(server)


def test_links_inside_the_workspace_are_refused_not_followed(workspace, start_grader, tiny_model):
    """A weights file linked to another checkpoint of the workspace: the grader copies files, not links."""
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v0")
    model = copy_model(tiny_model, workspace / "output" / "v1")
    (model / "model.safetensors").unlink()
    (model / "model.safetensors").symlink_to(workspace / "output" / "v0" / "model.safetensors")
    body = assert_refused(requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=60), 422,
                          "not_a_regular_file")
    assert "model.safetensors" in body["error"]
    # Links that are not checkpoint files are neither followed nor a reason to refuse.
    (model / "model.safetensors").unlink()
    shutil.copyfile(tiny_model / "model.safetensors", model / "model.safetensors")
    (model / "latest").symlink_to(workspace / "output" / "v0", target_is_directory=True)
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=60)
    assert response.status_code == 200 and response.json()["status"] == "cached"
    assert_consistent(server)


# -- 10. weights killed again and again are the model's failure ---------------------------------------------------
@pytest.mark.slow  # 15 s: three killed evaluations; one killed evaluation stays in the default tier (above)
def test_repeatedly_killed_evaluation_becomes_the_models_failure(workspace, start_grader, tiny_model, tmp_path):
    """As an out-of-memory kill: SIGKILL while generating. The held-out split is a FIFO nobody
    writes, so each child blocks in the generating phase until it is killed."""
    from rlbench.tasks.gsm8k import EVAL_FILE

    server = start_grader(workspace, own_workers=True)
    split = tmp_path / "fifo-split"
    split.mkdir()
    os.mkfifo(split / EVAL_FILE)
    server.grader.config.eval_dir = split
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    statuses = []
    for attempt in range(1, grader_grading.GRADER_FAULTS_RETRIED + 2):
        phase_file = server.grader.snapshots / f"{attempt:04d}" / "eval" / "phase.json"
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(requests.post, f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=300)

            def generating() -> bool:
                try:
                    return read_json(phase_file)["phase"] == "generating"
                except (OSError, ValueError, KeyError):
                    return False

            wait_for(generating, timeout=180)
            wait_for(lambda: pool_workers(server))[0].send_signal(signal.SIGKILL)
            response = pending.result()
        statuses.append((response.status_code, response.json()["reason"]))
    assert statuses == [(503, "grader_error")] * grader_grading.GRADER_FAULTS_RETRIED + [(422, "evaluation_failed")]
    body = response.json()
    assert "killed" in body["error"] and "out of memory" in body["error"] and "retryable" not in body
    entries = assert_consistent(server)
    assert "SIGKILL" in entries[-1]["error_detail"]
    assert [s["submission_id"] for s in read_json(workspace / "scores.json")] == [len(entries)]


# -- 11. a flood of requests costs each one the same ------------------------------------------------------------
def test_agent_files_are_cheap_and_bounded(workspace, start_grader, monkeypatch):
    from rlbench.fileio import jsonio
    from rlbench.grader import visible

    monkeypatch.setattr(visible, "SUBMISSIONS_SHOWN", 5)
    server = start_grader(workspace)
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(jsonio.os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    for i in range(8):  # submissions (missing paths) and request errors (malformed), interleaved
        requests.post(f"{server.url}/submit", json={"model_path": f"output/nope{i}"} if i % 2 else {}, timeout=60)
    assert len(fsyncs) == 8  # the ledger line of each request; the files derived from it are not fsync'd
    entries = assert_consistent(server)  # scores.json still lists every submission
    ours = strict_json((workspace / "submissions.json").read_bytes())
    assert ours["requests"] == 8 and ours["total_submissions"] == 4 and ours["submissions_shown"] == 5
    assert [e["submission_id"] for e in ours["submissions"]] == [4, 5, 6, 7, 8]  # the most recent
    assert ours["submissions"][-1] == {k: v for k, v in entries[-1].items()
                                       if k not in PRIVATE_FIELDS + ("best", "total_submissions")}


def test_fifo_in_a_checkpoint_is_refused_without_blocking(workspace, start_grader, tiny_model):
    """A FIFO named like a checkpoint file: opening it to copy would block the grader forever."""
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    os.mkfifo(model / "notes.txt")
    response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=60)
    assert "notes.txt" in assert_refused(response, 422, "not_a_regular_file")["error"]
    assert_consistent(server)
